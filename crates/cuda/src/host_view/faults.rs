//! Trapping the program's accesses to host views: a `SIGSEGV` handler that passes faults
//! inside managed memory to a service thread and waits for its verdict, and hands every other
//! fault to the handler that was there before (or to the default action).
//!
//! The handler itself only makes system calls (`write` to a pipe, `futex` waits), so it is
//! async-signal-safe whatever the faulting thread was doing; the service thread, an ordinary
//! thread, does the work a fault needs (locks, network reads, `mprotect`). A fault in the
//! service thread, or in a forked child (which has neither the thread nor the views), is never
//! treated as ours.

use std::ffi::c_void;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use super::blocks::Touch;

/// Decides a fault at an address (true: handled, retry the access); runs on the service
/// thread.
pub type Resolver = fn(usize, Touch) -> bool;

const PENDING: u32 = 0;
const HANDLED: u32 = 1;
const NOT_OURS: u32 = 2;

/// Bytes of a request: the address, where the verdict goes, and the [`Touch`].
const REQUEST: usize = 24;

struct Service {
    /// Write end of the pipe the service thread reads requests from.
    requests: RawFd,
    /// The handler that was installed before this one.
    previous: libc::sigaction,
}

static SERVICE: OnceLock<Service> = OnceLock::new();
static SERVICE_THREAD: AtomicI32 = AtomicI32::new(0);
static INSTALLING: Mutex<()> = Mutex::new(());

/// Bounds of every host view ever made: faults outside them are not looked up.
static LOW: AtomicUsize = AtomicUsize::new(usize::MAX);
static HIGH: AtomicUsize = AtomicUsize::new(0);

/// Notes a host view's range, so that faults in it reach the resolver.
pub fn cover(start: usize, len: usize) {
    LOW.fetch_min(start, Ordering::AcqRel);
    HIGH.fetch_max(start + len, Ordering::AcqRel);
}

/// Starts the service thread and installs the handler (once per process).
pub fn install(resolve: Resolver) -> io::Result<()> {
    if SERVICE.get().is_some() {
        return Ok(());
    }
    let _installing = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
    if SERVICE.get().is_some() {
        return Ok(());
    }
    let mut ends = [0 as RawFd; 2];
    // SAFETY: an array of two descriptors for the kernel to fill.
    if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let [read_end, write_end] = ends;
    std::thread::Builder::new()
        .name("rgpu-managed".into())
        .spawn(move || serve(read_end, resolve))?;
    // SAFETY: reads the current disposition into a local struct (zeroed is a valid one).
    let previous = unsafe {
        let mut previous: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut previous);
        previous
    };
    let _ = SERVICE.set(Service {
        requests: write_end,
        previous,
    });
    // SAFETY: installs `on_fault`, which is async-signal-safe (see the module's comment).
    let installed = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_fault as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER | libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGSEGV, &action, std::ptr::null_mut())
    };
    if installed != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn thread_id() -> i32 {
    // SAFETY: a system call without arguments.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

extern "C" fn on_fault(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    let Some(service) = SERVICE.get() else {
        return;
    };
    // SAFETY: the thread's errno, saved and restored around the system calls made here.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: the kernel's description of this SIGSEGV.
    let address = unsafe { (*info).si_addr() } as usize;
    let ours = address >= LOW.load(Ordering::Acquire)
        && address < HIGH.load(Ordering::Acquire)
        && !rgpu_client::fork::forked()
        && thread_id() != SERVICE_THREAD.load(Ordering::Acquire)
        // SAFETY: the context the kernel passed with this signal.
        && ask(service.requests, address, unsafe { touch_of(context) });
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
    if !ours {
        // SAFETY: the arguments of this signal, passed on unchanged.
        unsafe { chain(&service.previous, signal, info, context) };
    }
}

/// Whether the faulting access was a write: x86-64 says so in the page fault's error code.
#[cfg(target_arch = "x86_64")]
unsafe fn touch_of(context: *mut c_void) -> Touch {
    // SAFETY: a SA_SIGINFO handler's third argument is the interrupted thread's ucontext.
    let error =
        unsafe { (*context.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_ERR as usize] };
    // Bit 1 of the page fault error code: the access was a write.
    if error & 2 != 0 {
        Touch::Write
    } else {
        Touch::Read
    }
}

/// Elsewhere the access is not decoded: a fault on a readable block is taken as a write.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn touch_of(_context: *mut c_void) -> Touch {
    Touch::Unknown
}

fn touch_code(touch: Touch) -> u64 {
    match touch {
        Touch::Read => 0,
        Touch::Write => 1,
        Touch::Unknown => 2,
    }
}

fn touch_from(code: u64) -> Touch {
    match code {
        0 => Touch::Read,
        1 => Touch::Write,
        _ => Touch::Unknown,
    }
}

/// Sends the fault to the service thread and waits for its verdict.
fn ask(requests: RawFd, address: usize, touch: Touch) -> bool {
    let verdict = AtomicU32::new(PENDING);
    let mut request = [0u8; REQUEST];
    request[..8].copy_from_slice(&(address as u64).to_ne_bytes());
    request[8..16].copy_from_slice(&(&verdict as *const AtomicU32 as u64).to_ne_bytes());
    request[16..].copy_from_slice(&touch_code(touch).to_ne_bytes());
    loop {
        // SAFETY: a local buffer; writes of at most PIPE_BUF bytes to a pipe are atomic.
        let written = unsafe { libc::write(requests, request.as_ptr().cast(), REQUEST) };
        if written == REQUEST as isize {
            break;
        }
        // SAFETY: reads this thread's errno.
        if written < 0 && unsafe { *libc::__errno_location() } == libc::EINTR {
            continue;
        }
        return false;
    }
    while verdict.load(Ordering::Acquire) == PENDING {
        // SAFETY: waits while the word still holds PENDING; the service thread wakes it.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                verdict.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                PENDING,
                std::ptr::null::<libc::timespec>(),
            )
        };
    }
    verdict.load(Ordering::Acquire) == HANDLED
}

/// Hands a fault that is not about a host view to the handler installed before, or to the
/// default action (restored: returning re-runs the access, which then ends the process as
/// it would have without rgpu).
unsafe fn chain(
    previous: &libc::sigaction,
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut c_void,
) {
    let handler = previous.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // SAFETY: restores the default disposition from a local struct.
        unsafe {
            let mut default: libc::sigaction = std::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(signal, &default, std::ptr::null_mut());
        }
    } else if previous.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: a handler installed with SA_SIGINFO has this signature.
        unsafe {
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                std::mem::transmute(handler);
            handler(signal, info, context)
        }
    } else {
        // SAFETY: a handler installed without SA_SIGINFO has this signature.
        unsafe {
            let handler: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
            handler(signal)
        }
    }
}

/// The service thread: answers each request with the resolver's verdict.
fn serve(requests: RawFd, resolve: Resolver) {
    SERVICE_THREAD.store(thread_id(), Ordering::Release);
    let mut request = [0u8; REQUEST];
    loop {
        let mut filled = 0;
        while filled < REQUEST {
            // SAFETY: reads into the rest of a local buffer.
            let read = unsafe {
                libc::read(
                    requests,
                    request[filled..].as_mut_ptr().cast(),
                    REQUEST - filled,
                )
            };
            match read {
                n if n > 0 => filled += n as usize,
                // SAFETY: reads this thread's errno.
                n if n < 0 && unsafe { *libc::__errno_location() } == libc::EINTR => {}
                _ => return,
            }
        }
        let address = u64::from_ne_bytes(request[..8].try_into().unwrap()) as usize;
        let verdict = u64::from_ne_bytes(request[8..16].try_into().unwrap()) as *const AtomicU32;
        let touch = touch_from(u64::from_ne_bytes(request[16..].try_into().unwrap()));
        let handled = std::panic::catch_unwind(|| resolve(address, touch)).unwrap_or(false);
        // SAFETY: the faulting thread waits on this word (on its stack) until it changes.
        unsafe {
            (*verdict).store(if handled { HANDLED } else { NOT_OURS }, Ordering::Release);
            libc::syscall(
                libc::SYS_futex,
                (*verdict).as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                1,
            );
        }
    }
}
