//! `rgpu trace FILE...`: reads the traces `RGPU_TRACE` wrote and prints, per entry point, the
//! calls, network waits and time (the table `RGPU_STATS=1` prints at a program's exit), then
//! what the servers counted of each of the program's sessions.

use std::path::PathBuf;
use std::process::ExitCode;

use rgpu_client::trace::{read_trace, SessionRecord, StatsTable};

#[derive(clap::Args, Debug)]
#[command(about = "Summarize call traces written with RGPU_TRACE=FILE")]
pub struct TraceArgs {
    /// Trace files (one per process: RGPU_TRACE=trace.%p.jsonl names each by its pid).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// One table for all the files instead of one per file.
    #[arg(long)]
    merge: bool,
}

pub fn run(args: TraceArgs) -> Result<ExitCode, String> {
    let mut merged = Vec::new();
    let mut merged_sessions = Vec::new();
    for path in &args.files {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let trace = read_trace(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if args.merge {
            merged.extend(trace.calls);
            merged_sessions.extend(trace.sessions);
            continue;
        }
        let records = &trace.calls;
        let span_s = records.last().map_or(0.0, |r| (r.t as f64 + r.us) / 1e6);
        let title = format!(
            "{}: process {} ({}), {} calls over {span_s:.3} s",
            path.display(),
            trace.header.pid,
            trace.header.command,
            records.len()
        );
        print!("{}", StatsTable::from_records(records).render(&title));
        print!("{}", sessions(&trace.sessions));
    }
    if args.merge {
        let title = format!("{} traces, {} calls", args.files.len(), merged.len());
        print!("{}", StatsTable::from_records(&merged).render(&title));
        print!("{}", sessions(&merged_sessions));
    }
    Ok(ExitCode::SUCCESS)
}

/// One line per session: what its server counted.
fn sessions(sessions: &[SessionRecord]) -> String {
    let mut out = String::new();
    for s in sessions {
        let c = &s.counters;
        out += &format!(
            "server {} ({}) session {}: {} requests, {} replies, {:.1} MB received ({:.1} on lanes, \
             {:.1} through shared memory), {:.1} MB sent ({:.1} on lanes, {:.1} through shared \
             memory), busy {:.1} ms, {} errors; holds {:.1} MB in {} objects\n",
            s.server,
            s.endpoint,
            s.session,
            c.requests,
            c.replies,
            c.bulk_received as f64 / 1e6,
            c.lane_received as f64 / 1e6,
            c.shared_received as f64 / 1e6,
            c.bulk_sent as f64 / 1e6,
            c.lane_sent as f64 / 1e6,
            c.shared_sent as f64 / 1e6,
            c.busy_us as f64 / 1e3,
            c.errors,
            c.memory as f64 / 1e6,
            c.objects
        );
    }
    out
}
