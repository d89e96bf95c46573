//! Caps on connections that have not authenticated yet, in total and per source address: an
//! unauthenticated peer gets at most one handshake's worth of the server (its frames are
//! limited to a few KiB and its handshake to a deadline, in rgpu_transport), and no more
//! handshakes at once than these caps. Connections past a cap are closed at once, with a log
//! line at most every few seconds.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Handshakes under way at once, from all sources.
pub(crate) const MAX_HANDSHAKES: usize = 256;
/// Handshakes under way at once from one address (every local client shares one).
pub(crate) const MAX_HANDSHAKES_PER_SOURCE: usize = 64;
/// How often a refusal is logged (the others are counted in the next line).
const LOG_EVERY: Duration = Duration::from_secs(5);

#[derive(Default)]
pub(crate) struct Handshakes {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    total: usize,
    /// By source address (`None`: a Unix socket).
    per_source: HashMap<Option<IpAddr>, usize>,
    refused_unlogged: u64,
    last_log: Option<Instant>,
}

/// A handshake under way; its place is given back when dropped.
pub(crate) struct Slot {
    gate: Arc<Handshakes>,
    source: Option<IpAddr>,
}

impl Handshakes {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a handshake from `source`, or `None` (logged) when a cap is reached.
    pub fn enter(self: &Arc<Self>, source: Option<IpAddr>, peer: &str) -> Option<Slot> {
        let mut state = self.lock();
        let from_source = state.per_source.get(&source).copied().unwrap_or(0);
        if state.total >= MAX_HANDSHAKES || from_source >= MAX_HANDSHAKES_PER_SOURCE {
            state.refused_unlogged += 1;
            let due = state.last_log.is_none_or(|at| at.elapsed() >= LOG_EVERY);
            if due {
                log::warn!(
                    "{peer}: refused: {} handshakes under way ({from_source} from this \
                     address; at most {MAX_HANDSHAKES}, {MAX_HANDSHAKES_PER_SOURCE} per \
                     address); {} connection(s) refused so",
                    state.total,
                    state.refused_unlogged
                );
                state.refused_unlogged = 0;
                state.last_log = Some(Instant::now());
            }
            return None;
        }
        state.total += 1;
        *state.per_source.entry(source).or_default() += 1;
        Some(Slot {
            gate: self.clone(),
            source,
        })
    }

    #[cfg(test)]
    fn under_way(&self) -> usize {
        self.lock().total
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.gate.lock();
        state.total = state.total.saturating_sub(1);
        if let Some(n) = state.per_source.get_mut(&self.source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                state.per_source.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_cannot_take_every_place() {
        let gate = Arc::new(Handshakes::default());
        let attacker = Some("10.0.0.9".parse().unwrap());
        let held: Vec<Slot> = (0..MAX_HANDSHAKES_PER_SOURCE)
            .map(|_| gate.enter(attacker, "a").expect("under the cap"))
            .collect();
        assert!(
            gate.enter(attacker, "a").is_none(),
            "past the per-address cap"
        );
        let other = gate.enter(Some("10.0.0.10".parse().unwrap()), "b");
        assert!(other.is_some(), "another address still gets in");
        drop(other);
        drop(held);
        assert_eq!(gate.under_way(), 0);
        assert!(gate.enter(attacker, "a").is_some(), "places come back");
    }
}
