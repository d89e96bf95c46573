//! `rgpu bench fabric`: copies between GPUs of two rgpu servers, which the servers move
//! between themselves (crates/server/src/fabric.rs), against the raw loopback TCP link of this
//! machine (one stream, and striped over several) and native `cuMemcpyPeer` between the same
//! GPUs, all measured in one run. Both CUDA drivers are loaded in this process (NVIDIA's and
//! rgpu's), as `rgpu bench cuda` does.
//!
//! Through rgpu each size is measured twice: with the servers copying device to device through
//! CUDA IPC handles (they are on one machine), and over the network path
//! (`RGPU_FABRIC_IPC=0`): page-locked chunks, striped links, loopback TCP.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::ptr::null_mut;
use std::time::Instant;

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::{check, Driver, Status};
use serde::Serialize;

use crate::local_server::LocalServer;
use crate::output::{format_bytes, line_plot, Series};
use crate::{median, min, tcp, ClientSetup};

#[derive(clap::Args, Debug)]
#[command(
    about = "Copies between GPUs of two rgpu servers vs native peer copies and raw loopback TCP",
    long_about = "Copies between GPUs of two rgpu servers, moved server to server by the \
                  fabric, against native cuMemcpyPeer between the same GPUs (when this machine \
                  has two) and the raw loopback TCP link measured in the same run (one stream, \
                  and striped over --streams streams). Through rgpu both paths are measured: \
                  device to device through CUDA IPC handles (servers on one machine) and over \
                  the network. Without --servers, starts two local servers, one per GPU (both \
                  on GPU 0 when there is one). Prints a table, writes JSON and an SVG plot."
)]
pub struct FabricBenchArgs {
    /// Two servers whose first devices are copied between (instead of two local ones).
    #[arg(long, value_name = "LIST")]
    servers: Option<String>,

    /// Token file for --servers.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,

    /// Copy sizes (K and M suffixes), comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = super::opencl::parse_size,
        default_value = "64K,256K,1M,4M,16M,64M,256M"
    )]
    sizes: Vec<usize>,

    /// Timed runs per measurement (median and minimum reported).
    #[arg(long, default_value_t = 5)]
    repetitions: usize,

    /// Synchronous 8-byte copies per latency run.
    #[arg(long, default_value_t = 200)]
    latency_copies: usize,

    /// TCP streams of the striped raw baseline (rgpu stripes large pulls over 4 links).
    #[arg(long, default_value_t = 4)]
    streams: usize,

    #[arg(long, value_name = "FILE", default_value = "bench-fabric.json")]
    json: PathBuf,

    #[arg(long, value_name = "FILE", default_value = "bench-fabric.svg")]
    svg: PathBuf,
}

#[derive(Serialize)]
struct Row {
    size_bytes: usize,
    native_gbps: Option<f64>,
    rgpu_ipc_gbps: f64,
    rgpu_ipc_min_gbps: f64,
    rgpu_network_gbps: f64,
    rgpu_network_min_gbps: f64,
    tcp_one_stream_gbps: f64,
    tcp_striped_gbps: f64,
}

#[derive(Serialize)]
struct Report {
    servers: String,
    devices: [String; 2],
    repetitions: usize,
    streams: usize,
    rows: Vec<Row>,
    /// One synchronous 8-byte copy between the GPUs, microseconds (median).
    latency_native_us: Option<f64>,
    latency_rgpu_ipc_us: f64,
    latency_rgpu_network_us: f64,
    tcp_round_trip_us: f64,
}

pub fn run(args: FabricBenchArgs, setup: &dyn ClientSetup) -> Result<ExitCode, String> {
    if args.repetitions == 0 || args.latency_copies == 0 || args.streams == 0 {
        return Err("--repetitions, --latency-copies and --streams must be positive".into());
    }
    let native = Driver::load(None).ok();
    let local_gpus = native.as_ref().map_or(0, device_count);
    let mut local_servers = Vec::new();
    let servers = match &args.servers {
        Some(list) => list.clone(),
        None => {
            for i in 0..2 {
                let gpu = if local_gpus >= 2 {
                    i.to_string()
                } else {
                    "0".into()
                };
                eprintln!("starting a local rgpu server on GPU {gpu}...");
                local_servers.push(LocalServer::start_with(&[("CUDA_VISIBLE_DEVICES", &gpu)])?);
            }
            let endpoints: Vec<&str> = local_servers.iter().map(|s| s.endpoint()).collect();
            endpoints.join(",")
        }
    };

    let tcp_error = |e: std::io::Error| format!("loopback TCP: {e}");
    eprintln!("measuring raw loopback TCP...");
    let mut tcp_one = Vec::new();
    let mut tcp_striped = Vec::new();
    for &size in &args.sizes {
        let window = copies_per_run(size);
        tcp_one.push(tcp::sized_bandwidth(size, window, args.repetitions).map_err(tcp_error)?);
        let striped = tcp::striped_bandwidth(size, window, args.streams, args.repetitions);
        tcp_striped.push(striped.map_err(tcp_error)?);
    }
    let tcp_round_trip = tcp::measure(1 << 20, 1, 1000)
        .map_err(tcp_error)?
        .round_trip_us;

    let native_samples = match (&native, local_gpus >= 2) {
        (Some(driver), true) => {
            eprintln!("measuring native cuMemcpyPeer between GPUs 0 and 1...");
            Some(measure(driver, &args)?)
        }
        _ => None,
    };
    let rgpu_library = setup
        .apply(&servers, args.token_file.as_deref())?
        .cuda_library
        .ok_or("cannot find librgpu_cuda.so beside the rgpu ICD")?;
    let rgpu = Driver::load_any(Some(&rgpu_library), true)?;
    if device_count(&rgpu) < 2 {
        return Err(format!("{servers}: rgpu sees fewer than two GPUs"));
    }
    let devices = [device_name(&rgpu, 0)?, device_name(&rgpu, 1)?];
    eprintln!("measuring rgpu, IPC path: {} -> {}", devices[0], devices[1]);
    std::env::set_var("RGPU_FABRIC_IPC", "1");
    let ipc = measure(&rgpu, &args)?;
    eprintln!("measuring rgpu, network path");
    std::env::set_var("RGPU_FABRIC_IPC", "0");
    let network = measure(&rgpu, &args)?;

    let rows = args
        .sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| Row {
            size_bytes: size,
            native_gbps: native_samples.as_ref().map(|n| median(&n.copies[i])),
            rgpu_ipc_gbps: median(&ipc.copies[i]),
            rgpu_ipc_min_gbps: min(&ipc.copies[i]),
            rgpu_network_gbps: median(&network.copies[i]),
            rgpu_network_min_gbps: min(&network.copies[i]),
            tcp_one_stream_gbps: tcp_one[i],
            tcp_striped_gbps: tcp_striped[i],
        })
        .collect();
    let report = Report {
        servers,
        devices,
        repetitions: args.repetitions,
        streams: args.streams,
        rows,
        latency_native_us: native_samples.as_ref().map(|n| median(&n.latency_us)),
        latency_rgpu_ipc_us: median(&ipc.latency_us),
        latency_rgpu_network_us: median(&network.latency_us),
        tcp_round_trip_us: tcp_round_trip,
    };
    crate::output::write_stdout(&render(&report))?;
    let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    std::fs::write(&args.json, json + "\n")
        .map_err(|e| format!("cannot write {}: {e}", args.json.display()))?;
    std::fs::write(&args.svg, plot(&report))
        .map_err(|e| format!("cannot write {}: {e}", args.svg.display()))?;
    eprintln!("wrote {} and {}", args.json.display(), args.svg.display());
    // Never unloaded: the libraries have threads of their own that outlive the measurements.
    std::mem::forget(rgpu);
    std::mem::forget(native);
    drop(local_servers);
    Ok(ExitCode::SUCCESS)
}

/// Copies per timed run: about 1 GiB, at least 4 and at most 256.
fn copies_per_run(size: usize) -> usize {
    ((1usize << 30) / size.max(1)).clamp(4, 256)
}

fn device_count(driver: &Driver) -> usize {
    let mut count = 0;
    // SAFETY: a local out-value.
    let ok = unsafe { cu_call!(driver, cuInit(0)) } == 0
        // SAFETY: a local out-value.
        && unsafe { cu_call!(driver, cuDeviceGetCount(&mut count)) } == 0;
    if ok {
        count.max(0) as usize
    } else {
        0
    }
}

fn device_name(driver: &Driver, ordinal: i32) -> Result<String, String> {
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: a local buffer of the size given.
    let status = unsafe { cu_call!(driver, cuDeviceGetName(name.as_mut_ptr(), 256, ordinal)) };
    cu_check("cuDeviceGetName", status)?;
    // SAFETY: the driver wrote a NUL-terminated name into the buffer.
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) };
    Ok(format!("{} (device {ordinal})", name.to_string_lossy()))
}

fn cu_check(what: &str, status: Status) -> Result<(), String> {
    check(status).map_err(|status| format!("{what} failed: CUDA error {status}"))
}

struct Samples {
    /// GB/s per size, one sample per run.
    copies: Vec<Vec<f64>>,
    latency_us: Vec<f64>,
}

/// Two contexts (devices 0 and 1), a buffer of the largest size on each, a stream on the
/// source's: `count` async peer copies per run, waited for at the end.
fn measure(driver: &Driver, args: &FabricBenchArgs) -> Result<Samples, String> {
    let d = driver;
    let largest = args.sizes.iter().copied().max().unwrap_or(1 << 20);
    let mut contexts = [null_mut(); 2];
    let mut buffers = [0u64; 2];
    for (ordinal, (ctx, buffer)) in contexts.iter_mut().zip(&mut buffers).enumerate() {
        let mut device = 0;
        // SAFETY: local out-values; the benchmark's own handles.
        unsafe {
            cu_check(
                "cuDeviceGet",
                cu_call!(d, cuDeviceGet(&mut device, ordinal as i32)),
            )?;
            cu_check(
                "cuDevicePrimaryCtxRetain",
                cu_call!(d, cuDevicePrimaryCtxRetain(ctx, device)),
            )?;
            cu_check("cuCtxSetCurrent", cu_call!(d, cuCtxSetCurrent(*ctx)))?;
            cu_check("cuMemAlloc", cu_call!(d, cuMemAlloc_v2(buffer, largest)))?;
            cu_check(
                "cuMemsetD8",
                cu_call!(d, cuMemsetD8_v2(*buffer, ordinal as u8 + 1, largest)),
            )?;
        }
    }
    // Natively, peer access where the GPUs allow it (as programs that care enable it); rgpu
    // answers "no access" between servers, and the servers use the link between the GPUs.
    let mut can = 0;
    // SAFETY: local out-values and the benchmark's contexts.
    unsafe {
        if cu_call!(d, cuDeviceCanAccessPeer(&mut can, 0, 1)) == 0 && can == 1 {
            cu_call!(d, cuCtxSetCurrent(contexts[0]));
            cu_call!(d, cuCtxEnablePeerAccess(contexts[1], 0));
            cu_call!(d, cuCtxSetCurrent(contexts[1]));
            cu_call!(d, cuCtxEnablePeerAccess(contexts[0], 0));
        }
    }
    let mut stream = null_mut();
    // SAFETY: the source's context is made current; a local out-value.
    unsafe {
        cu_check("cuCtxSetCurrent", cu_call!(d, cuCtxSetCurrent(contexts[0])))?;
        cu_check(
            "cuStreamCreate",
            cu_call!(d, cuStreamCreate(&mut stream, 1)),
        )?;
    }
    let copy = |size: usize| {
        // SAFETY: the benchmark's buffers, each at least `size` bytes, and its stream.
        let status = unsafe {
            cu_call!(
                d,
                cuMemcpyPeerAsync(
                    buffers[1],
                    contexts[1],
                    buffers[0],
                    contexts[0],
                    size,
                    stream
                )
            )
        };
        cu_check("cuMemcpyPeerAsync", status)
    };
    let sync = || {
        // SAFETY: the benchmark's stream.
        let status = unsafe { cu_call!(d, cuStreamSynchronize(stream)) };
        cu_check("cuStreamSynchronize", status)
    };
    let mut copies = Vec::new();
    for &size in &args.sizes {
        let count = copies_per_run(size);
        // Where a slow or stuck path is, when one is.
        eprintln!("  {} x {count}", format_bytes(size as u64));
        copy(size)?;
        sync()?;
        let mut runs = Vec::new();
        for _ in 0..args.repetitions {
            let start = Instant::now();
            for _ in 0..count {
                copy(size)?;
            }
            sync()?;
            runs.push((size * count) as f64 / start.elapsed().as_secs_f64() / 1e9);
        }
        copies.push(runs);
    }
    let mut latency_us = Vec::new();
    for _ in 0..args.repetitions {
        let start = Instant::now();
        for _ in 0..args.latency_copies {
            // SAFETY: the benchmark's buffers.
            let status = unsafe {
                cu_call!(
                    d,
                    cuMemcpyPeer(buffers[1], contexts[1], buffers[0], contexts[0], 8)
                )
            };
            cu_check("cuMemcpyPeer", status)?;
        }
        latency_us.push(start.elapsed().as_secs_f64() * 1e6 / args.latency_copies as f64);
    }
    // Check the bytes arrived: the destination now holds the source's fill value.
    let mut probe = [0u8; 8];
    // SAFETY: a local buffer of 8 bytes and the destination buffer.
    unsafe {
        cu_check("cuCtxSetCurrent", cu_call!(d, cuCtxSetCurrent(contexts[1])))?;
        cu_check(
            "cuMemcpyDtoH",
            cu_call!(
                d,
                cuMemcpyDtoH_v2(
                    probe.as_mut_ptr().cast(),
                    buffers[1] + largest as u64 - 8,
                    8
                )
            ),
        )?;
    }
    if largest == args.sizes[args.sizes.len() - 1] && probe != [1u8; 8] {
        return Err(format!("the copies delivered wrong bytes: {probe:?}"));
    }
    // SAFETY: the benchmark's own handles, released once.
    unsafe {
        cu_call!(d, cuStreamDestroy_v2(stream));
        for (ctx, buffer) in contexts.iter().zip(buffers) {
            cu_call!(d, cuCtxSetCurrent(*ctx));
            cu_call!(d, cuMemFree_v2(buffer));
        }
    }
    Ok(Samples { copies, latency_us })
}

fn render(report: &Report) -> String {
    let mut out = format!(
        "Copies between two GPUs on two rgpu servers ({}): {} -> {}\n\
         rgpu IPC: servers copy device to device; rgpu network: page-locked chunks over \
         striped links; TCP: raw loopback, one stream and {} streams (same sizes)\n\n",
        report.servers, report.devices[0], report.devices[1], report.streams
    );
    let _ = writeln!(
        out,
        "{:>10} {:>11} {:>11} {:>11} {:>10} {:>10} {:>10} {:>12}",
        "size", "native", "rgpu IPC", "rgpu net", "TCP 1", "TCP strip", "IPC/nat", "net/TCPstrip"
    );
    for row in &report.rows {
        let native = row.native_gbps.map_or("-".into(), |v| format!("{v:.2}"));
        let ratio = row
            .native_gbps
            .map_or("-".into(), |v| format!("{:.2}x", row.rgpu_ipc_gbps / v));
        let _ = writeln!(
            out,
            "{:>10} {:>11} {:>11.2} {:>11.2} {:>10.2} {:>10.2} {:>10} {:>11.2}x",
            format_bytes(row.size_bytes as u64),
            native,
            row.rgpu_ipc_gbps,
            row.rgpu_network_gbps,
            row.tcp_one_stream_gbps,
            row.tcp_striped_gbps,
            ratio,
            row.rgpu_network_gbps / row.tcp_striped_gbps
        );
    }
    let native = report
        .latency_native_us
        .map_or("-".into(), |v| format!("{v:.1}"));
    let _ = writeln!(
        out,
        "\n(GB/s, median of {} runs)\nsynchronous 8-byte copy (us): native {native}, rgpu IPC {:.1}, \
         rgpu network {:.1}; loopback TCP round trip {:.1}",
        report.repetitions,
        report.latency_rgpu_ipc_us,
        report.latency_rgpu_network_us,
        report.tcp_round_trip_us
    );
    out
}

fn plot(report: &Report) -> String {
    let line = |label, color, value: &dyn Fn(&Row) -> Option<f64>| Series {
        label,
        color,
        points: report
            .rows
            .iter()
            .filter_map(|r| value(r).map(|v| (r.size_bytes as u64, v)))
            .collect(),
    };
    let series = [
        line("native peer copy", "#1f77b4", &|r| r.native_gbps),
        line("rgpu, IPC", "#2ca02c", &|r| Some(r.rgpu_ipc_gbps)),
        line("rgpu, network", "#d62728", &|r| Some(r.rgpu_network_gbps)),
        line("TCP, striped", "#7f7f7f", &|r| Some(r.tcp_striped_gbps)),
        line("TCP, one stream", "#bcbd22", &|r| {
            Some(r.tcp_one_stream_gbps)
        }),
    ];
    line_plot("Copies between GPUs of two servers", "GB/s", &series)
}
