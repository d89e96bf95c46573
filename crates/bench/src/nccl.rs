//! `rgpu bench nccl`: NCCL's collectives through rgpu against the same GPUs natively, in one
//! process, as NVIDIA's nccl-tests measure them: one process drives every GPU
//! (`ncclCommInitAll`), each timed iteration is one NCCL group of the collective on every
//! rank, and bus bandwidth is the algorithm bandwidth times nccl-tests' factor (all-reduce
//! 2(n-1)/n, all-gather and reduce-scatter (n-1)/n, broadcast 1). Natively the machine's
//! `libcuda.so.1` and `libnccl.so.2` run it; through rgpu, rgpu's `librgpu_cuda.so` and
//! `librgpu_nccl.so`, against one local server per GPU (each seeing only its GPU, so that the
//! ranks' NCCL runs between servers) unless `--servers` names others.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::ptr::null_mut;
use std::time::Instant;

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::Driver;
use rgpu_cuda_api::nccl::{ncclComm_t, ncclResult_t, NCCL_SUCCESS};
use rgpu_cuda_api::sys::*;
use serde::Serialize;

use crate::local_server::LocalServer;
use crate::median;
use crate::output::{format_bytes, line_plot, Series};
use crate::ClientSetup;

#[derive(clap::Args, Debug)]
#[command(
    about = "Measure NCCL's collectives through rgpu against the same GPUs natively",
    long_about = "Measure NCCL's collectives through rgpu against the same GPUs natively: \
                  all-reduce, all-gather, reduce-scatter and broadcast of float data over \
                  every GPU of this machine (one process, ncclCommInitAll), from 8 B to 1 GiB. \
                  Reports each size's time per collective and bus bandwidth (nccl-tests' \
                  definition) natively and through rgpu side by side, with their ratio. \
                  Needs two or more CUDA GPUs and NCCL (libnccl.so.2, or RGPU_NCCL_LIBRARY) \
                  on this machine; starts one local server per GPU unless --servers names \
                  others. Prints a table, writes JSON and an SVG plot."
)]
pub struct NcclBenchArgs {
    /// Servers to use instead of local ones started for the run (one per GPU).
    #[arg(long, value_name = "LIST")]
    servers: Option<String>,

    /// Token file for --servers.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,

    /// Where to write the JSON report.
    #[arg(long, value_name = "FILE", default_value = "bench-nccl.json")]
    json: PathBuf,

    /// Where to write the SVG plot of bus bandwidth.
    #[arg(long, value_name = "FILE", default_value = "bench-nccl.svg")]
    svg: PathBuf,

    /// Sizes of the collectives' buffers (nccl-tests' "size"; K, M and G suffixes).
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = parse_bytes,
        default_value = "8,64,512,4K,32K,256K,2M,16M,64M,256M,1G"
    )]
    sizes: Vec<usize>,

    /// Timed runs per measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    repetitions: usize,
}

/// A size with an optional K, M or G suffix (powers of 1024).
fn parse_bytes(text: &str) -> Result<usize, String> {
    let (digits, unit) = match text.chars().last() {
        Some('K' | 'k') => (&text[..text.len() - 1], 1 << 10),
        Some('M' | 'm') => (&text[..text.len() - 1], 1 << 20),
        Some('G' | 'g') => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    let value: usize = digits.parse().map_err(|_| format!("not a size: {text}"))?;
    value
        .checked_mul(unit)
        .filter(|&bytes| bytes >= 4)
        .ok_or_else(|| format!("size out of range: {text}"))
}

/// The collectives measured.
#[derive(Clone, Copy, Debug, Serialize)]
enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
}

const COLLECTIVES: [Collective; 4] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::Broadcast,
];

impl Collective {
    /// nccl-tests' factor from algorithm to bus bandwidth over `n` ranks.
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::AllGather | Collective::ReduceScatter => (n - 1.0) / n,
            Collective::Broadcast => 1.0,
        }
    }
}

type Reduction = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    ncclComm_t,
    CUstream,
) -> ncclResult_t;

/// The NCCL functions the benchmark calls, from NCCL or from rgpu's drop-in.
struct Nccl {
    _library: libloading::Library,
    init_all: unsafe extern "C" fn(*mut ncclComm_t, c_int, *const c_int) -> ncclResult_t,
    destroy: unsafe extern "C" fn(ncclComm_t) -> ncclResult_t,
    group_start: unsafe extern "C" fn() -> ncclResult_t,
    group_end: unsafe extern "C" fn() -> ncclResult_t,
    all_reduce: Reduction,
    reduce_scatter: Reduction,
    all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        ncclComm_t,
        CUstream,
    ) -> ncclResult_t,
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        ncclComm_t,
        CUstream,
    ) -> ncclResult_t,
    error_string: unsafe extern "C" fn(ncclResult_t) -> *const c_char,
}

/// `ncclFloat32` and `ncclSum`.
const FLOAT: c_int = 7;
const SUM: c_int = 0;

impl Nccl {
    /// Loads `path`; `rgpu`: whether it must be rgpu's drop-in (or must not be).
    fn load(path: &Path, rgpu: bool) -> Result<Nccl, String> {
        // SAFETY: loading NCCL runs its initializers, as any NCCL program does.
        let library = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("cannot load NCCL ({}): {e}", path.display()))?;
        // SAFETY: a lookup of a plain symbol.
        let is_rgpu = unsafe { library.get::<*const u8>(b"rgpu_nccl_client\0") }.is_ok();
        if is_rgpu != rgpu {
            return Err(format!(
                "{} is {}rgpu's libnccl.so.2",
                path.display(),
                if is_rgpu { "" } else { "not " }
            ));
        }
        macro_rules! symbol {
            ($name:literal) => {
                // SAFETY: NCCL's function of this name has the type of the field it fills
                // (nccl.h); the library stays loaded with the table.
                *unsafe { library.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("{}: no {}: {e}", path.display(), $name))?
            };
        }
        Ok(Nccl {
            init_all: symbol!("ncclCommInitAll"),
            destroy: symbol!("ncclCommDestroy"),
            group_start: symbol!("ncclGroupStart"),
            group_end: symbol!("ncclGroupEnd"),
            all_reduce: symbol!("ncclAllReduce"),
            reduce_scatter: symbol!("ncclReduceScatter"),
            all_gather: symbol!("ncclAllGather"),
            broadcast: symbol!("ncclBroadcast"),
            error_string: symbol!("ncclGetErrorString"),
            _library: library,
        })
    }

    fn check(&self, what: &str, code: ncclResult_t) -> Result<(), String> {
        if code == NCCL_SUCCESS {
            return Ok(());
        }
        // SAFETY: NCCL's static text for a result code.
        let text = unsafe { CStr::from_ptr((self.error_string)(code)) };
        Err(format!("{what}: {} ({code})", text.to_string_lossy()))
    }
}

fn cu(what: &str, status: rgpu_cuda_api::native::Status) -> Result<(), String> {
    rgpu_cuda_api::native::check(status).map_err(|s| format!("{what}: CUDA error {s}"))
}

/// One communicator over every GPU, with each rank's context, stream and buffers.
struct Ranks<'a> {
    driver: &'a Driver,
    nccl: &'a Nccl,
    contexts: Vec<CUcontext>,
    streams: Vec<CUstream>,
    send: Vec<CUdeviceptr>,
    recv: Vec<CUdeviceptr>,
    comms: Vec<ncclComm_t>,
}

impl<'a> Ranks<'a> {
    fn open(driver: &'a Driver, nccl: &'a Nccl, n: usize, bytes: usize) -> Result<Self, String> {
        let mut ranks = Ranks {
            driver,
            nccl,
            contexts: Vec::new(),
            streams: Vec::new(),
            send: Vec::new(),
            recv: Vec::new(),
            comms: vec![null_mut(); n],
        };
        // SAFETY: the benchmark's own handles and local out-values, in each call.
        unsafe {
            cu("cuInit", cu_call!(driver, cuInit(0)))?;
            for device in 0..n as c_int {
                let mut ctx = null_mut();
                cu(
                    "cuDevicePrimaryCtxRetain",
                    cu_call!(driver, cuDevicePrimaryCtxRetain(&mut ctx, device)),
                )?;
                ranks.contexts.push(ctx);
                cu("cuCtxSetCurrent", cu_call!(driver, cuCtxSetCurrent(ctx)))?;
                let (mut stream, mut send, mut recv) = (null_mut(), 0, 0);
                cu(
                    "cuStreamCreate",
                    cu_call!(driver, cuStreamCreate(&mut stream, 1)),
                )?;
                ranks.streams.push(stream);
                cu(
                    "cuMemAlloc",
                    cu_call!(driver, cuMemAlloc_v2(&mut send, bytes)),
                )?;
                ranks.send.push(send);
                cu(
                    "cuMemAlloc",
                    cu_call!(driver, cuMemAlloc_v2(&mut recv, bytes)),
                )?;
                ranks.recv.push(recv);
                cu(
                    "cuMemsetD8",
                    cu_call!(driver, cuMemsetD8_v2(send, 1, bytes)),
                )?;
            }
            let devices: Vec<c_int> = (0..n as c_int).collect();
            let code = (nccl.init_all)(ranks.comms.as_mut_ptr(), n as c_int, devices.as_ptr());
            nccl.check("ncclCommInitAll", code)?;
        }
        Ok(ranks)
    }

    /// One group of `collective` on every rank, over buffers of `bytes` (nccl-tests' size).
    fn launch(&self, collective: Collective, bytes: usize) -> Result<(), String> {
        let n = self.comms.len();
        let nccl = self.nccl;
        // SAFETY: in each call, the ranks' own communicators, streams and buffers, each at
        // least `bytes` long.
        unsafe {
            nccl.check("ncclGroupStart", (nccl.group_start)())?;
            for r in 0..n {
                let (send, recv) = (self.send[r] as *const c_void, self.recv[r] as *mut c_void);
                let (comm, stream) = (self.comms[r], self.streams[r]);
                let floats = bytes / 4;
                let code = match collective {
                    Collective::AllReduce => {
                        (nccl.all_reduce)(send, recv, floats, FLOAT, SUM, comm, stream)
                    }
                    // Each rank contributes (all-gather) or receives (reduce-scatter) 1/n.
                    Collective::AllGather => {
                        (nccl.all_gather)(send, recv, (floats / n).max(1), FLOAT, comm, stream)
                    }
                    Collective::ReduceScatter => {
                        let count = (floats / n).max(1);
                        (nccl.reduce_scatter)(send, recv, count, FLOAT, SUM, comm, stream)
                    }
                    Collective::Broadcast => {
                        (nccl.broadcast)(send, recv, floats, FLOAT, 0, comm, stream)
                    }
                };
                nccl.check("a collective", code)?;
            }
            nccl.check("ncclGroupEnd", (nccl.group_end)())
        }
    }

    fn synchronize(&self) -> Result<(), String> {
        for (&ctx, &stream) in self.contexts.iter().zip(&self.streams) {
            // SAFETY: the ranks' own context and stream.
            unsafe {
                cu(
                    "cuCtxSetCurrent",
                    cu_call!(self.driver, cuCtxSetCurrent(ctx)),
                )?;
                cu(
                    "cuStreamSynchronize",
                    cu_call!(self.driver, cuStreamSynchronize(stream)),
                )?;
            }
        }
        Ok(())
    }

    /// Seconds per collective: `repetitions` timed runs of enough iterations to take about
    /// 50 ms (at least 5), after a warm-up.
    fn time(
        &self,
        collective: Collective,
        bytes: usize,
        repetitions: usize,
    ) -> Result<Vec<f64>, String> {
        self.launch(collective, bytes)?;
        self.synchronize()?;
        let start = Instant::now();
        self.launch(collective, bytes)?;
        self.synchronize()?;
        let once = start.elapsed().as_secs_f64().max(1e-6);
        let iterations = ((0.05 / once).ceil() as usize).clamp(5, 2000);
        let mut samples = Vec::new();
        for _ in 0..repetitions {
            let start = Instant::now();
            for _ in 0..iterations {
                self.launch(collective, bytes)?;
            }
            self.synchronize()?;
            samples.push(start.elapsed().as_secs_f64() / iterations as f64);
        }
        Ok(samples)
    }
}

impl Drop for Ranks<'_> {
    fn drop(&mut self) {
        // SAFETY: the ranks' own objects, released once.
        unsafe {
            for &comm in &self.comms {
                if !comm.is_null() {
                    (self.nccl.destroy)(comm);
                }
            }
            for (r, &ctx) in self.contexts.iter().enumerate() {
                cu_call!(self.driver, cuCtxSetCurrent(ctx));
                cu_call!(self.driver, cuMemFree_v2(self.send[r]));
                cu_call!(self.driver, cuMemFree_v2(self.recv[r]));
                cu_call!(self.driver, cuStreamDestroy_v2(self.streams[r]));
            }
        }
    }
}

/// Seconds per collective, by collective then size.
fn measure(
    driver: &Driver,
    nccl: &Nccl,
    n: usize,
    args: &NcclBenchArgs,
) -> Result<Vec<Vec<Vec<f64>>>, String> {
    let largest = args.sizes.iter().copied().max().unwrap_or(4);
    let ranks = Ranks::open(driver, nccl, n, largest)?;
    let mut all = Vec::new();
    for collective in COLLECTIVES {
        let mut by_size = Vec::new();
        for &bytes in &args.sizes {
            eprintln!("  {collective:?} {}", format_bytes(bytes as u64));
            by_size.push(ranks.time(collective, bytes, args.repetitions)?);
        }
        all.push(by_size);
    }
    Ok(all)
}

#[derive(Serialize)]
struct Row {
    collective: Collective,
    size_bytes: usize,
    native_us: f64,
    rgpu_us: f64,
    native_bus_gbps: f64,
    rgpu_bus_gbps: f64,
    /// rgpu's bus bandwidth over native's.
    ratio: f64,
    /// rgpu's time minus native's.
    added_us: f64,
}

#[derive(Serialize)]
struct Report {
    gpus: usize,
    servers: String,
    repetitions: usize,
    rows: Vec<Row>,
}

fn device_count(driver: &Driver) -> usize {
    let mut count = 0;
    // SAFETY: local out-values.
    let ok = unsafe {
        cu_call!(driver, cuInit(0)) == 0 && cu_call!(driver, cuDeviceGetCount(&mut count)) == 0
    };
    if ok {
        count.max(0) as usize
    } else {
        0
    }
}

pub fn run(args: NcclBenchArgs, setup: &dyn ClientSetup) -> Result<ExitCode, String> {
    if args.repetitions == 0 || args.sizes.is_empty() {
        return Err("--repetitions and --sizes must not be empty or zero".into());
    }
    let native = Driver::load(None)?;
    let gpus = device_count(&native);
    if gpus < 2 {
        return Err(format!(
            "this machine has {gpus} CUDA GPU(s); NCCL's collectives need two"
        ));
    }
    let nccl_path = std::env::var_os("RGPU_NCCL_LIBRARY").unwrap_or_else(|| "libnccl.so.2".into());
    let native_nccl = Nccl::load(Path::new(&nccl_path), false)?;

    let mut local_servers = Vec::new();
    let servers = match &args.servers {
        Some(list) => list.clone(),
        None => {
            for gpu in 0..gpus {
                eprintln!("starting a local rgpu server on GPU {gpu}...");
                let visible = gpu.to_string();
                local_servers.push(LocalServer::start_with(&[(
                    "CUDA_VISIBLE_DEVICES",
                    &visible,
                )])?);
            }
            let endpoints: Vec<&str> = local_servers.iter().map(|s| s.endpoint()).collect();
            endpoints.join(",")
        }
    };

    eprintln!("measuring native NCCL over {gpus} GPUs...");
    let native_times = measure(&native, &native_nccl, gpus, &args)?;

    let rgpu_cuda = setup
        .apply(&servers, args.token_file.as_deref())?
        .cuda_library
        .ok_or("cannot find librgpu_cuda.so beside the rgpu ICD")?;
    let rgpu_nccl_path = rgpu_cuda.with_file_name("librgpu_nccl.so");
    let rgpu = Driver::load_any(Some(&rgpu_cuda), true)?;
    let rgpu_nccl = Nccl::load(&rgpu_nccl_path, true)?;
    let rgpu_gpus = device_count(&rgpu);
    if rgpu_gpus < gpus {
        return Err(format!(
            "{servers}: rgpu sees {rgpu_gpus} GPU(s), this machine has {gpus}"
        ));
    }
    eprintln!("measuring NCCL through rgpu ({servers})...");
    let rgpu_times = measure(&rgpu, &rgpu_nccl, gpus, &args)?;

    let mut rows = Vec::new();
    for (c, collective) in COLLECTIVES.into_iter().enumerate() {
        for (s, &bytes) in args.sizes.iter().enumerate() {
            let (native_s, rgpu_s) = (median(&native_times[c][s]), median(&rgpu_times[c][s]));
            let bus = |seconds: f64| bytes as f64 / seconds / 1e9 * collective.bus_factor(gpus);
            rows.push(Row {
                collective,
                size_bytes: bytes,
                native_us: native_s * 1e6,
                rgpu_us: rgpu_s * 1e6,
                native_bus_gbps: bus(native_s),
                rgpu_bus_gbps: bus(rgpu_s),
                ratio: native_s / rgpu_s,
                added_us: (rgpu_s - native_s) * 1e6,
            });
        }
    }
    let report = Report {
        gpus,
        servers,
        repetitions: args.repetitions,
        rows,
    };
    crate::output::write_stdout(&render(&report))?;
    let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    std::fs::write(&args.json, json + "\n")
        .map_err(|e| format!("cannot write {}: {e}", args.json.display()))?;
    std::fs::write(&args.svg, plot(&report))
        .map_err(|e| format!("cannot write {}: {e}", args.svg.display()))?;
    eprintln!("wrote {} and {}", args.json.display(), args.svg.display());
    // Never unloaded: the libraries have threads of their own that outlive the measurements.
    std::mem::forget((rgpu_nccl, rgpu, native_nccl, native));
    drop(local_servers);
    Ok(ExitCode::SUCCESS)
}

fn render(report: &Report) -> String {
    let mut out = format!(
        "NCCL over {} GPUs, natively and through rgpu ({}); median of {} runs; bus bandwidth \
         as nccl-tests defines it\n",
        report.gpus, report.servers, report.repetitions
    );
    let mut last = None;
    for row in &report.rows {
        if last != Some(format!("{:?}", row.collective)) {
            last = Some(format!("{:?}", row.collective));
            let _ = writeln!(
                out,
                "\n{:?}\n{:>10} {:>12} {:>12} {:>11} {:>11} {:>8} {:>10}",
                row.collective,
                "size",
                "native us",
                "rgpu us",
                "native GB/s",
                "rgpu GB/s",
                "ratio",
                "added us"
            );
        }
        let _ = writeln!(
            out,
            "{:>10} {:>12.1} {:>12.1} {:>11.2} {:>11.2} {:>7.2}x {:>10.1}",
            format_bytes(row.size_bytes as u64),
            row.native_us,
            row.rgpu_us,
            row.native_bus_gbps,
            row.rgpu_bus_gbps,
            row.ratio,
            row.added_us
        );
    }
    out
}

fn plot(report: &Report) -> String {
    const COLORS: [(&str, &str); 4] = [
        ("#1f77b4", "#aec7e8"),
        ("#d62728", "#ff9896"),
        ("#2ca02c", "#98df8a"),
        ("#9467bd", "#c5b0d5"),
    ];
    let labels: Vec<(String, String)> = COLLECTIVES
        .iter()
        .map(|c| (format!("{c:?}, native"), format!("{c:?}, rgpu")))
        .collect();
    let mut series = Vec::new();
    for (c, collective) in COLLECTIVES.iter().enumerate() {
        let rows = || {
            report
                .rows
                .iter()
                .filter(move |r| format!("{:?}", r.collective) == format!("{collective:?}"))
        };
        series.push(Series {
            label: &labels[c].0,
            color: COLORS[c].0,
            points: rows()
                .map(|r| (r.size_bytes as u64, r.native_bus_gbps))
                .collect(),
        });
        series.push(Series {
            label: &labels[c].1,
            color: COLORS[c].1,
            points: rows()
                .map(|r| (r.size_bytes as u64, r.rgpu_bus_gbps))
                .collect(),
        });
    }
    line_plot(
        "NCCL bus bandwidth, native and through rgpu",
        "GB/s",
        &series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_bus_factors() {
        assert_eq!(parse_bytes("8"), Ok(8));
        assert_eq!(parse_bytes("4K"), Ok(4096));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert!(parse_bytes("2").is_err() && parse_bytes("x").is_err());
        assert_eq!(Collective::AllReduce.bus_factor(2), 1.0);
        assert_eq!(Collective::AllGather.bus_factor(4), 0.75);
        assert_eq!(Collective::Broadcast.bus_factor(8), 1.0);
    }

    #[test]
    fn the_report_renders() {
        let report = Report {
            gpus: 2,
            servers: "a,b".into(),
            repetitions: 3,
            rows: vec![Row {
                collective: Collective::AllReduce,
                size_bytes: 1 << 20,
                native_us: 10.0,
                rgpu_us: 12.0,
                native_bus_gbps: 100.0,
                rgpu_bus_gbps: 83.3,
                ratio: 0.83,
                added_us: 2.0,
            }],
        };
        let text = render(&report);
        assert!(
            text.contains("AllReduce") && text.contains("1.0 MiB"),
            "{text}"
        );
        assert!(plot(&report).starts_with("<svg"));
    }
}
