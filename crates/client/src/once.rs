//! Saying a thing once per process (front ends log each unsupported entry point the first time
//! a program calls it, not on every call), and what a caught panic said.

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

/// What a caught panic says (its `&str` or `String` payload), for the C boundaries of the
/// drop-in libraries, which turn a panic into an error code and a log line.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}
