//! The network performance model (docs/model.md): from a call trace taken on one link, the
//! program's time on another.
//!
//! The trace gives, per call, the client's own time, the time it waited on the network and how
//! often, whether it posted requests, and the bulk bytes each way. The model replays the calls
//! of every thread in their traced order through a simulated link — one serializer per
//! direction at the link's rate, half the round trip each way, a send buffer that blocks a
//! sender running ahead of the link — and a server that answers a waited request once it has
//! arrived and the work posted before it is done. What the server spent on a waited request
//! (its own work and the GPU work still queued ahead of it) is what the trace's wait leaves
//! after the traced link's share; that work is taken to shift with the arrival of the requests
//! that fed it. The client's time between calls and inside them is kept as traced.

use std::collections::HashMap;

use rgpu_client::trace::CallRecord;
use rgpu_transport::link::LinkSpec;

/// Bytes a request or reply costs on the link beyond its bulk data (frame header and
/// arguments, typical of the protocol's small messages).
pub const MESSAGE_BYTES: f64 = 96.0;

/// A link as the model sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// Round-trip time, µs.
    pub rtt_us: f64,
    /// Bytes per µs each way (`f64::INFINITY`: no limit).
    pub bytes_per_us: f64,
    /// Bytes a sender may have in flight before a write blocks (socket buffers, or the link
    /// emulator's queue).
    pub buffer_bytes: f64,
}

/// The link emulator's queue per direction (crates/transport/src/link.rs MAX_QUEUED) plus
/// the sockets' buffers: what a sender can get ahead by.
pub const DEFAULT_BUFFER_BYTES: f64 = (8 << 20) as f64 + (256 << 10) as f64;

impl Link {
    /// The link added to the traced path: `spec`'s round trip and rate.
    pub fn from_spec(spec: &LinkSpec) -> Link {
        Link {
            rtt_us: spec.rtt.as_secs_f64() * 1e6,
            bytes_per_us: spec
                .bits_per_second
                .map_or(f64::INFINITY, |bits| bits / 8.0 / 1e6),
            buffer_bytes: DEFAULT_BUFFER_BYTES,
        }
    }

    /// The traced path itself when nothing was added (loopback): no extra time.
    pub fn unlimited() -> Link {
        Link {
            rtt_us: 0.0,
            bytes_per_us: f64::INFINITY,
            buffer_bytes: DEFAULT_BUFFER_BYTES,
        }
    }

    fn transfer_us(&self, bytes: f64) -> f64 {
        if self.bytes_per_us.is_infinite() {
            0.0
        } else {
            bytes / self.bytes_per_us
        }
    }
}

/// Named networks (`--link 10GbE`): the rCUDA paper's, with round trips of a small TCP message
/// between hosts and the rate TCP reaches on them.
pub const PRESETS: &[(&str, &str, &str)] = &[
    ("1GbE", "rtt=60us,bandwidth=0.94Gbit", "Gigabit Ethernet"),
    ("10GbE", "rtt=25us,bandwidth=9.4Gbit", "10 Gigabit Ethernet"),
    (
        "40G-QDR",
        "rtt=12us,bandwidth=26Gbit",
        "InfiniBand QDR 4x (IPoIB)",
    ),
    ("100G-EDR", "rtt=8us,bandwidth=80Gbit", "InfiniBand EDR 4x"),
    ("200G-HDR", "rtt=6us,bandwidth=160Gbit", "InfiniBand HDR 4x"),
];

/// Parses a `--link` value: a preset's name or `rtt=..,bandwidth=..`.
pub fn parse_link(text: &str) -> Result<(String, LinkSpec), String> {
    let spec_text = PRESETS
        .iter()
        .find(|(name, _, _)| name.eq_ignore_ascii_case(text))
        .map_or(text, |(_, spec, _)| spec);
    let spec = spec_text.parse::<LinkSpec>()?;
    Ok((text.to_string(), spec))
}

/// One direction of the simulated link.
#[derive(Default, Clone, Copy)]
struct Wire {
    /// When the serializer is free again.
    free: f64,
}

impl Wire {
    /// Sends `bytes` handed over at `at`; returns (when the last byte leaves, when it arrives).
    fn send(&mut self, link: &Link, at: f64, bytes: f64) -> (f64, f64) {
        let leaves = self.free.max(at) + link.transfer_us(bytes);
        self.free = leaves;
        (leaves, leaves + link.rtt_us / 2.0)
    }
}

/// The simulated path: the link both ways and the server's queue.
#[derive(Clone, Copy)]
struct Path {
    /// The link as requests see it (`down_link`: as replies do).
    link: Link,
    down_link: Link,
    up: Wire,
    down: Wire,
    /// Arrival time of the latest request (the server handles a session's requests in order).
    last_arrival: f64,
}

impl Path {
    fn new(link: Link, down_link: Link) -> Path {
        Path {
            link,
            down_link,
            up: Wire::default(),
            down: Wire::default(),
            last_arrival: f64::NEG_INFINITY,
        }
    }

    /// A request of `bytes` handed to the link at `at`: when it arrives, and when the sender
    /// may go on (at once, unless the link's buffer is full).
    fn request(&mut self, at: f64, bytes: f64) -> (f64, f64) {
        let (leaves, arrives) = self.up.send(&self.link, at, bytes);
        let arrives = arrives.max(self.last_arrival);
        self.last_arrival = arrives;
        let backlog = self.link.transfer_us(self.link.buffer_bytes);
        (arrives, at.max(leaves - backlog))
    }
}

/// Transfers this large show the traced path's rate (smaller ones are dominated by latency).
const LARGE_TRANSFER: u64 = 1 << 20;

/// The rate (bytes/µs) at which the traced path carried bulk data (up, down), as the trace
/// shows it: the fastest of its large transfers, a write's bytes over the call's time (the
/// client hands data over no faster than the path takes it, beyond its buffers), a read's
/// over its wait. `None`: no large transfer that way.
pub fn observed_rates(records: &[CallRecord]) -> (Option<f64>, Option<f64>) {
    let fastest = |rates: &mut dyn Iterator<Item = f64>| {
        rates.filter(|r| r.is_finite()).max_by(f64::total_cmp)
    };
    let up = fastest(
        &mut records
            .iter()
            .filter(|r| r.bytes_out >= LARGE_TRANSFER && r.us > 0.0)
            .map(|r| r.bytes_out as f64 / r.us),
    );
    let down = fastest(
        &mut records
            .iter()
            .filter(|r| r.bytes_in >= LARGE_TRANSFER && r.wait_us > 0.0)
            .map(|r| r.bytes_in as f64 / r.wait_us),
    );
    (up, down)
}

/// What adding `target` to a traced path whose bulk data moved at `observed` (bytes/µs)
/// costs per byte. Bulk data is pipelined through every stage of the path (the client, the
/// sockets, the server's copies to and from the GPU), so a path's rate is its slowest stage's:
/// a link slower than the traced path costs each byte the difference of their times per byte,
/// a faster one nothing.
fn added_to(target: &Link, observed: Option<f64>) -> Link {
    let Some(observed) = observed else {
        return *target;
    };
    let per_byte = 1.0 / target.bytes_per_us - 1.0 / observed;
    Link {
        bytes_per_us: if per_byte > 0.0 {
            1.0 / per_byte
        } else {
            f64::INFINITY
        },
        ..*target
    }
}

/// The traced path's own round trip as the trace shows it: the least time a request without
/// bulk data waited beyond what the server said it spent (`None` without server times).
pub fn traced_round_trip_us(records: &[CallRecord]) -> Option<f64> {
    records
        .iter()
        .filter(|r| r.waits == 1 && r.server_us > 0.0 && r.bytes_out == 0 && r.bytes_in == 0)
        .map(|r| r.wait_us - r.server_us)
        .filter(|rt| *rt >= 0.0)
        .min_by(f64::total_cmp)
}

/// Replays `records` (one process's trace, in the order written) on `target`, the trace having
/// been taken on `traced`: the span from the first call's start to the last call's end, and the
/// time the program waited on the network, µs. With `target == traced` the span is the
/// traced one.
pub fn predict(records: &[CallRecord], traced: &Link, target: &Link) -> (f64, f64) {
    let replay = replay(records, traced, target, &Sharing::default());
    (replay.span, replay.waited)
}

/// Programs run at the same time on one server and GPU, each traced on its own (on `traced`):
/// each one's (span, network wait) on `target`, µs. The server's time on a waited request
/// (`server_us` in the trace, else the work inferred from the wait) is shared equally among
/// the programs that have such work at that moment (processor sharing: a GPU time-slices the
/// contexts of separate processes); the rest of each call is the program's own. Each program's
/// busy periods depend on the others', so the replays are repeated until they agree.
pub fn predict_together(
    programs: &[Vec<CallRecord>],
    traced: &Link,
    target: &Link,
) -> Vec<(f64, f64)> {
    let mut busy: Vec<Vec<(f64, f64)>> = vec![Vec::new(); programs.len()];
    let mut creations: Vec<Vec<(f64, f64)>> = vec![Vec::new(); programs.len()];
    let mut results = vec![(0.0, 0.0); programs.len()];
    for _ in 0..50 {
        let mut moved = 0.0f64;
        for (i, records) in programs.iter().enumerate() {
            let mut others = Sharing::of(
                busy.iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, b)| b.as_slice()),
            );
            others.creating = steps_of(
                creations
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, c)| c.as_slice()),
            );
            let replay = replay(records, traced, target, &others);
            moved = moved.max((replay.span - results[i].0).abs() / replay.span.max(1.0));
            results[i] = (replay.span, replay.waited);
            busy[i] = replay.busy;
            creations[i] = replay.creations;
        }
        if moved < 1e-5 {
            break;
        }
    }
    results
}

/// The part of a context's creation that the driver does for one process at a time, sharing
/// its time among the processes creating contexts at once. Measured on the H200 (driver 580,
/// `cuInit`, primary context, first allocation, in N processes started together): ~115 ms
/// alone; two at once ~185-200 ms each (1 + p ≈ 1.68), four ~365-435 ms each and ending
/// together (1 + 3p ≈ 3.5): p ≈ 0.68-0.82.
const SERIALIZED_CREATION: f64 = 0.75;

/// What the other programs sharing the device do: how many of them have work on it at each
/// moment, and how many are creating a context (breakpoints (time, count from then on),
/// sorted; none before the first).
#[derive(Default)]
pub struct Sharing {
    steps: Vec<(f64, u32)>,
    creating: Vec<(f64, u32)>,
}

/// How many of `programs`' intervals ((start, end), each program's own disjoint) are open at
/// each moment: breakpoints (time, count from then on), sorted.
fn steps_of<'a>(programs: impl Iterator<Item = &'a [(f64, f64)]>) -> Vec<(f64, u32)> {
    let mut edges: Vec<(f64, i32)> = programs
        .flat_map(|intervals| intervals.iter().flat_map(|&(s, e)| [(s, 1), (e, -1)]))
        .collect();
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut count = 0i32;
    let mut steps: Vec<(f64, u32)> = Vec::with_capacity(edges.len());
    for (t, delta) in edges {
        count += delta;
        match steps.last_mut() {
            Some(last) if last.0 == t => last.1 = count.max(0) as u32,
            _ => steps.push((t, count.max(0) as u32)),
        }
    }
    steps
}

/// When `work` µs begun at `start` is done, shared equally with the others that `steps` says
/// are at it meanwhile.
fn shared_finish(steps: &[(f64, u32)], start: f64, work: f64) -> f64 {
    if work <= 0.0 {
        return start;
    }
    let mut i = steps.partition_point(|s| s.0 <= start);
    let mut t = start;
    let mut left = work;
    loop {
        let others = if i == 0 { 0 } else { steps[i - 1].1 };
        let rate = 1.0 / (1.0 + others as f64);
        let until = steps.get(i).map_or(f64::INFINITY, |s| s.0);
        let can = (until - t) * rate;
        if can >= left {
            return t + left / rate;
        }
        left -= can;
        t = until;
        i += 1;
    }
}

impl Sharing {
    /// From the busy periods of each other program.
    fn of<'a>(programs: impl Iterator<Item = &'a [(f64, f64)]>) -> Sharing {
        Sharing {
            steps: steps_of(programs),
            creating: Vec::new(),
        }
    }

    /// When a context creation of `work` µs asked for at `asked` is done: (when its part that
    /// the driver serializes is, when the whole is). The serialized part is shared among the
    /// creations under way ([`SERIALIZED_CREATION`]); the rest runs beside them.
    fn create_context(&self, asked: f64, work: f64) -> (f64, f64) {
        let serialized = shared_finish(&self.creating, asked, SERIALIZED_CREATION * work);
        (serialized, serialized + (1.0 - SERIALIZED_CREATION) * work)
    }

    /// When `work` µs of the server's time, begun at `start`, is done, sharing the server
    /// equally with the others busy meanwhile.
    fn finish(&self, start: f64, work: f64) -> f64 {
        shared_finish(&self.steps, start, work)
    }
}

/// Whether the server's time on `call` is spent waiting for the device (its queue of kernels
/// and copies), which programs sharing the device share; the rest of a worker's time (module
/// loading, allocation, its own processing) runs in its own process, beside the others'
/// (measured: two or four PyTorch programs loading their modules at once take no longer).
pub fn waits_for_device(call: &str) -> bool {
    const DEVICE_WAITS: &[&str] = &[
        "Synchronize",
        "clFinish",
        "clWaitForEvents",
        "ReadBuffer",
        "ReadImage",
        "MapBuffer",
        "MapImage",
        "cuMemcpyDtoH",
        "cuMemcpy2D",
        "cuMemcpy3D",
    ];
    DEVICE_WAITS.iter().any(|name| call.contains(name))
}

/// Whether `call` creates a context on the device, most of which the driver does for one
/// process at a time ([`SERIALIZED_CREATION`]).
pub fn creates_context(call: &str) -> bool {
    ["clCreateContext", "CtxCreate", "PrimaryCtxRetain"]
        .iter()
        .any(|name| call.contains(name))
}

/// One program's replay on the target path.
struct Replay {
    span: f64,
    waited: f64,
    /// When the device was working for this program's waited requests (target path).
    busy: Vec<(f64, f64)>,
    /// Its context creations: (asked, done).
    creations: Vec<(f64, f64)>,
}

fn replay(records: &[CallRecord], traced: &Link, target: &Link, others: &Sharing) -> Replay {
    // A trace taken on loopback moved its bulk data at the rate of the path's other stages;
    // a trace taken on a limited link, at that link's rate (which its share of the waits is).
    let (up_rate, down_rate) = if traced.bytes_per_us.is_finite() {
        (None, None)
    } else {
        observed_rates(records)
    };
    let mut records: Vec<&CallRecord> = records.iter().collect();
    records.sort_by_key(|r| r.t);
    let mut result = Replay {
        span: 0.0,
        waited: 0.0,
        busy: Vec::new(),
        creations: Vec::new(),
    };
    let Some(first) = records.first() else {
        return result;
    };
    let origin = first.t as f64;
    let mut old = Path::new(*traced, *traced);
    let mut new = Path::new(added_to(target, up_rate), added_to(target, down_rate));
    let down_link = new.down_link;
    // Per thread: (when its previous call ended as traced, as predicted).
    let mut threads: HashMap<u32, (f64, f64)> = HashMap::new();
    // How much later than traced the latest posted request reached the server (the work it
    // queued shifts so), if one came since the last waited request.
    let mut posted_shift: Option<f64> = None;
    // How much later than traced the program is, as of the latest call (a new thread's start).
    let mut lag = 0.0f64;
    // A context creation was posted since the last waited request.
    let mut context_ahead = false;
    for r in records {
        let t = r.t as f64 - origin;
        let (old_prev, new_prev) = *threads.get(&r.thread).unwrap_or(&(t, t + lag));
        // Not clamped: `t` is whole µs, so a call may seem to start a fraction before the
        // previous one ended.
        let gap = t - old_prev;
        let local = (r.us - r.wait_us).max(0.0);
        let old_ready = t + local;
        let new_ready = new_prev + gap + local;
        let new_end;
        if r.waits == 0 {
            context_ahead |= r.posted > 0 && creates_context(&r.call);
            let bytes = r.bytes_out as f64 + MESSAGE_BYTES * r.posted as f64;
            if r.posted > 0 || r.bytes_out > 0 {
                let (old_arrival, _) = old.request(old_ready, bytes);
                let (new_arrival, go_on) = new.request(new_ready, bytes);
                posted_shift = Some(new_arrival - old_arrival);
                new_end = go_on.max(new_ready);
            } else {
                new_end = new_ready;
            }
        } else {
            // The traced wait: (waits - 1) plain round trips, then one request that carried
            // the bytes out, the server's work, and the reply with the bytes in.
            let extra_trips = r.waits.saturating_sub(1) as f64;
            let bytes_out = r.bytes_out as f64 + MESSAGE_BYTES;
            let bytes_in = r.bytes_in as f64 + MESSAGE_BYTES;
            let (old_arrival, _) = old.request(old_ready, bytes_out);
            let old_reply_leaves = old_ready + r.wait_us
                - extra_trips * traced.rtt_us
                - traced.rtt_us / 2.0
                - traced.transfer_us(bytes_in);
            let work = (old_reply_leaves - old_arrival).max(0.0);
            old.down.send(traced, old_reply_leaves, bytes_in);
            let (new_arrival, _) = new.request(new_ready, bytes_out);
            // With posted work ahead of it, the work was under way from the traced arrival,
            // shifted as the posted requests were (the GPU went on meanwhile); else the work is
            // the request's own and starts when it arrives. The part the server says it spent
            // is shared with other programs (`others`); the rest is this path's own.
            let start = match posted_shift.take() {
                Some(shift) => old_arrival + shift,
                None => new_arrival,
            };
            let own = if r.server_us > 0.0 {
                r.server_us.min(work)
            } else {
                work
            };
            let device = if waits_for_device(&r.call) { own } else { 0.0 };
            let mut creation = if creates_context(&r.call) { own } else { 0.0 };
            if context_ahead {
                // A posted context creation was the work queued ahead of this call.
                creation += work - own;
                context_ahead = false;
            }
            let (serialized, created) = others.create_context(start, creation);
            if creation > 0.0 {
                result.creations.push((start, serialized));
            }
            let done = others.finish(created, device);
            if device > 0.0 {
                result.busy.push((created, done));
            }
            let shared = creation + device;
            let reply_leaves = new_arrival.max(done + (work - shared));
            let (_, reply_arrives) = new.down.send(&down_link, reply_leaves, bytes_in);
            new_end = reply_arrives + extra_trips * target.rtt_us;
            result.waited += new_end - new_ready;
        }
        let old_end = t + r.us;
        threads.insert(r.thread, (old_end, new_end));
        lag = new_end - old_end;
        result.span = result.span.max(new_end);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(
        t: u64,
        us: f64,
        waits: u32,
        wait_us: f64,
        posted: u32,
        out: u64,
        inb: u64,
    ) -> CallRecord {
        CallRecord {
            t,
            thread: 1,
            api: "cuda".into(),
            call: if waits > 0 {
                "cuStreamSynchronize"
            } else {
                "cuLaunchKernel"
            }
            .into(),
            us,
            waits,
            wait_us,
            server_us: 0.0,
            posted,
            bytes_out: out,
            bytes_in: inb,
        }
    }

    fn link(rtt_us: f64, gbit: f64) -> Link {
        Link {
            rtt_us,
            bytes_per_us: if gbit.is_infinite() {
                gbit
            } else {
                gbit * 1e3 / 8.0
            },
            buffer_bytes: DEFAULT_BUFFER_BYTES,
        }
    }

    /// A loop of `n` round trips of 20 µs each, 5 µs of client time apart.
    fn ping_loop(n: u64) -> Vec<CallRecord> {
        (0..n)
            .map(|i| call(i * 25, 20.0, 1, 20.0, 0, 0, 0))
            .collect()
    }

    #[test]
    fn the_traced_link_gives_back_the_traced_span() {
        let records = ping_loop(100);
        let loopback = link(20.0, f64::INFINITY);
        let (span, _) = predict(&records, &loopback, &loopback);
        assert!((span - 2495.0).abs() < 1e-6, "{span}");
    }

    #[test]
    fn each_wait_pays_the_added_round_trip() {
        let records = ping_loop(100);
        let (span, waited) = predict(&records, &Link::unlimited(), &link(500.0, f64::INFINITY));
        assert!((span - (2495.0 + 100.0 * 500.0)).abs() < 1e-6, "{span}");
        assert!((waited - 100.0 * 520.0).abs() < 1e-6, "{waited}");
    }

    #[test]
    fn posted_calls_overlap_and_a_sync_waits_for_their_work() {
        // 100 launches posted 2 µs apart, then a sync that waited 1000 µs on loopback (the GPU
        // finishing their work): on a slower link the work shifts by the one-way delay and the
        // sync adds one round trip.
        let mut records: Vec<CallRecord> = (0..100)
            .map(|i| call(i * 2, 1.0, 0, 0.0, 1, 0, 0))
            .collect();
        records.push(call(200, 1000.0, 1, 1000.0, 0, 0, 0));
        let (span, _) = predict(&records, &Link::unlimited(), &link(200.0, f64::INFINITY));
        assert!((span - (1200.0 + 200.0)).abs() < 1e-6, "{span}");
    }

    #[test]
    fn bulk_writes_pace_at_the_link_rate_and_block_beyond_its_buffer() {
        // 64 posted copies of 1 MiB then a sync; at 1 Gbit/s the data takes ~537 ms and the sync
        // returns once all of it arrived. The traced path took each MiB in 90 µs: the link
        // costs each byte its time less that.
        let mib = 1u64 << 20;
        let mut records: Vec<CallRecord> = (0..64)
            .map(|i| call(i * 100, 90.0, 0, 0.0, 1, mib, 0))
            .collect();
        records.push(call(6400, 50.0, 1, 50.0, 0, 0, 0));
        let (span, _) = predict(&records, &Link::unlimited(), &link(0.0, 1.0));
        let per_byte = 8.0 / 1e3 - 90.0 / mib as f64;
        let data_us = 64.0 * (mib as f64 + MESSAGE_BYTES) * per_byte;
        assert!(
            span > data_us && span < data_us + 200.0,
            "{span} vs {data_us}"
        );
    }

    /// A recorded trace (tools/bench/model_loops.c: 200 launches through rgpu on PoCL, a
    /// clFinish per 10): on its own link the span comes back; 5 ms more of round trip adds
    /// 5 ms per wait, launches and their work overlapping as traced.
    #[test]
    fn a_recorded_launch_loop_pays_a_round_trip_per_wait() {
        let text = include_str!("../tests/data/launch-loop.trace.jsonl");
        let records = rgpu_client::trace::read_trace(text).unwrap().calls;
        let first = records.iter().map(|r| r.t).min().unwrap() as f64;
        let traced_span = records
            .iter()
            .map(|r| r.t as f64 + r.us)
            .fold(0.0, f64::max)
            - first;
        let (span, _) = predict(&records, &Link::unlimited(), &Link::unlimited());
        assert!((span - traced_span).abs() < 1.0, "{span} vs {traced_span}");
        let waits: u32 = records.iter().map(|r| r.waits).sum();
        assert!(waits >= 20, "{waits} waits");
        let (slower, _) = predict(&records, &Link::unlimited(), &link(5000.0, f64::INFINITY));
        let expected = traced_span + waits as f64 * 5000.0;
        assert!((slower - expected).abs() < 1.0, "{slower} vs {expected}");
    }

    #[test]
    fn the_traced_round_trip_is_the_least_wait_beyond_the_servers_time() {
        let mut records = ping_loop(3);
        assert_eq!(traced_round_trip_us(&records), None);
        records[0].server_us = 5.0;
        records[1].server_us = 2.0;
        assert_eq!(traced_round_trip_us(&records), Some(15.0));
    }

    /// `n` syncs the server spent `server` µs on, 10 µs of client time apart.
    fn gpu_loop(n: u64, server: f64) -> Vec<CallRecord> {
        (0..n)
            .map(|i| {
                let mut r = call(
                    i * (server as u64 + 30),
                    server + 20.0,
                    1,
                    server + 20.0,
                    0,
                    0,
                    0,
                );
                r.server_us = server;
                r
            })
            .collect()
    }

    #[test]
    fn programs_sharing_the_server_share_its_time() {
        let loopback = Link::unlimited();
        let alone = predict(&gpu_loop(100, 1000.0), &loopback, &loopback).0;
        // Two programs whose time is all the server's: each takes about twice as long.
        let both = predict_together(
            &[gpu_loop(100, 1000.0), gpu_loop(100, 1000.0)],
            &loopback,
            &loopback,
        );
        for (span, _) in &both {
            assert!((span / alone - 2.0).abs() < 0.05, "{span} vs {alone}");
        }
        // A program that only posts is not slowed by one that waits on the server.
        let launches: Vec<CallRecord> = (0..100)
            .map(|i| call(i * 10, 5.0, 0, 0.0, 1, 0, 0))
            .collect();
        let alone = predict(&launches, &loopback, &loopback).0;
        let together = predict_together(&[launches, gpu_loop(100, 1000.0)], &loopback, &loopback);
        assert!(
            (together[0].0 - alone).abs() < 1e-6,
            "{} vs {alone}",
            together[0].0
        );
        // One program alone is its own prediction.
        let one = predict_together(&[gpu_loop(10, 500.0)], &loopback, &link(100.0, 10.0));
        let solo = predict(&gpu_loop(10, 500.0), &loopback, &link(100.0, 10.0));
        assert_eq!(one[0], solo);
    }

    #[test]
    fn contexts_created_at_once_share_the_driver() {
        let mut create = call(0, 1000.0, 1, 1000.0, 0, 0, 0);
        create.call = "clCreateContext".into();
        create.server_us = 990.0;
        let mut info = call(1000, 20.0, 1, 20.0, 0, 0, 0);
        info.call = "clGetDeviceInfo".into();
        let program = vec![create, info];
        let loopback = Link::unlimited();
        let both = predict_together(&[program.clone(), program], &loopback, &loopback);
        // Asked at once: the serialized parts at half speed each, both done together.
        let expected = (1.0 + SERIALIZED_CREATION) * 990.0 + 30.0;
        for one in &both {
            assert!((one.0 - expected).abs() < 0.1, "{both:?}");
        }
        // A posted creation (CUDA's primary context) is the work ahead of the next wait.
        let mut retain = call(0, 15.0, 0, 0.0, 1, 0, 0);
        retain.call = "cuDevicePrimaryCtxRetain".into();
        let mut alloc = call(20, 1000.0, 1, 1000.0, 0, 0, 0);
        alloc.call = "cuMemAlloc_v2".into();
        alloc.server_us = 10.0;
        let cuda = vec![retain, alloc];
        let both = predict_together(&[cuda.clone(), cuda.clone()], &loopback, &loopback);
        let alone = predict(&cuda, &loopback, &loopback).0;
        // (The retain's work: the allocation's wait beyond its own 10 µs.)
        for one in &both {
            let expected = alone + SERIALIZED_CREATION * 990.0;
            assert!((one.0 - expected).abs() < 0.1, "{both:?} vs {alone}");
        }
    }

    #[test]
    fn shared_work_ends_later_by_the_others_share() {
        let sharing =
            Sharing::of([[(0.0, 100.0)].as_slice(), [(50.0, 100.0)].as_slice()].into_iter());
        // 0-50: one other (half rate), 50-100: two others (a third), then alone.
        assert!((sharing.finish(0.0, 10.0) - 20.0).abs() < 1e-9);
        assert!((sharing.finish(0.0, 40.0) - (50.0 + (40.0 - 25.0) * 3.0)).abs() < 1e-9);
        assert!((sharing.finish(200.0, 5.0) - 205.0).abs() < 1e-9);
        assert_eq!(sharing.finish(10.0, 0.0), 10.0);
    }

    #[test]
    fn a_link_as_fast_as_the_traced_path_adds_no_transfer_time() {
        // Reads of 8 MiB that waited 1 ms each: the traced path carried 8 GiB/s down.
        let records: Vec<CallRecord> = (0..10)
            .map(|i| call(i * 1100, 1000.0, 1, 1000.0, 0, 0, 8 << 20))
            .collect();
        let (_, down) = observed_rates(&records);
        assert!((down.unwrap() - 8388.608).abs() < 1e-6);
        let traced = predict(&records, &Link::unlimited(), &Link::unlimited()).0;
        let faster = predict(&records, &Link::unlimited(), &link(0.0, 100.0)).0;
        assert!((faster - traced).abs() < 1.0, "{faster} vs {traced}");
        // At 10 Gbit/s, each read costs 8 MiB at 1.25 GB/s less the 1 ms it took.
        let slower = predict(&records, &Link::unlimited(), &link(0.0, 10.0)).0;
        let expected =
            traced + 10.0 * ((8 << 20) as f64 + MESSAGE_BYTES) * (8.0 / 1e4 - 1.0 / 8388.608);
        assert!((slower - expected).abs() < 1.0, "{slower} vs {expected}");
    }

    #[test]
    fn presets_parse() {
        for (name, _, _) in PRESETS {
            let (_, spec) = parse_link(name).unwrap();
            assert!(
                spec.bits_per_second.is_some() && spec.rtt.as_nanos() > 0,
                "{name}"
            );
        }
        assert!(parse_link("rtt=1ms").is_ok());
        assert!(parse_link("nonsense").is_err());
    }
}
