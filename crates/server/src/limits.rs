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

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
}

/// Who a session belongs to, for the per-client limit.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ClientKey {
    Address(IpAddr),
    Local,
}

/// The listener's count of live sessions.
#[derive(Default)]
pub(crate) struct Admission {
    live: Mutex<(usize, HashMap<ClientKey, usize>)>,
}

/// A place taken by a live session; dropping it gives the place back.
pub(crate) struct Slot {
    admission: Arc<Admission>,
    client: ClientKey,
}

impl Admission {
    /// Takes a place for a new session of `client`, if the limits leave one.
    pub fn admit(self: &Arc<Self>, limits: &Limits, client: ClientKey) -> Result<Slot, String> {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let (total, per_client) = &mut *live;
        if limits.max_sessions > 0 && *total >= limits.max_sessions {
            return Err(format!(
                "this rgpu server is full: {total} sessions, its limit (max_sessions)"
            ));
        }
        let mine = per_client.entry(client.clone()).or_default();
        if limits.max_sessions_per_client > 0 && *mine >= limits.max_sessions_per_client {
            return Err(format!(
                "this client already has {mine} sessions on this rgpu server, its limit \
                 (max_sessions_per_client)"
            ));
        }
        *mine += 1;
        *total += 1;
        Ok(Slot {
            admission: self.clone(),
            client,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut live = self
            .admission
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (total, per_client) = &mut *live;
        *total = total.saturating_sub(1);
        if let Some(mine) = per_client.get_mut(&self.client) {
            *mine = mine.saturating_sub(1);
            if *mine == 0 {
                per_client.remove(&self.client);
            }
        }
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

/// Closes a session that has sent no request for `timeout`: a watchdog thread shuts the
/// connection down when the session thread has been waiting for the next request that long.
pub(crate) struct IdleClock {
    start: std::time::Instant,
    /// Milliseconds since `start` when the session thread last began waiting for a request;
    /// `u64::MAX` while it carries one out.
    waiting_since: AtomicU64,
    ended: AtomicBool,
    /// Set when the watchdog closed the session.
    fired: AtomicBool,
}

impl IdleClock {
    /// Starts the watchdog for a session whose connection `stream` is.
    pub fn start(
        session: u64,
        timeout: Duration,
        stream: rgpu_transport::Stream,
    ) -> Arc<IdleClock> {
        let clock = Arc::new(IdleClock {
            start: std::time::Instant::now(),
            waiting_since: AtomicU64::new(0),
            ended: AtomicBool::new(false),
            fired: AtomicBool::new(false),
        });
        let watched = clock.clone();
        let tick = (timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let spawned = std::thread::Builder::new()
            .name(format!("rgpu-idle{session}"))
            .spawn(move || {
                while !watched.ended.load(Ordering::Acquire) {
                    std::thread::sleep(tick);
                    let since = watched.waiting_since.load(Ordering::Acquire);
                    let now = watched.start.elapsed().as_millis() as u64;
                    if since != u64::MAX && now.saturating_sub(since) >= timeout.as_millis() as u64
                    {
                        log::info!(
                            "session {session}: no request for {:.0} s (idle_timeout); closing it",
                            timeout.as_secs_f64()
                        );
                        watched.fired.store(true, Ordering::Release);
                        stream.shutdown();
                        return;
                    }
                }
            });
        if let Err(e) = spawned {
            log::warn!("session {session}: no idle watchdog: {e}");
        }
        clock
    }

    /// The session thread waits for the next request from now on.
    pub fn waiting(&self) {
        let now = self.start.elapsed().as_millis() as u64;
        self.waiting_since.store(now, Ordering::Release);
    }

    /// The session thread carries out a request.
    pub fn working(&self) {
        self.waiting_since.store(u64::MAX, Ordering::Release);
    }

    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }

    pub fn end(&self) {
        self.ended.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let a1 = admission.admit(&limits, ClientKey::Address(a)).unwrap();
        let _a2 = admission.admit(&limits, ClientKey::Address(a)).unwrap();
        let err = admission
            .admit(&limits, ClientKey::Address(a))
            .err()
            .unwrap();
        assert!(err.contains("max_sessions_per_client"), "{err}");
        let _b1 = admission.admit(&limits, ClientKey::Address(b)).unwrap();
        let err = admission.admit(&limits, ClientKey::Local).err().unwrap();
        assert!(err.contains("full"), "{err}");
        drop(a1);
        assert!(admission.admit(&limits, ClientKey::Local).is_ok());
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
