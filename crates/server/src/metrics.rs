//! Live metrics in Prometheus' text format (`rgpu server --metrics ADDR`, `GET /metrics`): the
//! listener's sessions (active, started, ended normally or not) and, from each session's
//! worker once a second, its requests and replies (the client's round trips), the bulk bytes
//! each way (and how much of them crossed data lanes) and the time it spent serving, per
//! session and in total (ended sessions included).
//!
//! The endpoint answers one connection at a time and reads at most [`MAX_REQUEST`] bytes for
//! at most [`READ_TIME`]: whoever can reach it costs the server one thread and a few KiB.
//! Metrics carry no secrets, but the address should be one the monitoring system alone
//! reaches (a private interface, or loopback behind the node's exporter).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// The most of a request the endpoint reads.
const MAX_REQUEST: usize = 4096;
/// How long it waits for a request.
const READ_TIME: Duration = Duration::from_secs(2);

/// What a session's worker reports (the totals so far).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WorkerStats {
    pub requests: u64,
    pub bulk_received: u64,
    /// Bulk bytes sent back (reads' contents).
    pub bulk_sent: u64,
    /// µs spent serving requests.
    pub busy_us: u64,
    /// Replies sent: the requests the client waited for (its round trips).
    pub replies: u64,
    /// Bulk bytes received and sent over the data lanes (part of the bulk figures above).
    pub lane_received: u64,
    pub lane_sent: u64,
    /// Bulk bytes received and sent through the shared-memory rings (a client on this host).
    #[serde(default)]
    pub shared_received: u64,
    #[serde(default)]
    pub shared_sent: u64,
    /// Per request name (`LaunchKernel`, `MemcpyHtoD`, …).
    pub calls: Vec<CallStats>,
    /// Failures reported to the client, per API and error code.
    pub errors: Vec<ErrorStats>,
    /// Device memory (bytes) and objects the session holds now, as its quotas count them.
    pub memory: u64,
    pub objects: u64,
    /// Bytes that reached the session's socket and wait for the worker (the requests the
    /// client posted ahead of the one being served), and bytes the worker wrote that the
    /// client has not yet acknowledged (replies and reads on their way): its queues.
    pub queued: u64,
    pub unsent: u64,
}

impl WorkerStats {
    /// Adds `other`'s counters (not its per-call and per-error lists, nor its gauges).
    fn add_counters(&mut self, other: &WorkerStats) {
        self.requests += other.requests;
        self.bulk_received += other.bulk_received;
        self.bulk_sent += other.bulk_sent;
        self.busy_us += other.busy_us;
        self.replies += other.replies;
        self.lane_received += other.lane_received;
        self.lane_sent += other.lane_sent;
        self.shared_received += other.shared_received;
        self.shared_sent += other.shared_sent;
    }

    /// The counters a client's trace gets (`GetCounters`).
    pub fn counters(&self) -> rgpu_protocol::session::SessionCounters {
        rgpu_protocol::session::SessionCounters {
            requests: self.requests,
            replies: self.replies,
            bulk_received: self.bulk_received,
            bulk_sent: self.bulk_sent,
            lane_received: self.lane_received,
            lane_sent: self.lane_sent,
            shared_received: self.shared_received,
            shared_sent: self.shared_sent,
            busy_us: self.busy_us,
            errors: self.errors.iter().map(|e| e.count).sum(),
            memory: self.memory,
            objects: self.objects,
        }
    }
}

/// One request name's totals.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CallStats {
    pub call: String,
    pub count: u64,
    pub busy_us: u64,
}

/// How often one API's requests failed with one code.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ErrorStats {
    /// `opencl`, `cuda` (NVML and NCCL included), `session`, or `read` (a read's end).
    pub api: String,
    pub code: i64,
    pub count: u64,
}

#[derive(Default)]
struct Session {
    client: String,
    stats: WorkerStats,
}

#[derive(Default)]
struct Metrics {
    started: AtomicU64,
    ended_normally: AtomicU64,
    ended_abnormally: AtomicU64,
    live: Mutex<HashMap<u64, Session>>,
    /// The totals of sessions that ended (their per-call figures in `ended_calls`).
    ended: Mutex<WorkerStats>,
    ended_calls: Mutex<HashMap<String, (u64, u64)>>,
    ended_errors: Mutex<HashMap<(String, i64), u64>>,
}

fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::default)
}

/// A session began to be served.
pub fn session_started(id: u64, client: &str) {
    let m = metrics();
    m.started.fetch_add(1, Ordering::Relaxed);
    m.live.lock().unwrap().insert(
        id,
        Session {
            client: client.to_string(),
            stats: WorkerStats::default(),
        },
    );
}

/// Its worker's latest totals.
pub fn session_stats(id: u64, stats: WorkerStats) {
    if let Some(session) = metrics().live.lock().unwrap().get_mut(&id) {
        session.stats = stats;
    }
}

/// The session ended (its worker exited, `normally` or not); its totals join the ended ones.
pub fn session_ended(id: u64, normally: bool) {
    let m = metrics();
    let Some(session) = m.live.lock().unwrap().remove(&id) else {
        return;
    };
    let counter = if normally {
        &m.ended_normally
    } else {
        &m.ended_abnormally
    };
    counter.fetch_add(1, Ordering::Relaxed);
    m.ended.lock().unwrap().add_counters(&session.stats);
    let mut calls = m.ended_calls.lock().unwrap();
    for call in session.stats.calls {
        let entry = calls.entry(call.call).or_default();
        entry.0 += call.count;
        entry.1 += call.busy_us;
    }
    let mut errors = m.ended_errors.lock().unwrap();
    for error in session.stats.errors {
        *errors.entry((error.api, error.code)).or_default() += error.count;
    }
}

/// The metrics as Prometheus' text exposition format.
pub fn render() -> String {
    let m = metrics();
    let live = m.live.lock().unwrap();
    let ended = m.ended.lock().unwrap().clone();
    let mut out = String::new();
    family(
        &mut out,
        "rgpu_sessions_active",
        "gauge",
        "Sessions being served.",
    );
    out += &format!("rgpu_sessions_active {}\n", live.len());
    family(
        &mut out,
        "rgpu_sessions_started_total",
        "counter",
        "Sessions begun.",
    );
    out += &format!(
        "rgpu_sessions_started_total {}\n",
        m.started.load(Ordering::Relaxed)
    );
    family(
        &mut out,
        "rgpu_sessions_ended_total",
        "counter",
        "Sessions ended, by how.",
    );
    out += &format!(
        "rgpu_sessions_ended_total{{how=\"normal\"}} {}\nrgpu_sessions_ended_total{{how=\"abnormal\"}} {}\n",
        m.ended_normally.load(Ordering::Relaxed),
        m.ended_abnormally.load(Ordering::Relaxed)
    );
    let mut ids: Vec<&u64> = live.keys().collect();
    ids.sort();
    let mut calls = m.ended_calls.lock().unwrap().clone();
    for session in live.values() {
        for call in &session.stats.calls {
            let entry = calls.entry(call.call.clone()).or_default();
            entry.0 += call.count;
            entry.1 += call.busy_us;
        }
    }
    let totals = live.values().fold(ended, |mut t, s| {
        t.add_counters(&s.stats);
        t
    });
    let per_session: [(&str, &str, Figure); 9] = [
        ("requests", "Requests served.", |s| s.requests.to_string()),
        (
            "replies",
            "Replies sent: the requests a client waited for (its round trips); the rest were posted.",
            |s| s.replies.to_string(),
        ),
        (
            "lane_received_bytes",
            "Bulk bytes received over data lanes (part of received_bulk_bytes).",
            |s| s.lane_received.to_string(),
        ),
        (
            "lane_sent_bytes",
            "Bulk bytes sent over data lanes (part of sent_bulk_bytes).",
            |s| s.lane_sent.to_string(),
        ),
        (
            "shared_received_bytes",
            "Bulk bytes received through shared memory (part of received_bulk_bytes).",
            |s| s.shared_received.to_string(),
        ),
        (
            "shared_sent_bytes",
            "Bulk bytes sent through shared memory (part of sent_bulk_bytes).",
            |s| s.shared_sent.to_string(),
        ),
        (
            "received_bulk_bytes",
            "Bulk bytes received with requests (writes, arguments).",
            |s| s.bulk_received.to_string(),
        ),
        (
            "sent_bulk_bytes",
            "Bulk bytes sent back (reads' contents).",
            |s| s.bulk_sent.to_string(),
        ),
        ("busy_seconds", "Time spent serving requests.", |s| {
            format!("{:.6}", s.busy_us as f64 / 1e6)
        }),
    ];
    for (what, help, get) in [
        (
            "memory_bytes",
            "Device memory the session holds (as its quota counts it).",
            (|s: &WorkerStats| s.memory) as fn(&WorkerStats) -> u64,
        ),
        (
            "objects",
            "Objects the session holds.",
            |s: &WorkerStats| s.objects,
        ),
        (
            "queued_bytes",
            "Bytes of requests in the session's socket that its worker has not yet taken: how far the client is ahead (TCP and Unix sockets, TLS included; sampled each second).",
            |s: &WorkerStats| s.queued,
        ),
        (
            "unsent_bytes",
            "Bytes the session's worker wrote that its client has not yet acknowledged (sampled each second).",
            |s: &WorkerStats| s.unsent,
        ),
    ] {
        let name = format!("rgpu_session_{what}");
        family(&mut out, &name, "gauge", help);
        for id in &ids {
            let session = &live[id];
            out += &format!(
                "{name}{{session=\"{id}\",client=\"{}\"}} {}\n",
                escape(&session.client),
                get(&session.stats)
            );
        }
    }
    for (what, help, value) in per_session {
        let name = format!("rgpu_session_{what}_total");
        family(
            &mut out,
            &name,
            "counter",
            &format!("{help} Per live session."),
        );
        for id in &ids {
            let session = &live[id];
            out += &format!(
                "{name}{{session=\"{id}\",client=\"{}\"}} {}\n",
                escape(&session.client),
                value(&session.stats)
            );
        }
        let name = format!("rgpu_{what}_total");
        family(
            &mut out,
            &name,
            "counter",
            &format!("{help} All sessions, ended ones included."),
        );
        out += &format!("{name} {}\n", value(&totals));
    }
    let mut names: Vec<&String> = calls.keys().collect();
    names.sort();
    family(
        &mut out,
        "rgpu_calls_total",
        "counter",
        "Requests served, by request, all sessions.",
    );
    for name in &names {
        out += &format!(
            "rgpu_calls_total{{call=\"{}\"}} {}\n",
            escape(name),
            calls[*name].0
        );
    }
    family(
        &mut out,
        "rgpu_call_seconds_total",
        "counter",
        "Time spent serving, by request, all sessions.",
    );
    for name in &names {
        out += &format!(
            "rgpu_call_seconds_total{{call=\"{}\"}} {:.6}\n",
            escape(name),
            calls[*name].1 as f64 / 1e6
        );
    }
    let mut errors = m.ended_errors.lock().unwrap().clone();
    for session in live.values() {
        for error in &session.stats.errors {
            *errors.entry((error.api.clone(), error.code)).or_default() += error.count;
        }
    }
    let mut kinds: Vec<&(String, i64)> = errors.keys().collect();
    kinds.sort();
    family(
        &mut out,
        "rgpu_errors_total",
        "counter",
        "Failures reported to clients, by API and error code (the API's own: a CL_INVALID_* \
         value, a CUresult; CUDA's 600 is a query's \"not ready\"), all sessions.",
    );
    for kind in kinds {
        out += &format!(
            "rgpu_errors_total{{api=\"{}\",code=\"{}\"}} {}\n",
            escape(&kind.0),
            kind.1,
            errors[kind]
        );
    }
    out
}

/// One of a session's figures, as the text format writes it.
type Figure = fn(&WorkerStats) -> String;

/// A metric family's HELP and TYPE lines.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    *out += &format!("# HELP {name} {help}\n# TYPE {name} {kind}\n");
}

/// A label value as the text format wants it.
fn escape(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Serves `GET /metrics` on `address` from a thread of its own.
pub fn serve(address: &str) -> Result<std::net::SocketAddr, String> {
    let listener = TcpListener::bind(address)
        .map_err(|e| format!("metrics: cannot listen on {address}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("rgpu-metrics".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = answer(stream);
            }
        })
        .map_err(|e| format!("metrics: cannot start its thread: {e}"))?;
    Ok(bound)
}

fn answer(mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(READ_TIME))?;
    stream.set_write_timeout(Some(READ_TIME))?;
    let mut request = Vec::with_capacity(512);
    let mut buf = [0u8; 512];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < MAX_REQUEST {
        match stream.read(&mut buf)? {
            0 => break,
            n => request.extend_from_slice(&buf[..n]),
        }
    }
    let line = request
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or(&[]);
    let (status, kind, body) = match line {
        l if l.starts_with(b"GET /metrics ") || l == b"GET /metrics" => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            render(),
        ),
        l if l.starts_with(b"GET ") => ("404 Not Found", "text/plain", "see /metrics\n".into()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET /metrics\n".into(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_and_their_counters_render_as_prometheus_text() {
        session_started(7, "prog[1] \"quoted\"");
        session_stats(
            7,
            WorkerStats {
                requests: 12,
                bulk_received: 4096,
                bulk_sent: 512,
                busy_us: 1500,
                replies: 5,
                lane_received: 2048,
                lane_sent: 0,
                shared_received: 0,
                shared_sent: 0,
                memory: 1 << 20,
                objects: 3,
                queued: 640,
                unsent: 0,
                calls: vec![CallStats {
                    call: "LaunchKernel".into(),
                    count: 10,
                    busy_us: 1000,
                }],
                errors: vec![ErrorStats {
                    api: "opencl".into(),
                    code: -38,
                    count: 2,
                }],
            },
        );
        let text = render();
        assert!(text.contains("rgpu_sessions_active 1\n"), "{text}");
        assert!(
            text.contains("rgpu_session_memory_bytes{session=\"7\""),
            "{text}"
        );
        assert!(
            text.contains(
                "rgpu_session_queued_bytes{session=\"7\",client=\"prog[1] \\\"quoted\\\"\"} 640\n"
            ),
            "{text}"
        );
        assert!(text.contains("\"} 1048576\n"), "{text}");
        assert!(
            text.contains(
                "rgpu_session_requests_total{session=\"7\",client=\"prog[1] \\\"quoted\\\"\"} 12\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("rgpu_session_busy_seconds_total{session=\"7\""),
            "{text}"
        );
        session_ended(7, false);
        let text = render();
        assert!(text.contains("rgpu_sessions_active 0\n"), "{text}");
        assert!(
            text.contains("rgpu_sessions_ended_total{how=\"abnormal\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("rgpu_requests_total 12\n"), "{text}");
        assert!(text.contains("rgpu_replies_total 5\n"), "{text}");
        assert!(
            text.contains("rgpu_lane_received_bytes_total 2048\n"),
            "{text}"
        );
        assert!(
            text.contains("rgpu_received_bulk_bytes_total 4096\n"),
            "{text}"
        );
        assert!(
            text.contains("rgpu_calls_total{call=\"LaunchKernel\"} 10\n"),
            "{text}"
        );
        assert!(
            text.contains("rgpu_call_seconds_total{call=\"LaunchKernel\"} 0.001000\n"),
            "{text}"
        );
        assert!(
            text.contains("rgpu_errors_total{api=\"opencl\",code=\"-38\"} 2\n"),
            "{text}"
        );
    }
}
