//! What the listener shares with every session (and every session worker): the inventory, the
//! CUDA backend, the token and TLS identity, the quotas, the live sessions and their lanes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rgpu_protocol::LaneAttach;
use rgpu_transport::{tell_queued, Applicant, ServerSecurity, Stream, Token};

use crate::lanes::LaneRegistry;
use crate::limits::{Admission, Asking, ClientKey, Limits, Slot};
use crate::opencl::inventory::Inventory;
use crate::workers::WorkerPool;

/// How long a client may stay unreachable before its session ends, unless configured.
pub const DEFAULT_CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

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
    /// The sessions' exports of device memory for other servers to pull, and this process's
    /// links to other servers.
    pub fabric: Arc<crate::fabric::Fabric>,
    /// The session workers, when sessions run in processes of their own.
    pub workers: Option<Arc<WorkerPool>>,
    /// How long a client may stay unreachable before its connections fail.
    pub client_timeout: Duration,
    /// The quotas, and the count of live sessions they limit.
    pub limits: Limits,
    pub admission: Arc<Admission>,
    /// The connections that have not authenticated yet (capped).
    pub handshakes: Arc<crate::handshakes::Handshakes>,
    /// The abstract Unix socket clients on this host may use instead of TCP (`@name`).
    pub local_socket: Option<String>,
    /// Clients on this host of this user (or root) may operate the server.
    pub operator_uid: Option<u32>,
    /// Each live session's writer, for messages the server sends its client unasked
    /// (`MoveTo`).
    writers: Mutex<HashMap<u64, Arc<crate::writer::Writer>>>,
    /// In a session worker: passes an operator's move order to the listener, which tells
    /// every session's worker (see `workers::process`); the sessions told.
    pub move_relay: std::sync::OnceLock<MoveRelay>,
}

/// How a session worker has the listener tell every session to move.
pub(crate) type MoveRelay = Box<dyn Fn(&str, Duration) -> Result<(u32, u32), String> + Send + Sync>;

/// A new session's id: random (63 bits, never 0), since a data lane names its session by id
/// before it proves anything: a sequential id would let anyone aim lane handshakes at a live
/// session's worker.
pub(crate) fn new_session_id() -> u64 {
    let key = rgpu_transport::random_lane_key();
    let id = u64::from_le_bytes(key[..8].try_into().expect("8 bytes")) >> 1;
    id.max(1)
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
            fabric: Default::default(),
            workers: None,
            client_timeout: DEFAULT_CLIENT_TIMEOUT,
            limits: Limits::default(),
            admission: Arc::default(),
            handshakes: Arc::default(),
            local_socket: None,
            operator_uid: None,
            writers: Mutex::new(HashMap::new()),
            move_relay: std::sync::OnceLock::new(),
        }
    }

    /// Decides a handshake's admission: a data lane goes to `join_lane`, a new session takes
    /// a place in `slot` if the session limits leave one.
    pub fn admit(
        &self,
        applicant: &Applicant,
        stream: &Stream,
        slot: &mut Option<Slot>,
        join_lane: impl FnOnce(&LaneAttach, &Stream) -> Result<(), String>,
    ) -> Result<(), String> {
        match &applicant.lane {
            Some(lane) => join_lane(lane, stream),
            None => {
                // A refusal is logged with the handshake's outcome.
                let queued = |ahead: usize| {
                    let _ = tell_queued(stream, ahead as u32);
                };
                *slot = Some(self.admit_session(
                    stream.peer_ip(),
                    &applicant.application,
                    applicant.wait,
                    queued,
                )?);
                Ok(())
            }
        }
    }

    /// A place for a new session of `application` from `peer` (`None`: a Unix socket), if
    /// the session limits leave one; with exclusive use, once the application's turn has come
    /// (within `wait`; `queued` hears how many wait before it).
    pub fn admit_session(
        &self,
        peer: Option<std::net::IpAddr>,
        application: &str,
        wait: Duration,
        queued: impl FnMut(usize),
    ) -> Result<Slot, String> {
        let client = match peer {
            Some(ip) => ClientKey::Address(ip),
            None => ClientKey::Local,
        };
        let asking = Asking {
            client,
            application,
            wait,
        };
        self.admission.admit(&self.limits, asking, queued)
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
        self.writers_lock().remove(&id);
    }

    /// Keeps the session's writer for messages sent unasked (until `unregister`).
    pub fn register_writer(&self, id: u64, writer: &Arc<crate::writer::Writer>) {
        self.writers_lock().insert(id, writer.clone());
    }

    fn writers_lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<crate::writer::Writer>>> {
        self.writers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the client of each session of this process but `except` to move to `to`, then
    /// waits up to `wait` for those sessions to end: (told, ended).
    pub fn move_sessions(&self, except: u64, to: &str, wait: Duration) -> (u32, u32) {
        let told = self.tell_to_move(except, to);
        let gone = wait_until_ended(&told, wait, |id| !self.writers_lock().contains_key(&id));
        (told.len() as u32, gone)
    }

    /// Tells the client of each session of this process but `except` to move to `to`: the
    /// sessions told.
    pub fn tell_to_move(&self, except: u64, to: &str) -> Vec<u64> {
        let writers: Vec<(u64, Arc<crate::writer::Writer>)> = self
            .writers_lock()
            .iter()
            .filter(|(id, _)| **id != except)
            .map(|(id, w)| (*id, w.clone()))
            .collect();
        let order = rgpu_protocol::ServerMsg::MoveTo {
            endpoint: to.to_string(),
        };
        let mut told = Vec::new();
        for (id, writer) in writers {
            match writer.send(&order, 0, &[]) {
                Ok(()) => {
                    log::info!("session {id}: told to move to {to}");
                    told.push(id);
                }
                Err(e) => log::warn!("session {id}: cannot tell it to move: {e}"),
            }
        }
        told
    }

    pub(crate) fn streams_lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Stream>> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops this process's sessions: they end as at shutdown (a session worker's way to stop).
    pub fn stop_sessions(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.end_sessions();
    }

    /// Wakes every session's request thread with a closed socket.
    pub(crate) fn end_sessions(&self) {
        for stream in self.streams_lock().values() {
            stream.shutdown();
        }
        self.lanes.shutdown();
    }
}

/// Waits up to `wait` until every session of `ids` has ended (`ended(id)`): how many have.
pub(crate) fn wait_until_ended(ids: &[u64], wait: Duration, ended: impl Fn(u64) -> bool) -> u32 {
    let deadline = std::time::Instant::now() + wait;
    loop {
        let gone = ids.iter().filter(|&&id| ended(id)).count() as u32;
        if gone as usize == ids.len() || std::time::Instant::now() >= deadline {
            return gone;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
