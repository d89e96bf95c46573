//! Quotas: what one client, and all of them together, may hold on a server.
//!
//! - Sessions, in all and per client address, are counted by the listener ([`Admission`]): a
//!   connection over the limit is refused at the handshake with the reason, which the client
//!   library logs (its program sees no device of that server).
//! - Device memory and objects are counted per session ([`Usage`]) where they are created:
//!   OpenCL buffers and images, CUDA allocations (plain, stream-ordered, VMM) count their bytes
//!   (on a CPU device that is host memory of the server); every object counts one. Over a
//!   limit, the creation fails with the API's own out-of-resources error
//!   (`CL_OUT_OF_RESOURCES`, `CL_OUT_OF_HOST_MEMORY`, `CUDA_ERROR_OUT_OF_MEMORY`), and the
//!   server logs it once per session and kind.
//! - An idle session (no request for `idle_timeout`) is closed.
//! - With `exclusive` set, the server's devices are used by one application at a time
//!   ([`Lease`]): the sessions of the application that holds them come in; another
//!   application's wait in a bounded FIFO queue, up to what their client asked for and the
//!   server allows, and are told how many wait before them.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The server's quotas. Zero (or `None`) means no limit.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Limits {
    /// Sessions at once, from all clients.
    pub max_sessions: usize,
    /// Sessions at once from one client address (one IP; every Unix-socket client is one).
    pub max_sessions_per_client: usize,
    /// A session with no request for this long is closed.
    pub idle_timeout: Option<Duration>,
    /// Bytes of device memory (buffers, images, allocations) one session may hold.
    pub session_memory: u64,
    /// Objects (contexts, queues, buffers, kernels, events, streams, ...) one session may hold.
    pub session_objects: usize,
    /// `Some`: the devices are used by one application at a time.
    pub exclusive: Option<Exclusive>,
}

/// How applications queue for a server whose devices are used exclusively.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Exclusive {
    /// Applications that may wait at once; one more is refused.
    pub queue: usize,
    /// The longest any client waits, whatever it asked for.
    pub max_wait: Duration,
}

/// Who a session belongs to, for the per-client limit.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ClientKey {
    Address(IpAddr),
    Local,
}

/// Who asks for a session: the client's address, its application and how long it waits for
/// exclusive use.
pub(crate) struct Asking<'a> {
    pub client: ClientKey,
    pub application: &'a str,
    pub wait: Duration,
}

/// How long a session over a limit waits for the places of sessions whose clients have gone
/// (their workers releasing what they held): a program started right after the one before it
/// ended is not refused because the server had not finished cleaning up after it.
const ENDING_WAIT: Duration = Duration::from_secs(10);

/// The listener's count of live sessions, and the lease of exclusive use.
#[derive(Default)]
pub(crate) struct Admission {
    live: Mutex<Live>,
    /// Signalled whenever a place comes back.
    freed: Condvar,
    lease: Arc<Lease>,
}

/// Live sessions, in all and per client; of them, `ending` have lost their client and give
/// their place back once their worker has released what they held.
#[derive(Default)]
struct Live {
    total: Places,
    per_client: HashMap<ClientKey, Places>,
}

#[derive(Clone, Copy, Default)]
struct Places {
    live: usize,
    ending: usize,
}

/// A place taken by a live session; dropping it gives the place back (and its share of the
/// lease).
pub(crate) struct Slot {
    admission: Arc<Admission>,
    client: ClientKey,
    ending: bool,
    _held: Option<Held>,
}

impl Admission {
    /// Takes a place for a new session, if the limits leave one, after waiting (and calling
    /// `queued` with the number of applications ahead whenever it changes) for exclusive use
    /// where the server has it.
    pub fn admit(
        self: &Arc<Self>,
        limits: &Limits,
        asking: Asking<'_>,
        queued: impl FnMut(usize),
    ) -> Result<Slot, String> {
        let held = match &limits.exclusive {
            Some(exclusive) => Some(self.lease.acquire(
                asking.application,
                asking.wait.min(exclusive.max_wait),
                exclusive.queue,
                queued,
            )?),
            None => None,
        };
        let client = asking.client;
        let deadline = Instant::now() + ENDING_WAIT;
        let mut live = self.lock();
        loop {
            let total = live.total;
            let mine = live.per_client.get(&client).copied().unwrap_or_default();
            let refusal = if limits.max_sessions > 0 && total.live >= limits.max_sessions {
                Some((
                    total.ending,
                    format!(
                        "this rgpu server is full: {} sessions, its limit (max_sessions)",
                        total.live
                    ),
                ))
            } else if limits.max_sessions_per_client > 0
                && mine.live >= limits.max_sessions_per_client
            {
                Some((
                    mine.ending,
                    format!(
                        "this client already has {} sessions on this rgpu server, its limit \
                         (max_sessions_per_client)",
                        mine.live
                    ),
                ))
            } else {
                None
            };
            let Some((ending, refusal)) = refusal else {
                break;
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if ending == 0 || left.is_zero() {
                return Err(refusal);
            }
            live = self
                .freed
                .wait_timeout(live, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        live.total.live += 1;
        live.per_client.entry(client.clone()).or_default().live += 1;
        Ok(Slot {
            admission: self.clone(),
            client,
            ending: false,
            _held: held,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Slot {
    /// Its session's client has gone: a session over a limit may wait for this place, which
    /// comes back once the worker has released what the session held.
    pub fn ending(&mut self) {
        if std::mem::replace(&mut self.ending, true) {
            return;
        }
        let mut live = self.admission.lock();
        live.total.ending += 1;
        live.per_client
            .entry(self.client.clone())
            .or_default()
            .ending += 1;
    }
}

/// Exclusive use of the server's devices: held by one application (by as many of its
/// sessions as it opens) at a time; other applications wait their turn, first come first
/// served.
#[derive(Default)]
pub(crate) struct Lease {
    state: Mutex<LeaseState>,
    changed: Condvar,
}

#[derive(Default)]
struct LeaseState {
    /// The application that holds the devices, and how many of its sessions are live.
    holder: Option<(String, usize)>,
    /// Waiting applications' tickets, oldest first.
    queue: VecDeque<(u64, String)>,
    next_ticket: u64,
}

/// One session's share of the lease; the last one dropped frees the devices.
pub(crate) struct Held {
    lease: Arc<Lease>,
}

impl Lease {
    fn lock(&self) -> MutexGuard<'_, LeaseState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A share of the lease for `application`: at once if it holds the devices or nobody
    /// does (and nobody waits), else after the applications queued before it, within `wait`.
    fn acquire(
        self: &Arc<Self>,
        application: &str,
        wait: Duration,
        queue_limit: usize,
        mut queued: impl FnMut(usize),
    ) -> Result<Held, String> {
        let mut state = self.lock();
        if state.take(application, None) {
            return Ok(Held {
                lease: self.clone(),
            });
        }
        let holder = state.holder_name();
        if wait.is_zero() {
            return Err(format!(
                "this server's devices are in exclusive use by {holder}; not waiting \
                 (RGPU_EXCLUSIVE_WAIT=0)"
            ));
        }
        let waiting: usize = state
            .queue
            .iter()
            .filter(|(_, app)| app != application)
            .count();
        if waiting >= queue_limit {
            return Err(format!(
                "this server's devices are in exclusive use by {holder} and {waiting} \
                 applications wait for them, its limit (exclusive_queue)"
            ));
        }
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.queue.push_back((ticket, application.to_string()));
        log::info!(
            "application {application} waits up to {} s for exclusive use of the devices, \
             held by {holder}",
            wait.as_secs()
        );
        let deadline = Instant::now() + wait;
        let mut told = None;
        loop {
            if state.take(application, Some(ticket)) {
                drop(state);
                log::info!("application {application} has the devices now (exclusive use)");
                self.changed.notify_all();
                return Ok(Held {
                    lease: self.clone(),
                });
            }
            let ahead = state.position(ticket);
            if told != Some(ahead) {
                told = Some(ahead);
                // Not under the lock: the callback writes to the client.
                drop(state);
                queued(ahead);
                state = self.lock();
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                state.queue.retain(|(t, _)| *t != ticket);
                let holder = state.holder_name();
                drop(state);
                self.changed.notify_all();
                return Err(format!(
                    "waited {} s for this server's devices, in exclusive use by {holder}",
                    wait.as_secs()
                ));
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl LeaseState {
    /// Gives `application` a share if it holds the lease, or if nobody does and it is first
    /// in the queue (`ticket`; `None`: only if nobody waits). Its ticket leaves the queue.
    fn take(&mut self, application: &str, ticket: Option<u64>) -> bool {
        let granted = match &mut self.holder {
            Some((holder, sessions)) if holder == application => {
                *sessions += 1;
                true
            }
            Some(_) => false,
            None => {
                let first = self.queue.front().map(|(t, _)| *t);
                if first == ticket {
                    self.holder = Some((application.to_string(), 1));
                    true
                } else {
                    false
                }
            }
        };
        if granted {
            if let Some(ticket) = ticket {
                self.queue.retain(|(t, _)| *t != ticket);
            }
        }
        granted
    }

    /// How many applications wait before `ticket`.
    fn position(&self, ticket: u64) -> usize {
        self.queue.iter().take_while(|(t, _)| *t != ticket).count()
    }

    fn holder_name(&self) -> String {
        match &self.holder {
            Some((application, _)) => format!("application {application}"),
            None => "an application ahead in the queue".into(),
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut state = self.lease.lock();
        if let Some((_, sessions)) = &mut state.holder {
            *sessions -= 1;
            if *sessions == 0 {
                state.holder = None;
            }
        }
        drop(state);
        self.lease.changed.notify_all();
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let ending = usize::from(self.ending);
        let mut live = self.admission.lock();
        let Live { total, per_client } = &mut *live;
        for places in std::iter::once(total).chain(per_client.get_mut(&self.client)) {
            places.live = places.live.saturating_sub(1);
            places.ending = places.ending.saturating_sub(ending);
        }
        if per_client
            .get(&self.client)
            .is_some_and(|mine| mine.live == 0)
        {
            per_client.remove(&self.client);
        }
        drop(live);
        self.admission.freed.notify_all();
    }
}

/// One session's memory and objects, against its limits. Shared by the session's OpenCL
/// tables and its CUDA state.
pub(crate) struct Usage {
    session: u64,
    memory_limit: u64,
    object_limit: usize,
    memory: AtomicU64,
    objects: AtomicUsize,
    memory_logged: AtomicBool,
    objects_logged: AtomicBool,
}

impl Usage {
    pub fn new(session: u64, limits: &Limits) -> Arc<Usage> {
        Arc::new(Usage {
            session,
            memory_limit: limits.session_memory,
            object_limit: limits.session_objects,
            memory: AtomicU64::new(0),
            objects: AtomicUsize::new(0),
            memory_logged: AtomicBool::new(false),
            objects_logged: AtomicBool::new(false),
        })
    }

    /// Counts `bytes` more device memory, or refuses them (`false`) when that would pass the
    /// limit.
    pub fn charge_memory(&self, bytes: u64) -> bool {
        let update = self
            .memory
            .try_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                let after = held.checked_add(bytes)?;
                (self.memory_limit == 0 || after <= self.memory_limit).then_some(after)
            });
        if let Err(held) = update {
            if !self.memory_logged.swap(true, Ordering::Relaxed) {
                log::warn!(
                    "session {}: memory quota: holds {held} bytes, asked for {bytes} more, \
                     limit {} (session_memory); refused",
                    self.session,
                    self.memory_limit
                );
            }
            return false;
        }
        true
    }

    /// Device memory held now.
    pub fn memory(&self) -> u64 {
        self.memory.load(Ordering::Relaxed)
    }

    /// Objects held now.
    pub fn objects(&self) -> usize {
        self.objects.load(Ordering::Relaxed)
    }

    pub fn refund_memory(&self, bytes: u64) {
        let _ = self
            .memory
            .try_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held.saturating_sub(bytes))
            });
    }

    /// Whether one more object fits.
    pub fn has_room_for_object(&self) -> bool {
        let room =
            self.object_limit == 0 || self.objects.load(Ordering::Acquire) < self.object_limit;
        if !room && !self.objects_logged.swap(true, Ordering::Relaxed) {
            log::warn!(
                "session {}: object quota: holds {} objects, limit {} (session_objects); \
                 refused",
                self.session,
                self.object_limit,
                self.object_limit
            );
        }
        room
    }

    pub fn add_objects(&self, count: usize) {
        self.objects.fetch_add(count, Ordering::AcqRel);
    }

    pub fn remove_objects(&self, count: usize) {
        let _ = self
            .objects
            .try_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held.saturating_sub(count))
            });
    }
}

/// Parses a size such as `4096`, `512M`, `16G` or `1.5T` (binary units: K = 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| c.is_ascii_alphabetic()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let scale: u64 = match unit.trim().to_ascii_uppercase().trim_end_matches("IB") {
        "" | "B" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        other => {
            return Err(format!(
                "{text:?}: unknown size unit {other:?} (K, M, G or T)"
            ))
        }
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a size (e.g. 4096, 512M, 16G)"))?;
    if !(value.is_finite() && value >= 0.0) {
        return Err(format!("{text:?} is not a size"));
    }
    Ok((value * scale as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asking(client: ClientKey, application: &str) -> Asking<'_> {
        Asking {
            client,
            application,
            wait: Duration::from_secs(30),
        }
    }

    fn exclusive(queue: usize) -> Limits {
        Limits {
            exclusive: Some(Exclusive {
                queue,
                max_wait: Duration::from_secs(60),
            }),
            ..Limits::default()
        }
    }

    /// A session of `application` asking on a thread of its own (ending at once when admitted),
    /// and what it is told while it waits.
    fn waiting(
        admission: &Arc<Admission>,
        limits: &Limits,
        application: &'static str,
    ) -> (
        std::thread::JoinHandle<Result<(), String>>,
        std::sync::mpsc::Receiver<usize>,
    ) {
        let (told, heard) = std::sync::mpsc::channel();
        let (admission, limits) = (admission.clone(), limits.clone());
        let thread = std::thread::spawn(move || {
            admission
                .admit(&limits, asking(ClientKey::Local, application), |ahead| {
                    let _ = told.send(ahead);
                })
                .map(|_slot| ())
        });
        (thread, heard)
    }

    /// One application's sessions share the devices; another's waits its turn, told how many
    /// wait before it, and comes in when the first application's last session ends.
    #[test]
    fn exclusive_use_goes_to_one_application_at_a_time() {
        let admission = Arc::new(Admission::default());
        let limits = exclusive(4);
        let a1 = admission
            .admit(&limits, asking(ClientKey::Local, "a"), |_| {})
            .unwrap();
        let a2 = admission
            .admit(&limits, asking(ClientKey::Local, "a"), |_| {})
            .unwrap();
        let no_wait = Asking {
            wait: Duration::ZERO,
            ..asking(ClientKey::Local, "b")
        };
        let err = admission.admit(&limits, no_wait, |_| {}).err().unwrap();
        assert!(err.contains("exclusive use by application a"), "{err}");

        let (b, heard_b) = waiting(&admission, &limits, "b");
        assert_eq!(heard_b.recv().unwrap(), 0, "b waits first in the queue");
        let (c, heard_c) = waiting(&admission, &limits, "c");
        assert_eq!(heard_c.recv().unwrap(), 1, "c waits behind b");
        drop(a1);
        // a still has a session: b keeps waiting.
        assert!(heard_b.recv_timeout(Duration::from_millis(200)).is_err());
        drop(a2);
        b.join().unwrap().unwrap();
        // b came in and (its thread done) left; c, told it is first now, follows.
        c.join().unwrap().unwrap();
        // (Told it is first once b came in, unless b had already left when c looked.)
        assert!(heard_c.try_iter().all(|ahead| ahead == 0));
    }

    #[test]
    fn exclusive_waits_are_bounded() {
        let admission = Arc::new(Admission::default());
        let mut limits = exclusive(1);
        let a = admission
            .admit(&limits, asking(ClientKey::Local, "a"), |_| {})
            .unwrap();
        limits.exclusive.as_mut().unwrap().max_wait = Duration::from_millis(100);
        let err = admission
            .admit(&limits, asking(ClientKey::Local, "b"), |_| {})
            .err()
            .unwrap();
        assert!(
            err.contains("waited") && err.contains("application a"),
            "{err}"
        );
        // A queue that is full refuses at once.
        limits.exclusive.as_mut().unwrap().max_wait = Duration::from_secs(60);
        let (b, heard_b) = waiting(&admission, &limits, "b");
        heard_b.recv().unwrap();
        let err = admission
            .admit(&limits, asking(ClientKey::Local, "c"), |_| {})
            .err()
            .unwrap();
        assert!(err.contains("exclusive_queue"), "{err}");
        drop(a);
        b.join().unwrap().unwrap();
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("16G").unwrap(), 16 << 30);
        assert_eq!(parse_size("1.5 GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("0").unwrap(), 0);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1G").is_err());
    }

    #[test]
    fn sessions_are_admitted_up_to_the_limits_and_places_come_back() {
        let admission = Arc::new(Admission::default());
        let limits = Limits {
            max_sessions: 3,
            max_sessions_per_client: 2,
            ..Limits::default()
        };
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = admission
            .admit(&limits, asking(ClientKey::Address(a), "app"), |_| {})
            .unwrap();
        let _a2 = admission
            .admit(&limits, asking(ClientKey::Address(a), "app"), |_| {})
            .unwrap();
        let err = admission
            .admit(&limits, asking(ClientKey::Address(a), "app"), |_| {})
            .err()
            .unwrap();
        assert!(err.contains("max_sessions_per_client"), "{err}");
        let _b1 = admission
            .admit(&limits, asking(ClientKey::Address(b), "app"), |_| {})
            .unwrap();
        let err = admission
            .admit(&limits, asking(ClientKey::Local, "app"), |_| {})
            .err()
            .unwrap();
        assert!(err.contains("full"), "{err}");
        drop(a1);
        assert!(admission
            .admit(&limits, asking(ClientKey::Local, "app"), |_| {})
            .is_ok());
    }

    /// Over a limit, a session waits for the place of one whose client has gone (its worker
    /// cleaning up), and comes in when that place comes back; with none ending it is refused
    /// at once.
    #[test]
    fn a_session_over_a_limit_waits_for_ending_ones() {
        let admission = Arc::new(Admission::default());
        let limits = Limits {
            max_sessions_per_client: 1,
            ..Limits::default()
        };
        let mut first = admission
            .admit(&limits, asking(ClientKey::Local, "app"), |_| {})
            .unwrap();
        let started = Instant::now();
        let err = admission
            .admit(&limits, asking(ClientKey::Local, "app"), |_| {})
            .err()
            .unwrap();
        assert!(err.contains("max_sessions_per_client"), "{err}");
        assert!(
            started.elapsed() < ENDING_WAIT / 2,
            "refused without waiting"
        );
        first.ending();
        let next = std::thread::spawn({
            let (admission, limits) = (admission.clone(), limits.clone());
            move || {
                admission
                    .admit(&limits, asking(ClientKey::Local, "app"), |_| {})
                    .map(|_slot| ())
            }
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !next.is_finished(),
            "it waits for the ending session's place"
        );
        drop(first);
        next.join().unwrap().unwrap();
        let live = admission.lock();
        assert_eq!((live.total.live, live.total.ending), (0, 0));
        assert!(live.per_client.is_empty());
    }

    #[test]
    fn usage_refuses_past_the_limits() {
        let limits = Limits {
            session_memory: 1000,
            session_objects: 2,
            ..Limits::default()
        };
        let usage = Usage::new(1, &limits);
        assert!(usage.charge_memory(600));
        assert!(!usage.charge_memory(600));
        usage.refund_memory(600);
        assert!(usage.charge_memory(1000));
        assert!(usage.has_room_for_object());
        usage.add_objects(2);
        assert!(!usage.has_room_for_object());
        usage.remove_objects(1);
        assert!(usage.has_room_for_object());
        let unlimited = Usage::new(2, &Limits::default());
        assert!(unlimited.charge_memory(u64::MAX / 2));
        unlimited.add_objects(1 << 20);
        assert!(unlimited.has_room_for_object());
    }
}
