//! Posted kernel launches issued on a thread of their own.
//!
//! A launch costs the driver about 3 µs of one core, and the session thread spends about one
//! more reading and decoding each request; done in turn, a stream of posted launches ran at
//! 0.65-0.85 of the native rate. Here the session thread resolves a launch's handles and hands
//! it over; the launch thread does nothing but call the driver, so the two overlap. Order is
//! kept by draining: before the session serves any request other than a launch, every launch
//! handed over has been issued (`Launcher::drain`). The two threads hand over by polling
//! (crate rgpu-transport's `spin`), so the launcher is only used where polling is on.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::launch_param;
use rgpu_cuda_api::native::{Status, SUCCESS};
use rgpu_cuda_api::sys::*;

use super::Backend;

/// One launch, its handles resolved; its parameters are `params` bytes of the batch's buffer.
struct Launch {
    context: CUcontext,
    function: CUfunction,
    stream: CUstream,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    attributes: Vec<CUlaunchAttribute>,
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

pub(super) struct Launcher {
    shared: Arc<Shared>,
    /// Returns how many launches it issued, in how many batches.
    thread: Option<std::thread::JoinHandle<(u64, u64)>>,
    handed: u64,
}

impl Launcher {
    /// A launch thread for a session, where polling is on (else launches stay on the session
    /// thread).
    pub(super) fn start(backend: Arc<Backend>) -> Option<Launcher> {
        if rgpu_transport::spin::spin_time().is_zero() {
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
            }),
            Err(e) => {
                log::warn!("no launch thread ({e}); launching in turn");
                None
            }
        }
    }

    /// Hands a launch over (`params`: its parameter buffer).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn post(
        &mut self,
        context: CUcontext,
        function: CUfunction,
        stream: CUstream,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        attributes: Vec<CUlaunchAttribute>,
        params: &[u8],
    ) {
        let mut state = self.shared.lock();
        let at = state.batch.params.len();
        state.batch.params.extend_from_slice(params);
        state.batch.launches.push_back(Launch {
            context,
            function,
            stream,
            grid,
            block,
            shared_mem,
            attributes,
            params: at..at + params.len(),
        });
        self.handed += 1;
        self.shared.handed.store(self.handed, Ordering::Release);
        if state.launcher_sleeping {
            self.shared.work.notify_one();
        }
    }

    /// Whether every launch handed over has been issued and none failed unreported.
    pub(super) fn is_idle(&self) -> bool {
        self.shared.issued.load(Ordering::Acquire) == self.handed
            && !self.shared.failed.load(Ordering::Acquire)
    }

    /// Waits until every launch handed over has been issued; the first failure among them
    /// since the last drain, if any.
    pub(super) fn drain(&mut self) -> Option<Status> {
        let issued = || self.shared.issued.load(Ordering::Acquire);
        if issued() == self.handed && !self.shared.failed.load(Ordering::Acquire) {
            return None;
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
        state.failure.take()
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
        let mut failure = None;
        for launch in taken.launches.drain(..) {
            if launch.context != current {
                // SAFETY: a live context of the session (see `Batch`).
                let status = unsafe { cu_call!(driver, cuCtxSetCurrent(launch.context)) };
                if status != SUCCESS {
                    failure.get_or_insert(status);
                    issued += 1;
                    continue;
                }
                current = launch.context;
            }
            let status = issue(driver, launch, &mut taken.params);
            if status != SUCCESS {
                log::debug!("cuLaunchKernel failed: CUDA error {status}; deferred");
                failure.get_or_insert(status);
            }
            issued += 1;
        }
        taken.params.clear();
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

fn issue(driver: &rgpu_cuda_api::native::Driver, launch: Launch, params: &mut [u8]) -> Status {
    let Launch {
        function,
        stream,
        grid,
        block,
        shared_mem,
        mut attributes,
        params: range,
        ..
    } = launch;
    let mut size = range.len();
    let mut extra = [
        launch_param::BUFFER_POINTER as *mut c_void,
        params[range].as_mut_ptr().cast(),
        launch_param::BUFFER_SIZE as *mut c_void,
        (&mut size as *mut usize).cast(),
        launch_param::END as *mut c_void,
    ];
    if attributes.is_empty() {
        // SAFETY: the session's live handles (see `Batch`) and local buffers; the driver
        // checks addresses.
        return unsafe {
            cu_call!(
                driver,
                cuLaunchKernel(
                    function,
                    grid[0],
                    grid[1],
                    grid[2],
                    block[0],
                    block[1],
                    block[2],
                    shared_mem,
                    stream,
                    null_mut(),
                    extra.as_mut_ptr()
                )
            )
        };
    }
    let config = super::launches::launch_config(grid, block, shared_mem, stream, &mut attributes);
    // SAFETY: as above.
    unsafe {
        cu_call!(
            driver,
            cuLaunchKernelEx(&config, function, null_mut(), extra.as_mut_ptr())
        )
    }
}
