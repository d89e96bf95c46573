//! Processes that fork. A child shares its parent's sockets: the same connections to the same
//! server sessions. Anything the child wrote, read or shut down on them would interleave with
//! the parent's traffic and corrupt or end the parent's sessions (a PyTorch DataLoader worker
//! exiting, a multiprocessing child flushing what the parent had buffered). So once a process
//! has opened a connection, every stream in its forked children refuses to write, read or shut
//! down, with [`FORKED`] as the error; closing them (dropping) only closes the child's copies
//! of the descriptors, which leaves the parent's connections as they were. The client libraries
//! check [`forked`] first and answer with their API's error for this case (CUDA's
//! `CUDA_ERROR_NOT_INITIALIZED`, as NVIDIA's driver answers in a child forked after CUDA was
//! initialized). A child of a process that never connected connects as any process does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

/// Why a stream refuses in a forked child.
pub const FORKED: &str =
    "this process was forked from the one that opened the connection; the connection stays the \
     parent's";

static OPENED: AtomicBool = AtomicBool::new(false);
static IN_FORKED_CHILD: AtomicBool = AtomicBool::new(false);

/// Notes that this process opened a connection (called for each; registers the fork handler
/// once).
pub fn note_connection_opened() {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // SAFETY: registers a handler that only stores to atomics (async-signal-safe, as a
        // handler run in a child of a multithreaded process must be).
        let _ = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    });
    OPENED.store(true, Ordering::Release);
}

extern "C" fn in_child() {
    if OPENED.load(Ordering::Acquire) {
        IN_FORKED_CHILD.store(true, Ordering::Release);
    }
}

/// Whether this process is a child forked after its parent had opened a connection (its
/// inherited connections are the parent's).
#[inline]
pub fn forked() -> bool {
    IN_FORKED_CHILD.load(Ordering::Relaxed)
}

/// The error a stream gives in a forked child.
pub(crate) fn forked_error() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::BrokenPipe, FORKED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_forked_after_a_connection_is_marked_and_its_parent_is_not() {
        note_connection_opened();
        assert!(!forked());
        // SAFETY: the child only reads an atomic and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = if forked() { 0 } else { 1 };
            // SAFETY: leaves the child without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        assert!(pid > 0);
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        assert!(!forked());
    }
}
