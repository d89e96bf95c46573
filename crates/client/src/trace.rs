//! Call tracing and statistics: what each intercepted call cost and how much of it was the
//! network.
//!
//! - `RGPU_TRACE=FILE`: one JSON line per call the program made into an rgpu library (CUDA
//!   driver, OpenCL, NVML, NCCL), after a header line ([`TraceHeader`], [`CallRecord`]);
//!   `rgpu trace FILE` reads it back. `%p` in FILE becomes the process id (each process of a
//!   multi-process program writes its own).
//! - `RGPU_STATS=1`: at exit, a table on stderr of calls, network waits and time per entry
//!   point ([`StatsTable`]), the same one `rgpu trace` prints.
//!
//! Every exported entry point's panic guard opens a [`Span`]; the connection code reports into
//! the innermost open span of its thread (a network wait, a posted request, bulk bytes), and the
//! span's end writes the record. Calls made while a span is open (an entry point implemented
//! with another) count in the outer one. With neither variable set a span is one load of an
//! initialized `OnceLock` and a branch.

use std::cell::Cell;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The trace file's format version ([`TraceHeader::rgpu_trace`]). 2 added [`SessionRecord`]
/// lines; a trace of format 1 reads as one without them.
pub const TRACE_FORMAT: u32 = 2;

/// The first line of a trace.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TraceHeader {
    /// The format version, [`TRACE_FORMAT`].
    pub rgpu_trace: u32,
    pub pid: u32,
    /// When the trace began, µs since the Unix epoch (the records' `t` counts from here).
    pub start_unix_us: u64,
    /// The program, as /proc/self/cmdline gives it (arguments joined by spaces).
    pub command: String,
    /// The emulated link the program ran behind (`RGPU_LINK`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
}

/// One call the program made into an rgpu library.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CallRecord {
    /// Start, µs after the trace began.
    pub t: u64,
    /// The program's thread, numbered in the order threads first called (1, 2, …).
    pub thread: u32,
    /// "cuda", "opencl", "nvml" or "nccl".
    pub api: String,
    /// The entry point.
    pub call: String,
    /// The call's time in the client, µs (network waits included).
    pub us: f64,
    /// Network waits: replies (round trips) and blocking reads the call waited for.
    pub waits: u32,
    /// Of `us`, the time spent in those waits.
    pub wait_us: f64,
    /// Of `wait_us`, what the server said it spent on the requests (from taking each off the
    /// connection to its reply; 0 where it did not say, as for reads).
    #[serde(default)]
    pub server_us: f64,
    /// Requests it sent without waiting for a reply (posted).
    pub posted: u32,
    /// Bulk bytes it sent (copies to the device, kernel arguments, …).
    pub bytes_out: u64,
    /// Bulk bytes it read back (copies from the device).
    pub bytes_in: u64,
}

/// A server's counters of one of the program's sessions, asked for when the program exits
/// (after its calls' records, but the records of another rgpu library of the process may
/// follow).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SessionRecord {
    /// When they were asked for, µs after the trace began.
    pub t: u64,
    /// The server's name and address, and its session's id.
    pub server: String,
    pub endpoint: String,
    pub session: u64,
    pub counters: rgpu_protocol::session::SessionCounters,
}

/// A trace read back ([`read_trace`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    pub header: TraceHeader,
    pub calls: Vec<CallRecord>,
    pub sessions: Vec<SessionRecord>,
}

/// What the connection code adds to the span open on its thread.
#[derive(Default, Clone, Copy)]
struct Counters {
    waits: u32,
    wait: Duration,
    /// Of the waits, the server's own time on the requests (`Timing` frames).
    served_us: u64,
    posted: u32,
    bytes_out: u64,
    bytes_in: u64,
}

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    static COUNTERS: Cell<Counters> = const { Cell::new(Counters {
        waits: 0, wait: Duration::ZERO, served_us: 0, posted: 0, bytes_out: 0, bytes_in: 0,
    }) };
    static THREAD: Cell<u32> = const { Cell::new(0) };
    /// This thread's record being serialized (outside the trace's lock).
    static LINE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

struct Tracer {
    start: Instant,
    /// `start` as µs after the trace file's header time (a second library of this process,
    /// NVML beside CUDA, writes into the file the first one began).
    start_after_header_us: u64,
    file: Option<&'static TraceFile>,
    stats: Option<Mutex<HashMap<(&'static str, &'static str), Stat>>>,
}

/// The trace file and the whole lines not yet written to it. A writer thread writes them a
/// buffer at a time (the program's threads never wait for the disk), in append mode and whole
/// lines only, so the libraries of one process (each has its own tracer) never split each
/// other's lines.
struct TraceFile {
    file: Mutex<File>,
    pending: Mutex<Vec<u8>>,
    /// Signalled when `pending` grows past [`TraceFile::FLUSH_AT`].
    full: Condvar,
}

impl TraceFile {
    const FLUSH_AT: usize = 256 * 1024;

    fn new(file: File) -> &'static TraceFile {
        let trace: &'static TraceFile = Box::leak(Box::new(TraceFile {
            file: Mutex::new(file),
            pending: Mutex::new(Vec::with_capacity(Self::FLUSH_AT * 2)),
            full: Condvar::new(),
        }));
        let _ = std::thread::Builder::new()
            .name("rgpu-trace".into())
            .spawn(move || trace.write_behind());
        trace
    }

    /// Appends one serialized line (made by the caller, outside the lock).
    fn push(&self, line: &[u8]) {
        let Ok(mut pending) = self.pending.lock() else {
            return;
        };
        pending.extend_from_slice(line);
        if pending.len() >= Self::FLUSH_AT {
            self.full.notify_one();
        }
    }

    /// The writer thread: writes what is pending once there is enough, or every 100 ms.
    fn write_behind(&self) {
        loop {
            {
                let Ok(pending) = self.pending.lock() else {
                    return;
                };
                if self
                    .full
                    .wait_timeout(pending, Duration::from_millis(100))
                    .is_err()
                {
                    return;
                }
            }
            self.flush();
        }
    }

    /// Writes what is pending now. The file's lock is taken first, so batches reach the file
    /// in the order they were taken.
    fn flush(&self) {
        let Ok(mut file) = self.file.lock() else {
            return;
        };
        let batch = match self.pending.lock() {
            Ok(mut pending) => std::mem::replace(&mut *pending, Vec::with_capacity(Self::FLUSH_AT)),
            Err(_) => return,
        };
        if !batch.is_empty() {
            let _ = file.write_all(&batch);
        }
    }
}

fn tracer() -> Option<&'static Tracer> {
    static TRACER: OnceLock<Option<Tracer>> = OnceLock::new();
    TRACER.get_or_init(start_tracer).as_ref()
}

fn start_tracer() -> Option<Tracer> {
    let path = std::env::var("RGPU_TRACE").ok().filter(|p| !p.is_empty());
    let stats = std::env::var("RGPU_STATS").is_ok_and(|v| !v.is_empty() && v != "0");
    if path.is_none() && !stats {
        return None;
    }
    let start = Instant::now();
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let mut start_after_header_us = 0;
    let file = path.and_then(|path| {
        let path = path.replace("%p", &std::process::id().to_string());
        match open_trace(&path, now_us) {
            Ok((file, header_us)) => {
                start_after_header_us = now_us.saturating_sub(header_us);
                Some(TraceFile::new(file))
            }
            Err(e) => {
                eprintln!("rgpu: RGPU_TRACE: cannot write {path}: {e}; not tracing");
                None
            }
        }
    });
    at_exit();
    Some(Tracer {
        start,
        start_after_header_us,
        file,
        stats: stats.then(|| Mutex::new(HashMap::new())),
    })
}

/// Opens the trace file for appending. The first library of this process to trace starts it
/// over with a header; a later one (its header names this process) appends. Returns the file
/// and its header's start time.
fn open_trace(path: &str, now_us: u64) -> std::io::Result<(File, u64)> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)?;
    file.lock()?;
    let mut first = String::new();
    let _ = (&file).take(4096).read_to_string(&mut first);
    let ours = first
        .lines()
        .next()
        .and_then(|line| serde_json::from_str::<TraceHeader>(line).ok())
        .filter(|h| h.pid == std::process::id() && h.rgpu_trace == TRACE_FORMAT);
    let header_us = match ours {
        Some(header) => header.start_unix_us,
        None => {
            file.set_len(0)?;
            let header = TraceHeader {
                rgpu_trace: TRACE_FORMAT,
                pid: std::process::id(),
                start_unix_us: now_us,
                command: command_line(),
                link: std::env::var("RGPU_LINK").ok().filter(|l| !l.is_empty()),
            };
            let mut line = serde_json::to_vec(&header).map_err(std::io::Error::other)?;
            line.push(b'\n');
            file.write_all(&line)?;
            now_us
        }
    };
    file.unlock()?;
    Ok((file, header_us))
}

fn command_line() -> String {
    std::fs::read("/proc/self/cmdline")
        .map(|raw| {
            raw.split(|&b| b == 0)
                .filter(|part| !part.is_empty())
                .map(|part| String::from_utf8_lossy(part).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// Runs [`finish`] when the program exits (flushes the trace, prints the statistics).
fn at_exit() {
    extern "C" {
        fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
    }
    extern "C" fn on_exit() {
        finish();
    }
    // SAFETY: atexit takes a plain function pointer; `on_exit` is `extern "C"` and lives as long
    // as this library (glibc runs a library's handlers when it is unloaded, before its code goes).
    unsafe { atexit(on_exit) };
}

/// The sessions whose servers' counters end the trace.
fn traced_sessions() -> &'static Mutex<Vec<std::sync::Weak<crate::ServerSession>>> {
    static SESSIONS: OnceLock<Mutex<Vec<std::sync::Weak<crate::ServerSession>>>> = OnceLock::new();
    SESSIONS.get_or_init(Default::default)
}

/// A session opened while tracing to a file: its server's counters end the trace.
pub(crate) fn session_opened(connection: &std::sync::Arc<crate::ServerSession>) {
    if let Ok(mut sessions) = traced_sessions().lock() {
        sessions.retain(|s| s.strong_count() > 0);
        sessions.push(std::sync::Arc::downgrade(connection));
    }
}

/// Asks the server of each session still open for its counters and writes them to the trace
/// (a server that keeps none per session, or is gone, is left out).
fn write_session_counters(tracer: &Tracer, file: &TraceFile) {
    use rgpu_protocol::session::SessionClient;
    let sessions: Vec<_> = match traced_sessions().lock() {
        Ok(mut sessions) => std::mem::take(&mut *sessions),
        Err(_) => return,
    };
    for connection in sessions.iter().filter_map(std::sync::Weak::upgrade) {
        let Ok(Ok(counters)) = connection.session().get_counters() else {
            continue;
        };
        let record = SessionRecord {
            t: tracer.start_after_header_us + tracer.start.elapsed().as_micros() as u64,
            server: connection.server_name().to_string(),
            endpoint: connection.endpoint().to_string(),
            session: connection.session_id(),
            counters,
        };
        if let Ok(mut line) = serde_json::to_vec(&record) {
            line.push(b'\n');
            file.push(&line);
        }
    }
}

/// Ends the trace with the sessions' counters, flushes it, and prints the statistics table
/// (once; later calls do nothing).
pub fn finish() {
    let Some(tracer) = tracer() else { return };
    if let Some(file) = tracer.file {
        write_session_counters(tracer, file);
        file.flush();
    }
    if let Some(stats) = &tracer.stats {
        let Ok(mut stats) = stats.lock() else { return };
        if stats.is_empty() {
            return;
        }
        let table = StatsTable::from_stats(std::mem::take(&mut *stats));
        let mut apis: Vec<&str> = table.rows.iter().map(|row| row.0.as_str()).collect();
        apis.sort_unstable();
        apis.dedup();
        let title = format!(
            "rgpu: {} calls of process {}",
            apis.join(", "),
            std::process::id()
        );
        eprint!("{}", table.render(&title));
    }
}

/// An intercepted call, open from its entry point's guard to the guard's return.
#[must_use]
pub struct Span {
    state: SpanState,
}

enum SpanState {
    /// Tracing is off: nothing to do at the end.
    Off,
    /// Inside another traced call, which counts this one's costs.
    Nested,
    Outer {
        api: &'static str,
        call: &'static str,
        start: Instant,
    },
}

/// Opens the span of entry point `call` of `api` (every exported entry point's guard does).
#[inline]
pub fn enter(api: &'static str, call: &'static str) -> Span {
    if tracer().is_none() {
        return Span {
            state: SpanState::Off,
        };
    }
    let depth = DEPTH.with(|d| {
        d.set(d.get() + 1);
        d.get()
    });
    if depth > 1 {
        return Span {
            state: SpanState::Nested,
        };
    }
    COUNTERS.with(|c| c.set(Counters::default()));
    Span {
        state: SpanState::Outer {
            api,
            call,
            start: Instant::now(),
        },
    }
}

impl Drop for Span {
    #[inline]
    fn drop(&mut self) {
        let (api, call, start) = match self.state {
            SpanState::Off => return,
            SpanState::Nested => {
                DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
                return;
            }
            SpanState::Outer { api, call, start } => (api, call, start),
        };
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
        end_call(api, call, start);
    }
}

/// Records an outermost call that began at `start`.
fn end_call(api: &'static str, call: &'static str, start: Instant) {
    let Some(tracer) = tracer() else { return };
    let took = start.elapsed();
    let counters = COUNTERS.with(|c| c.replace(Counters::default()));
    if let Some(stats) = &tracer.stats {
        if let Ok(mut stats) = stats.lock() {
            stats.entry((api, call)).or_default().add(took, &counters);
        }
    }
    if let Some(file) = tracer.file {
        let record = CallRecordRef {
            t: tracer.start_after_header_us + start.duration_since(tracer.start).as_micros() as u64,
            thread: thread_number(),
            api,
            call,
            us: micros(took),
            waits: counters.waits,
            wait_us: micros(counters.wait),
            server_us: counters.served_us as f64,
            posted: counters.posted,
            bytes_out: counters.bytes_out,
            bytes_in: counters.bytes_in,
        };
        let write = |line: &mut Vec<u8>| {
            line.clear();
            if serde_json::to_writer(&mut *line, &record).is_ok() {
                line.push(b'\n');
                file.push(line);
            }
        };
        // Calls made while the process exits (atexit handlers, after this thread's locals
        // are gone) get a buffer of their own.
        if LINE
            .try_with(|line| {
                line.try_borrow_mut()
                    .map(|mut line| write(&mut line))
                    .is_ok()
            })
            .ok()
            != Some(true)
        {
            write(&mut Vec::new());
        }
    }
}

/// [`CallRecord`] as written (borrowing the names; the same JSON).
#[derive(Serialize)]
struct CallRecordRef {
    t: u64,
    thread: u32,
    api: &'static str,
    call: &'static str,
    us: f64,
    waits: u32,
    wait_us: f64,
    server_us: f64,
    posted: u32,
    bytes_out: u64,
    bytes_in: u64,
}

fn micros(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1000.0
}

fn thread_number() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    THREAD.with(|t| {
        if t.get() == 0 {
            t.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        t.get()
    })
}

/// Adds to this thread's open span, if one is open and tracing is on.
#[inline]
fn add(f: impl FnOnce(&mut Counters)) {
    if tracer().is_none() || DEPTH.with(Cell::get) == 0 {
        return;
    }
    COUNTERS.with(|c| {
        let mut counters = c.get();
        f(&mut counters);
        c.set(counters);
    });
}

/// The calling thread waited `took` for the network (a reply or a read's completion).
pub(crate) fn waited(took: Duration) {
    add(|c| {
        c.waits += 1;
        c.wait += took;
    });
}

/// The server spent `us` on the request the calling thread just waited for.
pub(crate) fn served(us: u32) {
    add(|c| c.served_us += u64::from(us));
}

/// Whether calls are traced to a file (the server is then asked for its time on each request).
pub(crate) fn tracing_to_file() -> bool {
    tracer().is_some_and(|t| t.file.is_some())
}

/// The calling thread sent a request without waiting for its reply, with `bulk` bytes.
pub(crate) fn posted(bulk: usize) {
    add(|c| {
        c.posted += 1;
        c.bytes_out += bulk as u64;
    });
}

/// The calling thread sent `bulk` bytes with a request it waits for.
pub(crate) fn sent(bulk: usize) {
    add(|c| c.bytes_out += bulk as u64);
}

/// The calling thread asked for `len` bytes to be read back.
pub(crate) fn reading(len: usize) {
    add(|c| c.bytes_in += len as u64);
}

/// Totals of one entry point.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Stat {
    pub calls: u64,
    /// Calls that waited on the network at least once.
    pub waiting_calls: u64,
    pub waits: u64,
    pub time: Duration,
    pub wait: Duration,
    pub posted: u64,
    pub bytes_out: u64,
    pub bytes_in: u64,
}

impl Stat {
    fn add(&mut self, took: Duration, c: &Counters) {
        self.calls += 1;
        self.waiting_calls += u64::from(c.waits > 0);
        self.waits += u64::from(c.waits);
        self.time += took;
        self.wait += c.wait;
        self.posted += u64::from(c.posted);
        self.bytes_out += c.bytes_out;
        self.bytes_in += c.bytes_in;
    }

    /// How the entry point's calls used the network: `waits` (every call waited), `waits N%`
    /// (that share of its calls did), `posted` (sent requests, never waited) or `local`.
    pub fn class(&self) -> String {
        if self.waiting_calls > 0 && self.waiting_calls == self.calls {
            "waits".into()
        } else if self.waiting_calls > 0 {
            // At least 1 %: a call that ever waits is not to be mistaken for one that never does.
            let share = (self.waiting_calls * 100 / self.calls.max(1)).max(1);
            format!("waits {share}%")
        } else if self.posted > 0 {
            "posted".into()
        } else {
            "local".into()
        }
    }

    /// Adds one traced call.
    pub fn add_record(&mut self, r: &CallRecord) {
        self.calls += 1;
        self.waiting_calls += u64::from(r.waits > 0);
        self.waits += u64::from(r.waits);
        self.time += Duration::from_secs_f64(r.us.max(0.0) / 1e6);
        self.wait += Duration::from_secs_f64(r.wait_us.max(0.0) / 1e6);
        self.posted += u64::from(r.posted);
        self.bytes_out += r.bytes_out;
        self.bytes_in += r.bytes_in;
    }
}

/// Per-entry-point totals, as `RGPU_STATS=1` and `rgpu trace` print them: the entry points
/// that waited on the network most first.
#[derive(Debug, Default)]
pub struct StatsTable {
    pub rows: Vec<(String, String, Stat)>,
}

impl StatsTable {
    fn from_stats(stats: HashMap<(&'static str, &'static str), Stat>) -> StatsTable {
        let rows = stats
            .into_iter()
            .map(|((api, call), stat)| (api.to_string(), call.to_string(), stat))
            .collect();
        StatsTable::sorted(rows)
    }

    /// The table of a trace's records.
    pub fn from_records<'a>(records: impl IntoIterator<Item = &'a CallRecord>) -> StatsTable {
        let mut by_call: HashMap<(&str, &str), Stat> = HashMap::new();
        for r in records {
            by_call
                .entry((r.api.as_str(), r.call.as_str()))
                .or_default()
                .add_record(r);
        }
        let rows = by_call
            .into_iter()
            .map(|((api, call), stat)| (api.to_string(), call.to_string(), stat))
            .collect();
        StatsTable::sorted(rows)
    }

    fn sorted(mut rows: Vec<(String, String, Stat)>) -> StatsTable {
        rows.sort_by(|a, b| {
            (b.2.wait, b.2.time)
                .cmp(&(a.2.wait, a.2.time))
                .then_with(|| a.1.cmp(&b.1))
        });
        StatsTable { rows }
    }

    /// The table as text, under `title`, with a totals line.
    pub fn render(&self, title: &str) -> String {
        let mut total = Stat::default();
        let mut out = format!(
            "{title}\n{:<44} {:>9} {:>9} {:>12} {:>12} {:>9} {:>12} {:>12}  {}\n",
            "entry point",
            "calls",
            "waits",
            "wait ms",
            "time ms",
            "posted",
            "bytes out",
            "bytes in",
            "class"
        );
        for (api, call, s) in &self.rows {
            total.calls += s.calls;
            total.waiting_calls += s.waiting_calls;
            total.waits += s.waits;
            total.time += s.time;
            total.wait += s.wait;
            total.posted += s.posted;
            total.bytes_out += s.bytes_out;
            total.bytes_in += s.bytes_in;
            out += &row(&format!("{api} {call}"), s);
        }
        out += &row("total", &total);
        out
    }
}

fn row(name: &str, s: &Stat) -> String {
    format!(
        "{name:<44} {:>9} {:>9} {:>12.3} {:>12.3} {:>9} {:>12} {:>12}  {}\n",
        s.calls,
        s.waits,
        s.wait.as_secs_f64() * 1e3,
        s.time.as_secs_f64() * 1e3,
        s.posted,
        s.bytes_out,
        s.bytes_in,
        s.class()
    )
}

/// A trace file read back: its header, call records and sessions' counters (a line that does
/// not parse, e.g. the last one of a program killed mid-write, ends the reading).
pub fn read_trace(text: &str) -> Result<Trace, String> {
    let mut lines = text.lines();
    let first = lines.next().ok_or("an empty file, not an rgpu trace")?;
    let header: TraceHeader =
        serde_json::from_str(first).map_err(|e| format!("not an rgpu trace: {e}"))?;
    if !(1..=TRACE_FORMAT).contains(&header.rgpu_trace) {
        return Err(format!(
            "trace format {} (this rgpu reads 1 to {TRACE_FORMAT})",
            header.rgpu_trace
        ));
    }
    let mut trace = Trace {
        header,
        calls: Vec::new(),
        sessions: Vec::new(),
    };
    for line in lines {
        if let Ok(call) = serde_json::from_str::<CallRecord>(line) {
            trace.calls.push(call);
        } else if let Ok(session) = serde_json::from_str::<SessionRecord>(line) {
            trace.sessions.push(session);
        } else {
            break;
        }
    }
    Ok(trace)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(call: &str, us: f64, waits: u32, wait_us: f64) -> CallRecord {
        CallRecord {
            t: 0,
            thread: 1,
            api: "cuda".into(),
            call: call.into(),
            us,
            waits,
            wait_us,
            server_us: 0.0,
            posted: 1,
            bytes_out: 8,
            bytes_in: 0,
        }
    }

    #[test]
    fn a_trace_reads_back_and_its_table_puts_waits_first() {
        let header = TraceHeader {
            rgpu_trace: TRACE_FORMAT,
            pid: 7,
            start_unix_us: 1,
            command: "prog".into(),
            link: None,
        };
        let records = [
            record("cuLaunchKernel", 2.0, 0, 0.0),
            record("cuStreamSynchronize", 40.0, 1, 35.5),
            record("cuLaunchKernel", 3.0, 0, 0.0),
        ];
        let session = SessionRecord {
            t: 50,
            server: "gpu1".into(),
            endpoint: "tcp:gpu1:7000".into(),
            session: 3,
            counters: rgpu_protocol::session::SessionCounters {
                requests: 4,
                replies: 2,
                ..Default::default()
            },
        };
        let mut text = serde_json::to_string(&header).unwrap() + "\n";
        for r in &records[..2] {
            text += &(serde_json::to_string(r).unwrap() + "\n");
        }
        // Another library's session may end before this one's last records are written.
        text += &(serde_json::to_string(&session).unwrap() + "\n");
        text += &(serde_json::to_string(&records[2]).unwrap() + "\n");
        text += "{\"t\": 12, \"thre"; // cut short by a killed program
        let read = read_trace(&text).unwrap();
        assert_eq!(read.header, header);
        assert_eq!(read.calls, records);
        assert_eq!(read.sessions, [session]);
        let table = StatsTable::from_records(&read.calls);
        assert_eq!(table.rows[0].1, "cuStreamSynchronize");
        assert_eq!(table.rows[1].2.calls, 2);
        assert_eq!(table.rows[1].2.posted, 2);
        let text = table.render("t");
        assert!(text.lines().last().unwrap().starts_with("total"), "{text}");
        // Every synchronization waited; launches were posted; of all calls a third waited.
        assert_eq!(table.rows[0].2.class(), "waits");
        assert_eq!(table.rows[1].2.class(), "posted");
        assert!(
            text.lines().last().unwrap().ends_with("waits 33%"),
            "{text}"
        );
        assert!(read_trace(
            "{\"rgpu_trace\": 99, \"pid\": 1, \"start_unix_us\": 0, \"command\": \"\"}"
        )
        .is_err());
    }
}
