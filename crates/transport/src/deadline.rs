//! Deadlines for a whole exchange (a handshake): a peer that sends a byte every few seconds
//! passes every per-read timeout, so one watchdog thread per process shuts down a connection
//! whose exchange is not over by its deadline (its blocked read then fails).

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::Stream;

/// The exchange is over when this is dropped (its connection is left alone from then on).
#[must_use = "the deadline ends when the guard is dropped"]
pub struct Deadline {
    id: u64,
}

#[derive(Default)]
struct Watch {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// By id: when, and a handle on the connection to shut down then.
    pending: BTreeMap<u64, (Instant, Stream)>,
    running: bool,
}

fn watch() -> &'static Watch {
    static WATCH: OnceLock<Watch> = OnceLock::new();
    WATCH.get_or_init(Watch::default)
}

/// Shuts `stream` down `within` from now unless the returned guard is dropped first. Without
/// a watchdog thread (none could be started), the per-read timeouts still bound each step.
pub fn deadline(stream: &Stream, within: Duration) -> Deadline {
    let watch = watch();
    let mut state = watch.state.lock().unwrap_or_else(|e| e.into_inner());
    state.next_id += 1;
    let id = state.next_id;
    if let Ok(handle) = stream.try_clone() {
        state.pending.insert(id, (Instant::now() + within, handle));
    }
    if !state.running {
        let started = std::thread::Builder::new()
            .name("rgpu-deadlines".into())
            .spawn(run);
        state.running = started.is_ok();
    }
    drop(state);
    watch.changed.notify_one();
    Deadline { id }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        let watch = watch();
        let mut state = watch.state.lock().unwrap_or_else(|e| e.into_inner());
        state.pending.remove(&self.id);
    }
}

/// The watchdog: sleeps until the earliest deadline, shuts down what is overdue.
fn run() {
    let watch = watch();
    let mut state = watch.state.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let now = Instant::now();
        let overdue: Vec<u64> = state
            .pending
            .iter()
            .filter(|(_, (when, _))| *when <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in overdue {
            if let Some((_, stream)) = state.pending.remove(&id) {
                log::warn!(
                    "{}: its handshake ran past its deadline; closed",
                    stream.peer_description()
                );
                stream.shutdown();
            }
        }
        let next = state.pending.values().map(|(when, _)| *when).min();
        let wait = next.map_or(Duration::from_secs(3600), |when| {
            when.saturating_duration_since(now)
        });
        state = watch
            .changed
            .wait_timeout(state, wait)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn an_exchange_past_its_deadline_is_cut_and_one_within_it_is_not() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = std::net::TcpStream::connect(addr).unwrap();
        let (server, _) = listener.accept().unwrap();
        let mut server = Stream::Tcp(server);
        let started = Instant::now();
        let guard = deadline(&server, Duration::from_millis(300));
        let mut byte = [0u8; 1];
        // The peer sends nothing: the read ends when the deadline shuts the connection.
        let read = server.read(&mut byte);
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        assert!(started.elapsed() >= Duration::from_millis(300));
        drop(guard);

        let _other = std::net::TcpStream::connect(addr).unwrap();
        let (kept, _) = listener.accept().unwrap();
        let kept = Stream::Tcp(kept);
        drop(deadline(&kept, Duration::from_millis(50)));
        std::thread::sleep(Duration::from_millis(200));
        assert!(kept.peer_is_local(), "still connected");
        kept.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let mut kept = kept;
        let err = kept.read(&mut byte).unwrap_err();
        assert!(
            matches!(
                err.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "the connection was cut: {err:?}"
        );
    }
}
