//! Polling briefly before sleeping. A thread that sleeps in `read` (or on a condition
//! variable) until its peer answers is woken by the scheduler, which costs several
//! microseconds on every synchronous call, more on virtual machines and idle cores. Where
//! cores are plentiful, the waiting thread polls for a short while first: an answer that comes
//! within it is taken without a wake-up. On small machines polling would take a core from the
//! threads doing the work, so there it is off.

use std::os::fd::RawFd;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Machines with fewer cores than this do not poll.
const MIN_CORES: usize = 8;
/// How long a wait polls by default: longer than a small call's round trip on one host.
const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// How long a wait polls before it sleeps: `RGPU_SPIN_US` (0: never), else 50 µs on machines
/// with 8 cores or more and none on smaller ones.
pub fn spin_time() -> Duration {
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| {
        let asked = std::env::var("RGPU_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok());
        match asked {
            Some(us) => Duration::from_micros(us.min(10_000)),
            None => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                if cores >= MIN_CORES {
                    DEFAULT_SPIN
                } else {
                    Duration::ZERO
                }
            }
        }
    })
}

/// Polls socket `fd` until it has something to read (bytes, its end, an error) or the spin
/// time passes, whichever comes first; the caller then reads (and sleeps there if nothing came).
pub fn until_readable(fd: RawFd) {
    let spin = spin_time();
    if spin.is_zero() {
        return;
    }
    let start = Instant::now();
    loop {
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; a zero timeout never blocks.
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        if ready != 0 || start.elapsed() >= spin {
            return;
        }
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn returns_once_readable_and_after_the_spin_time() {
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        // Nothing to read: returns after at most the spin time (bounded either way).
        let start = std::time::Instant::now();
        super::until_readable(b.as_raw_fd());
        assert!(start.elapsed() < std::time::Duration::from_secs(1));
        a.write_all(b"x").unwrap();
        super::until_readable(b.as_raw_fd());
        drop(a);
        super::until_readable(b.as_raw_fd());
    }
}
