//! `rgpu server`: serve this machine's OpenCL devices and CUDA GPUs.

mod config;

use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::ArgMatches;
use rgpu_server::{
    parse_size, Exclusive, Limits, Server, ServerConfig, SessionSettings, WorkerCommand, WorkerUser,
};
use rgpu_server::{CERTIFICATE_PREFIX, LISTENING_PREFIX};
use rgpu_transport::tls::IdentityOrigin;
use rgpu_transport::{Endpoint, Plaintext, TlsIdentity, Token};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

#[derive(clap::Args, Debug)]
#[command(
    about = "Serve this machine's OpenCL devices and CUDA GPUs to rgpu clients",
    long_about = "Serve this machine's OpenCL devices and CUDA GPUs to rgpu clients.\n\n\
                  The devices come from the system's OpenCL ICD loader and CUDA driver \
                  (libcuda.so.1), both loaded at run time; a machine without one serves the \
                  other. \
                  Without a token file only clients on this machine (loopback TCP, Unix socket) \
                  are admitted; with one, clients anywhere must prove they hold the same token \
                  (RGPU_TOKEN or RGPU_TOKEN_FILE on their side; `rgpu token new` makes one). \
                  SIGINT or SIGTERM stops the server cleanly.\n\n\
                  Every setting below can also come from the environment variable it names or \
                  from a TOML file (--config) whose keys are the flag names with underscores \
                  (listen = \"0.0.0.0:7450\", token_file = \"/etc/rgpu/token\", no_cuda = true, \
                  ...). A flag wins over the environment, which wins over the file. \
                  --print-config shows the result and where each value came from."
)]
pub struct ServerArgs {
    #[command(flatten)]
    settings: ServerSettings,

    /// Read settings from this TOML file (keys: the flag names with underscores).
    #[arg(long, value_name = "FILE", env = "RGPU_SERVER_CONFIG")]
    config: Option<PathBuf>,

    /// Print the effective settings (and where each came from) as TOML, then exit.
    #[arg(long)]
    print_config: bool,

    /// Find the devices as serving would (libraries, filters), print how many there are, and
    /// exit without serving: 0, or 1 with --expect-devices when there are fewer (a cluster's
    /// epilog checks a node this way).
    #[arg(long)]
    check_devices: bool,

    /// Print the fingerprint of the server's TLS certificate (making the key pair first if
    /// there is none yet), then exit. Clients pin it with RGPU_TLS_FINGERPRINT.
    #[arg(long)]
    print_fingerprint: bool,
}

/// The server's settings: each is a flag, an environment variable and a key of the config
/// file, with one name (the flag's, with underscores) in the file and in --print-config.
#[derive(clap::Args, Debug, serde::Serialize, serde::Deserialize)]
pub struct ServerSettings {
    /// Where to listen: host:port (port 0 picks a free one) or unix:/path/to/socket.
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:7450",
        env = "RGPU_LISTEN"
    )]
    listen: String,

    /// File holding the shared token (at least 16 characters) clients must prove they hold.
    #[arg(long, value_name = "FILE", env = "RGPU_SERVER_TOKEN_FILE")]
    token_file: Option<PathBuf>,

    /// The server's TLS certificate (PEM; a chain starts with the server's own). When neither
    /// it nor the key exists, a key pair and a self-signed certificate are made there at start.
    /// Default: tls/server.crt in the state directory ($STATE_DIRECTORY, /var/lib/rgpu for
    /// root, else $XDG_STATE_HOME/rgpu or ~/.local/state/rgpu).
    #[arg(long, value_name = "FILE", env = "RGPU_SERVER_TLS_CERT")]
    tls_cert: Option<PathBuf>,

    /// The private key of the TLS certificate (PEM). Default: tls/server.key beside the
    /// default certificate.
    #[arg(long, value_name = "FILE", env = "RGPU_SERVER_TLS_KEY")]
    tls_key: Option<PathBuf>,

    /// Where connections without TLS are accepted: `local` (from this machine only: loopback
    /// TCP and Unix sockets), `allow` (from anyone; a trusted network), `never` (Unix sockets
    /// only).
    #[arg(
        long,
        value_enum,
        default_value = "local",
        env = "RGPU_SERVER_PLAINTEXT"
    )]
    plaintext: PlaintextArg,

    /// Serve only platforms whose name contains SUBSTR (case-insensitive).
    #[arg(long, value_name = "SUBSTR", env = "RGPU_SERVER_PLATFORM")]
    platform: Option<String>,

    /// Serve only devices whose name contains FILTER (case-insensitive).
    #[arg(long, value_name = "FILTER", env = "RGPU_SERVER_DEVICES")]
    devices: Option<String>,

    /// The OpenCL library to load instead of the system ICD loader.
    #[arg(long, value_name = "PATH", env = "RGPU_OPENCL_LIBRARY")]
    opencl_library: Option<PathBuf>,

    /// Do not serve CUDA GPUs.
    #[arg(long, env = "RGPU_SERVER_NO_CUDA")]
    no_cuda: bool,

    /// The CUDA driver to load instead of the system's libcuda.so.1.
    #[arg(long, value_name = "PATH", env = "RGPU_CUDA_LIBRARY")]
    cuda_library: Option<PathBuf>,

    /// The name clients see for this server (default: the host name).
    #[arg(long, env = "RGPU_SERVER_NAME")]
    name: Option<String>,

    /// Refuse to start (exit 1, saying why) when fewer than N devices are found: OpenCL
    /// devices or CUDA GPUs, whichever are more (a node missing a GPU is then noticed, by the
    /// service manager or a cluster's prolog, instead of serving fewer).
    #[arg(long, value_name = "N", env = "RGPU_SERVER_EXPECT_DEVICES")]
    expect_devices: Option<usize>,

    /// Seconds a client may stay unreachable (host gone, silent network partition) or leave
    /// the server's heartbeats unanswered (a hung client, a path that delivers nothing) before
    /// its session is ended and what it held is released.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 30.0,
        env = "RGPU_SERVER_CLIENT_TIMEOUT"
    )]
    client_timeout: f64,

    /// Sessions at once from all clients (0: no limit); one more is refused at connect.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 64,
        env = "RGPU_SERVER_MAX_SESSIONS"
    )]
    max_sessions: usize,

    /// Sessions at once from one client address (0: no limit).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 16,
        env = "RGPU_SERVER_MAX_SESSIONS_PER_CLIENT"
    )]
    max_sessions_per_client: usize,

    /// Device memory one session may hold: buffers, images, CUDA allocations (e.g. 16G; 0: no
    /// limit but the device's). Past it, allocations fail with the API's out-of-memory error.
    #[arg(
        long,
        value_name = "SIZE",
        default_value = "0",
        env = "RGPU_SERVER_SESSION_MEMORY"
    )]
    session_memory: String,

    /// Objects one session may hold at once (contexts, queues, buffers, kernels, events,
    /// streams, ...; 0: no limit).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 100_000,
        env = "RGPU_SERVER_SESSION_OBJECTS"
    )]
    session_objects: usize,

    /// Close a session that sends no request for this many seconds (0: never).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 0.0,
        env = "RGPU_SERVER_IDLE_TIMEOUT"
    )]
    idle_timeout: f64,

    /// How applications share the devices: `shared` (sessions of any number of applications
    /// at once, time-sliced on each GPU) or `exclusive` (one application at a time: the
    /// sessions of one RGPU_APP_ID come in; another application's wait their turn, first come
    /// first served, up to the wait their client asked for with RGPU_EXCLUSIVE_WAIT).
    #[arg(
        long,
        value_enum,
        default_value = "shared",
        env = "RGPU_SERVER_SHARING"
    )]
    sharing: Sharing,

    /// With --sharing exclusive: applications that may wait at once (one more is refused).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 16,
        env = "RGPU_SERVER_EXCLUSIVE_QUEUE"
    )]
    exclusive_queue: usize,

    /// With --sharing exclusive: the longest any application waits, in seconds, whatever its
    /// client asked for.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 3600.0,
        env = "RGPU_SERVER_EXCLUSIVE_MAX_WAIT"
    )]
    exclusive_max_wait: f64,

    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464): sessions, and
    /// each session's requests, bulk bytes and busy time. Off unless given.
    #[arg(long, value_name = "ADDR", env = "RGPU_SERVER_METRICS")]
    metrics: Option<String>,

    /// Where sessions run: `process` (each in a worker process of its own, so a crash or a
    /// sticky GPU error ends only that session) or `thread` (all in this process; debugging).
    #[arg(
        long,
        value_enum,
        default_value = "process",
        env = "RGPU_SERVER_ISOLATION"
    )]
    isolation: Isolation,

    /// The user session workers run as (with its groups), when the server runs as root;
    /// e.g. the service's own user, or `root` to keep root. Default: for a server running as
    /// root, the user `rgpu` where it exists, else an unprivileged uid of systemd's dynamic
    /// range (61184-65519) with a private home; otherwise the server's own user.
    #[arg(long, value_name = "USER", env = "RGPU_SERVER_WORKER_USER")]
    worker_user: Option<String>,

    /// Session workers started ahead of need, so that a session does not wait for one.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        env = "RGPU_SERVER_PRESTARTED_WORKERS"
    )]
    prestarted_workers: usize,
}

#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
enum Isolation {
    Process,
    Thread,
}

#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
enum Sharing {
    Shared,
    Exclusive,
}

#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
enum PlaintextArg {
    Local,
    Allow,
    Never,
}

impl From<PlaintextArg> for Plaintext {
    fn from(arg: PlaintextArg) -> Plaintext {
        match arg {
            PlaintextArg::Local => Plaintext::Local,
            PlaintextArg::Allow => Plaintext::Allow,
            PlaintextArg::Never => Plaintext::Never,
        }
    }
}

/// The hidden subcommand a session worker runs as (`rgpu server` starts it).
pub const WORKER_SUBCOMMAND: &str = "server-worker";

/// `matches` are the parsed command line of `rgpu server`: they tell which settings the
/// command line or the environment gave (those win over the config file).
pub fn run(args: ServerArgs, matches: &ArgMatches) -> Result<ExitCode, String> {
    let args_print_fingerprint = args.print_fingerprint;
    let check_devices = args.check_devices;
    let resolved = config::resolve(args.settings, matches, args.config.as_deref())?;
    if args.print_config {
        rgpu_bench::output::write_stdout(&resolved.render())?;
        return Ok(ExitCode::SUCCESS);
    }
    let args = resolved.settings;
    let name = args.name.clone().unwrap_or_else(host_name);
    let identity = tls_identity(&args, &name)?;
    let fingerprint = identity.fingerprint()?;
    if args_print_fingerprint {
        rgpu_bench::output::write_stdout(&format!("{fingerprint}\n"))?;
        return Ok(ExitCode::SUCCESS);
    }
    let listen = Endpoint::parse(&args.listen).map_err(|e| format!("listen: {e}"))?;
    let token = args
        .token_file
        .as_deref()
        .map(Token::from_file)
        .transpose()?;
    // The server logs its token mode; the case that surprises people gets a plain line too.
    let refuses_remote_clients = token.is_none() && !is_local_only(&listen);
    let token_given = token.is_some();

    let config = ServerConfig {
        listen,
        sessions: SessionSettings {
            client_timeout: Some(positive_seconds("client_timeout", args.client_timeout)?),
            platform_filter: args.platform,
            device_filter: args.devices,
            opencl_library: args.opencl_library,
            cuda: !args.no_cuda,
            cuda_library: args.cuda_library,
            name,
            token,
            tls: Some(identity),
            plaintext: args.plaintext.into(),
            local_socket: None,
            operator_uid: None,
            limits: Limits {
                max_sessions: args.max_sessions,
                max_sessions_per_client: args.max_sessions_per_client,
                idle_timeout: match args.idle_timeout {
                    0.0 => None,
                    seconds => Some(positive_seconds("idle_timeout", seconds)?),
                },
                session_memory: parse_size(&args.session_memory)
                    .map_err(|e| format!("session_memory: {e}"))?,
                session_objects: args.session_objects,
                exclusive: match args.sharing {
                    Sharing::Shared => None,
                    Sharing::Exclusive => Some(Exclusive {
                        queue: args.exclusive_queue,
                        max_wait: positive_seconds("exclusive_max_wait", args.exclusive_max_wait)?,
                    }),
                },
            },
        },
        metrics: args.metrics,
        workers: match args.isolation {
            Isolation::Thread => None,
            Isolation::Process => {
                let user = worker_user(args.worker_user.as_deref())?;
                Some(WorkerCommand {
                    program: worker_program(user.is_some())?,
                    args: vec![WORKER_SUBCOMMAND.to_string()],
                    prestarted: args.prestarted_workers,
                    user,
                    env: nccl_environment(token_given),
                })
            }
        },
    };
    // Caught before OpenCL loads: an implementation built on LLVM (PoCL) installs handlers
    // that restore the previous disposition and re-raise. Installed after them, ours would
    // chain into theirs and the default action would kill the server without a clean
    // shutdown; installed before, theirs re-raise into ours. Signals that arrive while
    // OpenCL loads wait in `signals`.
    let mut signals =
        Signals::new([SIGINT, SIGTERM]).map_err(|e| format!("cannot catch signals: {e}"))?;
    // The home made for workers of a dynamic user, removed when the server ends.
    let workers_home = config
        .workers
        .as_ref()
        .and_then(|w| w.user.as_ref())
        .filter(|u| u.dynamic_home)
        .map(|u| u.home.clone());
    let server = Server::bind(config)?;
    if let Some(expected) = args.expect_devices {
        let (opencl, cuda) = server.device_counts();
        if opencl.max(cuda) < expected {
            return Err(format!(
                "found {opencl} OpenCL devices and {cuda} CUDA GPUs, fewer than the \
                 {expected} expected (--expect-devices); not serving"
            ));
        }
    }
    if check_devices {
        let (opencl, cuda) = server.device_counts();
        rgpu_bench::output::write_stdout(&format!("{opencl} OpenCL devices, {cuda} CUDA GPUs\n"))?;
        return Ok(ExitCode::SUCCESS);
    }
    let shutdown = server.shutdown_handle();
    std::thread::Builder::new()
        .name("rgpu-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                log::info!("signal {signal}: shutting down");
                shutdown.shutdown();
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;

    eprintln!("{CERTIFICATE_PREFIX}{fingerprint}");
    eprintln!("{LISTENING_PREFIX}{}", server.local_endpoint());
    if refuses_remote_clients {
        eprintln!(
            "rgpu server: no token file, so only clients on this machine are admitted; \
             remote clients are refused until it is given a token file \
             (--token-file, RGPU_SERVER_TOKEN_FILE or token_file in the config file)"
        );
    }
    let ran = server.run();
    if let Some(home) = &workers_home {
        let _ = std::fs::remove_dir_all(home);
    }
    ran?;
    Ok(ExitCode::SUCCESS)
}

/// `rgpu server-worker`: one session's process, started and fed by `rgpu server`.
pub fn run_worker() -> Result<ExitCode, String> {
    rgpu_server::run_worker(|stop| {
        // SIGTERM (the listener stopping, or the service manager) ends the session in order.
        if let Ok(mut signals) = Signals::new([SIGINT, SIGTERM]) {
            let _ = std::thread::Builder::new()
                .name("rgpu-signals".into())
                .spawn(move || {
                    if signals.forever().next().is_some() {
                        stop.stop();
                    }
                });
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The server's TLS certificate and key, made (and logged) at the first start.
fn tls_identity(args: &ServerSettings, name: &str) -> Result<TlsIdentity, String> {
    let (default_cert, default_key) = rgpu_transport::tls::default_identity_paths();
    let cert = args.tls_cert.clone().unwrap_or(default_cert);
    let key = args.tls_key.clone().unwrap_or(default_key);
    let names = [name.to_string(), host_name()];
    let (identity, origin) = TlsIdentity::load_or_create(&cert, &key, &names)?;
    if origin == IdentityOrigin::Created {
        log::info!(
            "made a TLS key pair for this server: {} and {} (fingerprint {})",
            cert.display(),
            key.display(),
            identity.fingerprint()?
        );
    }
    Ok(identity)
}

/// The user to run workers as: the one named (only a root server can switch to another;
/// `root` keeps root, as asked); with none named, a root server's workers run as an
/// unprivileged user ([`WorkerUser::unprivileged`]), never as root; another server's run as
/// its own user.
fn worker_user(name: Option<&str>) -> Result<Option<WorkerUser>, String> {
    // SAFETY: plain system calls.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let user = match name {
        Some("root") if uid == 0 => {
            log::warn!("session workers run as root (worker_user = root)");
            return Ok(None);
        }
        Some(name) => WorkerUser::lookup(name).map_err(|e| format!("worker_user: {e}"))?,
        None if uid == 0 => {
            let mut user = WorkerUser::unprivileged().map_err(|e| format!("worker_user: {e}"))?;
            if user.dynamic_home {
                user.home = dynamic_home(user.uid, user.gid)?;
            }
            user
        }
        None => return Ok(None),
    };
    if uid == 0 || (uid == user.uid && gid == user.gid) {
        log::info!(
            "session workers run as {} (uid {}, gid {})",
            user.name,
            user.uid,
            user.gid
        );
        Ok(Some(user))
    } else {
        Err(format!(
            "worker_user: the server runs as uid {uid}, not root: it cannot start workers as {}",
            user.name
        ))
    }
}

/// A private home for workers of a dynamic user (caches): a fresh directory of an
/// unpredictable name in the temporary directory, theirs alone (mode 0700).
fn dynamic_home(uid: u32, gid: u32) -> Result<PathBuf, String> {
    use std::os::unix::ffi::OsStringExt;
    let template = std::env::temp_dir().join("rgpu-workers-XXXXXX");
    let mut raw = template.into_os_string().into_vec();
    raw.push(0);
    // SAFETY: a NUL-terminated template the call fills in place.
    let made = unsafe { libc::mkdtemp(raw.as_mut_ptr().cast()) };
    if made.is_null() {
        return Err(format!(
            "cannot make a home for the workers: {}",
            std::io::Error::last_os_error()
        ));
    }
    raw.pop();
    let home = PathBuf::from(std::ffi::OsString::from_vec(raw));
    std::os::unix::fs::chown(&home, Some(uid), Some(gid))
        .map_err(|e| format!("cannot give {} to uid {uid}: {e}", home.display()))?;
    Ok(home)
}

/// The program workers run: rgpu itself, through a descriptor this process keeps open when
/// they run as another user (who may not reach the path: a build under /root, say).
fn worker_program(other_user: bool) -> Result<PathBuf, String> {
    use std::os::fd::AsRawFd;
    let path = std::env::current_exe()
        .map_err(|e| format!("cannot locate rgpu itself to start workers: {e}"))?;
    if !other_user {
        return Ok(path);
    }
    // Close-on-exec: a worker's exec opens the file through it before it closes.
    let file = std::fs::File::open(&path)
        .map_err(|e| format!("cannot open {} to start workers: {e}", path.display()))?;
    // Far above the descriptors a worker's start sets up (its control socket is 3); kept
    // open for as long as the server runs.
    // SAFETY: duplicates a descriptor this function owns.
    let fd = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 100) };
    if fd < 0 {
        return Err(format!(
            "cannot keep {} open to start workers: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(PathBuf::from(format!("/proc/self/fd/{fd}")))
}

fn positive_seconds(name: &str, seconds: f64) -> Result<Duration, String> {
    if seconds.is_finite() && seconds > 0.0 {
        Ok(Duration::from_secs_f64(seconds))
    } else {
        Err(format!(
            "{name}: {seconds} is not a positive number of seconds"
        ))
    }
}

/// Whether only this machine can reach `endpoint` (a Unix socket or a loopback address).
fn is_local_only(endpoint: &Endpoint) -> bool {
    match endpoint {
        Endpoint::Unix(_) => true,
        Endpoint::Tcp(addr) => addr
            .to_socket_addrs()
            .map(|mut addrs| addrs.all(|a| a.ip().is_loopback()))
            .unwrap_or(false),
    }
}

fn host_name() -> String {
    rgpu_transport::host_name().unwrap_or_else(|| "rgpu-server".to_string())
}

/// The workers' NCCL environment: a server without a token serves only this machine's
/// clients, whose communicators' ranks are all here, so NCCL's bootstrap and socket transport
/// (NCCL's own protocol, unauthenticated) listen on loopback only, unless the server's
/// environment names an interface. A server with a token leaves NCCL's choice to
/// NCCL_SOCKET_IFNAME in its environment.
fn nccl_environment(token_given: bool) -> Vec<(String, String)> {
    match token_given || std::env::var_os("NCCL_SOCKET_IFNAME").is_some() {
        true => Vec::new(),
        false => vec![("NCCL_SOCKET_IFNAME".into(), "lo".into())],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_of_a_local_only_server_keep_nccl_on_loopback() {
        assert!(nccl_environment(true).is_empty());
        if std::env::var_os("NCCL_SOCKET_IFNAME").is_none() {
            let lo = ("NCCL_SOCKET_IFNAME".to_string(), "lo".to_string());
            assert_eq!(nccl_environment(false), vec![lo]);
        }
    }

    #[test]
    fn local_only_endpoints() {
        assert!(is_local_only(&Endpoint::parse("127.0.0.1:7450").unwrap()));
        assert!(is_local_only(
            &Endpoint::parse("unix:/tmp/rgpu.sock").unwrap()
        ));
        assert!(!is_local_only(&Endpoint::parse("0.0.0.0:7450").unwrap()));
    }
}
