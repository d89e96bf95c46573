//! `rgpu trace FILE...`: reads the traces `RGPU_TRACE` wrote and prints, per entry point, the
//! calls, network waits and time (the table `RGPU_STATS=1` prints at a program's exit).

use std::path::PathBuf;
use std::process::ExitCode;

use rgpu_client::trace::{read_trace, StatsTable};

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
    for path in &args.files {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let (header, records) =
            read_trace(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if args.merge {
            merged.extend(records);
            continue;
        }
        let span_s = records.last().map_or(0.0, |r| (r.t as f64 + r.us) / 1e6);
        let title = format!(
            "{}: process {} ({}), {} calls over {span_s:.3} s",
            path.display(),
            header.pid,
            header.command,
            records.len()
        );
        print!("{}", StatsTable::from_records(&records).render(&title));
    }
    if args.merge {
        let title = format!("{} traces, {} calls", args.files.len(), merged.len());
        print!("{}", StatsTable::from_records(&merged).render(&title));
    }
    Ok(ExitCode::SUCCESS)
}
