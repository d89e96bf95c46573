//! Saying a thing once per process: front ends log each unsupported entry point the first time
//! a program calls it, not on every call.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

/// True the first time it is called with `name`, false after.
pub fn first_time(name: &'static str) -> bool {
    static SEEN: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    SEEN.get_or_init(|| Mutex::new(HashSet::new()))
        .lock()
        .map(|mut seen| seen.insert(name))
        .unwrap_or(false)
}
