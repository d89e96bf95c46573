//! Large memory copies shared with a few helper threads. One core copies pageable memory at
//! about 6 GB/s on the H200 host, below the driver's own pageable path (10-14 GB/s) and far
//! below PCIe; the shared-memory rings (crate::shared_ring) copy through here.

use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, OnceLock};

use crate::Countdown;

/// Copies shorter than this stay on the calling thread (a hand-over costs a wake-up).
const SPLIT_MIN: usize = 512 << 10;
/// Helper threads (the caller copies a part too).
const HELPERS: usize = 3;

struct Job {
    src: usize,
    dst: usize,
    len: usize,
    done: Arc<Countdown>,
}

fn helpers() -> Option<&'static [Mutex<Sender<Job>>]> {
    static POOL: OnceLock<Vec<Mutex<Sender<Job>>>> = OnceLock::new();
    let pool = POOL.get_or_init(|| {
        let mut senders = Vec::new();
        for i in 0..HELPERS {
            let (tx, rx) = mpsc::channel::<Job>();
            let spawned = std::thread::Builder::new()
                .name(format!("rgpu-copy{i}"))
                .spawn(move || {
                    for job in rx {
                        // SAFETY: the submitter keeps both ranges valid, and does not touch
                        // this part, until `done` finishes (`copy` waits for it).
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                job.src as *const u8,
                                job.dst as *mut u8,
                                job.len,
                            )
                        };
                        job.done.finish(Ok(()));
                    }
                });
            if spawned.is_err() {
                break;
            }
            senders.push(Mutex::new(tx));
        }
        senders
    });
    (!pool.is_empty()).then_some(pool.as_slice())
}

/// Copies `len` bytes from `src` to `dst`, large copies in parts on helper threads.
///
/// # Safety
/// As for `std::ptr::copy_nonoverlapping`: both ranges valid, not overlapping.
pub unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
    let pool = if len >= SPLIT_MIN && !crate::fork::forked() {
        helpers()
    } else {
        None
    };
    let Some(pool) = pool else {
        // SAFETY: passed on from the caller.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        return;
    };
    let parts = pool.len() + 1;
    let part = len.div_ceil(parts).next_multiple_of(4096);
    let done = Arc::new(Countdown::new(0));
    let mut at = part.min(len);
    for helper in pool {
        if at >= len {
            break;
        }
        let n = part.min(len - at);
        done.add();
        let job = Job {
            src: src as usize + at,
            dst: dst as usize + at,
            len: n,
            done: done.clone(),
        };
        if let Err(mpsc::SendError(job)) = helper.lock().unwrap().send(job) {
            // SAFETY: passed on from the caller; this part is inside both ranges.
            unsafe {
                std::ptr::copy_nonoverlapping(job.src as *const u8, job.dst as *mut u8, job.len)
            };
            done.finish(Ok(()));
        }
        at += n;
    }
    // SAFETY: passed on from the caller; the first part is inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, part.min(len)) };
    let _ = done.wait(None);
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_large_copy_in_parts_is_whole() {
        for len in [10, 600 << 10, (3 << 20) + 123] {
            let src: Vec<u8> = (0..len).map(|i| (i * 31 + i / 4099) as u8).collect();
            let mut dst = vec![0u8; len];
            // SAFETY: two distinct buffers of `len` bytes.
            unsafe { super::copy(src.as_ptr(), dst.as_mut_ptr(), len) };
            assert!(src == dst, "copy of {len} bytes");
        }
    }
}
