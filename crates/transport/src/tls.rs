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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey, NONCE_LEN};
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::kernel::KernelConnection;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, InsufficientSizeError, UnbufferedStatus};
use rustls::{ConnectionTrafficSecrets, ExtractedSecrets};

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
/// Bytes read from the socket at a time, before decryption (many records: one read of the
/// socket, and one of the stream, can take them all).
const READ_STEP: usize = 256 << 10;
/// The send buffer: a write's records (each `MAX_PLAINTEXT` of plaintext at most, plus its
/// header, content type and tag) and a key update's record before them.
const OUTBOX: usize = SEAL_STEP + (SEAL_STEP / MAX_PLAINTEXT + 2) * (MAX_RECORD - MAX_PLAINTEXT);

/// Makes aws-lc seed its random generator now: the first use in a process takes tens of
/// milliseconds (its entropy gathering), which a session's first handshake should not wait
/// for. Servers call it before they take sessions; clients start it in the background.
pub fn warm_up() {
    let mut byte = [0u8; 1];
    let _ = aws_lc_rs::rand::fill(&mut byte);
}

fn provider() -> Arc<CryptoProvider> {
    // Explicit, not the process default: the client library lives in other programs, which may
    // install a default of their own.
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    // AES-128-GCM first: about 30% faster than AES-256-GCM per core (10.0 vs 7.7 GB/s sealing
    // on the H100 machine), and a TLS 1.3 suite of full strength.
    provider
        .cipher_suites
        .sort_by_key(|suite| suite.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(provider)
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
        f.write_str(&hex::encode(self.0))
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
        // The record layer after the handshake is TlsStream's own (see there).
        config.enable_secret_extraction = true;
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
        config.enable_secret_extraction = true;
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
        if security.mode != TlsMode::Off {
            // Overlaps aws-lc's seeding with what the program does before it connects.
            let _ = std::thread::Builder::new()
                .name("rgpu-tls-warm-up".into())
                .spawn(warm_up);
        }
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
            TlsMode::On => !stream.is_unix(),
            TlsMode::Auto => !stream.peer_is_local(),
        }
    }

    /// Runs the client side of a TLS handshake with `endpoint` on `socket` (its read timeout
    /// bounds the wait).
    pub fn connect(&self, socket: Stream, endpoint: &crate::Endpoint) -> io::Result<TlsStream> {
        TlsStream::connect_with(socket, self.config.clone(), server_name_of(endpoint))
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

// ------------------------------------------------------------------------------ records

/// Largest plaintext in one record (RFC 8446 5.1).
const MAX_PLAINTEXT: usize = 1 << 14;
/// Largest record on the wire: header, plaintext, content type, padding allowance, tag.
const MAX_RECORD: usize = 5 + MAX_PLAINTEXT + 256;
const HEADER_LEN: usize = 5;
const TAG_LEN: usize = 16;
const CONTENT_ALERT: u8 = 21;
const CONTENT_HANDSHAKE: u8 = 22;
const CONTENT_APPLICATION_DATA: u8 = 23;
const HANDSHAKE_KEY_UPDATE: u8 = 24;
const HANDSHAKE_NEW_SESSION_TICKET: u8 = 4;

/// Records sealed under one key before it is replaced (a key update); 0: the cipher suite's
/// confidentiality limit, less a margin. Tests set it low to exercise key updates.
static KEY_UPDATE_AFTER: AtomicU64 = AtomicU64::new(0);

/// Makes every TLS connection of this process update its sending key after `records` records
/// (tests only: the default follows the cipher suite's limit).
#[doc(hidden)]
pub fn set_key_update_interval(records: u64) {
    KEY_UPDATE_AFTER.store(records, Ordering::Relaxed);
}

/// One direction's record protection: an AEAD key, its IV and the record sequence number.
struct Protection {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
}

impl Protection {
    fn new((seq, secrets): (u64, ConnectionTrafficSecrets)) -> io::Result<Protection> {
        let (algorithm, key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, key, iv)
            }
            _ => return Err(io::Error::other("TLS: an unsupported cipher suite")),
        };
        let key = UnboundKey::new(algorithm, key.as_ref())
            .map_err(|_| io::Error::other("TLS: a bad traffic key"))?;
        let iv: [u8; NONCE_LEN] = iv
            .as_ref()
            .try_into()
            .map_err(|_| io::Error::other("TLS: a bad IV"))?;
        Ok(Protection {
            key: LessSafeKey::new(key),
            iv,
            seq,
        })
    }

    /// The next record's nonce: the IV XORed with the sequence number (RFC 8446 5.3).
    fn next_nonce(&mut self) -> Nonce {
        let mut nonce = self.iv;
        for (byte, seq) in nonce[NONCE_LEN - 8..]
            .iter_mut()
            .zip(self.seq.to_be_bytes())
        {
            *byte ^= seq;
        }
        self.seq += 1;
        Nonce::assume_unique_for_key(nonce)
    }
}

/// rustls's part after the handshake: it derives the next traffic secrets at a key update.
enum KeySchedule {
    Client(KernelConnection<ClientConnectionData>),
    Server(KernelConnection<ServerConnectionData>),
}

impl KeySchedule {
    fn next_tx(&mut self) -> io::Result<(u64, ConnectionTrafficSecrets)> {
        match self {
            KeySchedule::Client(k) => k.update_tx_secret(),
            KeySchedule::Server(k) => k.update_tx_secret(),
        }
        .map_err(tls_error)
    }

    fn next_rx(&mut self) -> io::Result<(u64, ConnectionTrafficSecrets)> {
        match self {
            KeySchedule::Client(k) => k.update_rx_secret(),
            KeySchedule::Server(k) => k.update_rx_secret(),
        }
        .map_err(tls_error)
    }

    /// Records one key may seal (the suite's confidentiality limit, with a margin).
    fn records_per_key(&self) -> u64 {
        let suite = match self {
            KeySchedule::Client(k) => k.negotiated_cipher_suite(),
            KeySchedule::Server(k) => k.negotiated_cipher_suite(),
        };
        let limit = suite
            .tls13()
            .map_or(u64::MAX, |s| s.common.confidentiality_limit);
        limit - limit / 8
    }
}

/// The receiving half: ciphertext as it came from the socket, opened in place.
struct Receiving {
    protection: Protection,
    buf: Box<[u8]>,
    /// Ciphertext not yet opened: `buf[start..end]`.
    start: usize,
    end: usize,
    /// Opened application data not yet handed out: `buf[plain.0..plain.1]`.
    plain: (usize, usize),
    /// The peer sent close_notify.
    closed: bool,
}

/// What [`TlsStream::open_record`] did.
enum Opened {
    /// No whole record has arrived.
    Nothing,
    /// A record was opened into the caller's buffer: this many bytes of application data.
    Into(usize),
    /// A record was opened in place (its application data, if any, is in `plain`).
    Buffered,
}

/// The sending half: records are sealed into `outbox[..queued]` and written from there.
struct Sending {
    protection: Protection,
    /// Room for one write's records (`SEAL_STEP` of plaintext) and a key update.
    outbox: Box<[u8]>,
    queued: usize,
    /// Records left before the key must be updated.
    left: u64,
}

struct Shared {
    receiving: Mutex<Receiving>,
    sending: Mutex<Sending>,
    keys: Mutex<KeySchedule>,
}

/// One thread's handle on a TLS connection; [`TlsStream::try_clone`] makes another that shares
/// the connection (as a cloned socket does).
///
/// rustls runs the handshake; then the record layer is this type's own, on aws-lc-rs's AEAD,
/// with each direction's state apart (rustls's kernel-TLS interface: it hands over the
/// traffic secrets and derives the next ones at key updates). A thread reading never waits
/// for one writing; records are sealed from the caller's bytes into the send buffer and
/// opened from the receive buffer into the caller's (the cipher's pass is the copy: one pass
/// over the bytes each way besides the socket's), and records of any size are read at once.
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

fn bad_record(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {what}"))
}

/// Runs a handshake with rustls's unbuffered API over `socket`, until the connection may
/// carry application data with the handshake complete. Returns the bytes received past the
/// handshake (records for the record layer). On failure, the alert rustls queued is sent
/// (best effort), so the peer learns why.
macro_rules! drive_handshake {
    ($conn:expr, $socket:expr) => {{
        let conn = $conn;
        let socket: &mut Stream = $socket;
        let mut incoming = vec![0u8; MAX_RECORD];
        let mut filled = 0usize;
        let mut outgoing = vec![0u8; MAX_RECORD];
        let mut queued = 0usize;
        loop {
            let UnbufferedStatus { discard, state } =
                conn.process_tls_records(&mut incoming[..filled]);
            let mut read_more = false;
            let mut finished = false;
            match state {
                Err(e) => {
                    let _ = send_alert!(conn, socket);
                    return Err(tls_error(e));
                }
                Ok(ConnectionState::EncodeTlsData(mut data)) => loop {
                    match data.encode(&mut outgoing[queued..]) {
                        Ok(n) => {
                            queued += n;
                            break;
                        }
                        Err(EncodeError::InsufficientSize(InsufficientSizeError {
                            required_size,
                        })) => outgoing.resize(queued + required_size, 0),
                        Err(e) => return Err(io::Error::other(format!("TLS: {e:?}"))),
                    }
                },
                Ok(ConnectionState::TransmitTlsData(data)) => {
                    socket.write_all(&outgoing[..queued])?;
                    queued = 0;
                    data.done();
                }
                Ok(ConnectionState::WriteTraffic(_)) => finished = true,
                Ok(ConnectionState::BlockedHandshake) => read_more = true,
                Ok(ConnectionState::PeerClosed) | Ok(ConnectionState::Closed) => {
                    return Err(io::ErrorKind::UnexpectedEof.into())
                }
                Ok(_) => return Err(bad_record("unexpected data during the handshake")),
            }
            if discard > 0 {
                incoming.copy_within(discard..filled, 0);
                filled -= discard;
            }
            // A server may send before the client's Finished (0.5-RTT); it waits for it.
            if finished && conn.is_handshaking() {
                finished = false;
                read_more = true;
            }
            if finished {
                incoming.truncate(filled);
                break incoming;
            }
            if read_more {
                if filled == incoming.len() {
                    incoming.resize(incoming.len() * 2, 0);
                }
                let n = socket.read(&mut incoming[filled..])?;
                if n == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                filled += n;
            }
        }
    }};
}

/// Sends what rustls queued after a failure (its alert).
macro_rules! send_alert {
    ($conn:expr, $socket:expr) => {{
        let mut alert = vec![0u8; 256];
        match $conn.process_tls_records(&mut []).state {
            Ok(ConnectionState::EncodeTlsData(mut data)) => match data.encode(&mut alert) {
                Ok(n) => $socket.write_all(&alert[..n]),
                Err(_) => Ok(()),
            },
            _ => Ok(()),
        }
    }};
}

impl TlsStream {
    /// Runs the client side of a handshake on `socket` (its read timeout bounds the wait).
    fn connect_with(
        mut socket: Stream,
        config: Arc<ClientConfig>,
        name: ServerName<'static>,
    ) -> io::Result<TlsStream> {
        let mut conn = UnbufferedClientConnection::new(config, name).map_err(tls_error)?;
        let rest = drive_handshake!(&mut conn, &mut socket);
        let (secrets, keys) = conn.dangerous_into_kernel_connection().map_err(tls_error)?;
        TlsStream::new(socket, secrets, KeySchedule::Client(keys), &rest)
    }

    /// Runs the server side of a handshake on `socket` (its read timeout bounds the wait).
    pub fn accept(mut socket: Stream, config: Arc<ServerConfig>) -> io::Result<TlsStream> {
        let mut conn = UnbufferedServerConnection::new(config).map_err(tls_error)?;
        let rest = drive_handshake!(&mut conn, &mut socket);
        let (secrets, keys) = conn.dangerous_into_kernel_connection().map_err(tls_error)?;
        TlsStream::new(socket, secrets, KeySchedule::Server(keys), &rest)
    }

    fn new(
        socket: Stream,
        secrets: ExtractedSecrets,
        keys: KeySchedule,
        received: &[u8],
    ) -> io::Result<TlsStream> {
        // Room for many records per socket read, and at least one whole record.
        let mut buf = vec![0u8; READ_STEP.max(2 * MAX_RECORD)].into_boxed_slice();
        if received.len() > buf.len() {
            return Err(bad_record("too much data right after the handshake"));
        }
        buf[..received.len()].copy_from_slice(received);
        let left = records_per_key(&keys);
        Ok(TlsStream {
            shared: Arc::new(Shared {
                receiving: Mutex::new(Receiving {
                    protection: Protection::new(secrets.rx)?,
                    buf,
                    start: 0,
                    end: received.len(),
                    plain: (0, 0),
                    closed: false,
                }),
                sending: Mutex::new(Sending {
                    protection: Protection::new(secrets.tx)?,
                    outbox: vec![0u8; OUTBOX].into_boxed_slice(),
                    queued: 0,
                    left,
                }),
                keys: Mutex::new(keys),
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

    /// Opens the record at the front of the receive buffer, if it is whole: straight into
    /// `out` when its whole inner plaintext fits there (decrypting and copying in one pass;
    /// the content-type byte lands just after the data, in room the caller's count excludes),
    /// else in place, its application data then waiting in `rx.plain`.
    fn open_record(&mut self, rx: &mut Receiving, out: &mut [u8]) -> io::Result<Opened> {
        let pending = &rx.buf[rx.start..rx.end];
        if pending.len() < HEADER_LEN {
            return Ok(Opened::Nothing);
        }
        let header: [u8; HEADER_LEN] = pending[..HEADER_LEN].try_into().unwrap();
        let len = u16::from_be_bytes([header[3], header[4]]) as usize;
        if header[0] != CONTENT_APPLICATION_DATA
            || !(TAG_LEN + 1..=MAX_RECORD - HEADER_LEN).contains(&len)
        {
            return Err(bad_record("a malformed record"));
        }
        if pending.len() < HEADER_LEN + len {
            return Ok(Opened::Nothing);
        }
        let body = rx.start + HEADER_LEN..rx.start + HEADER_LEN + len;
        rx.start = body.end;
        let nonce = rx.protection.next_nonce();
        let failed = |_| bad_record("a record failed authentication");
        let inner_len = len - TAG_LEN;
        let (opened, into_out) = match out.get_mut(..inner_len) {
            Some(direct) => {
                let (ciphertext, tag) = rx.buf[body.clone()].split_at(inner_len);
                let key = &rx.protection.key;
                key.open_separate_gather(nonce, Aad::from(header), ciphertext, tag, direct)
                    .map_err(failed)?;
                (&*direct, true)
            }
            None => {
                let Receiving {
                    protection, buf, ..
                } = &mut *rx;
                let in_place = protection
                    .key
                    .open_in_place(nonce, Aad::from(header), &mut buf[body.clone()])
                    .map_err(failed)?;
                (&*in_place, false)
            }
        };
        // The content's type is its last non-zero byte; zeros after it are padding.
        let Some(type_at) = opened.iter().rposition(|&b| b != 0) else {
            return Err(bad_record("a record without a content type"));
        };
        match (opened[type_at], into_out) {
            (CONTENT_APPLICATION_DATA, true) => Ok(Opened::Into(type_at)),
            (CONTENT_APPLICATION_DATA, false) => {
                rx.plain = (body.start, body.start + type_at);
                Ok(Opened::Buffered)
            }
            (content_type, _) => {
                let content = opened[..type_at].to_vec();
                self.control_record(rx, content_type, &content)?;
                Ok(Opened::Buffered)
            }
        }
    }

    /// A record that is not application data: an alert, or handshake messages.
    fn control_record(
        &mut self,
        rx: &mut Receiving,
        content_type: u8,
        content: &[u8],
    ) -> io::Result<()> {
        match content_type {
            CONTENT_ALERT => match content {
                [_, 0] => rx.closed = true, // close_notify
                [_, description] => {
                    return Err(bad_record(&format!("the peer sent alert {description}")))
                }
                _ => return Err(bad_record("a malformed alert")),
            },
            CONTENT_HANDSHAKE => self.post_handshake(rx, content)?,
            _ => return Err(bad_record("a record of an unknown type")),
        }
        Ok(())
    }

    /// Handshake messages after the handshake: key updates (and session tickets, which are
    /// not used: servers send none).
    fn post_handshake(&mut self, rx: &mut Receiving, mut messages: &[u8]) -> io::Result<()> {
        while let [kind, a, b, c, rest @ ..] = messages {
            let len = u32::from_be_bytes([0, *a, *b, *c]) as usize;
            if rest.len() < len {
                return Err(bad_record("a truncated handshake message"));
            }
            let (body, next) = rest.split_at(len);
            match (*kind, body) {
                (HANDSHAKE_KEY_UPDATE, [request]) => {
                    rx.protection = Protection::new(lock(&self.shared.keys).next_rx()?)?;
                    if *request == 1 {
                        // The peer asks for ours too.
                        let shared = self.shared.clone();
                        let mut tx = lock(&shared.sending);
                        tx.queued = 0;
                        self.update_sending_key(&mut tx)?;
                        let result = self.socket.write_all(&tx.outbox[..tx.queued]);
                        tx.queued = 0;
                        result?;
                    }
                }
                (HANDSHAKE_NEW_SESSION_TICKET, _) => {}
                _ => return Err(bad_record("an unexpected handshake message")),
            }
            messages = next;
        }
        Ok(())
    }

    /// Seals one record of `content_type` holding `data` at the end of the outbox, encrypting
    /// from `data` straight into it (one pass over the bytes, not a copy and then a pass).
    fn seal(tx: &mut Sending, content_type: u8, data: &[u8]) -> io::Result<()> {
        let start = tx.queued;
        let len = data.len() + 1 + TAG_LEN;
        let header = [CONTENT_APPLICATION_DATA, 3, 3, (len >> 8) as u8, len as u8];
        let record = tx
            .outbox
            .get_mut(start..start + HEADER_LEN + len)
            .ok_or_else(|| io::Error::other("TLS: a record past the outbox"))?;
        record[..HEADER_LEN].copy_from_slice(&header);
        let (body, type_and_tag) = record[HEADER_LEN..].split_at_mut(data.len());
        let nonce = tx.protection.next_nonce();
        tx.protection
            .key
            .seal_out_of_place_scatter(
                nonce,
                Aad::from(header),
                data,
                body,
                &[content_type],
                type_and_tag,
            )
            .map_err(|_| io::Error::other("TLS: sealing failed"))?;
        tx.queued += HEADER_LEN + len;
        tx.left = tx.left.saturating_sub(1);
        Ok(())
    }

    /// Queues a KeyUpdate (sealed with the old key) and switches to the next key.
    fn update_sending_key(&self, tx: &mut Sending) -> io::Result<()> {
        // KeyUpdate, 1 byte: update_not_requested.
        Self::seal(tx, CONTENT_HANDSHAKE, &[HANDSHAKE_KEY_UPDATE, 0, 0, 1, 0])?;
        let mut keys = lock(&self.shared.keys);
        tx.protection = Protection::new(keys.next_tx()?)?;
        tx.left = records_per_key(&keys);
        Ok(())
    }
}

fn records_per_key(keys: &KeySchedule) -> u64 {
    match KEY_UPDATE_AFTER.load(Ordering::Relaxed) {
        0 => keys.records_per_key(),
        n => n,
    }
}

impl Read for TlsStream {
    /// Reads what is there: the plaintext of every whole record already received (as much as
    /// fits), waiting on the socket only when there is none.
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        let shared = self.shared.clone();
        let mut rx = lock(&shared.receiving);
        let mut copied = 0;
        loop {
            let (from, to) = rx.plain;
            if from < to {
                let n = (out.len() - copied).min(to - from);
                out[copied..copied + n].copy_from_slice(&rx.buf[from..from + n]);
                rx.plain.0 += n;
                copied += n;
                if copied == out.len() {
                    return Ok(copied);
                }
            }
            if rx.closed {
                return Ok(copied);
            }
            match self.open_record(&mut rx, &mut out[copied..])? {
                Opened::Into(n) => {
                    copied += n;
                    if copied == out.len() {
                        return Ok(copied);
                    }
                    continue;
                }
                Opened::Buffered => continue,
                Opened::Nothing => {}
            }
            if copied > 0 {
                return Ok(copied);
            }
            // Not a whole record yet: make room behind what is pending, then read more.
            if rx.buf.len() - rx.end < MAX_RECORD {
                let Receiving {
                    buf, start, end, ..
                } = &mut *rx;
                buf.copy_within(*start..*end, 0);
                *end -= *start;
                *start = 0;
            }
            let end = rx.end;
            let n = self.socket.read(&mut rx.buf[end..])?;
            if n == 0 {
                // The socket ended without close_notify: a clean end between records reads as
                // the end of the stream (as on a plain socket), one inside a record is an error.
                return if rx.start == rx.end {
                    Ok(0)
                } else {
                    Err(io::ErrorKind::UnexpectedEof.into())
                };
            }
            rx.end += n;
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let piece = &buf[..buf.len().min(SEAL_STEP)];
        let shared = self.shared.clone();
        let mut tx = lock(&shared.sending);
        tx.queued = 0;
        for record in piece.chunks(MAX_PLAINTEXT) {
            if tx.left == 0 {
                self.update_sending_key(&mut tx)?;
            }
            Self::seal(&mut tx, CONTENT_APPLICATION_DATA, record)?;
        }
        // Written with the lock held: records reach the socket in the order they were sealed.
        let result = self.socket.write_all(&tx.outbox[..tx.queued]);
        tx.queued = 0;
        result.map(|()| piece.len())
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
