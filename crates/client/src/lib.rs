//! rgpu client core: what every front end (OpenCL, CUDA) shares. It knows servers,
//! connections, ids and replies; it knows nothing of OpenCL semantics.

mod apis;
mod connection;
mod cuda_devices;
mod lanes;
mod link;
mod logging;
mod movable;
mod once;
mod peers;
mod selection;
pub mod trace;
mod wait;

use std::sync::Arc;
use std::time::Duration;

pub use apis::{Cuda, OpenCl};
pub use connection::{take_done_records, ReadSink, SendPtr, ServerSession};
pub use cuda_devices::{choose_devices, find_cuda_devices, RemoteDevice, RemoteDevices};
pub use link::ServerLink;
pub use logging::{init_logging, log_builder};
pub use movable::Connection;
pub use once::{first_time, panic_message};
pub use peers::{pull_to_host, ExportRecord};
pub use rgpu_protocol::cuda::CudaClient;
pub use rgpu_protocol::opencl::OpenClClient;
pub use rgpu_transport::fork;
use rgpu_transport::Stream;
pub use rgpu_transport::{
    load_client_token, random_lane_key as new_ticket, ClientSecurity, Endpoint, TlsConnector, Token,
};
pub use selection::{DeviceKind, DeviceSelection, SelectionError};
pub use wait::Handoff;

#[derive(Debug, Clone)]
pub enum ClientError {
    /// Could not connect or authenticate.
    Connect(String),
    /// The connection broke; every later request on it fails the same way.
    Broken(String),
    /// No reply within the configured time.
    Timeout(String),
    /// The server answered something this client did not expect.
    Protocol(String),
}

impl ClientError {
    fn io(e: std::io::Error) -> ClientError {
        ClientError::Connect(e.to_string())
    }
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Connect(why) => write!(f, "cannot connect: {why}"),
            ClientError::Broken(why) => write!(f, "{why}"),
            ClientError::Timeout(why) => write!(f, "timeout: {why}"),
            ClientError::Protocol(why) => write!(f, "protocol error: {why}"),
        }
    }
}

impl std::error::Error for ClientError {}

/// Client settings, from the environment:
/// - `RGPU_SERVERS`: `host:port[,host:port|unix:/path...]`
/// - `RGPU_TOKEN` / `RGPU_TOKEN_FILE`: the shared token
/// - `RGPU_CONNECT_TIMEOUT` (seconds, default 5), `RGPU_TIMEOUT` (seconds a reply may take, default 600)
/// - `RGPU_LIVENESS_TIMEOUT` (seconds an unreachable server is waited for, default 10)
/// - `RGPU_LANES` (data lanes per server, default 8), `RGPU_STRIPED_READS` (`off`; `on` or `auto`, the default: large CUDA reads striped over the lanes), `RGPU_SHARED_MEMORY`, `RGPU_SHARED_RING_MB` (a `unix:` server's shared memory), `RGPU_SAME_HOST` (`off`: a TCP server on this host stays on TCP)
/// - `RGPU_APP_ID` (the application, for servers used exclusively), `RGPU_EXCLUSIVE_WAIT`
///   (seconds to wait for such a server, default 600)
/// - `RGPU_TLS` (`auto`: TLS except to loopback and Unix sockets; `on`; `off`),
///   `RGPU_TLS_FINGERPRINT` (the servers' certificates, pinned), `RGPU_TLS_CA` (a CA bundle)
#[derive(Clone)]
pub struct ClientConfig {
    pub servers: Vec<Endpoint>,
    pub token: Option<Token>,
    pub tls: TlsConnector,
    pub connect_timeout: Duration,
    pub reply_timeout: Duration,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("servers", &self.servers)
            .field("token", &self.token)
            .field("connect_timeout", &self.connect_timeout)
            .field("reply_timeout", &self.reply_timeout)
            .finish_non_exhaustive()
    }
}

/// How long a reply may take (`RGPU_TIMEOUT`, seconds, default 600).
pub fn reply_timeout_from_env() -> Duration {
    seconds_from_env("RGPU_TIMEOUT", 600.0)
}

/// How long a server may stay unreachable before the connection to it is given up
/// (`RGPU_LIVENESS_TIMEOUT`, seconds, default 10): a silent network partition or a vanished
/// host then fails every call (a waiting one, an idle connection's next one) instead of hanging.
pub fn liveness_timeout_from_env() -> Duration {
    seconds_from_env("RGPU_LIVENESS_TIMEOUT", 10.0)
}

/// Bounds every wait on a new connection to a server: liveness (see
/// [`liveness_timeout_from_env`]) and writes that the server does not take within
/// `write_timeout`.
pub(crate) fn bound_waits(stream: &Stream, write_timeout: Duration) -> std::io::Result<()> {
    stream.set_liveness(liveness_timeout_from_env())?;
    stream.set_write_timeout(Some(write_timeout))
}

/// Data lanes per server for large transfers (`RGPU_LANES`, default 8; 0: none). Eight, not
/// four: on the H200 host 64 MiB device→host reads went from 14 to 23–29 GB/s (plaintext) and
/// from 10–13 to 15–19 GB/s (TLS), host→device writes from 7.6–8.7 to 8.4–9.2 GB/s
/// (docs/benchmarks.md, "Every lane busy").
pub fn lanes_from_env() -> usize {
    std::env::var("RGPU_LANES")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(DEFAULT_LANES)
}

/// The application this process belongs to (`RGPU_APP_ID`, which `rgpu run` sets for the
/// command it runs and its children; else this host and process): on a server whose devices
/// are used exclusively, sessions of one application share them.
pub fn application_from_env() -> String {
    match std::env::var("RGPU_APP_ID") {
        Ok(id) if !id.trim().is_empty() => id.trim().to_string(),
        _ => {
            let host = rgpu_transport::host_name().unwrap_or_else(|| "localhost".into());
            format!("{host}:{}", std::process::id())
        }
    }
}

/// How long to wait for a server whose devices another application uses exclusively
/// (`RGPU_EXCLUSIVE_WAIT`, seconds, default 600; 0: be refused at once).
pub fn exclusive_wait_from_env() -> Duration {
    std::env::var("RGPU_EXCLUSIVE_WAIT")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map_or(Duration::from_secs(600), Duration::from_secs_f64)
}

/// Whether large reads come back striped over the data lanes (`RGPU_STRIPED_READS`: `on`
/// (also `auto`, the default) or `off`). Each lane's bytes are written, received (and with TLS
/// sealed and opened) by threads of their own, where one connection's reader thread takes
/// everything: on the H200 a 64 MiB device-to-host read in plaintext went from 4.0-4.1 to
/// 7.9-9.1 GB/s, in TLS from 3.26 to 4.8-5.0 (docs/benchmarks.md). A connection with shared
/// memory reads through its ring instead.
pub fn striped_reads_from_env() -> bool {
    !env_is_off("RGPU_STRIPED_READS")
}

/// Whether a connection to a TCP server on this host moves to the server's same-host socket
/// (`RGPU_SAME_HOST`: on by default; `off` keeps TCP, as the test suite does to exercise it).
pub fn same_host_from_env() -> bool {
    !env_is_off("RGPU_SAME_HOST")
}

/// The size of each of the two shared-memory rings a connection to a server on this host
/// (a `unix:` endpoint) attaches (`RGPU_SHARED_RING_MB`, MiB); `RGPU_SHARED_MEMORY=off`: none,
/// all bytes cross the socket.
pub fn shared_ring_from_env() -> Option<u64> {
    if env_is_off("RGPU_SHARED_MEMORY") {
        return None;
    }
    let mb = std::env::var("RGPU_SHARED_RING_MB")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_SHARED_RING_MB);
    (mb > 0).then(|| (mb << 20).min(rgpu_transport::shared_ring::MAX_RING_LEN))
}

/// Large enough that a ring's two halves keep both ends copying at memory speed.
const DEFAULT_SHARED_RING_MB: u64 = 16;

/// Four lanes reach about 1.7x one stream's rate from a 64 MiB buffer on a 16-core host
/// (docs/benchmarks.md); more add little.
const DEFAULT_LANES: usize = 8;

/// Whether the switch `name` is set to `off` (or `0`); unset or anything else leaves it on.
fn env_is_off(name: &str) -> bool {
    matches!(
        std::env::var(name).as_deref().map(str::trim),
        Ok("off" | "0")
    )
}

fn seconds_from_env(name: &str, default: f64) -> Duration {
    let secs = std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(default);
    Duration::from_secs_f64(secs)
}

impl ClientConfig {
    pub fn from_env() -> Result<ClientConfig, String> {
        let servers = match std::env::var("RGPU_SERVERS") {
            Ok(list) => Endpoint::parse_list(&list).map_err(|e| format!("RGPU_SERVERS: {e}"))?,
            Err(_) => Vec::new(),
        };
        Ok(ClientConfig {
            servers,
            token: load_client_token()?,
            tls: TlsConnector::new(&ClientSecurity::from_env()?)?,
            connect_timeout: seconds_from_env("RGPU_CONNECT_TIMEOUT", 5.0),
            reply_timeout: reply_timeout_from_env(),
        })
    }

    /// Settings for connecting to `servers` as a program on this machine would without any
    /// environment: no token, TLS by default rules, default timeouts (tests, tools).
    pub fn plain(servers: Vec<Endpoint>) -> ClientConfig {
        ClientConfig {
            servers,
            token: None,
            tls: TlsConnector::new(&ClientSecurity::default())
                .expect("the default TLS settings read no file"),
            connect_timeout: Duration::from_secs(5),
            reply_timeout: reply_timeout_from_env(),
        }
    }

    /// Connects to every server at once; each result is in the order of `servers`.
    pub fn connect_all(&self) -> Vec<Result<Arc<Connection>, ClientError>> {
        let handles: Vec<_> = self
            .servers
            .iter()
            .cloned()
            .map(|endpoint| {
                let config = self.clone();
                std::thread::spawn(move || Connection::connect(&endpoint, &config))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(ClientError::Connect("connect thread panicked".into())))
            })
            .collect()
    }
}
