//! The C boundary: every exported OpenCL entry point (generated_dispatch.rs, which also fills
//! the ICD dispatch table) runs its implementation through [`guard`], so a panic becomes an
//! OpenCL error and a log line instead of unwinding into C (undefined behavior) or aborting
//! the program. Every call also passes the migration gate ([`close_gate`]).

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Runs entry point `name`'s implementation; a panic inside returns `on_panic()` (the error
/// the entry point reports: a status, or NULL with the status through `errcode_ret`).
#[inline]
pub fn guard<R>(name: &'static str, on_panic: impl FnOnce() -> R, call: impl FnOnce() -> R) -> R {
    let _inside = Inside::enter();
    let _span = rgpu_client::trace::enter("opencl", name);
    match catch_unwind(AssertUnwindSafe(|| {
        inject_panic(name);
        call()
    })) {
        Ok(result) => result,
        Err(panic) => {
            let why = rgpu_client::panic_message(&*panic);
            log::error!("rgpu: {name} panicked ({why}); returning CL_OUT_OF_HOST_MEMORY");
            on_panic()
        }
    }
}

/// Fault injection for the boundary's own test: `RGPU_TEST_PANIC_IN=<entry point>` makes that
/// entry point panic (read once; costs one atomic load per call otherwise).
fn inject_panic(name: &str) {
    static PANIC_IN: OnceLock<Option<String>> = OnceLock::new();
    let target = PANIC_IN.get_or_init(|| std::env::var("RGPU_TEST_PANIC_IN").ok());
    if target.as_deref() == Some(name) {
        panic!("RGPU_TEST_PANIC_IN={name}");
    }
}

/// Live migration's quiescence (docs/migration.md): a move closes the gate, waits until no
/// call of the program is inside the library (other than the one asking for the move), moves
/// the sessions, and opens it; calls that arrive meanwhile wait at the gate. Two atomic
/// operations per call while it is open.
struct Gate {
    /// Outermost calls inside the library now.
    inside: AtomicUsize,
    closed: AtomicBool,
    lock: Mutex<()>,
    changed: Condvar,
}

static GATE: Gate = Gate {
    inside: AtomicUsize::new(0),
    closed: AtomicBool::new(false),
    lock: Mutex::new(()),
    changed: Condvar::new(),
};

thread_local! {
    /// How deep this thread is in the library's entry points (a callback of a call may call
    /// in again): only the outermost passes the gate.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// A call inside the library, counted until it returns.
struct Inside;

impl Inside {
    fn enter() -> Inside {
        let depth = DEPTH.get();
        DEPTH.set(depth + 1);
        if depth == 0 {
            loop {
                GATE.inside.fetch_add(1, SeqCst);
                if !GATE.closed.load(SeqCst) {
                    break;
                }
                // A move is under way: step back out and wait for the gate to open.
                leave_gate();
                let mut lock = GATE.lock.lock().unwrap_or_else(|e| e.into_inner());
                while GATE.closed.load(SeqCst) {
                    lock = GATE.changed.wait(lock).unwrap_or_else(|e| e.into_inner());
                }
            }
        }
        Inside
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let depth = DEPTH.get() - 1;
        DEPTH.set(depth);
        if depth == 0 {
            leave_gate();
        }
    }
}

fn leave_gate() {
    GATE.inside.fetch_sub(1, SeqCst);
    if GATE.closed.load(SeqCst) {
        let _lock = GATE.lock.lock().unwrap_or_else(|e| e.into_inner());
        GATE.changed.notify_all();
    }
}

/// The closed gate; it opens when dropped.
pub struct Closed(());

impl Drop for Closed {
    fn drop(&mut self) {
        let _lock = GATE.lock.lock().unwrap_or_else(|e| e.into_inner());
        GATE.closed.store(false, SeqCst);
        GATE.changed.notify_all();
    }
}

/// Closes the gate and waits until the program has no call inside the library but the
/// caller's own; `None` when another move holds it or calls stay inside for `timeout` (one
/// waits for something only another thread's call would give it: the move is given up).
pub fn close_gate(timeout: Duration) -> Option<Closed> {
    let own = usize::from(DEPTH.get() > 0);
    let deadline = Instant::now() + timeout;
    let mut lock = GATE.lock.lock().unwrap_or_else(|e| e.into_inner());
    if GATE.closed.swap(true, SeqCst) {
        return None;
    }
    let closed = Closed(());
    while GATE.inside.load(SeqCst) > own {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            drop(lock);
            return None; // `closed` opens the gate again
        }
        lock = GATE
            .changed
            .wait_timeout(lock, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    drop(lock);
    Some(closed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    /// One test, because the gate is the process's: a call inside keeps a move from closing
    /// it; once closed, a new call waits until it opens; a call inside a call passes.
    #[test]
    fn the_gate_waits_for_calls_inside_and_holds_new_ones() {
        let (inside, release) = (channel(), channel::<()>());
        let (entered, leave) = (inside.0, release.1);
        let caller = std::thread::spawn(move || {
            guard(
                "test",
                || (),
                || {
                    entered.send(()).unwrap();
                    leave.recv().unwrap();
                },
            )
        });
        inside.1.recv().unwrap();
        assert!(close_gate(Duration::from_millis(50)).is_none());
        release.0.send(()).unwrap();
        caller.join().unwrap();

        let closed = close_gate(Duration::from_secs(5)).expect("nothing inside");
        let (done_tx, done_rx) = channel();
        let waiter = std::thread::spawn(move || {
            guard("test", || (), || done_tx.send(()).unwrap());
        });
        assert!(done_rx.recv_timeout(Duration::from_millis(100)).is_err());
        drop(closed);
        done_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        waiter.join().unwrap();

        // From inside a call (the extension function asking for the move), and nested.
        guard(
            "outer",
            || (),
            || {
                guard(
                    "inner",
                    || (),
                    || {
                        assert!(close_gate(Duration::from_secs(5)).is_some());
                    },
                )
            },
        );
    }
}
