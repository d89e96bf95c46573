//! Waiting for several threads to be done with one job (the data lanes of a striped
//! transfer), and for the first failure among them.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Parties still busy with a job, and the first failure among them.
pub struct Countdown {
    state: Mutex<(usize, Option<String>)>,
    zero: Condvar,
}

impl Countdown {
    /// A job that `parties` parties must each finish.
    pub fn new(parties: usize) -> Countdown {
        Countdown {
            state: Mutex::new((parties, None)),
            zero: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, (usize, Option<String>)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One more party takes part.
    pub fn add(&self) {
        self.lock().0 += 1;
    }

    /// One party is done, with `result`.
    pub fn finish(&self, result: Result<(), String>) {
        let mut state = self.lock();
        state.0 -= 1;
        if let Err(why) = result {
            state.1.get_or_insert(why);
        }
        if state.0 == 0 {
            self.zero.notify_all();
        }
    }

    /// Whether every party is done (without waiting).
    pub fn is_done(&self) -> bool {
        self.lock().0 == 0
    }

    /// Waits for every party (up to `timeout`; `None`: until they are); `Err(None)` on
    /// timeout, `Err(Some(why))` with the first failure.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<(), Option<String>> {
        let mut state = self.lock();
        while state.0 > 0 {
            match timeout {
                None => state = self.zero.wait(state).unwrap_or_else(|e| e.into_inner()),
                Some(timeout) => {
                    let (next, waited) = self
                        .zero
                        .wait_timeout(state, timeout)
                        .unwrap_or_else(|e| e.into_inner());
                    state = next;
                    if waited.timed_out() && state.0 > 0 {
                        return Err(None);
                    }
                }
            }
        }
        state.1.clone().map_or(Ok(()), |why| Err(Some(why)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn waits_for_every_party_and_keeps_the_first_failure() {
        let countdown = Arc::new(Countdown::new(2));
        countdown.add();
        assert_eq!(
            countdown.wait(Some(Duration::from_millis(10))),
            Err(None),
            "nobody finished yet"
        );
        countdown.finish(Ok(()));
        countdown.finish(Err("party 1".into()));
        let last = {
            let countdown = countdown.clone();
            std::thread::spawn(move || countdown.finish(Err("party 2".into())))
        };
        assert_eq!(countdown.wait(None), Err(Some("party 1".into())));
        last.join().unwrap();
    }
}
