//! `rgpu model TRACE --link ..`: the program's time on other links, predicted from a trace
//! (crate::model, docs/model.md).

use std::path::PathBuf;
use std::process::ExitCode;

use rgpu_client::trace::{read_trace, CallRecord, TraceHeader};
use rgpu_transport::link::LinkSpec;

use crate::model::{parse_link, predict, predict_together, traced_round_trip_us, Link, PRESETS};

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
    /// The traced programs run at the same time on one server and GPU (each traced on its own,
    /// on the same path): predicts each one's span when they share the server's time.
    #[arg(long)]
    together: bool,
    /// Where to write an SVG plot of the predicted time against the round trip (1 µs to 50 ms)
    /// at 1, 10 and 100 Gbit/s and unlimited (the first trace's).
    #[arg(long)]
    plot: Option<PathBuf>,
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
    /// Predicted with the other traces' programs sharing the server (--together).
    together: bool,
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
        let (header, records, traced) = load(path, args.traced_on.as_deref())?;
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
                together: false,
            });
        }
    }
    if args.together && args.files.len() > 1 {
        rows.extend(print_together(&args, &links)?);
    }
    if let (Some(plot), Some(path)) = (&args.plot, args.files.first()) {
        let (header, records, traced) = load(path, args.traced_on.as_deref())?;
        let svg = plot_against_round_trip(&records, &traced, args.measured, &header.command);
        std::fs::write(plot, svg).map_err(|e| format!("cannot write {}: {e}", plot.display()))?;
        eprintln!("wrote {}", plot.display());
    }
    if let Some(json) = &args.json {
        let text = serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?;
        std::fs::write(json, text).map_err(|e| format!("cannot write {}: {e}", json.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The --together table: each program's span alone and sharing the server with the others.
fn print_together(args: &ModelArgs, links: &[(String, LinkSpec)]) -> Result<Vec<Row>, String> {
    let mut programs = Vec::new();
    let mut traced = Link::unlimited();
    for path in &args.files {
        let (_, records, link) = load(path, args.traced_on.as_deref())?;
        traced = link;
        programs.push(records);
    }
    println!(
        "\n{} programs sharing one server and GPU (spans, s):",
        programs.len()
    );
    println!(
        "{:<34} {:<40} {:>10} {:>10} {:>8}",
        "link", "trace", "alone", "together", "x alone"
    );
    let mut rows = Vec::new();
    let mut named: Vec<(String, LinkSpec)> = vec![("traced".into(), traced_spec(&traced))];
    named.extend(links.iter().cloned());
    for (name, spec) in &named {
        let target = Link::from_spec(spec);
        let together = predict_together(&programs, &traced, &target);
        for ((path, records), (span, waited)) in args.files.iter().zip(&programs).zip(together) {
            let (alone, _) = predict(records, &traced, &target);
            println!(
                "{:<34} {:<40} {:>10.6} {:>10.6} {:>8.3}",
                name,
                path.display(),
                alone / 1e6,
                span / 1e6,
                span / alone.max(1e-9)
            );
            rows.push(Row {
                trace: path.display().to_string(),
                link: name.clone(),
                rtt_us: target.rtt_us,
                gbit_per_s: spec.bits_per_second.map(|b| b / 1e9),
                predicted_s: span / 1e6,
                traced_s: alone / 1e6,
                network_wait_s: waited / 1e6,
                together: true,
            });
        }
    }
    Ok(rows)
}

/// The spec of a model link (for the "traced" row: the path itself, nothing added).
fn traced_spec(link: &Link) -> LinkSpec {
    LinkSpec {
        rtt: std::time::Duration::from_secs_f64(link.rtt_us / 1e6),
        bits_per_second: link
            .bytes_per_us
            .is_finite()
            .then_some(link.bytes_per_us * 8e6),
    }
}

/// A trace, and the link it was taken on (`traced_on`, else its own `RGPU_LINK`, else
/// loopback).
fn load(
    path: &std::path::Path,
    traced_on: Option<&str>,
) -> Result<(TraceHeader, Vec<CallRecord>, Link), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let trace = read_trace(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let (header, records) = (trace.header, trace.calls);
    let traced = match traced_on.or(header.link.as_deref()) {
        Some(text) => Link::from_spec(&parse_link(text)?.1),
        None => Link::unlimited(),
    };
    Ok((header, records, traced))
}

/// The predicted time (seconds) against the added round trip, one line per rate.
fn plot_against_round_trip(
    records: &[CallRecord],
    traced: &Link,
    measured: Option<f64>,
    command: &str,
) -> String {
    use rgpu_bench::output::{line_plot_with, Series};
    let (traced_span, _) = predict(records, traced, traced);
    let base = measured.map_or(traced_span, |s| s * 1e6);
    // Round trips in ns: 1 µs to 50 ms, three per decade.
    let round_trips: Vec<u64> = (0..=14)
        .map(|i| (1e3 * 10f64.powf(i as f64 / 3.0)) as u64)
        .filter(|&ns| ns <= 50_000_000)
        .collect();
    let rates = [
        ("1 Gbit/s", Some(1e9), "#d62728"),
        ("10 Gbit/s", Some(1e10), "#ff7f0e"),
        ("100 Gbit/s", Some(1e11), "#2ca02c"),
        ("unlimited", None, "#1f77b4"),
    ];
    let series: Vec<Series> = rates
        .iter()
        .map(|&(label, bits, color)| Series {
            label,
            color,
            points: round_trips
                .iter()
                .map(|&ns| {
                    let target = Link {
                        rtt_us: ns as f64 / 1e3,
                        bytes_per_us: bits.map_or(f64::INFINITY, |b| b / 8.0 / 1e6),
                        buffer_bytes: traced.buffer_bytes,
                    };
                    let (span, _) = predict(records, traced, &target);
                    (ns, (base + span - traced_span) / 1e6)
                })
                .collect(),
        })
        .collect();
    let title = format!(
        "rgpu model: {} — predicted time vs added round trip",
        escape(command)
    );
    line_plot_with(&title, "s", &series, |ns| {
        if ns >= 1_000_000 {
            format!("{} ms", ns / 1_000_000)
        } else {
            format!("{} us", ns / 1_000)
        }
    })
}

/// The command line made safe for SVG text (and kept short).
fn escape(text: &str) -> String {
    let short: String = text.chars().take(60).collect();
    short
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plot_has_a_line_per_rate_rising_with_the_round_trip() {
        let text = include_str!("../../tests/data/launch-loop.trace.jsonl");
        let records = read_trace(text).unwrap().calls;
        let svg = plot_against_round_trip(&records, &Link::unlimited(), None, "a <loop>");
        assert_eq!(svg.matches("<polyline").count(), 4, "{svg}");
        assert!(
            svg.contains("a &lt;loop&gt;") && svg.contains("46 ms"),
            "{svg}"
        );
    }
}
