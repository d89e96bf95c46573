//! `rgpu model TRACE --link ..`: the program's time on other links, predicted from a trace
//! (crate::model, docs/model.md).

use std::path::PathBuf;
use std::process::ExitCode;

use rgpu_client::trace::read_trace;

use crate::model::{parse_link, predict, traced_round_trip_us, Link, PRESETS};

#[derive(clap::Args, Debug)]
#[command(about = "Predict a traced program's time on other links (docs/model.md)")]
pub struct ModelArgs {
    /// Trace files written with RGPU_TRACE (one per process; each is predicted on its own).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// A link to predict for: a preset (1GbE, 10GbE, 40G-QDR, 100G-EDR, 200G-HDR) or
    /// `rtt=..,bandwidth=..`, added to the path the trace was taken on. Repeatable; default:
    /// every preset.
    #[arg(long = "link")]
    links: Vec<String>,
    /// The link the trace was taken on, over the loopback path (default: the trace's
    /// RGPU_LINK, else loopback itself).
    #[arg(long)]
    traced_on: Option<String>,
    /// The program's measured time on the traced link, seconds: predictions are then given as
    /// program times (measured + predicted change) rather than call spans.
    #[arg(long)]
    measured: Option<f64>,
    /// Where to write the predictions as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(serde::Serialize)]
struct Row {
    trace: String,
    link: String,
    rtt_us: f64,
    gbit_per_s: Option<f64>,
    /// Predicted span of the calls (or program time with --measured), seconds.
    predicted_s: f64,
    /// The same on the traced link (by construction, the traced span).
    traced_s: f64,
    network_wait_s: f64,
}

pub fn run(args: ModelArgs) -> Result<ExitCode, String> {
    let names: Vec<String> = if args.links.is_empty() {
        PRESETS
            .iter()
            .map(|(name, _, _)| name.to_string())
            .collect()
    } else {
        args.links.clone()
    };
    let links = names
        .iter()
        .map(|name| parse_link(name))
        .collect::<Result<Vec<_>, _>>()?;
    let mut rows = Vec::new();
    for path in &args.files {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let (header, records) =
            read_trace(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let traced = match args.traced_on.as_deref().or(header.link.as_deref()) {
            Some(text) => Link::from_spec(&parse_link(text)?.1),
            None => Link::unlimited(),
        };
        let (traced_span, _) = predict(&records, &traced, &traced);
        let base = args.measured.map_or(traced_span, |s| s * 1e6);
        println!(
            "{}: process {} ({}), {} calls, traced span {:.6} s{}",
            path.display(),
            header.pid,
            header.command,
            records.len(),
            traced_span / 1e6,
            args.measured
                .map_or(String::new(), |s| format!(", measured {s:.6} s"))
        );
        if let Some(rt) = traced_round_trip_us(&records) {
            println!(
                "traced path's round trip: {rt:.1} us (the least wait beyond the server's time); \
                 links below are added to it"
            );
        }
        println!(
            "{:<34} {:>10} {:>10} {:>14} {:>10} {:>14}",
            "link", "RTT us", "Gbit/s", "predicted s", "x traced", "net wait s"
        );
        for (name, spec) in &links {
            let target = Link::from_spec(spec);
            let (span, waited) = predict(&records, &traced, &target);
            let predicted = base + (span - traced_span);
            let gbit = spec.bits_per_second.map(|b| b / 1e9);
            println!(
                "{:<34} {:>10.1} {:>10} {:>14.6} {:>10.3} {:>14.6}",
                name,
                target.rtt_us,
                gbit.map_or("-".to_string(), |g| format!("{g:.2}")),
                predicted / 1e6,
                predicted / base.max(1e-9),
                waited / 1e6
            );
            rows.push(Row {
                trace: path.display().to_string(),
                link: name.clone(),
                rtt_us: target.rtt_us,
                gbit_per_s: gbit,
                predicted_s: predicted / 1e6,
                traced_s: base / 1e6,
                network_wait_s: waited / 1e6,
            });
        }
    }
    if let Some(json) = &args.json {
        let text = serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?;
        std::fs::write(json, text).map_err(|e| format!("cannot write {}: {e}", json.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}
