//! Posted kernel launches issued on a thread of their own.
//!
//! A launch costs the driver about 3 µs of one core, and the session thread spends about one
//! more reading and decoding each request; done in turn, a stream of posted launches ran at
//! 0.65-0.85 of the native rate. Here the session thread resolves a launch's handles and hands
//! it over; the launch thread does nothing but call the driver, so the two overlap. Order is
//! kept by draining: before the session serves any request other than a launch, every launch
//! handed over has been issued (`Launcher::drain`). The two threads hand over by polling
//! (crate rgpu-transport's `spin`), so the launcher is only used where polling is on (and not
//! with `RGPU_LAUNCH_THREAD=off` in the server's environment). A launch with nothing behind it
//! (one the program is about to wait for) is issued on the session thread when the launch
//! thread has nothing left: handing it over would only add a hand-over to the wait.

use std::collections::VecDeque;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::{Driver, Status, SUCCESS};
use rgpu_cuda_api::sys::*;

use super::launches::LaunchShape;
use super::Backend;

/// One launch, its handles resolved; its parameters are `params` bytes of the batch's buffer.
struct Launch {
    context: CUcontext,
    shape: LaunchShape,
    params: std::ops::Range<usize>,
}

/// Launches handed over and not yet taken, with their parameter bytes side by side.
#[derive(Default)]
struct Batch {
    launches: VecDeque<Launch>,
    params: Vec<u8>,
}

// SAFETY: the handles are the session's driver objects, which live until the session drains
// the launcher (every request that could destroy one drains first); the driver's handles may
// be used from any thread.
unsafe impl Send for Batch {}

#[derive(Default)]
struct State {
    batch: Batch,
    /// The launch thread waits on `work` (nothing was handed over while it polled).
    launcher_sleeping: bool,
    /// The session thread waits on `done` in `drain`.
    drainer_sleeping: bool,
    /// The first failure since the last drain.
    failure: Option<Status>,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    done: Condvar,
    /// Launches handed over so far, and issued so far (for polling without the lock).
    handed: AtomicU64,
    issued: AtomicU64,
    failed: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Launches waiting for a sleeping launch thread that wake it at once; fewer wait for the
/// session thread to run out of requests to read (`wake_if_owed`) or to drain them itself.
const WAKE_AT: usize = 4;

pub(super) struct Launcher {
    shared: Arc<Shared>,
    /// Launches wait for a sleeping launch thread that was not woken yet.
    wake_owed: bool,
    /// Returns how many launches it issued, in how many batches.
    thread: Option<std::thread::JoinHandle<(u64, u64)>>,
    handed: u64,
}

impl Launcher {
    /// A launch thread for a session, where polling is on (else launches stay on the session
    /// thread).
    pub(super) fn start(backend: Arc<Backend>) -> Option<Launcher> {
        let off = std::env::var("RGPU_LAUNCH_THREAD").is_ok_and(|v| v == "0" || v == "off");
        if off || rgpu_transport::spin::spin_time().is_zero() {
            return None;
        }
        let shared = Arc::new(Shared {
            state: Mutex::default(),
            work: Condvar::new(),
            done: Condvar::new(),
            handed: AtomicU64::new(0),
            issued: AtomicU64::new(0),
            failed: AtomicBool::new(false),
        });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("rgpu-launch".into())
            .spawn(move || launch_loop(&thread_shared, &backend));
        match thread {
            Ok(thread) => Some(Launcher {
                shared,
                thread: Some(thread),
                handed: 0,
                wake_owed: false,
            }),
            Err(e) => {
                log::warn!("no launch thread ({e}); launching in turn");
                None
            }
        }
    }

    /// Hands a launch over, to be issued in `context` (`params`: its parameter buffer).
    pub(super) fn post(&mut self, context: CUcontext, shape: LaunchShape, params: &[u8]) {
        let mut state = self.shared.lock();
        let at = state.batch.params.len();
        state.batch.params.extend_from_slice(params);
        state.batch.launches.push_back(Launch {
            context,
            shape,
            params: at..at + params.len(),
        });
        self.handed += 1;
        self.shared.handed.store(self.handed, Ordering::Release);
        // A wake-up costs this thread a system call and the launch thread a scheduling delay:
        // a few launches that a request right behind them drains are issued here instead.
        if state.launcher_sleeping {
            if state.batch.launches.len() >= WAKE_AT {
                self.shared.work.notify_one();
                self.wake_owed = false;
            } else {
                self.wake_owed = true;
            }
        }
    }

    /// Wakes the launch thread for launches left waiting (the session thread is about to wait
    /// for the client).
    pub(super) fn wake_if_owed(&mut self) {
        if std::mem::take(&mut self.wake_owed) {
            let state = self.shared.lock();
            if state.launcher_sleeping && !state.batch.launches.is_empty() {
                self.shared.work.notify_one();
            }
        }
    }

    /// Whether every launch handed over has been issued and none failed unreported.
    pub(super) fn is_idle(&self) -> bool {
        self.shared.issued.load(Ordering::Acquire) == self.handed
            && !self.shared.failed.load(Ordering::Acquire)
    }

    /// Waits until every launch handed over has been issued, issuing here (on the session
    /// thread, whose context is `current`) those a sleeping launch thread has not taken; the
    /// first failure among them since the last drain, if any.
    pub(super) fn drain(&mut self, driver: &Driver, current: CUcontext) -> Option<Status> {
        if self.is_idle() {
            return None;
        }
        let issued = || self.shared.issued.load(Ordering::Acquire);
        self.wake_owed = false;
        let mut stolen_failure = None;
        {
            let mut state = self.shared.lock();
            // Asleep, it holds nothing: every batch it took is issued.
            if state.launcher_sleeping && !state.batch.launches.is_empty() {
                let mut batch = std::mem::take(&mut state.batch);
                self.handed -= batch.launches.len() as u64;
                self.shared.handed.store(self.handed, Ordering::Release);
                drop(state);
                let mut here = current;
                stolen_failure = issue_all(driver, &mut batch, &mut here);
                if here != current {
                    // SAFETY: the session thread's own context, as it was.
                    unsafe { cu_call!(driver, cuCtxSetCurrent(current)) };
                }
            }
        }
        let spin = rgpu_transport::spin::spin_time();
        let start = Instant::now();
        while issued() != self.handed && start.elapsed() < spin {
            std::hint::spin_loop();
        }
        let mut state = self.shared.lock();
        while issued() != self.handed {
            state.drainer_sleeping = true;
            // Bounded only to look again: a launch waits for room in the device's queue as
            // long as the device's earlier work takes, as it would on the session thread.
            state = self
                .shared
                .done
                .wait_timeout(state, Duration::from_secs(1))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        state.drainer_sleeping = false;
        self.shared.failed.store(false, Ordering::Release);
        // The launch thread's launches came before the stolen ones.
        state.failure.take().or(stolen_failure)
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.work.notify_one();
        if let Some(Ok((launches, batches))) = self.thread.take().map(|t| t.join()) {
            // Launches per batch: about 1 when the launch thread keeps up with the session
            // thread, many when the driver is the slower of the two.
            log::debug!("launch thread: {launches} launches in {batches} batches");
        }
    }
}

/// The launch thread: takes what was handed over, issues it, says so.
fn launch_loop(shared: &Shared, backend: &Backend) -> (u64, u64) {
    let driver = &backend.driver;
    let mut taken = Batch::default();
    let mut issued = 0u64;
    let mut batches = 0u64;
    let mut current: CUcontext = null_mut();
    loop {
        let spin = rgpu_transport::spin::spin_time();
        let start = Instant::now();
        while shared.handed.load(Ordering::Acquire) == issued && start.elapsed() < spin {
            std::hint::spin_loop();
        }
        {
            let mut state = shared.lock();
            while state.batch.launches.is_empty() && !state.stop {
                state.launcher_sleeping = true;
                state = shared.work.wait(state).unwrap_or_else(|e| e.into_inner());
                state.launcher_sleeping = false;
            }
            if state.batch.launches.is_empty() {
                return (issued, batches); // stopped, with nothing left
            }
            std::mem::swap(&mut state.batch, &mut taken);
        }
        batches += 1;
        issued += taken.launches.len() as u64;
        let failure = issue_all(driver, &mut taken, &mut current);
        // The failure is in place before the count says these launches are issued.
        let mut state = shared.lock();
        if let Some(status) = failure {
            state.failure.get_or_insert(status);
            shared.failed.store(true, Ordering::Release);
        }
        shared.issued.store(issued, Ordering::Release);
        if state.drainer_sleeping {
            shared.done.notify_one();
        }
    }
}

/// Issues a batch's launches in order, entering each one's context (`current`: the calling
/// thread's); the first failure. Leaves the batch empty.
fn issue_all(driver: &Driver, batch: &mut Batch, current: &mut CUcontext) -> Option<Status> {
    let mut failure = None;
    for launch in batch.launches.drain(..) {
        if launch.context != *current {
            // SAFETY: a live context of the session (see `Batch`).
            let status = unsafe { cu_call!(driver, cuCtxSetCurrent(launch.context)) };
            if status != SUCCESS {
                failure.get_or_insert(status);
                continue;
            }
            *current = launch.context;
        }
        let status = issue(driver, launch, &mut batch.params);
        if status != SUCCESS {
            log::debug!("cuLaunchKernel failed: CUDA error {status}; deferred");
            failure.get_or_insert(status);
        }
    }
    batch.params.clear();
    failure
}

fn issue(driver: &Driver, mut launch: Launch, params: &mut [u8]) -> Status {
    let params = &mut params[launch.params.clone()];
    super::launches::issue_launch(driver, &mut launch.shape, params)
}
