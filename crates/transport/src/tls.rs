//! TLS 1.3 (rustls) on rgpu connections: the server's identity (a key pair it makes and keeps
//! at first start unless one is configured), how a client decides to trust it (a pinned
//! fingerprint or a CA), and [`TlsStream`], a TLS connection that several threads share the way
//! they share a socket (one reads while others write).
//!
//! Sharing: rustls keeps one state per connection, which reading and writing both change. The
//! state sits behind a mutex that is only held to encrypt or decrypt, never across a socket
//! call, so a thread blocked reading the socket never stops another from writing. Encrypted
//! bytes go to the socket under a second lock (`send_turn`), taken before the state's, so that
//! records reach the socket in the order they were sealed.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, ServerConfig, SignatureScheme};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::Stream;

/// Plaintext sealed per turn of a write: large writes go out in pieces of this size, so the
/// state's lock is never held long and the encrypted copy stays small.
const SEAL_STEP: usize = 256 << 10;
/// Bytes read from the socket at a time, before decryption.
const READ_STEP: usize = 64 << 10;

fn provider() -> Arc<CryptoProvider> {
    // Explicit, not the process default: the client library lives in other programs, which may
    // install a default of their own.
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The SHA-256 of a certificate (its DER bytes): what a client pins.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    pub fn of(cert_der: &[u8]) -> Fingerprint {
        Fingerprint(Sha256::digest(cert_der).into())
    }

    /// Accepts `sha256:<64 hex digits>`, with or without the prefix, colons or case.
    pub fn parse(text: &str) -> Result<Fingerprint, String> {
        let trimmed = text.trim();
        let body = trimmed
            .strip_prefix("sha256:")
            .or_else(|| trimmed.strip_prefix("SHA256:"))
            .unwrap_or(trimmed);
        let hex: String = body.chars().filter(|c| *c != ':').collect();
        let bad =
            || format!("'{trimmed}' is not a certificate fingerprint (sha256:<64 hex digits>)");
        if hex.len() != 64 {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16)
                .map_err(|_| bad())?;
        }
        Ok(Fingerprint(out))
    }

    /// A list separated by commas or white space (`RGPU_TLS_FINGERPRINT`).
    pub fn parse_list(text: &str) -> Result<Vec<Fingerprint>, String> {
        text.split(|c: char| c == ',' || c.is_whitespace())
            .filter(|part| !part.is_empty())
            .map(Fingerprint::parse)
            .collect()
    }
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("sha256:")?;
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

// ------------------------------------------------------------------------------ server side

/// A server's certificate chain and private key, as PEM. The listener loads it once and hands
/// it to its session workers with their settings (a worker may run as a user that cannot read
/// the key file). Kept out of Debug output.
#[derive(Clone, Serialize, Deserialize)]
pub struct TlsIdentity {
    pub cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.fingerprint() {
            Ok(fp) => write!(f, "TlsIdentity({fp})"),
            Err(_) => f.write_str("TlsIdentity(?)"),
        }
    }
}

/// Where a server's identity came from, for its start-up log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdentityOrigin {
    Loaded,
    Created,
}

impl TlsIdentity {
    pub fn from_pem(cert_pem: String, key_pem: String) -> Result<TlsIdentity, String> {
        let identity = TlsIdentity { cert_pem, key_pem };
        identity.server_config()?;
        Ok(identity)
    }

    /// Loads the certificate and key at these paths; when neither exists, makes a new key pair
    /// and a self-signed certificate naming `names` (host names) and keeps them there (the key
    /// readable by its owner only). One without the other is an error, not replaced.
    pub fn load_or_create(
        cert: &Path,
        key: &Path,
        names: &[String],
    ) -> Result<(TlsIdentity, IdentityOrigin), String> {
        match (cert.exists(), key.exists()) {
            (true, true) => {
                let read = |path: &Path| {
                    std::fs::read_to_string(path)
                        .map_err(|e| format!("cannot read {}: {e}", path.display()))
                };
                let identity = TlsIdentity::from_pem(read(cert)?, read(key)?).map_err(|e| {
                    format!("TLS identity {} / {}: {e}", cert.display(), key.display())
                })?;
                Ok((identity, IdentityOrigin::Loaded))
            }
            (false, false) => {
                let identity = TlsIdentity::generate(names)?;
                match identity.save(cert, key) {
                    Ok(()) => Ok((identity, IdentityOrigin::Created)),
                    // Another server sharing the directory made one at the same moment: use
                    // that one, once it is complete.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        for _ in 0..50 {
                            if cert.exists() && key.exists() {
                                if let Ok(loaded) = TlsIdentity::load_or_create(cert, key, names) {
                                    return Ok(loaded);
                                }
                            }
                            std::thread::sleep(std::time::Duration::from_millis(20));
                        }
                        Err(format!(
                            "{} or {} exists but is incomplete",
                            cert.display(),
                            key.display()
                        ))
                    }
                    Err(e) => Err(format!("cannot keep the TLS identity: {e}")),
                }
            }
            (true, false) => Err(format!(
                "TLS certificate {} has no key at {}",
                cert.display(),
                key.display()
            )),
            (false, true) => Err(format!(
                "TLS key {} has no certificate at {}",
                key.display(),
                cert.display()
            )),
        }
    }

    /// A new ECDSA P-256 key pair and a self-signed certificate for `names`.
    pub fn generate(names: &[String]) -> Result<TlsIdentity, String> {
        let mut sans: Vec<String> = names
            .iter()
            .filter(|n| {
                !n.is_empty()
                    && n.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
            })
            .cloned()
            .collect();
        if !sans.iter().any(|n| n == "localhost") {
            sans.push("localhost".into());
        }
        let key = rcgen::KeyPair::generate().map_err(|e| format!("cannot make a key pair: {e}"))?;
        let mut params = rcgen::CertificateParams::new(sans)
            .map_err(|e| format!("cannot describe the certificate: {e}"))?;
        let mut subject = rcgen::DistinguishedName::new();
        subject.push(rcgen::DnType::CommonName, "rgpu server");
        params.distinguished_name = subject;
        let now = std::time::SystemTime::now();
        params.not_before = (now - std::time::Duration::from_secs(24 * 3600)).into();
        // Pinned by fingerprint: the validity only has to outlast the machine.
        params.not_after = (now + std::time::Duration::from_secs(100 * 365 * 24 * 3600)).into();
        let cert = params
            .self_signed(&key)
            .map_err(|e| format!("cannot sign the certificate: {e}"))?;
        Ok(TlsIdentity {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    fn save(&self, cert: &Path, key: &Path) -> io::Result<()> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let context = |path: &Path| {
            let path = path.display().to_string();
            move |e: io::Error| io::Error::new(e.kind(), format!("{path}: {e}"))
        };
        for dir in [cert.parent(), key.parent()].into_iter().flatten() {
            if !dir.as_os_str().is_empty() && !dir.exists() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(context(dir))?;
            }
        }
        let write = |path: &Path, mode: u32, text: &str| {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(path)
                .and_then(|mut f| f.write_all(text.as_bytes()))
                .map_err(context(path))
        };
        // The key first: a certificate without its key is never left behind.
        write(key, 0o600, &self.key_pem)?;
        write(cert, 0o644, &self.cert_pem)
    }

    fn chain(&self) -> Result<Vec<CertificateDer<'static>>, String> {
        let chain = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("bad certificate PEM: {e}"))?;
        if chain.is_empty() {
            return Err("no certificate in the PEM".into());
        }
        Ok(chain)
    }

    /// The fingerprint of the server's own certificate (the chain's first).
    pub fn fingerprint(&self) -> Result<Fingerprint, String> {
        Ok(Fingerprint::of(&self.chain()?[0]))
    }

    /// The rustls configuration that serves this identity: TLS 1.3 only, no session tickets
    /// (a session's connections each make a full handshake; resumption state is not kept).
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, String> {
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| format!("bad private key PEM: {e}"))?;
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(self.chain()?, key)
            .map_err(|e| format!("certificate and key do not go together: {e}"))?;
        config.send_tls13_tickets = 0;
        Ok(Arc::new(config))
    }
}

/// Where a server keeps the identity it makes, when none is configured: systemd's
/// `$STATE_DIRECTORY`, else `/var/lib/rgpu` for root, else `$XDG_STATE_HOME/rgpu` (by default
/// `~/.local/state/rgpu`). Returns (certificate, key).
pub fn default_identity_paths() -> (PathBuf, PathBuf) {
    let dir = std::env::var_os("STATE_DIRECTORY")
        .map(|dirs| {
            // systemd lists one per StateDirectory= entry, separated by colons.
            let first = dirs
                .to_string_lossy()
                .split(':')
                .next()
                .unwrap_or("")
                .to_string();
            PathBuf::from(first)
        })
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or_else(|| {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } == 0 {
                PathBuf::from("/var/lib/rgpu")
            } else {
                std::env::var_os("XDG_STATE_HOME")
                    .map(PathBuf::from)
                    .filter(|p| p.is_absolute())
                    .or_else(|| {
                        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state"))
                    })
                    .unwrap_or_else(|| PathBuf::from("."))
                    .join("rgpu")
            }
        });
    let dir = dir.join("tls");
    (dir.join("server.crt"), dir.join("server.key"))
}

// ------------------------------------------------------------------------------ client side

/// Whether a client speaks TLS to a server (`RGPU_TLS`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsMode {
    /// TLS to servers on other machines, plaintext to loopback addresses and Unix sockets.
    #[default]
    Auto,
    /// TLS to every TCP server, loopback included.
    On,
    /// Plaintext (a server accepts it from other machines only when configured to).
    Off,
}

impl TlsMode {
    pub fn parse(text: &str) -> Result<TlsMode, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(TlsMode::Auto),
            "on" | "1" | "yes" | "true" => Ok(TlsMode::On),
            "off" | "0" | "no" | "false" => Ok(TlsMode::Off),
            other => Err(format!("RGPU_TLS={other}: expected auto, on or off")),
        }
    }
}

/// How a client secures its connections: when it uses TLS, and whom it trusts.
#[derive(Clone, Debug, Default)]
pub struct ClientSecurity {
    pub mode: TlsMode,
    /// Certificates trusted by fingerprint (`RGPU_TLS_FINGERPRINT`).
    pub pins: Vec<Fingerprint>,
    /// A CA bundle (`RGPU_TLS_CA`): certificates it signed for the server's name are trusted.
    pub ca_file: Option<PathBuf>,
}

impl ClientSecurity {
    /// From `RGPU_TLS`, `RGPU_TLS_FINGERPRINT` and `RGPU_TLS_CA`.
    pub fn from_env() -> Result<ClientSecurity, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        Ok(ClientSecurity {
            mode: var("RGPU_TLS").map_or(Ok(TlsMode::Auto), |v| TlsMode::parse(&v))?,
            pins: var("RGPU_TLS_FINGERPRINT").map_or(Ok(Vec::new()), |v| {
                Fingerprint::parse_list(&v).map_err(|e| format!("RGPU_TLS_FINGERPRINT: {e}"))
            })?,
            ca_file: var("RGPU_TLS_CA").map(PathBuf::from),
        })
    }

    /// The rustls configuration: TLS 1.3, trusting what the pins or the CA say.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, String> {
        let provider = provider();
        let verifier: Arc<dyn ServerCertVerifier> = if self.pins.is_empty() {
            if let Some(ca) = &self.ca_file {
                let mut roots = rustls::RootCertStore::empty();
                let certs = CertificateDer::pem_file_iter(ca)
                    .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| format!("RGPU_TLS_CA {}: {e}", ca.display()))?;
                let (added, _) = roots.add_parsable_certificates(certs);
                if added == 0 {
                    return Err(format!(
                        "RGPU_TLS_CA {}: no certificate in it",
                        ca.display()
                    ));
                }
                rustls::client::WebPkiServerVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider.clone(),
                )
                .build()
                .map_err(|e| format!("RGPU_TLS_CA {}: {e}", ca.display()))?
            } else {
                Arc::new(Pinned {
                    pins: Vec::new(),
                    provider: provider.clone(),
                })
            }
        } else {
            Arc::new(Pinned {
                pins: self.pins.clone(),
                provider: provider.clone(),
            })
        };
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        config.resumption = rustls::client::Resumption::disabled();
        Ok(Arc::new(config))
    }
}

/// A client's TLS settings, ready to connect with (made once per process: a CA bundle is read
/// once).
#[derive(Clone)]
pub struct TlsConnector {
    mode: TlsMode,
    config: Arc<ClientConfig>,
}

impl TlsConnector {
    pub fn new(security: &ClientSecurity) -> Result<TlsConnector, String> {
        Ok(TlsConnector {
            mode: security.mode,
            config: security.client_config()?,
        })
    }

    /// Whether a connection on `stream` speaks TLS: Unix sockets never do; loopback addresses
    /// only when asked to (`RGPU_TLS=on`); everything else unless asked not to.
    pub fn wants_tls(&self, stream: &Stream) -> bool {
        match self.mode {
            TlsMode::Off => false,
            TlsMode::On => !matches!(stream, Stream::Unix(_)),
            TlsMode::Auto => !stream.peer_is_local(),
        }
    }

    /// Runs the client side of a TLS handshake with `endpoint` on `socket` (its read timeout
    /// bounds the wait).
    pub fn connect(&self, socket: Stream, endpoint: &crate::Endpoint) -> io::Result<TlsStream> {
        let conn = rustls::ClientConnection::new(self.config.clone(), server_name_of(endpoint))
            .map_err(tls_error)?;
        TlsStream::handshake(socket, conn.into())
    }
}

/// Trusts the certificates whose fingerprint it holds, whatever name or issuer they show; the
/// handshake's signature is still checked against the certificate's key.
#[derive(Debug)]
struct Pinned {
    pins: Vec<Fingerprint>,
    provider: Arc<CryptoProvider>,
}

/// The server's certificate is not one the client trusts; says which it was.
#[derive(Debug)]
struct UntrustedCertificate {
    seen: Fingerprint,
    pinned_any: bool,
}

impl std::fmt::Display for UntrustedCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.pinned_any {
            write!(
                f,
                "the server's certificate {} is none of those RGPU_TLS_FINGERPRINT names \
                 (a new key on the server, or another machine answering)",
                self.seen
            )
        } else {
            write!(
                f,
                "the server's certificate {} is not trusted: check that it is the fingerprint \
                 the server printed at start (`rgpu server --print-fingerprint` on the server) and set \
                 RGPU_TLS_FINGERPRINT={}, or trust its CA with RGPU_TLS_CA",
                self.seen, self.seen
            )
        }
    }
}

impl std::error::Error for UntrustedCertificate {}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let seen = Fingerprint::of(end_entity);
        if self.pins.contains(&seen) {
            return Ok(ServerCertVerified::assertion());
        }
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::Other(rustls::OtherError(Arc::new(UntrustedCertificate {
                seen,
                pinned_any: !self.pins.is_empty(),
            }))),
        ))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The name a client expects on the server's certificate (checked only against a CA).
fn server_name_of(endpoint: &crate::Endpoint) -> ServerName<'static> {
    let host = match endpoint {
        crate::Endpoint::Tcp(addr) => addr
            .rsplit_once(':')
            .map_or(addr.as_str(), |(host, _)| host)
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        crate::Endpoint::Unix(_) => "localhost".to_string(),
    };
    ServerName::try_from(host).unwrap_or_else(|_| ServerName::try_from("localhost").unwrap())
}

// ------------------------------------------------------------------------------ the stream

struct Shared {
    state: Mutex<rustls::Connection>,
    /// Received ciphertext not yet handed to rustls. Its lock is held by the reading thread,
    /// across its socket read (taken before `state`'s).
    inbox: Mutex<Inbox>,
    /// Sealed records on their way to the socket; its lock is each writer's turn (taken
    /// before `state`'s), so records reach the socket in the order they were sealed.
    outbox: Mutex<Vec<u8>>,
}

struct Inbox {
    bytes: Box<[u8]>,
    start: usize,
    end: usize,
}

/// One thread's handle on a TLS connection; [`TlsStream::try_clone`] makes another that shares
/// the connection (as a cloned socket does).
pub struct TlsStream {
    shared: Arc<Shared>,
    socket: Box<Stream>,
}

impl std::fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TlsStream({:?})", self.socket)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl TlsStream {
    /// Runs the server side of a handshake on `socket` (its read timeout bounds the wait).
    pub fn accept(socket: Stream, config: Arc<ServerConfig>) -> io::Result<TlsStream> {
        let conn = rustls::ServerConnection::new(config).map_err(tls_error)?;
        TlsStream::handshake(socket, conn.into())
    }

    fn handshake(mut socket: Stream, mut conn: rustls::Connection) -> io::Result<TlsStream> {
        while conn.is_handshaking() {
            conn.complete_io(&mut socket)?;
        }
        // Writes are sealed in bounded pieces (SEAL_STEP) and sent at once; rustls's own
        // limit on queued records would only split them further.
        conn.set_buffer_limit(None);
        Ok(TlsStream {
            shared: Arc::new(Shared {
                state: Mutex::new(conn),
                inbox: Mutex::new(Inbox {
                    bytes: vec![0; READ_STEP].into_boxed_slice(),
                    start: 0,
                    end: 0,
                }),
                outbox: Mutex::new(Vec::new()),
            }),
            socket: Box::new(socket),
        })
    }

    pub fn try_clone(&self) -> io::Result<TlsStream> {
        Ok(TlsStream {
            shared: self.shared.clone(),
            socket: Box::new(self.socket.try_clone()?),
        })
    }

    /// The socket under the TLS connection (for timeouts, addresses, shutdown).
    pub fn socket(&self) -> &Stream {
        &self.socket
    }

    /// Seals `plaintext` (when given) and whatever else rustls has queued, and sends it, in
    /// turn with other writers.
    fn seal_and_send(&mut self, plaintext: &[u8]) -> io::Result<usize> {
        let mut outbox = lock(&self.shared.outbox);
        let n = {
            let mut state = lock(&self.shared.state);
            let n = if plaintext.is_empty() {
                0
            } else {
                state.writer().write(plaintext)?
            };
            while state.wants_write() {
                state.write_tls(&mut *outbox)?;
            }
            n
        };
        let result = self.socket.write_all(&outbox);
        outbox.clear();
        result.map(|()| n)
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let shared = self.shared.clone();
        let mut inbox = lock(&shared.inbox);
        loop {
            let mut reply_due = false;
            {
                let mut state = lock(&shared.state);
                loop {
                    match state.reader().read(buf) {
                        Ok(n) => return Ok(n),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                    if inbox.start == inbox.end {
                        break;
                    }
                    // Hand over what was received; rustls takes it in pieces and decrypts the
                    // records that are complete.
                    let Inbox { bytes, start, end } = &mut *inbox;
                    *start += state.read_tls(&mut &bytes[*start..*end])?;
                    let io_state = state.process_new_packets().map_err(tls_error)?;
                    reply_due |= io_state.tls_bytes_to_write() > 0;
                }
            }
            if reply_due {
                // A key update or an alert the peer's messages asked for.
                self.seal_and_send(&[])?;
            }
            let n = self.socket.read(&mut inbox.bytes)?;
            inbox.start = 0;
            inbox.end = n;
            if n == 0 {
                // The socket ended: rustls tells a clean close (close_notify: Ok(0)) from a
                // truncated one (UnexpectedEof).
                let mut state = lock(&shared.state);
                state.read_tls(&mut &[][..])?;
                state.process_new_packets().map_err(tls_error)?;
                return match state.reader().read(buf) {
                    Ok(n) => Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                    Err(e) => Err(e),
                };
            }
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.seal_and_send(&buf[..buf.len().min(SEAL_STEP)])
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_parse_in_the_forms_people_paste() {
        let fp = Fingerprint([0xab; 32]);
        let text = fp.to_string();
        assert_eq!(text, format!("sha256:{}", "ab".repeat(32)));
        assert_eq!(Fingerprint::parse(&text).unwrap(), fp);
        assert_eq!(Fingerprint::parse(&"AB".repeat(32)).unwrap(), fp);
        let colons = vec!["AB"; 32].join(":");
        assert_eq!(Fingerprint::parse(&format!("SHA256:{colons}")).unwrap(), fp);
        assert!(Fingerprint::parse("sha256:abcd").is_err());
        assert!(Fingerprint::parse(&"zz".repeat(32)).is_err());
        let list = Fingerprint::parse_list(&format!("{text}, {}", "cd".repeat(32))).unwrap();
        assert_eq!(list.len(), 2);
    }

    #[test]
    fn an_identity_is_made_once_then_loaded() {
        let dir = std::env::temp_dir().join(format!("rgpu-tls-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (cert, key) = (dir.join("tls/server.crt"), dir.join("tls/server.key"));
        let (made, origin) = TlsIdentity::load_or_create(&cert, &key, &["gpu1".into()]).unwrap();
        assert_eq!(origin, IdentityOrigin::Created);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "key mode {mode:o}");
        let (loaded, origin) = TlsIdentity::load_or_create(&cert, &key, &[]).unwrap();
        assert_eq!(origin, IdentityOrigin::Loaded);
        assert_eq!(made.fingerprint().unwrap(), loaded.fingerprint().unwrap());
        assert!(!format!("{loaded:?}").contains("PRIVATE"));
        std::fs::remove_file(&key).unwrap();
        let err = TlsIdentity::load_or_create(&cert, &key, &[]).unwrap_err();
        assert!(err.contains("has no key"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
