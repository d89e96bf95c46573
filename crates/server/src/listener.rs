//! The accept loop and what the sessions of one server share.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rgpu_protocol::LaneAttach;
use rgpu_transport::{Listener, ServerSecurity, Stream, Token};

use crate::lanes::LaneRegistry;
use crate::limits::{Admission, ClientKey, Limits, Slot};
use crate::opencl::inventory::Inventory;
use crate::workers::WorkerPool;

/// How often the accept loop looks at the shutdown flag.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How long a client may stay unreachable before its session ends, unless configured.
pub const DEFAULT_CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
/// The shortest time a write to a client may block (a client that stopped reading).
const MIN_WRITE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long shutdown waits for sessions to release their objects.
const SESSION_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) struct Shared {
    pub inventory: Arc<Inventory>,
    /// The CUDA backend, where the machine has a CUDA driver.
    pub cuda: Option<Arc<crate::cuda::Backend>>,
    pub token: Option<Token>,
    /// TLS, and where plaintext is accepted.
    pub security: ServerSecurity,
    pub name: String,
    pub stop: AtomicBool,
    /// A handle on each live session's socket, to end them at shutdown.
    streams: Mutex<HashMap<u64, Stream>>,
    /// The data lanes of the live sessions.
    pub lanes: LaneRegistry,
    next_session: AtomicU64,
    /// The session workers, when sessions run in processes of their own.
    pub workers: Option<Arc<WorkerPool>>,
    /// How long a client may stay unreachable before its connections fail.
    pub client_timeout: Duration,
    /// The quotas, and the count of live sessions they limit.
    pub limits: Limits,
    pub admission: Arc<Admission>,
}

impl Shared {
    pub fn new(
        inventory: Inventory,
        cuda: Option<crate::cuda::Backend>,
        token: Option<Token>,
        name: String,
    ) -> Shared {
        Shared {
            inventory: Arc::new(inventory),
            cuda: cuda.map(Arc::new),
            token,
            security: ServerSecurity::default(),
            name,
            stop: AtomicBool::new(false),
            streams: Mutex::new(HashMap::new()),
            lanes: LaneRegistry::default(),
            next_session: AtomicU64::new(1),
            workers: None,
            client_timeout: DEFAULT_CLIENT_TIMEOUT,
            limits: Limits::default(),
            admission: Arc::default(),
        }
    }

    /// Decides a handshake's admission: a data lane goes to `join_lane`, a new session takes
    /// a place in `slot` if the session limits leave one.
    pub fn admit(
        &self,
        lane: Option<&LaneAttach>,
        stream: &Stream,
        slot: &mut Option<Slot>,
        join_lane: impl FnOnce(&LaneAttach, &Stream) -> Result<(), String>,
    ) -> Result<(), String> {
        match lane {
            Some(lane) => join_lane(lane, stream),
            None => {
                // A refusal is logged with the handshake's outcome.
                *slot = Some(self.admit_session(stream.peer_ip())?);
                Ok(())
            }
        }
    }

    /// A place for a new session from `peer` (`None`: a Unix socket), if the session limits
    /// leave one.
    pub fn admit_session(&self, peer: Option<std::net::IpAddr>) -> Result<Slot, String> {
        let client = match peer {
            Some(ip) => ClientKey::Address(ip),
            None => ClientKey::Local,
        };
        self.admission.admit(&self.limits, client)
    }

    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    pub fn register(&self, id: u64, stream: &Stream) {
        if let Ok(clone) = stream.try_clone() {
            self.streams_lock().insert(id, clone);
        }
    }

    pub fn unregister(&self, id: u64) {
        self.streams_lock().remove(&id);
    }

    fn streams_lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Stream>> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops this process's sessions: they end as at shutdown (a session worker's way to stop).
    pub fn stop_sessions(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.end_sessions();
    }

    /// Wakes every session's request thread with a closed socket.
    fn end_sessions(&self) {
        for stream in self.streams_lock().values() {
            stream.shutdown();
        }
        self.lanes.shutdown();
    }
}

/// Accepts connections until the stop flag is set, one session thread each; then ends the
/// sessions and waits (bounded) for them to clean up.
pub(crate) fn accept_loop(listener: &Listener, shared: &Arc<Shared>) {
    let mut sessions: Vec<JoinHandle<()>> = Vec::new();
    while !shared.stopping() {
        match listener.accept() {
            Ok(stream) => {
                if let Err(e) = bound_waits(&stream, shared.client_timeout) {
                    log::warn!(
                        "{}: cannot set up the connection: {e}",
                        stream.peer_description()
                    );
                    continue;
                }
                let id = shared.next_session.fetch_add(1, Ordering::SeqCst);
                let session_shared = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("rgpu-s{id}"))
                    .spawn(move || match session_shared.workers.clone() {
                        Some(workers) => serve_in_worker(stream, &session_shared, &workers, id),
                        None => crate::session::run(stream, session_shared, id),
                    });
                match spawned {
                    Ok(handle) => sessions.push(handle),
                    Err(e) => log::error!("cannot start a session thread: {e}"),
                }
                sessions.retain(|s| !s.is_finished());
            }
            // Woken at once by a connection; every POLL_INTERVAL to look at the stop flag.
            Err(e) if e.kind() == ErrorKind::WouldBlock => listener.wait_readable(POLL_INTERVAL),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                log::warn!("accept failed: {e}");
                std::thread::sleep(POLL_INTERVAL);
            }
        }
    }
    log::info!(
        "shutting down: closing {} session(s)",
        shared.streams_lock().len()
    );
    shared.end_sessions();
    if let Some(workers) = &shared.workers {
        workers.shutdown();
    }
    let deadline = Instant::now() + SESSION_DRAIN_TIMEOUT;
    while sessions.iter().any(|s| !s.is_finished()) {
        if Instant::now() > deadline {
            log::warn!("some sessions did not finish cleaning up in time");
            return;
        }
        // Sessions that registered after end_sessions ran are ended here too.
        shared.end_sessions();
        std::thread::sleep(Duration::from_millis(20));
    }
    for session in sessions {
        let _ = session.join();
    }
    log::info!("server stopped");
}

/// Reads a connection's preamble here, then hands it to a worker process: a new session to a
/// worker of its own (which runs the rest of the handshake and, once admitted, serves it), a
/// data lane to its session's worker. Returns when the session's worker has ended (or was
/// given back to the pool, the handshake having failed).
fn serve_in_worker(mut stream: Stream, shared: &Shared, workers: &Arc<WorkerPool>, id: u64) {
    shared.register(id, &stream);
    let route = if shared.stopping() {
        None
    } else {
        crate::session::preamble(&mut stream, shared)
    };
    // The worker owns the connection from here on; the listener keeps no handle on it.
    shared.unregister(id);
    let Some(route) = route else {
        stream.shutdown();
        return;
    };
    match route.lane_of {
        Some(session) => workers.route_lane(session, route, stream),
        None => workers.serve(stream, route, shared, id),
    }
}

/// Bounds every wait on a client's connection (its fd keeps these settings in the session's
/// worker): a client that vanished is noticed within `client_timeout`, and a write to a client
/// that stopped reading fails after four times that (at least two minutes: a program stopped
/// in a debugger is not a dead one).
fn bound_waits(stream: &Stream, client_timeout: Duration) -> std::io::Result<()> {
    stream.set_liveness(client_timeout)?;
    stream.set_write_timeout(Some((client_timeout * 4).max(MIN_WRITE_TIMEOUT)))
}
