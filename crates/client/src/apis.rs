//! The wire APIs' typed client methods on a connection: `conn.cuda().mem_alloc(ctx, size)`,
//! `conn.opencl().finish(queue)`. The methods themselves come from the protocol's tables
//! ([`CudaClient`], [`OpenClClient`]); this gives them their transport.

use rgpu_protocol::cuda::{CuReply, CuRequest, CudaClient};
use rgpu_protocol::opencl::{ClReply, ClRequest, OpenClClient};
use rgpu_protocol::session::{SessionClient, SessionReply, SessionRequest};
use rgpu_protocol::table::UnexpectedReply;
use rgpu_protocol::{ClientMsg, ServerMsg};

use std::sync::Arc;

use crate::connection::{ReadSink, ServerSession};
use crate::ClientError;
use crate::Connection;

impl From<UnexpectedReply> for ClientError {
    fn from(e: UnexpectedReply) -> ClientError {
        ClientError::Protocol(e.to_string())
    }
}

/// The CUDA API on a connection.
pub struct Cuda<'a>(Via<'a>);

/// The CUDA API on a connection, for asynchronous copies from and into page-locked memory:
/// where that memory is shared with the server (on its host) the server copies in place
/// ([`Connection::post_in_place`], [`Connection::start_read_in_place`]).
pub struct CudaInPlace<'a>(Via<'a>);

/// The OpenCL API on a connection.
pub struct OpenCl<'a>(Via<'a>);

/// The session's own messages on a connection.
pub struct Session<'a>(Via<'a>);

/// The session a typed API's calls go to: a connection's current one (kept for the calls
/// made through that value, even if the connection moves meanwhile), or one borrowed.
enum Via<'a> {
    Current(arc_swap::Guard<Arc<ServerSession>>),
    Borrowed(&'a ServerSession),
}

impl std::ops::Deref for Via<'_> {
    type Target = ServerSession;
    fn deref(&self) -> &ServerSession {
        match self {
            Via::Current(session) => session,
            Via::Borrowed(session) => session,
        }
    }
}

impl Connection {
    pub fn cuda(&self) -> Cuda<'static> {
        Cuda(Via::Current(self.now()))
    }

    pub fn cuda_in_place(&self) -> CudaInPlace<'static> {
        CudaInPlace(Via::Current(self.now()))
    }

    pub fn opencl(&self) -> OpenCl<'static> {
        OpenCl(Via::Current(self.now()))
    }

    pub fn session(&self) -> Session<'static> {
        Session(Via::Current(self.now()))
    }
}

impl ServerSession {
    /// The session's own messages, on this session.
    pub fn session(&self) -> Session<'_> {
        Session(Via::Borrowed(self))
    }
}

fn not_an_answer(reply: ServerMsg) -> ClientError {
    ClientError::Protocol(format!("unexpected reply {reply:?}"))
}

/// A table's client trait on a connection: its transport is the connection's call, post and
/// read, with the table's requests and replies in their envelope variant.
macro_rules! transport {
    ($Api:ident, $Trait:ident, $Request:ident, $Reply:ident, $Variant:ident) => {
        transport!($Api, $Trait, $Request, $Reply, $Variant, post, start_read);
    };
    ($Api:ident, $Trait:ident, $Request:ident, $Reply:ident, $Variant:ident, $post:ident, $read:ident) => {
        impl $Trait for $Api<'_> {
            type Error = ClientError;
            type Sink = ReadSink;

            fn send_call(&self, request: $Request, bulk: &[u8]) -> Result<$Reply, ClientError> {
                match self.0.call(&ClientMsg::$Variant(request), bulk)? {
                    ServerMsg::$Variant(reply) => Ok(reply),
                    other => Err(not_an_answer(other)),
                }
            }

            fn send_post(&self, request: $Request, bulk: &[u8]) -> Result<(), ClientError> {
                self.0.$post(&ClientMsg::$Variant(request), bulk)
            }

            fn send_read(&self, request: $Request, sink: ReadSink) -> Result<(), ClientError> {
                self.0.$read(&ClientMsg::$Variant(request), sink)
            }
        }
    };
}

transport!(Cuda, CudaClient, CuRequest, CuReply, Cu);
transport!(
    CudaInPlace,
    CudaClient,
    CuRequest,
    CuReply,
    Cu,
    post_in_place,
    start_read_in_place
);
transport!(OpenCl, OpenClClient, ClRequest, ClReply, Cl);
transport!(
    Session,
    SessionClient,
    SessionRequest,
    SessionReply,
    Session
);
