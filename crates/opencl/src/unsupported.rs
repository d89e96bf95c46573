//! What an entry point rgpu does not implement does: return the API's error and say so once.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

/// Logs (once per name) that the application called an entry point rgpu does not support.
pub fn report(name: &'static str) {
    static SEEN: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let first = SEEN
        .get_or_init(|| Mutex::new(HashSet::new()))
        .lock()
        .map(|mut seen| seen.insert(name))
        .unwrap_or(false);
    if first {
        log::warn!("rgpu: {name} is not supported; returning an error");
    }
}
