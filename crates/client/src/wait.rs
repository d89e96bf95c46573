//! Waiting for a value another thread delivers (a reply, a read's completion).

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a waiter polls before it sleeps: where cores are plentiful, polling saves the
/// wake-up of a sleeping thread (several microseconds, more on virtual machines) on every
/// synchronous call; on small machines it would take a core from the threads doing the work.
fn spin_time() -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Duration::from_micros(if cores >= 8 { 50 } else { 0 })
    })
}

/// A one-shot value handed from one thread to another.
pub struct Handoff<T> {
    value: Mutex<Option<T>>,
    ready: Condvar,
}

impl<T> Default for Handoff<T> {
    fn default() -> Self {
        Handoff {
            value: Mutex::new(None),
            ready: Condvar::new(),
        }
    }
}

impl<T> Handoff<T> {
    pub fn fill(&self, value: T) {
        *self.value.lock().unwrap() = Some(value);
        self.ready.notify_all();
    }

    /// The value, once delivered; None if `timeout` passes first. (Every wait is for the
    /// network: it counts in the call's trace.)
    pub fn wait(&self, timeout: Duration) -> Option<T> {
        let start = Instant::now();
        let value = self.wait_from(start, timeout);
        crate::trace::waited(start.elapsed());
        value
    }

    fn wait_from(&self, start: Instant, timeout: Duration) -> Option<T> {
        let spin = spin_time();
        while start.elapsed() < spin {
            if let Ok(mut value) = self.value.try_lock() {
                if let Some(v) = value.take() {
                    return Some(v);
                }
            }
            std::hint::spin_loop();
        }
        let deadline = start + timeout;
        let mut value = self.value.lock().unwrap();
        loop {
            if let Some(v) = value.take() {
                return Some(v);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            value = self.ready.wait_timeout(value, deadline - now).unwrap().0;
        }
    }
}
