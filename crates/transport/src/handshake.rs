//! The connection handshake: preambles (version check; TLS or not; where a data lane goes),
//! TLS 1.3 where agreed, then challenge-response with the shared token inside it. Without a
//! token a server only admits clients on its own machine.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rgpu_protocol::{
    auth, ClientMsg, LaneAttach, LaneKey, Nonce, Preamble, ProtocolError, ServerMsg,
};

use crate::tls::{TlsConnector, TlsStream};
use crate::{Endpoint, FrameReader, FrameWriter, Stream, TransportError};

/// How long either side waits for the other during the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a server gives a new connection for its whole handshake, up to authentication (a
/// peer that drips a byte every few seconds passes each read's timeout, not this).
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(15);
/// The largest frame body a server reads before the peer has authenticated: the client's
/// `Authenticate` (nonces, proof, names) with room to spare.
pub const HANDSHAKE_BODY_MAX: u32 = 8 << 10;

/// A shared secret. Kept out of Debug output. (Serializable for the listener to hand it to its
/// session workers over their private control socket.)
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub struct Token(Vec<u8>);

impl Token {
    pub fn new(bytes: Vec<u8>) -> Result<Token, String> {
        let trimmed = String::from_utf8_lossy(&bytes).trim().as_bytes().to_vec();
        if trimmed.len() < 16 {
            return Err("the token must have at least 16 characters".into());
        }
        Ok(Token(trimmed))
    }

    /// Reads a token file; warns (once per read) when users other than its owner and group
    /// may read or change it, as a secret should not allow.
    pub fn from_file(path: &Path) -> Result<Token, String> {
        let bytes = std::fs::read(path)
            .map_err(|e| format!("cannot read token file {}: {e}", path.display()))?;
        if let Some(warning) = std::fs::metadata(path)
            .ok()
            .and_then(|meta| exposure_warning(path, meta.permissions().mode()))
        {
            log::warn!("{warning}");
        }
        Token::new(bytes)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// A warning when a token file's `mode` lets other users read it, or anyone but its owner
/// change it.
fn exposure_warning(path: &Path, mode: u32) -> Option<String> {
    let world_readable = mode & 0o004 != 0;
    let writable_by_others = mode & 0o022 != 0;
    (world_readable || writable_by_others).then(|| {
        format!(
            "token file {} has mode {:04o}: {}; make it private with `chmod 600 {}` \
             (or 640 for a service's group)",
            path.display(),
            mode & 0o7777,
            if world_readable {
                "every user of this machine can read the token"
            } else {
                "users other than its owner can change the token"
            },
            path.display()
        )
    })
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// The client's token from `RGPU_TOKEN` or the file named by `RGPU_TOKEN_FILE`, if any.
pub fn load_client_token() -> Result<Option<Token>, String> {
    if let Ok(text) = std::env::var("RGPU_TOKEN") {
        if !text.is_empty() {
            return Token::new(text.into_bytes()).map(Some);
        }
    }
    if let Ok(path) = std::env::var("RGPU_TOKEN_FILE") {
        if !path.is_empty() {
            return Token::from_file(Path::new(&path)).map(Some);
        }
    }
    Ok(None)
}

/// A fresh random key for a session's data lanes.
pub fn random_lane_key() -> LaneKey {
    random_nonce()
}

fn random_nonce() -> Nonce {
    let mut nonce = [0u8; 32];
    getrandom::getrandom(&mut nonce).expect("the OS random source is available");
    nonce
}

/// Reads the peer's preamble: its head first (magic, version), so that a peer of another
/// version is told apart before waiting for bytes it may never send.
fn read_preamble(stream: &mut Stream) -> Result<Preamble, TransportError> {
    let mut raw = [0u8; Preamble::LEN];
    read_exact_or_closed(stream, &mut raw[..Preamble::HEAD_LEN])?;
    Preamble::check_head(raw[..Preamble::HEAD_LEN].try_into().unwrap())?;
    read_exact_or_closed(stream, &mut raw[Preamble::HEAD_LEN..])?;
    Ok(Preamble::decode(&raw)?)
}

/// A read that ran out of its time (a socket timeout reads as WouldBlock on Linux).
fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

fn read_exact_or_closed(stream: &mut Stream, buf: &mut [u8]) -> Result<(), TransportError> {
    stream.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            TransportError::Closed
        } else {
            e.into()
        }
    })
}

/// Where a server accepts connections in the clear (outside TLS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Plaintext {
    /// From clients on this machine (loopback addresses, Unix sockets) only.
    #[default]
    Local,
    /// From anyone (a trusted network, or a tunnel that encrypts already).
    Allow,
    /// On Unix sockets only: loopback TCP clients use TLS too.
    Never,
}

impl Plaintext {
    pub fn parse(text: &str) -> Result<Plaintext, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "local" => Ok(Plaintext::Local),
            "allow" => Ok(Plaintext::Allow),
            "never" => Ok(Plaintext::Never),
            other => Err(format!(
                "plaintext = \"{other}\": expected \"local\", \"allow\" or \"never\""
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Plaintext::Local => "local",
            Plaintext::Allow => "allow",
            Plaintext::Never => "never",
        }
    }

    fn admits(self, stream: &Stream) -> bool {
        match self {
            Plaintext::Allow => true,
            Plaintext::Local => stream.peer_is_local(),
            Plaintext::Never => matches!(stream, Stream::Unix(_)),
        }
    }
}

/// A server's side of encryption: its TLS configuration (`None`: it offers no TLS) and where
/// it accepts plaintext.
#[derive(Clone, Default)]
pub struct ServerSecurity {
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub plaintext: Plaintext,
}

/// What a client's preamble asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Route {
    /// The connection continues in TLS.
    pub tls: bool,
    /// A data lane of this session (to be proven inside the handshake).
    pub lane_of: Option<u64>,
}

/// The server's first step on a new connection: reads the client's preamble and answers it,
/// accepting or refusing (with the reason, in the clear) what it asks for. The listener does
/// this much itself, to know where the connection goes; the rest of the handshake
/// ([`server_handshake`]) runs where the session will be served.
pub fn accept_preamble(
    stream: &mut Stream,
    security: &ServerSecurity,
    token: Option<&Token>,
) -> Result<Route, TransportError> {
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let _deadline = crate::deadline(stream, HANDSHAKE_DEADLINE);
    let theirs = match read_preamble(stream) {
        Ok(theirs) => theirs,
        Err(e) => {
            if let TransportError::Protocol(ProtocolError::VersionMismatch { .. }) = e {
                // Tell the client our version, so that it reports the mismatch too.
                let _ = stream.write_all(&Preamble::server(0).encode());
            }
            return Err(e);
        }
    };
    let tls = theirs.tls();
    let refusal = if tls && security.tls.is_none() {
        Some("this rgpu server does not offer TLS".to_string())
    } else if !tls && !security.plaintext.admits(stream) {
        Some(match security.plaintext {
            Plaintext::Never => "this rgpu server accepts TLS connections only (plaintext = \
                                 \"never\"): unset RGPU_TLS=off"
                .to_string(),
            _ => "this rgpu server accepts plaintext only from clients on its own machine: \
                  connect with TLS (unset RGPU_TLS=off), or configure the server with \
                  plaintext = \"allow\""
                .to_string(),
        })
    } else {
        None
    };
    if let Some(message) = refusal {
        let _ = stream.write_all(&Preamble::server(Preamble::REFUSED).encode());
        let mut writer = FrameWriter::new(stream.try_clone()?);
        let _ = writer.send(
            &ServerMsg::Fatal {
                message: message.clone(),
            },
            0,
            &[],
        );
        return Err(TransportError::Auth(message));
    }
    let mut flags = if tls { Preamble::TLS } else { 0 };
    if token.is_some() {
        flags |= Preamble::PREAUTH;
    }
    stream.write_all(&Preamble::server(flags).encode())?;
    if let Some(token) = token {
        // Before the connection goes anywhere: the client proves it holds the token.
        let nonce = random_nonce();
        stream.write_all(&nonce)?;
        let mut proof = [0u8; 32];
        read_exact_or_closed(stream, &mut proof)?;
        let proven = auth::verify_preauth(token.as_bytes(), &nonce, &proof);
        stream.write_all(&[u8::from(proven)])?;
        if !proven {
            return Err(TransportError::Auth(
                "wrong token (pre-authentication)".into(),
            ));
        }
    }
    Ok(Route {
        tls,
        lane_of: theirs.lane_of,
    })
}

/// How a client introduces itself in its handshake.
#[derive(Clone, Copy, Debug)]
pub struct Introduction<'a> {
    /// For the server's log: program name and pid.
    pub name: &'a str,
    /// The application the session belongs to (sessions of one application share a server
    /// whose devices are used exclusively).
    pub application: &'a str,
    /// How long to wait while another application uses the server's devices exclusively.
    pub wait: Duration,
}

/// A plain name: an application of its own that does not wait.
impl<'a> From<&'a str> for Introduction<'a> {
    fn from(name: &'a str) -> Introduction<'a> {
        Introduction {
            name,
            application: name,
            wait: Duration::ZERO,
        }
    }
}

pub struct ClientWelcome {
    pub session_id: u64,
    pub server_name: String,
    /// What data lanes of this session present to join it.
    pub lane_key: LaneKey,
}

/// Runs the client side of the handshake on a fresh connection to `endpoint`: preambles, TLS
/// where `tls` says so, then authentication. With `lane`, the connection joins an existing
/// session as one of its data lanes. Returns the connection (in TLS or not) and the welcome.
pub fn client_handshake<'a>(
    mut stream: Stream,
    tls: &TlsConnector,
    endpoint: &Endpoint,
    token: Option<&Token>,
    client: impl Into<Introduction<'a>>,
    lane: Option<LaneAttach>,
) -> Result<(Stream, ClientWelcome), TransportError> {
    let client = client.into();
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let use_tls = tls.wants_tls(&stream);
    stream.write_all(&Preamble::client(use_tls, lane.map(|l| l.session)).encode())?;
    let theirs = read_preamble(&mut stream).map_err(|e| match e {
        TransportError::Io(io) if is_timeout(&io) => TransportError::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "{endpoint} did not answer within {HANDSHAKE_TIMEOUT:?}: is it an rgpu server \
                 (`rgpu server` on that port)?"
            ),
        )),
        other => other,
    })?;
    if theirs.refused() {
        let mut reader = FrameReader::new(stream.try_clone()?);
        return Err(TransportError::Auth(
            match reader.read_message::<ServerMsg>() {
                Ok((_, ServerMsg::Fatal { message })) => message,
                _ => "the server refused the connection".to_string(),
            },
        ));
    }
    if theirs.tls() != use_tls {
        return Err(TransportError::Protocol(ProtocolError::Malformed(
            "the server answered for another kind of connection".into(),
        )));
    }
    if theirs.preauth() {
        let mut nonce = [0u8; 32];
        read_exact_or_closed(&mut stream, &mut nonce)?;
        let Some(token) = token else {
            return Err(TransportError::Auth(format!(
                "the server at {endpoint} requires a token: set RGPU_TOKEN or RGPU_TOKEN_FILE"
            )));
        };
        stream.write_all(&auth::preauth_proof(token.as_bytes(), &nonce))?;
        let mut verdict = [0u8; 1];
        read_exact_or_closed(&mut stream, &mut verdict)?;
        if verdict[0] != 1 {
            return Err(TransportError::Auth(format!(
                "the server at {endpoint} refused the connection: wrong or missing token"
            )));
        }
    }
    if use_tls {
        stream = Stream::Tls(Box::new(tls.connect(stream, endpoint).map_err(|e| {
            TransportError::Auth(format!("TLS handshake with {endpoint}: {}", tls_reason(&e)))
        })?));
    }
    let mut reader = FrameReader::new(stream.try_clone()?);
    let mut writer = FrameWriter::new(stream.try_clone()?);
    let (_, challenge) = reader.read_message::<ServerMsg>()?;
    let (server_nonce, token_required, server_name) = match challenge {
        ServerMsg::Challenge {
            server_nonce,
            token_required,
            server_name,
        } => (server_nonce, token_required, server_name),
        ServerMsg::Fatal { message } => return Err(TransportError::Auth(message)),
        other => {
            return Err(TransportError::Auth(format!(
                "expected a challenge, got {other:?}"
            )))
        }
    };
    if token_required && token.is_none() {
        return Err(TransportError::Auth(format!(
            "server {server_name} requires a token: set RGPU_TOKEN or RGPU_TOKEN_FILE"
        )));
    }
    let client_nonce = random_nonce();
    let proof = token.map(|t| auth::client_proof(t.as_bytes(), &server_nonce, &client_nonce));
    writer.send(
        &ClientMsg::Authenticate {
            client_nonce,
            proof,
            client_name: client.name.to_string(),
            lane,
            application: client.application.to_string(),
            wait_secs: client.wait.as_secs().min(u64::from(u32::MAX)) as u32,
        },
        0,
        &[],
    )?;
    let mut welcome = reader.read_message::<ServerMsg>()?.1;
    let mut ahead = None;
    while let ServerMsg::Queued { ahead: now } = welcome {
        if ahead != Some(now) {
            log::warn!(
                "rgpu: {server_name} ({endpoint}) is in exclusive use by another application; \
                 waiting up to {} s behind {now} other(s) (RGPU_EXCLUSIVE_WAIT)",
                client.wait.as_secs()
            );
            ahead = Some(now);
        }
        // The server answers within the wait the client asked for.
        stream.set_read_timeout(Some(client.wait + HANDSHAKE_TIMEOUT))?;
        welcome = reader.read_message::<ServerMsg>()?.1;
    }
    let result = match welcome {
        ServerMsg::Welcome {
            session_id,
            server_proof,
            lane_key,
        } => {
            if let (Some(token), true) = (token, token_required) {
                if !auth::verify_server(
                    token.as_bytes(),
                    &server_nonce,
                    &client_nonce,
                    &server_proof,
                ) {
                    return Err(TransportError::Auth(format!(
                        "server {server_name} could not prove it holds the same token"
                    )));
                }
            }
            Ok(ClientWelcome {
                session_id,
                server_name,
                lane_key,
            })
        }
        ServerMsg::Fatal { message } => Err(TransportError::Auth(message)),
        other => Err(TransportError::Auth(format!(
            "expected a welcome, got {other:?}"
        ))),
    };
    stream.set_read_timeout(None)?;
    result.map(|welcome| (stream, welcome))
}

/// What the server learns from a client's handshake.
pub struct ClientHello {
    /// The client's self-description, for logs.
    pub name: String,
    /// Set when the connection joined another session as its data lane (`admit` took it).
    pub lane: Option<LaneAttach>,
}

/// What a client asks of `admit` in the server's handshake.
#[derive(Debug)]
pub struct Applicant {
    /// `Some`: the connection is to join that session as its data lane.
    pub lane: Option<LaneAttach>,
    /// The application the session belongs to (see [`Introduction`]).
    pub application: String,
    /// How long the client waits for exclusive use of the devices.
    pub wait: Duration,
}

/// Tells a client that waits for admission how many others wait before it (see
/// [`ServerMsg::Queued`]); for `admit`, before the handshake's answer.
pub fn tell_queued(stream: &Stream, ahead: u32) -> Result<(), TransportError> {
    FrameWriter::new(stream.try_clone()?).send(&ServerMsg::Queued { ahead }, 0, &[])
}

/// Runs the server side of the handshake after [`accept_preamble`]: TLS where `route` asked
/// for it, then authentication. With a token, the client must prove it holds it; without one,
/// only local clients are let in. Then `admit` decides, for a data lane
/// (`applicant.lane`: it takes the lane's stream) or a new session (room for one more? the
/// devices free, or free soon enough? it may [`tell_queued`] meanwhile); its `Err` reaches the
/// client as the reason it was refused. A new session gets `lane_key`,
/// the key its own future lanes must present.
#[allow(clippy::too_many_arguments)]
pub fn server_handshake(
    mut stream: Stream,
    route: &Route,
    security: &ServerSecurity,
    token: Option<&Token>,
    server_name: &str,
    session_id: u64,
    lane_key: LaneKey,
    admit: impl FnOnce(&Applicant, &Stream) -> Result<(), String>,
) -> Result<(Stream, ClientHello), TransportError> {
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    // Until the peer has proven itself: a deadline for the whole exchange, small frames only.
    let deadline = crate::deadline(&stream, HANDSHAKE_DEADLINE);
    if route.tls {
        let Some(config) = &security.tls else {
            return Err(TransportError::Auth(
                "TLS asked of a server that has none".into(),
            ));
        };
        stream = Stream::Tls(Box::new(
            TlsStream::accept(stream, config.clone())
                .map_err(|e| TransportError::Auth(format!("TLS handshake: {}", tls_reason(&e))))?,
        ));
    }
    let mut reader = FrameReader::unauthenticated(stream.try_clone()?, HANDSHAKE_BODY_MAX);
    let mut writer = FrameWriter::new(stream.try_clone()?);

    if token.is_none() && !stream.peer_is_local() {
        let message = "this rgpu server has no token and only serves clients on its own machine; \
                       start it with --token-file to serve remote clients"
            .to_string();
        let _ = writer.send(
            &ServerMsg::Fatal {
                message: message.clone(),
            },
            0,
            &[],
        );
        return Err(TransportError::Auth(message));
    }
    let server_nonce = random_nonce();
    writer.send(
        &ServerMsg::Challenge {
            server_nonce,
            token_required: token.is_some(),
            server_name: server_name.to_string(),
        },
        0,
        &[],
    )?;
    let (_, answer) = reader.read_message::<ClientMsg>()?;
    let ClientMsg::Authenticate {
        client_nonce,
        proof,
        client_name,
        lane,
        application,
        wait_secs,
    } = answer
    else {
        return Err(TransportError::Auth("client did not authenticate".into()));
    };
    let server_proof = match token {
        None => [0u8; 32],
        Some(token) => {
            let valid = proof.is_some_and(|p| {
                auth::verify_client(token.as_bytes(), &server_nonce, &client_nonce, &p)
            });
            if !valid {
                let message = "wrong or missing token".to_string();
                let _ = writer.send(
                    &ServerMsg::Fatal {
                        message: message.clone(),
                    },
                    0,
                    &[],
                );
                return Err(TransportError::Auth(message));
            }
            auth::server_proof(token.as_bytes(), &server_nonce, &client_nonce)
        }
    };
    // Authenticated (or a local client of a server without a token): admission may wait.
    drop(deadline);
    let applicant = Applicant {
        lane,
        application,
        wait: Duration::from_secs(wait_secs.into()),
    };
    if let Err(message) = admit(&applicant, &stream) {
        let _ = writer.send(
            &ServerMsg::Fatal {
                message: message.clone(),
            },
            0,
            &[],
        );
        return Err(TransportError::Auth(message));
    }
    writer.send(
        &ServerMsg::Welcome {
            session_id,
            server_proof,
            lane_key,
        },
        0,
        &[],
    )?;
    stream.set_read_timeout(None)?;
    Ok((
        stream,
        ClientHello {
            name: client_name,
            lane,
        },
    ))
}

/// A TLS failure in words: rustls's error where there is one (an untrusted certificate says
/// which fingerprint it saw).
fn tls_reason(e: &std::io::Error) -> String {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other))) => {
            other.to_string()
        }
        Some(tls) => tls.to_string(),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_files_others_can_read_or_change_are_reported() {
        let path = Path::new("/etc/rgpu/token");
        assert_eq!(exposure_warning(path, 0o100600), None);
        assert_eq!(exposure_warning(path, 0o100640), None);
        assert_eq!(exposure_warning(path, 0o100400), None);
        let readable = exposure_warning(path, 0o100644).unwrap();
        assert!(
            readable.contains("every user of this machine can read"),
            "{readable}"
        );
        assert!(readable.contains("0644"), "{readable}");
        let writable = exposure_warning(path, 0o100620).unwrap();
        assert!(writable.contains("can change"), "{writable}");
    }
}
