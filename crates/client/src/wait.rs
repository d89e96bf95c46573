//! Waiting for a value another thread delivers (a reply, a read's completion).

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

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
        let spin = rgpu_transport::spin::spin_time();
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
