//! `rgpu bench mpi`: OSU-style latency and bandwidth of MPI between two ranks, with host
//! buffers (the MPI link itself, measured in the same run) and with rgpu device buffers moved
//! by librgpu_mpi.so. The measuring program is `rgpu_mpi_bench` (mpi/rgpu_mpi_bench.c, built by
//! scripts/build-mpi.sh beside this executable); this command runs it under `mpirun` through
//! `rgpu run --mpi`, then prints a table, writes JSON and draws the bandwidths as an SVG plot.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use serde::{Deserialize, Serialize};

use crate::local_server::LocalServer;
use crate::output::{format_bytes, line_plot, Series};

#[derive(clap::Args, Debug)]
#[command(
    about = "MPI latency and bandwidth between two ranks: host buffers vs rgpu device buffers (staged and direct)",
    long_about = "MPI latency (ping-pong, half the round trip) and bandwidth (a window of 64 \
                  non-blocking sends, fewer above 16 MiB, then an acknowledgement) between two \
                  ranks started by \
                  mpirun through `rgpu run --mpi`, with host buffers (the MPI link itself) and \
                  with rgpu device buffers (OpenCL buffers marked by their datatype, or CUDA \
                  device memory) staged through the ranks' host memory, and moved directly \
                  between the servers, side by side. Without --servers, starts two local `rgpu \
                  server`s, one per rank. Needs rgpu_mpi_bench and librgpu_mpi.so beside this \
                  executable (scripts/build-mpi.sh). Prints a table, writes JSON and an SVG plot."
)]
pub struct MpiBenchArgs {
    /// Servers (host:port, comma-separated); rank r uses device r of the list's devices.
    #[arg(long, value_name = "LIST")]
    servers: Option<String>,

    /// Token file for --servers that require one.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,

    /// Device buffers of this API.
    #[arg(long, value_parser = ["opencl", "cuda"], default_value = "opencl")]
    api: String,

    /// Message sizes of the latency test (bytes).
    #[arg(long, value_delimiter = ',', default_value = "8,64,512,4096")]
    latency_sizes: Vec<u64>,

    /// Message sizes of the bandwidth test (bytes).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "65536,1048576,16777216,67108864,268435456"
    )]
    bandwidth_sizes: Vec<u64>,

    /// Round trips per latency size (and at most as many windows per bandwidth size).
    #[arg(long, default_value_t = 200)]
    iterations: u32,

    /// The mpirun to use, and arguments for it (whitespace-separated).
    #[arg(long, default_value = "mpirun")]
    mpirun: String,
    /// Arguments for mpirun (the default keeps the ranks, all on this machine, on TCP over
    /// loopback).
    #[arg(
        long,
        default_value = "--mca btl self,tcp --mca btl_tcp_if_include lo",
        allow_hyphen_values = true
    )]
    mpirun_args: String,

    /// Where to write the results as JSON.
    #[arg(long, value_name = "FILE", default_value = "bench-mpi.json")]
    json: PathBuf,

    /// Where to draw the bandwidths (SVG).
    #[arg(long, value_name = "FILE", default_value = "bench-mpi.svg")]
    svg: PathBuf,
}

/// One measurement, as rgpu_mpi_bench prints it.
#[derive(Clone, Debug, Deserialize, Serialize)]
struct Measurement {
    mode: String,
    test: String,
    bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mbps: Option<f64>,
}

#[derive(Serialize)]
struct Report<'a> {
    api: &'a str,
    servers: &'a str,
    measurements: &'a [Measurement],
}

pub fn run(args: MpiBenchArgs) -> Result<ExitCode, String> {
    let exe = std::env::current_exe().map_err(|e| format!("this executable: {e}"))?;
    let dir = exe.parent().ok_or("this executable has no directory")?;
    let bench = dir.join("rgpu_mpi_bench");
    if !bench.exists() {
        return Err(format!(
            "no {} (build it with scripts/build-mpi.sh, which needs mpicc)",
            bench.display()
        ));
    }
    // Two local servers unless given: each rank's device on its own server.
    let mut local = Vec::new();
    let servers = match &args.servers {
        Some(list) => list.clone(),
        None => {
            for _ in 0..2 {
                let (endpoint, server) = LocalServer::unless_given(None)?;
                local.push((endpoint, server));
            }
            local
                .iter()
                .map(|(e, _)| e.as_str())
                .collect::<Vec<_>>()
                .join(",")
        }
    };
    let mut command = Command::new(&args.mpirun);
    command.args(["-np", "2", "--oversubscribe"]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        command.arg("--allow-run-as-root");
    }
    command.args(args.mpirun_args.split_whitespace());
    command
        .arg(&exe)
        .args(["run", "--mpi", "--servers", &servers]);
    if let Some(token) = &args.token_file {
        command.arg("--token-file").arg(token);
    }
    let list = |sizes: &[u64]| {
        sizes
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    command.arg("--").arg(&bench).args([
        "--api",
        &args.api,
        "--latency-sizes",
        &list(&args.latency_sizes),
        "--bandwidth-sizes",
        &list(&args.bandwidth_sizes),
        "--iterations",
        &args.iterations.to_string(),
    ]);
    eprintln!(
        "running {} ranks through rgpu run --mpi (servers {servers})...",
        2
    );
    // The ranks' messages (rgpu's warnings, RGPU_LOG's log) go straight to our stderr.
    let output = command
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", args.mpirun))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "{} failed ({}):\n{stdout}",
            args.mpirun, output.status
        ));
    }
    let measurements: Vec<Measurement> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("rgpu_mpi_bench's output: {e}"))?;
    let report = Report {
        api: &args.api,
        servers: &servers,
        measurements: &measurements,
    };
    let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    std::fs::write(&args.json, json).map_err(|e| format!("{}: {e}", args.json.display()))?;
    std::fs::write(&args.svg, plot(&measurements, &args.api))
        .map_err(|e| format!("{}: {e}", args.svg.display()))?;
    crate::output::write_stdout(&table(&measurements, &args.api))?;
    println!("wrote {} and {}", args.json.display(), args.svg.display());
    drop(local);
    Ok(ExitCode::SUCCESS)
}

fn find<'a>(m: &'a [Measurement], mode: &str, test: &str, bytes: u64) -> Option<&'a Measurement> {
    m.iter()
        .find(|x| x.mode == mode && x.test == test && x.bytes == bytes)
}

fn sizes(m: &[Measurement], test: &str) -> Vec<u64> {
    let mut sizes: Vec<u64> = m
        .iter()
        .filter(|x| x.test == test)
        .map(|x| x.bytes)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// The table: each size with host (the MPI link) and device figures, and their ratio.
fn table(m: &[Measurement], api: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "MPI between two ranks: host buffers (the MPI link) vs rgpu {api} device buffers, \
         staged through the ranks' host memory and moved directly between the servers"
    );
    section(&mut out, m, "latency", "us", |x| x.us, 1);
    section(&mut out, m, "bandwidth", "MB/s", |x| x.mbps, 0);
    out
}

/// One test's rows: its sizes, with the figure `value` gives (`decimals` digits) per mode,
/// and the ratios direct / staged and direct / host.
fn section(
    out: &mut String,
    m: &[Measurement],
    test: &str,
    unit: &str,
    value: impl Fn(&Measurement) -> Option<f64>,
    decimals: usize,
) {
    let _ = writeln!(
        out,
        "\n{test:>10}  {:>14}  {:>14}  {:>14}  {:>15}  {:>13}",
        format!("host ({unit})"),
        format!("staged ({unit})"),
        format!("direct ({unit})"),
        "direct/staged",
        "direct/host"
    );
    for bytes in sizes(m, test) {
        let figure = |mode| find(m, mode, test, bytes).and_then(&value);
        let (host, staged, direct) = (figure("host"), figure("staged"), figure("direct"));
        let shown = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.decimals$}"));
        let _ = writeln!(
            out,
            "{:>10}  {:>14}  {:>14}  {:>14}  {:>15}  {:>13}",
            format_bytes(bytes),
            shown(host),
            shown(staged),
            shown(direct),
            ratio(direct, staged),
            ratio(direct, host)
        );
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "-".into(),
    }
}

/// Bandwidth against message size (log scale), one line per mode.
fn plot(m: &[Measurement], api: &str) -> String {
    let series: Vec<Series> = [
        ("host", "host buffers", "#1f77b4"),
        ("staged", "staged buffers", "#ff7f0e"),
        ("direct", "direct buffers", "#2ca02c"),
    ]
    .into_iter()
    .map(|(mode, label, color)| Series {
        label,
        color,
        points: sizes(m, "bandwidth")
            .into_iter()
            .filter_map(|b| {
                find(m, mode, "bandwidth", b)
                    .and_then(|x| x.mbps)
                    .map(|v| (b, v))
            })
            .collect(),
    })
    .collect();
    let title = format!("MPI bandwidth between two ranks (rgpu {api})");
    line_plot(&title, "MB/s", &series)
}
