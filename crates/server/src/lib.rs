//! The rgpu server: serves the machine's OpenCL devices and CUDA GPUs to rgpu clients.
//!
//! - [`Server::bind`] loads the system's OpenCL at run time (`opencl::native`), takes the
//!   inventory of platforms and devices once (`opencl::inventory`), and binds the listening
//!   socket.
//! - [`Server::run`] accepts connections ([`listener`]) and serves each in a session
//!   ([`session`], generic: the connection, bulk data, data lanes ([`lanes`]), quotas
//!   ([`limits`])), by default in a worker process of its own ([`workers`]).
//! - The backends: [`opencl`] (its native layer, object tables, staging pool, completion
//!   thread, and one file per group of the OpenCL wire table) and [`cuda`] (the driver loaded
//!   at run time, when there is one, and one file per group of the CUDA wire table).
//! - [`ShutdownHandle::shutdown`] makes `run` return after every session has been closed and
//!   its objects released.

mod cuda;
mod fabric;
mod flight;
mod handshakes;
mod lanes;
mod limits;
mod listener;
mod metrics;
mod opencl;
mod private_dir;
mod session;
mod shared;
mod watch;
mod workers;
mod writer;

pub use limits::{parse_size, Exclusive, Limits};

/// The line tests and `rgpu bench` wait for, followed by the endpoint.
pub const LISTENING_PREFIX: &str = "rgpu server listening on ";
/// The line before the listening one: the fingerprint clients pin (tests read it).
pub const CERTIFICATE_PREFIX: &str = "rgpu server certificate ";

pub use workers::{run_worker, WorkerCommand, WorkerStop, WorkerUser};

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rgpu_transport::{Endpoint, Listener, Plaintext, ServerSecurity, TlsIdentity, Token};

use crate::opencl::inventory::{Filters, Inventory};
use crate::opencl::native::Cl;
use crate::shared::Shared;

/// How to run a server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Where to listen (`host:port` or `unix:/path`).
    pub listen: Endpoint,
    /// What serves the sessions: libraries, devices, name, quotas (the workers get it too).
    pub sessions: SessionSettings,
    /// Serve each session in a worker process started with this command (see [`workers`]);
    /// `None` serves them on threads of this process (tests of the library).
    pub workers: Option<WorkerCommand>,
    /// Where to serve Prometheus metrics (`host:port`), if anywhere (see [`metrics`]; per
    /// session figures come from workers: none with `workers: None`).
    pub metrics: Option<String>,
}

/// What a process that serves sessions (the listener, each session worker) needs to know.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct SessionSettings {
    /// Serve only platforms whose CL_PLATFORM_NAME contains this (case-insensitive).
    pub platform_filter: Option<String>,
    /// Serve only devices whose CL_DEVICE_NAME contains this (case-insensitive), or a comma
    /// list of device indices (0-based, over the devices of the platforms served).
    pub device_filter: Option<String>,
    /// The OpenCL library to load instead of the system ICD loader.
    pub opencl_library: Option<PathBuf>,
    /// Serve the machine's CUDA GPUs (when it has a CUDA driver).
    pub cuda: bool,
    /// The CUDA driver to load instead of the system's `libcuda.so.1`.
    pub cuda_library: Option<PathBuf>,
    /// The server's name in the handshake (the CLI uses the host name).
    pub name: String,
    /// Quotas: sessions in all and per client, memory and objects per session, idle time.
    pub limits: Limits,
    /// Clients must prove they hold this token. Without one only local clients are served.
    pub token: Option<Token>,
    /// The server's TLS certificate and key; `None` offers no TLS.
    pub tls: Option<TlsIdentity>,
    /// Where connections in the clear are accepted.
    pub plaintext: Plaintext,
    /// How long a client may stay unreachable (a host gone, a silent partition) or leave the
    /// server's heartbeats unanswered (a hung client, a black-holing path) before its session
    /// is ended and everything it held released; `None`: 30 s.
    pub client_timeout: Option<std::time::Duration>,
    /// The abstract Unix socket (`@name`) a server listening on TCP also takes sessions on,
    /// for clients on its host (shared memory needs a Unix socket); set by [`Server::bind`].
    #[serde(default)]
    pub local_socket: Option<String>,
    /// The user the listener runs as: a client on this host running as that user (or root)
    /// may operate the server (`rgpu migrate`); set by [`Server::bind`].
    #[serde(default)]
    pub operator_uid: Option<u32>,
}

/// A bound server, ready to [`run`](Server::run).
pub struct Server {
    /// The listening socket, then the same-host one where there is one.
    listeners: Vec<Listener>,
    endpoint: Endpoint,
    shared: Arc<Shared>,
}

/// Stops a running server; cheap to clone and usable from any thread (a signal handler's).
#[derive(Clone)]
pub struct ShutdownHandle {
    shared: Arc<Shared>,
}

impl ShutdownHandle {
    /// Makes [`Server::run`] close every session and return.
    pub fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }
}

impl Server {
    /// The devices it serves: (OpenCL devices, CUDA GPUs).
    pub fn device_counts(&self) -> (usize, usize) {
        let cuda = self.shared.cuda.as_ref();
        (
            self.shared.inventory.devices.len(),
            cuda.map_or(0, |c| c.inventory.devices.len()),
        )
    }
}

impl Server {
    /// Loads OpenCL, takes the inventory and binds the listening socket. A machine without
    /// OpenCL still gets a server (with no devices) and a warning.
    pub fn bind(config: ServerConfig) -> Result<Server, String> {
        let mut settings = config.sessions.clone();
        let local = same_host_listener(&config.listen);
        settings.local_socket = local.as_ref().map(|(_, name)| name.clone());
        settings.operator_uid = Some(nix::unistd::getuid().as_raw());
        let mut shared = load_shared(settings.clone(), true);
        let listener = Listener::bind(&config.listen)
            .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
        let endpoint = listener
            .local_endpoint()
            .map_err(|e| format!("cannot read the listening address: {e}"))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("cannot set up the listening socket: {e}"))?;
        log_start(&shared, &endpoint, &config);
        if let Some(address) = &config.metrics {
            let bound = metrics::serve(address)?;
            log::info!("metrics: http://{bound}/metrics");
        }
        if let Some(command) = config.workers {
            let found = (
                shared.inventory.devices.len(),
                shared
                    .cuda
                    .as_ref()
                    .map_or(0, |c| c.inventory.devices.len()),
            );
            let pool = workers::WorkerPool::new(command, settings, found);
            pool.refill();
            shared.workers = Some(pool);
        } else {
            log::info!("sessions run on threads of this process (no session isolation)");
        }
        let mut listeners = vec![listener];
        if let Some((local, name)) = local {
            log::info!("clients on this host are offered unix:{name} (shared memory)");
            listeners.push(local);
        }
        Ok(Server {
            shared: Arc::new(shared),
            listeners,
            endpoint,
        })
    }

    /// The address actually bound (port 0 resolved).
    pub fn local_endpoint(&self) -> Endpoint {
        self.endpoint.clone()
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            shared: self.shared.clone(),
        }
    }

    /// Accepts clients until [`ShutdownHandle::shutdown`]; then closes every session, releases
    /// what they created and returns.
    pub fn run(self) -> Result<(), String> {
        listener::accept_loop(&self.listeners, &self.shared);
        Ok(())
    }
}

/// For a server listening on TCP: an abstract Unix socket with a random name, on which clients
/// on this host (who learn the name over their TCP session: `LocalRoute`) take their sessions
/// instead, with shared memory. Nothing on disk; only this network namespace reaches it; the
/// same handshake, token and quotas as on TCP. `None` (logged) where it cannot be bound.
fn same_host_listener(listen: &Endpoint) -> Option<(Listener, String)> {
    if listen.is_unix() {
        return None;
    }
    let random = rgpu_transport::random_lane_key();
    let name = hex::encode(&random[..12]);
    let name = format!("@rgpu-{name}");
    let bound = Listener::bind(&Endpoint::Unix(PathBuf::from(&name)))
        .and_then(|listener| listener.set_nonblocking(true).map(|()| listener));
    match bound {
        Ok(listener) => Some((listener, name)),
        Err(e) => {
            log::warn!("no same-host socket for clients on this host ({e}): they use TCP");
            None
        }
    }
}

/// Loads the native libraries (OpenCL through the ICD loader, the CUDA driver) and takes the
/// inventory of what they serve: the listener does it at start, and each session worker. A
/// machine without OpenCL (or CUDA) serves the other, with a warning.
pub(crate) fn load_shared(settings: SessionSettings, announce: bool) -> Shared {
    forget_rgpu_servers();
    // The listener says which libraries it loaded; workers load the same ones quietly.
    let level = if announce {
        log::Level::Info
    } else {
        log::Level::Debug
    };
    let inventory = match Cl::load(settings.opencl_library.as_deref()) {
        Ok(cl) => {
            log::log!(level, "OpenCL library: {}", cl.library_path().display());
            let filters = Filters {
                platform: settings.platform_filter.as_deref(),
                device: settings.device_filter.as_deref(),
            };
            Inventory::take(cl, &filters)
        }
        Err(e) => {
            log::warn!("{e}; serving no devices");
            Inventory::empty()
        }
    };
    let cuda = if settings.cuda {
        match cuda::Backend::load(settings.cuda_library.as_deref()) {
            Ok(backend) => {
                log::log!(level, "CUDA driver: {}", backend.driver.path().display());
                Some(backend)
            }
            Err(e) => {
                log::log!(level, "{e}; serving no CUDA GPUs");
                None
            }
        }
    } else {
        None
    };
    if settings.tls.is_some() {
        // Before the first session, not during its handshake.
        rgpu_transport::tls::warm_up();
    }
    let security = ServerSecurity {
        tls: settings
            .tls
            .as_ref()
            .and_then(|identity| match identity.server_config() {
                Ok(config) => Some(config),
                Err(e) => {
                    log::error!("TLS identity: {e}; offering no TLS");
                    None
                }
            }),
        plaintext: settings.plaintext,
    };
    let mut shared = Shared::new(inventory, cuda, settings.token, settings.name);
    shared.security = security;
    shared.local_socket = settings.local_socket;
    shared.operator_uid = settings.operator_uid;
    shared.limits = settings.limits;
    if let Some(timeout) = settings.client_timeout {
        shared.client_timeout = timeout;
    }
    shared
}

/// The rgpu ICD, if the loader finds it, must not connect this server to servers (possibly
/// itself). Changing the environment races with getenv in other threads (OpenCL
/// implementations read theirs at any time), so it is done only when needed, once.
fn forget_rgpu_servers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("RGPU_SERVERS").is_some() {
            std::env::remove_var("RGPU_SERVERS");
        }
    });
}

fn log_start(shared: &Shared, endpoint: &Endpoint, config: &ServerConfig) {
    let inventory = &shared.inventory;
    let cuda = shared.cuda.as_deref();
    for (ordinal, gpu) in cuda
        .iter()
        .flat_map(|c| c.inventory.devices.iter().enumerate())
    {
        log::info!(
            "serving CUDA device {ordinal}: {} ({} MiB)",
            gpu.name,
            gpu.total_mem >> 20
        );
    }
    if inventory.devices.is_empty() {
        log::warn!("no OpenCL device found: clients will see no devices");
    }
    for device in &inventory.devices {
        let platform = inventory
            .platform(device.platform)
            .map_or("?", |p| p.name.as_str());
        log::info!(
            "serving device {}: {} (platform {})",
            device.id,
            device.name,
            platform
        );
    }
    if shared.token.is_some() {
        log::info!("listening on {endpoint}; clients must present the token");
    } else {
        log::info!("listening on {endpoint}; no token: serving only clients on this machine");
    }
    let settings = &config.sessions;
    match (&settings.tls, settings.plaintext) {
        (Some(identity), plaintext) => log::info!(
            "TLS 1.3 certificate {} (clients pin it: RGPU_TLS_FINGERPRINT); plaintext {}",
            identity
                .fingerprint()
                .map_or_else(|e| e.to_string(), |f| f.to_string()),
            match plaintext {
                Plaintext::Local => "from clients on this machine only",
                Plaintext::Allow => "from anyone (plaintext = \"allow\")",
                Plaintext::Never => "on Unix sockets only",
            }
        ),
        (None, _) => log::warn!("no TLS: connections are not encrypted"),
    }
}
