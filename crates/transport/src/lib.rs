//! rgpu transport: streams (TCP, Unix socket, TLS over either), framed I/O and the
//! authenticated handshake.
//! Used by both the server and the client core; knows nothing of OpenCL or CUDA.

pub mod copier;
mod countdown;
mod deadline;
pub mod fork;
mod framed;
mod handshake;
pub mod link;
pub mod peer;
mod read_ahead;
pub mod shared_ring;
pub mod spin;
mod stream;
pub mod tls;

pub use countdown::Countdown;
pub use deadline::{deadline, Deadline};
pub use framed::{FrameReader, FrameWriter};
pub use handshake::{
    accept_preamble, client_handshake, load_client_token, random_lane_key, server_handshake,
    tell_queued, Applicant, ClientHello, ClientWelcome, Introduction, Plaintext, Route,
    ServerSecurity, Token,
};
pub use read_ahead::ReadHalf;
pub use stream::{host_name, Endpoint, Listener, Stream, StreamKind};
pub use tls::{ClientSecurity, Fingerprint, TlsConnector, TlsIdentity, TlsMode};

use rgpu_protocol::ProtocolError;

#[derive(Debug)]
pub enum TransportError {
    Io(std::io::Error),
    Protocol(ProtocolError),
    /// Authentication failed or was refused; the message is for the user.
    Auth(String),
    /// The peer closed the connection between frames.
    Closed,
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransportError::Io(e) => write!(f, "I/O error: {e}"),
            TransportError::Protocol(e) => write!(f, "{e}"),
            TransportError::Auth(why) => write!(f, "authentication failed: {why}"),
            TransportError::Closed => write!(f, "connection closed by peer"),
        }
    }
}

impl std::error::Error for TransportError {}

impl From<std::io::Error> for TransportError {
    fn from(e: std::io::Error) -> Self {
        TransportError::Io(e)
    }
}

impl From<ProtocolError> for TransportError {
    fn from(e: ProtocolError) -> Self {
        TransportError::Protocol(e)
    }
}
