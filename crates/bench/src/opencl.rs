//! `rgpu bench opencl`: bandwidth and latency of one device, natively and through rgpu, in the
//! same process through the same ICD loader, beside the raw loopback TCP baseline.
//!
//! Bandwidth follows VOCL's evaluation: a window of non-blocking transfers of one size, then
//! clFinish; GB/s is the window's bytes over its time (10^9 bytes per second).

use std::fmt::{self, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use rgpu_cl_api::native::Device;
use rgpu_cl_api::sys::CL_DEVICE_TYPE_ALL;
use rgpu_cl_api::{ClError, NativeOpenCl, CL_DEVICE_RGPU_SERVER, RGPU_PLATFORM_NAME};
use serde::Serialize;

use crate::local_server::LocalServer;
use crate::output::format_bytes;
use crate::tcp::{self, TcpBaseline};
use crate::ClientSetup;
use crate::{max, median, min};
use rgpu_cl_api::objects::{all_devices, Buffer, Context, Kernel, NamedDevice, Queue};

const DEFAULT_SIZES: &str = "512K,1M,2M,4M,8M,16M,32M,64M";
const EMPTY_KERNEL: &str = "__kernel void rgpu_bench_empty(void) {}";
/// Transfers before each size's timed windows, so first-touch costs stay out of them.
const WARMUP_TRANSFERS: usize = 4;
const LATENCY_WARMUP: usize = 20;

#[derive(clap::Args, Debug)]
#[command(
    about = "Bandwidth and latency of OpenCL through rgpu vs native, and of raw loopback TCP",
    long_about = "Bandwidth and latency of OpenCL through rgpu vs native (a benchmark, not a \
                  test).\n\nWithout --servers, starts a local `rgpu server` on a free loopback \
                  port. Picks the first local OpenCL device (or the first matching \
                  --device-filter) and the rgpu device of the same name. For each size: write and \
                  read bandwidth (a window of non-blocking transfers, then clFinish; the median of \
                  the repetitions). Then the latency of a 4-byte blocking read and of an empty \
                  kernel launch + clFinish (medians), and the raw loopback TCP bandwidth (1 MiB \
                  writes) and 64-byte round trip measured in the same run. Prints a table and \
                  writes JSON."
)]
pub struct OpenclBenchArgs {
    /// Servers to measure instead of a local one (host:port or unix:/path, comma-separated).
    #[arg(long, value_name = "LIST")]
    servers: Option<String>,

    /// Token file for --servers that require one.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,

    /// Transfer sizes (K, M, G suffixes are binary: 512K = 512 KiB).
    #[arg(long, value_name = "SIZES", value_delimiter = ',', default_value = DEFAULT_SIZES,
          value_parser = parse_size)]
    sizes: Vec<usize>,

    /// Where to write the results as JSON.
    #[arg(long, value_name = "FILE", default_value = "bench-opencl.json")]
    json: PathBuf,

    /// Use the local device whose name contains SUBSTR (case-insensitive).
    #[arg(long, value_name = "SUBSTR")]
    device_filter: Option<String>,

    /// Non-blocking transfers per timed window.
    #[arg(long, default_value_t = 32)]
    window: usize,

    /// Timed windows per size and direction.
    #[arg(long, default_value_t = 3)]
    repetitions: usize,

    /// Calls per latency measurement.
    #[arg(long, default_value_t = 1000)]
    latency_calls: usize,

    /// MiB sent per raw TCP bandwidth run (three runs).
    #[arg(long, default_value_t = 512)]
    tcp_mib: u64,

    /// Where to draw the results as SVG (opencl-bandwidth.svg, opencl-latency.svg).
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,
}

/// "512K" -> 524288; plain numbers are bytes.
pub(super) fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let upper = text.to_ascii_uppercase();
    let trimmed = upper.trim_end_matches("IB").trim_end_matches('B');
    let (digits, shift) = match trimmed.chars().last() {
        Some('K') => (&trimmed[..trimmed.len() - 1], 10),
        Some('M') => (&trimmed[..trimmed.len() - 1], 20),
        Some('G') => (&trimmed[..trimmed.len() - 1], 30),
        _ => (trimmed, 0),
    };
    let value: usize = digits
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a size like 512K, 4M or 1048576"))?;
    if value == 0 {
        return Err("sizes must be positive".into());
    }
    Ok(value << shift)
}

#[derive(Serialize)]
struct Report {
    native_device: DeviceLabel,
    rgpu_device: DeviceLabel,
    window: usize,
    repetitions: usize,
    latency_calls: usize,
    raw_tcp: TcpBaseline,
    bandwidth: Vec<SizeResult>,
    latency: Vec<LatencyResult>,
}

#[derive(Serialize)]
struct DeviceLabel {
    platform: String,
    name: String,
    /// The server holding the rgpu device.
    #[serde(skip_serializing_if = "Option::is_none")]
    server: Option<String>,
}

#[derive(Serialize)]
struct SizeResult {
    size_bytes: usize,
    /// Loopback TCP carrying the same window of transfers of this size (see tcp.rs).
    raw_tcp_same_size_gbps: f64,
    write: Direction,
    read: Direction,
}

#[derive(Serialize)]
struct Direction {
    native_gbps: f64,
    rgpu_gbps: f64,
    native_best_gbps: f64,
    rgpu_best_gbps: f64,
    rgpu_over_native: f64,
    rgpu_over_raw_tcp: f64,
    rgpu_over_raw_tcp_same_size: f64,
}

#[derive(Serialize)]
struct LatencyResult {
    name: &'static str,
    native_us: f64,
    rgpu_us: f64,
    native_min_us: f64,
    rgpu_min_us: f64,
    overhead_us: f64,
}

/// One device's raw samples.
struct DeviceSamples {
    /// Per size: GB/s of each window.
    write_gbps: Vec<Vec<f64>>,
    read_gbps: Vec<Vec<f64>>,
    small_read_us: Vec<f64>,
    launch_us: Vec<f64>,
}

pub fn run(args: OpenclBenchArgs, setup: &dyn ClientSetup) -> Result<ExitCode, String> {
    if args.window == 0 || args.repetitions == 0 || args.latency_calls == 0 {
        return Err("--window, --repetitions and --latency-calls must be positive".into());
    }
    // The baseline runs first, alone, before any OpenCL or server thread competes for CPUs.
    eprintln!("measuring raw loopback TCP...");
    let raw_tcp = tcp::measure(args.tcp_mib << 20, 3, args.latency_calls.max(1000))
        .map_err(|e| format!("loopback TCP measurement: {e}"))?;
    let raw_tcp_sized = args
        .sizes
        .iter()
        .map(|&size| tcp::sized_bandwidth(size, args.window, args.repetitions))
        .collect::<std::io::Result<Vec<f64>>>()
        .map_err(|e| format!("loopback TCP measurement: {e}"))?;

    let (servers, local_server) = LocalServer::unless_given(args.servers.as_deref())?;
    setup.apply(&servers, args.token_file.as_deref())?;
    let native = NativeOpenCl::load(None)?;
    let (local, remote) = pick_devices(&native, args.device_filter.as_deref())?;
    let server = native
        .device_info_string(remote.device, CL_DEVICE_RGPU_SERVER)
        .unwrap_or_else(|_| servers.clone());

    eprintln!("measuring native: {} ({})", local.name, local.platform_name);
    let native_samples = measure_device(&native, local.device, &args)?;
    eprintln!("measuring rgpu: {} via {server}", remote.name);
    let rgpu_samples = measure_device(&native, remote.device, &args)?;

    let report = Report {
        native_device: DeviceLabel {
            platform: local.platform_name.clone(),
            name: local.name.clone(),
            server: None,
        },
        rgpu_device: DeviceLabel {
            platform: remote.platform_name.clone(),
            name: remote.name.clone(),
            server: Some(server),
        },
        window: args.window,
        repetitions: args.repetitions,
        latency_calls: args.latency_calls,
        bandwidth: args
            .sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| SizeResult {
                size_bytes: size,
                raw_tcp_same_size_gbps: raw_tcp_sized[i],
                write: direction(
                    &native_samples.write_gbps[i],
                    &rgpu_samples.write_gbps[i],
                    &raw_tcp,
                    raw_tcp_sized[i],
                ),
                read: direction(
                    &native_samples.read_gbps[i],
                    &rgpu_samples.read_gbps[i],
                    &raw_tcp,
                    raw_tcp_sized[i],
                ),
            })
            .collect(),
        latency: vec![
            latency(
                "4-byte blocking read",
                &native_samples.small_read_us,
                &rgpu_samples.small_read_us,
            ),
            latency(
                "kernel launch + clFinish",
                &native_samples.launch_us,
                &rgpu_samples.launch_us,
            ),
        ],
        raw_tcp,
    };
    crate::output::write_stdout(&render_report(&report).map_err(|e| e.to_string())?)?;
    if let Some(dir) = &args.plot {
        crate::output::write_plots(dir, &plots(&report))?;
    }
    let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    std::fs::write(&args.json, json + "\n")
        .map_err(|e| format!("cannot write {}: {e}", args.json.display()))?;
    eprintln!("wrote {}", args.json.display());
    // Objects are released (in measure_device) before the server stops.
    drop(local_server);
    Ok(ExitCode::SUCCESS)
}

/// The local device to compare with, and the rgpu device that is the same device.
fn pick_devices(
    native: &NativeOpenCl,
    filter: Option<&str>,
) -> Result<(NamedDevice, NamedDevice), String> {
    let devices =
        all_devices(native, CL_DEVICE_TYPE_ALL).map_err(|e| format!("listing devices: {e}"))?;
    let (remote, local): (Vec<_>, Vec<_>) = devices
        .into_iter()
        .partition(|d| d.platform_name == RGPU_PLATFORM_NAME);
    let wanted = filter.map(str::to_lowercase);
    let local = local
        .into_iter()
        .find(|d| {
            wanted
                .as_ref()
                .is_none_or(|w| d.name.to_lowercase().contains(w))
        })
        .ok_or_else(|| match filter {
            Some(filter) => format!("no local OpenCL device matches '{filter}'"),
            None => "this machine has no OpenCL device of its own to compare with".to_string(),
        })?;
    let names: Vec<&str> = remote.iter().map(|d| d.name.as_str()).collect();
    let remote_match = remote.iter().find(|d| d.name == local.name).cloned();
    let remote = remote_match.ok_or_else(|| {
        format!(
            "no rgpu device is the local device '{}' (rgpu devices: {})",
            local.name,
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        )
    })?;
    Ok((local, remote))
}

fn measure_device(
    native: &NativeOpenCl,
    device: Device,
    args: &OpenclBenchArgs,
) -> Result<DeviceSamples, String> {
    let largest = args.sizes.iter().copied().max().unwrap_or(0);
    let context = Context::new(native, device).map_err(cl_error("clCreateContext"))?;
    let queue = Queue::new(&context, device).map_err(cl_error("clCreateCommandQueue"))?;
    let buffer = Buffer::new(&context, largest).map_err(cl_error("clCreateBuffer"))?;
    // Touched host memory, so page faults are not part of the first window.
    let mut host: Vec<u8> = (0..largest).map(|i| i as u8).collect();

    let mut samples = DeviceSamples {
        write_gbps: Vec::new(),
        read_gbps: Vec::new(),
        small_read_us: Vec::new(),
        launch_us: Vec::new(),
    };
    let window_bytes = |size: usize| (size * args.window) as f64;
    for &size in &args.sizes {
        eprint!("  {:>9}", format_bytes(size as u64));
        let data = &host[..size];
        queue
            .write_window(&buffer, data, WARMUP_TRANSFERS)
            .map_err(cl_error("write"))?;
        let mut writes = Vec::with_capacity(args.repetitions);
        for _ in 0..args.repetitions {
            let start = Instant::now();
            queue
                .write_window(&buffer, data, args.window)
                .map_err(cl_error("write"))?;
            writes.push(window_bytes(size) / start.elapsed().as_secs_f64() / 1e9);
        }
        let data = &mut host[..size];
        queue
            .read_window(&buffer, data, WARMUP_TRANSFERS)
            .map_err(cl_error("read"))?;
        let mut reads = Vec::with_capacity(args.repetitions);
        for _ in 0..args.repetitions {
            let start = Instant::now();
            queue
                .read_window(&buffer, data, args.window)
                .map_err(cl_error("read"))?;
            reads.push(window_bytes(size) / start.elapsed().as_secs_f64() / 1e9);
        }
        eprintln!(
            "  write {:>7.2} GB/s  read {:>7.2} GB/s",
            median(&writes),
            median(&reads)
        );
        samples.write_gbps.push(writes);
        samples.read_gbps.push(reads);
    }

    let small = Buffer::new(&context, 4).map_err(cl_error("clCreateBuffer"))?;
    let mut word = [0u8; 4];
    samples.small_read_us = time_calls(args.latency_calls, || {
        queue.read_blocking(&small, &mut word)
    })
    .map_err(cl_error("4-byte blocking read"))?;

    let kernel = Kernel::build(&context, device, EMPTY_KERNEL, "rgpu_bench_empty")?;
    samples.launch_us = time_calls(args.latency_calls, || {
        queue.launch(&kernel, 1)?;
        queue.finish()
    })
    .map_err(cl_error("kernel launch"))?;
    Ok(samples)
}

/// Labels an OpenCL error with what failed.
fn cl_error(what: &'static str) -> impl Fn(ClError) -> String {
    move |e| format!("{what}: {e}")
}

/// Each call's time in microseconds, after a warm-up.
fn time_calls<E>(calls: usize, mut call: impl FnMut() -> Result<(), E>) -> Result<Vec<f64>, E> {
    for _ in 0..LATENCY_WARMUP {
        call()?;
    }
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls {
        let start = Instant::now();
        call()?;
        times.push(start.elapsed().as_secs_f64() * 1e6);
    }
    Ok(times)
}

fn direction(native: &[f64], rgpu: &[f64], raw_tcp: &TcpBaseline, same_size_tcp: f64) -> Direction {
    let (native_gbps, rgpu_gbps) = (median(native), median(rgpu));
    Direction {
        native_gbps,
        rgpu_gbps,
        native_best_gbps: max(native),
        rgpu_best_gbps: max(rgpu),
        rgpu_over_native: rgpu_gbps / native_gbps,
        rgpu_over_raw_tcp: rgpu_gbps / raw_tcp.bandwidth_gbps,
        rgpu_over_raw_tcp_same_size: rgpu_gbps / same_size_tcp,
    }
}

fn latency(name: &'static str, native: &[f64], rgpu: &[f64]) -> LatencyResult {
    let (native_us, rgpu_us) = (median(native), median(rgpu));
    LatencyResult {
        name,
        native_us,
        rgpu_us,
        native_min_us: min(native),
        rgpu_min_us: min(rgpu),
        overhead_us: rgpu_us - native_us,
    }
}

/// The bandwidths against the size (native, rgpu, and loopback TCP carrying the same
/// transfers) and the latencies (native, rgpu, and a TCP round trip).
fn plots(report: &Report) -> Vec<(&'static str, String)> {
    use crate::output::{bar_chart, line_plot, Bar, Series};
    let series = |label, color, pick: &dyn Fn(&SizeResult) -> f64| Series {
        label,
        color,
        points: report
            .bandwidth
            .iter()
            .map(|s| (s.size_bytes as u64, pick(s)))
            .collect(),
    };
    let bandwidth = line_plot(
        &format!(
            "OpenCL transfers: {} (native and through rgpu)",
            report.native_device.name
        ),
        "GB/s",
        &[
            series("native write", "#1f77b4", &|s| s.write.native_gbps),
            series("rgpu write", "#d62728", &|s| s.write.rgpu_gbps),
            series("native read", "#2ca02c", &|s| s.read.native_gbps),
            series("rgpu read", "#ff7f0e", &|s| s.read.rgpu_gbps),
            series("loopback TCP", "gray", &|s| s.raw_tcp_same_size_gbps),
        ],
    );
    let groups: Vec<(&str, Vec<Bar>)> = report
        .latency
        .iter()
        .map(|l| {
            (
                l.name,
                vec![
                    Bar {
                        label: "native",
                        color: "#1f77b4",
                        value: l.native_us,
                    },
                    Bar {
                        label: "rgpu",
                        color: "#d62728",
                        value: l.rgpu_us,
                    },
                    Bar {
                        label: "TCP round trip",
                        color: "gray",
                        value: report.raw_tcp.round_trip_us,
                    },
                ],
            )
        })
        .collect();
    let latency = bar_chart("OpenCL latency (medians)", "µs", &groups);
    vec![
        ("opencl-bandwidth.svg", bandwidth),
        ("opencl-latency.svg", latency),
    ]
}

fn render_report(report: &Report) -> Result<String, fmt::Error> {
    let mut out = String::new();
    let tcp = &report.raw_tcp;
    writeln!(out)?;
    writeln!(
        out,
        "native: {} ({})",
        report.native_device.name, report.native_device.platform
    )?;
    writeln!(
        out,
        "rgpu:   {} via {}",
        report.rgpu_device.name,
        report.rgpu_device.server.as_deref().unwrap_or("?")
    )?;
    writeln!(
        out,
        "raw loopback TCP: {:.2} GB/s (one stream, 1 MiB writes from one cached buffer), round \
         trip {:.1} us ({} B ping-pong); TCP GB/s per size: the same window of transfers as \
         plain TCP, from and into buffers of that size",
        tcp.bandwidth_gbps, tcp.round_trip_us, tcp.ping_bytes
    )?;
    writeln!(
        out,
        "bandwidth: median of {} windows of {} non-blocking transfers + clFinish",
        report.repetitions, report.window
    )?;
    for (title, pick) in [
        (
            "write (host to device)",
            (|s: &SizeResult| &s.write) as fn(&SizeResult) -> &Direction,
        ),
        ("read (device to host)", |s: &SizeResult| &s.read),
    ] {
        writeln!(out, "\n{title}")?;
        writeln!(
            out,
            "{:>9}  {:>11}  {:>9}  {:>11}  {:>12}  {:>9}  {:>14}",
            "size",
            "native GB/s",
            "rgpu GB/s",
            "rgpu/native",
            "rgpu/raw-TCP",
            "TCP GB/s",
            "rgpu/TCP-same"
        )?;
        for size in &report.bandwidth {
            let d = pick(size);
            writeln!(
                out,
                "{:>9}  {:>11.2}  {:>9.2}  {:>11.2}  {:>12.2}  {:>9.2}  {:>14.2}",
                format_bytes(size.size_bytes as u64),
                d.native_gbps,
                d.rgpu_gbps,
                d.rgpu_over_native,
                d.rgpu_over_raw_tcp,
                size.raw_tcp_same_size_gbps,
                d.rgpu_over_raw_tcp_same_size
            )?;
        }
    }
    writeln!(
        out,
        "\nlatency, median of {} calls (us)",
        report.latency_calls
    )?;
    writeln!(
        out,
        "{:<26}  {:>9}  {:>9}  {:>11}",
        "", "native", "rgpu", "rgpu-native"
    )?;
    for row in &report.latency {
        writeln!(
            out,
            "{:<26}  {:>9.1}  {:>9.1}  {:>+11.1}",
            row.name, row.native_us, row.rgpu_us, row.overhead_us
        )?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("0").is_err());
    }
}
