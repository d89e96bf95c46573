//! The worker's flight recorder: the last [`RING`] requests of its session (name, seq, bulk
//! bytes, when it began, how long it took), kept where a signal handler can read them.
//!
//! - A worker that dies of a fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT: a driver
//!   crash, an abort) first writes to its log (the server's stderr) the request it was serving,
//!   the requests before it and a native backtrace, then dies of the same signal, which the
//!   listener reports as before.
//! - `kill -USR2 <worker pid>` writes the same ring to the log at any time, the worker going on.
//!
//! The handler only reads atomics and formats into a stack buffer, and writes with write(2):
//! nothing in it allocates or takes a lock. The backtrace comes from glibc's `backtrace` and
//! `backtrace_symbols_fd` (loaded at install, so that the handler does not load it).

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// Requests kept.
pub const RING: usize = 32;

struct Slot {
    /// The request's name (a `&'static str`'s pointer and length).
    name: AtomicPtr<u8>,
    name_len: AtomicUsize,
    seq: AtomicU64,
    bulk: AtomicU64,
    /// ns after the recorder started.
    began_ns: AtomicU64,
    /// ns it took, or `u64::MAX` while it is being served.
    took_ns: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)] // only the array's initializer
const EMPTY: Slot = Slot {
    name: AtomicPtr::new(std::ptr::null_mut()),
    name_len: AtomicUsize::new(0),
    seq: AtomicU64::new(0),
    bulk: AtomicU64::new(0),
    began_ns: AtomicU64::new(0),
    took_ns: AtomicU64::new(0),
};

static SLOTS: [Slot; RING] = [EMPTY; RING];
/// Requests begun so far (the next one's slot is `count % RING`).
static COUNT: AtomicUsize = AtomicUsize::new(0);
static SESSION: AtomicU64 = AtomicU64::new(0);
/// Totals for the metrics (crate::metrics): bulk bytes received, ns spent serving.
static BULK: AtomicU64 = AtomicU64::new(0);
/// Bulk bytes sent back (reads), through the session's writer.
static SENT: AtomicU64 = AtomicU64::new(0);

/// The session sent `bytes` of bulk data (a read's contents).
pub fn sent(bytes: u64) {
    SENT.fetch_add(bytes, Ordering::Relaxed);
}

/// Replies sent: the requests the client waited for (its round trips).
static REPLIES: AtomicU64 = AtomicU64::new(0);
/// Bulk bytes received and sent over the session's data lanes.
static LANE_RECEIVED: AtomicU64 = AtomicU64::new(0);
static LANE_SENT: AtomicU64 = AtomicU64::new(0);
static SHARED_RECEIVED: AtomicU64 = AtomicU64::new(0);
static SHARED_SENT: AtomicU64 = AtomicU64::new(0);

/// The session answered a request.
pub fn replied() {
    REPLIES.fetch_add(1, Ordering::Relaxed);
}

/// Failures reported to the client, by API and error code (replies, ends of reads, and
/// posted requests' failures kept for the next synchronizing call).
fn failures() -> &'static std::sync::Mutex<std::collections::HashMap<(&'static str, i64), u64>> {
    static FAILURES: OnceLock<
        std::sync::Mutex<std::collections::HashMap<(&'static str, i64), u64>>,
    > = OnceLock::new();
    FAILURES.get_or_init(Default::default)
}

/// A request of `api` failed with `code`.
pub fn failed(api: &'static str, code: i64) {
    *failures().lock().unwrap().entry((api, code)).or_default() += 1;
}

/// `bytes` of a request's bulk came over the data lanes.
pub fn lane_received(bytes: u64) {
    LANE_RECEIVED.fetch_add(bytes, Ordering::Relaxed);
}

/// `bytes` of a request's bulk came through the shared-memory ring.
pub fn shared_received(bytes: u64) {
    SHARED_RECEIVED.fetch_add(bytes, Ordering::Relaxed);
}

/// `bytes` of a read's data go out through the shared-memory ring.
pub fn shared_sent(bytes: u64) {
    SHARED_SENT.fetch_add(bytes, Ordering::Relaxed);
}

/// `bytes` of a read's data go out over the data lanes.
pub fn lane_sent(bytes: u64) {
    LANE_SENT.fetch_add(bytes, Ordering::Relaxed);
}
static BUSY_NS: AtomicU64 = AtomicU64::new(0);

/// The session's totals so far.
pub fn stats() -> crate::metrics::WorkerStats {
    let mut calls: Vec<crate::metrics::CallStats> = by_call()
        .lock()
        .unwrap()
        .iter()
        .map(|(name, &(count, busy_ns))| crate::metrics::CallStats {
            call: name.to_string(),
            count,
            busy_us: busy_ns / 1000,
        })
        .collect();
    calls.sort_by(|a, b| a.call.cmp(&b.call));
    let mut errors: Vec<crate::metrics::ErrorStats> = failures()
        .lock()
        .unwrap()
        .iter()
        .map(|(&(api, code), &count)| crate::metrics::ErrorStats {
            api: api.to_string(),
            code,
            count,
        })
        .collect();
    errors.sort_by(|a, b| (&a.api, a.code).cmp(&(&b.api, b.code)));
    let (memory, objects) = held();
    let (queued, unsent) = socket_queues();
    crate::metrics::WorkerStats {
        memory,
        objects,
        queued,
        unsent,
        requests: COUNT.load(Ordering::Relaxed) as u64,
        bulk_received: BULK.load(Ordering::Relaxed),
        bulk_sent: SENT.load(Ordering::Relaxed),
        busy_us: BUSY_NS.load(Ordering::Relaxed) / 1000,
        replies: REPLIES.load(Ordering::Relaxed),
        lane_received: LANE_RECEIVED.load(Ordering::Relaxed),
        lane_sent: LANE_SENT.load(Ordering::Relaxed),
        shared_received: SHARED_RECEIVED.load(Ordering::Relaxed),
        shared_sent: SHARED_SENT.load(Ordering::Relaxed),
        calls,
        errors,
    }
}

/// The session's socket (-1: none watched).
static SOCKET: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// Reports the queues of socket `fd` (the session's connection) in this process's statistics.
pub fn watch_socket(fd: std::os::fd::RawFd) {
    SOCKET.store(fd, Ordering::Relaxed);
}

/// The bytes waiting in the watched socket's receive queue, and those sent but not yet
/// acknowledged by the peer.
fn socket_queues() -> (u64, u64) {
    let fd = SOCKET.load(Ordering::Relaxed);
    if fd < 0 {
        return (0, 0);
    }
    let queue = |request| {
        let mut bytes: libc::c_int = 0;
        // SAFETY: SIOCINQ and SIOCOUTQ write one int through the pointer given; `fd` is the
        // session's socket, open while its worker serves (a closed one fails with EBADF).
        let done = unsafe { libc::ioctl(fd, request, &mut bytes as *mut libc::c_int) };
        if done == 0 {
            bytes.max(0) as u64
        } else {
            0
        }
    };
    (queue(libc::FIONREAD), queue(libc::TIOCOUTQ))
}

/// The session's memory and objects (its worker's one session; with sessions on threads the
/// last one made, which only the worker's figures use).
static USAGE: OnceLock<std::sync::Mutex<Option<std::sync::Weak<crate::limits::Usage>>>> =
    OnceLock::new();

/// Reports `usage` in this process's statistics.
pub fn watch_usage(usage: &std::sync::Arc<crate::limits::Usage>) {
    *USAGE.get_or_init(Default::default).lock().unwrap() = Some(std::sync::Arc::downgrade(usage));
}

/// Device memory and objects the session holds now.
fn held() -> (u64, u64) {
    USAGE
        .get()
        .and_then(|u| {
            u.lock()
                .unwrap()
                .as_ref()
                .and_then(std::sync::Weak::upgrade)
        })
        .map_or((0, 0), |u| (u.memory(), u.objects() as u64))
}

/// Requests and ns served per request name (for the metrics; not read by signal handlers).
fn by_call() -> &'static std::sync::Mutex<std::collections::HashMap<&'static str, (u64, u64)>> {
    static BY_CALL: OnceLock<
        std::sync::Mutex<std::collections::HashMap<&'static str, (u64, u64)>>,
    > = OnceLock::new();
    BY_CALL.get_or_init(Default::default)
}

fn clock() -> &'static Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now)
}

/// A request begins: returns its token for [`end`].
pub fn begin(name: &'static str, seq: u64, bulk: u64) -> usize {
    let n = COUNT.load(Ordering::Relaxed);
    let slot = &SLOTS[n % RING];
    slot.took_ns.store(u64::MAX, Ordering::Relaxed);
    slot.name.store(name.as_ptr().cast_mut(), Ordering::Relaxed);
    slot.name_len.store(name.len(), Ordering::Relaxed);
    slot.seq.store(seq, Ordering::Relaxed);
    slot.bulk.store(bulk, Ordering::Relaxed);
    BULK.fetch_add(bulk, Ordering::Relaxed);
    slot.began_ns
        .store(clock().elapsed().as_nanos() as u64, Ordering::Relaxed);
    COUNT.store(n + 1, Ordering::Release);
    n
}

/// The request `token` ended.
pub fn end(token: usize) {
    let slot = &SLOTS[token % RING];
    let began = slot.began_ns.load(Ordering::Relaxed);
    let took = (clock().elapsed().as_nanos() as u64).saturating_sub(began);
    slot.took_ns.store(took, Ordering::Relaxed);
    BUSY_NS.fetch_add(took, Ordering::Relaxed);
    let name = slot.name.load(Ordering::Relaxed);
    let len = slot.name_len.load(Ordering::Relaxed);
    if !name.is_null() {
        // SAFETY: `name`/`len` are a `&'static str`'s, stored together by `begin`.
        let name = unsafe { std::str::from_utf8_unchecked(std::slice::from_raw_parts(name, len)) };
        let mut by_call = by_call().lock().unwrap();
        let entry = by_call.entry(name).or_default();
        entry.0 += 1;
        entry.1 += took;
    }
}

/// For the recorder's own test: a server started with `RGPU_TEST_WORKER_ABORT_IN=<request>`
/// (e.g. `CreateBuffer`) has the worker abort when it begins serving that request.
pub fn crash_test(name: &str) {
    static TARGET: OnceLock<Option<String>> = OnceLock::new();
    let target = TARGET.get_or_init(|| std::env::var("RGPU_TEST_WORKER_ABORT_IN").ok());
    if target.as_deref() == Some(name) {
        std::process::abort();
    }
}

/// Whether this process is one session's worker (its counters are that session's alone).
static INSTALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// This process's counters if they are one session's (not with sessions on threads, whose
/// counters add up in one process).
pub fn session_stats() -> Option<crate::metrics::WorkerStats> {
    INSTALLED.load(Ordering::Relaxed).then(stats)
}

/// Installs the fatal-signal and SIGUSR2 handlers (a worker, once its session is known).
pub fn install(session: u64) {
    SESSION.store(session, Ordering::Relaxed);
    INSTALLED.store(true, Ordering::Relaxed);
    clock();
    // Loads libgcc's unwinder now: the first backtrace() would, and loading allocates.
    let mut frames = [std::ptr::null_mut(); 4];
    // SAFETY: `frames` has room for the 4 entries asked for.
    unsafe { backtrace(frames.as_mut_ptr(), 4) };
    for signal in [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGILL,
        libc::SIGFPE,
        libc::SIGABRT,
    ] {
        set_handler(
            signal,
            on_fatal_signal,
            libc::SA_RESETHAND | libc::SA_ONSTACK,
        );
    }
    set_handler(libc::SIGUSR2, on_dump_signal, libc::SA_RESTART);
}

fn set_handler(signal: libc::c_int, handler: extern "C" fn(libc::c_int), flags: libc::c_int) {
    // SAFETY: a zeroed sigaction is valid; the handler is an `extern "C" fn(c_int)` that only
    // does what a signal handler may (see the module's documentation).
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as *const () as usize;
        action.sa_flags = flags;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(signal, &action, std::ptr::null_mut());
    }
}

extern "C" {
    fn backtrace(buffer: *mut *mut libc::c_void, size: libc::c_int) -> libc::c_int;
    fn backtrace_symbols_fd(buffer: *const *mut libc::c_void, size: libc::c_int, fd: libc::c_int);
}

extern "C" fn on_fatal_signal(signal: libc::c_int) {
    let mut out = Line::new();
    out.push("rgpu: session ");
    out.number(SESSION.load(Ordering::Relaxed));
    out.push(": its worker (pid ");
    // SAFETY: getpid is async-signal-safe.
    out.number(unsafe { libc::getpid() } as u64);
    out.push(") got fatal signal ");
    out.number(signal as u64);
    let count = COUNT.load(Ordering::Acquire);
    match count.checked_sub(1).map(|last| &SLOTS[last % RING]) {
        Some(slot) if slot.took_ns.load(Ordering::Relaxed) == u64::MAX => {
            out.push(" while serving ");
            out.request(slot);
        }
        _ => out.push(" between requests"),
    }
    out.push("\n");
    out.write();
    dump_ring("the requests before it");
    let mut frames = [std::ptr::null_mut(); 64];
    // SAFETY: `frames` has room for 64 entries; the unwinder was loaded at install.
    let depth = unsafe { backtrace(frames.as_mut_ptr(), 64) };
    let mut title = Line::new();
    title.push("rgpu: native backtrace of the worker (rgpu's frames as offsets: `addr2line -f -C -e $(which rgpu) OFFSET`):\n");
    title.write();
    // SAFETY: `depth` entries of `frames` were filled; fd 2 is the log.
    unsafe { backtrace_symbols_fd(frames.as_ptr(), depth, 2) };
    // SA_RESETHAND put the default action back: the signal kills the worker once returned to
    // (a fault) or raised again (an abort).
    // SAFETY: raise is async-signal-safe.
    unsafe { libc::raise(signal) };
}

extern "C" fn on_dump_signal(_: libc::c_int) {
    dump_ring("requests asked for (SIGUSR2)");
}

/// Writes the ring, oldest first.
fn dump_ring(title: &str) {
    let count = COUNT.load(Ordering::Acquire);
    let mut head = Line::new();
    head.push("rgpu: session ");
    head.number(SESSION.load(Ordering::Relaxed));
    head.push(", last ");
    head.number(count.min(RING) as u64);
    head.push(" of ");
    head.number(count as u64);
    head.push(" ");
    head.push(title);
    head.push(":\n");
    head.write();
    for n in count.saturating_sub(RING)..count {
        let mut line = Line::new();
        line.push("  ");
        line.request(&SLOTS[n % RING]);
        line.push("\n");
        line.write();
    }
}

/// A line built on the stack and written with one write(2).
struct Line {
    buf: [u8; 512],
    len: usize,
}

impl Line {
    fn new() -> Line {
        Line {
            buf: [0; 512],
            len: 0,
        }
    }

    fn push(&mut self, text: &str) {
        self.bytes(text.as_bytes());
    }

    fn bytes(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    fn number(&mut self, mut value: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (value % 10) as u8;
            value /= 10;
            if value == 0 {
                break;
            }
        }
        self.bytes(&digits[i..]);
    }

    fn request(&mut self, slot: &Slot) {
        let name = slot.name.load(Ordering::Relaxed);
        let len = slot.name_len.load(Ordering::Relaxed);
        if name.is_null() {
            self.push("(none)");
        } else {
            // SAFETY: `name`/`len` are a `&'static str`'s, stored together by `begin`.
            self.bytes(unsafe { std::slice::from_raw_parts(name, len) });
        }
        self.push(" seq ");
        self.number(slot.seq.load(Ordering::Relaxed));
        self.push(", bulk ");
        self.number(slot.bulk.load(Ordering::Relaxed));
        self.push(" B, at ");
        self.number(slot.began_ns.load(Ordering::Relaxed) / 1_000_000);
        self.push(" ms, ");
        match slot.took_ns.load(Ordering::Relaxed) {
            u64::MAX => self.push("not finished"),
            took => {
                self.number(took / 1000);
                self.push(" us");
            }
        }
    }

    fn write(&self) {
        // SAFETY: write(2) of our own buffer to the log (async-signal-safe).
        unsafe { libc::write(2, self.buf.as_ptr().cast(), self.len) };
    }
}
