//! `rgpu bench cuda`: the CUDA driver API natively and through rgpu, in one process. Both
//! drivers are loaded side by side (NVIDIA's `libcuda.so.1` and rgpu's `librgpu_cuda.so`) and
//! run the same measurements on the same GPU, followed by the raw loopback TCP bandwidth that
//! bounds what any remoting can reach on this machine.

use std::ffi::{c_void, CString};
use std::fmt::{self, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::ptr::null_mut;
use std::time::Instant;

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::{check, Driver, Status};
use rgpu_cuda_api::sys::*;
use serde::Serialize;

use crate::local_server::LocalServer;
use crate::median;
use crate::tcp::{self, TcpBaseline};
use crate::ClientSetup;

/// The benchmark's kernels (see cuda_kernels.cu).
const KERNELS_PTX: &str = include_str!("cuda_kernels.ptx");

#[derive(clap::Args, Debug)]
#[command(
    about = "Measure the CUDA driver API through rgpu against the same GPU natively",
    long_about = "Measure the CUDA driver API through rgpu against the same GPU natively: \
                  host<->device bandwidth from pinned and pageable memory, the latency of a \
                  small synchronous call, the asynchronous launch rate of an empty kernel and \
                  a compute-bound SGEMM, with the loopback TCP bandwidth of this machine \
                  measured in the same run (raw: one cached 1 MiB buffer; TCP-same: the \
                  copies' own sizes and counts). Prints a table and writes JSON. Needs a CUDA GPU \
                  and driver on this machine; starts its own local server unless --servers \
                  names one (which must serve this machine's GPU for the ratios to mean much)."
)]
pub struct CudaBenchArgs {
    /// Servers to use instead of a local one started for the run.
    #[arg(long, value_name = "LIST")]
    servers: Option<String>,

    /// Token file for --servers.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,

    /// Where to write the JSON report.
    #[arg(long, value_name = "FILE", default_value = "bench-cuda.json")]
    json: PathBuf,

    /// Copy sizes (K and M suffixes), comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = super::opencl::parse_size,
        default_value = "512K,1M,4M,16M,64M,256M"
    )]
    sizes: Vec<usize>,

    /// Timed runs per measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    repetitions: usize,

    /// Calls per latency measurement.
    #[arg(long, default_value_t = 500)]
    latency_calls: usize,

    /// Launches per launch-rate measurement.
    #[arg(long, default_value_t = 20000)]
    launches: usize,

    /// The SGEMM's matrix size (a multiple of 64).
    #[arg(long, default_value_t = 8192)]
    sgemm_n: usize,

    /// The GPU to use (its ordinal, natively and through rgpu).
    #[arg(long, default_value_t = 0)]
    device: i32,

    /// Where to draw the results as SVG (cuda-bandwidth.svg, cuda-latency.svg,
    /// cuda-launch-rate.svg).
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,
}

#[derive(Serialize)]
struct Report {
    device: String,
    rgpu_server: String,
    repetitions: usize,
    copies: Vec<CopyResult>,
    latency: Vec<Compared>,
    launch_rate_per_s: Compared,
    /// The launch loop alone, before its synchronization: how fast the program hands launches
    /// over (rgpu: to its connection), against how fast they run (`launch_rate_per_s`).
    launch_post_rate_per_s: Compared,
    /// The launch rate measured in turns, native then rgpu, in one session each: the machine's
    /// drift (the native rate alone varies by a fifth between runs) falls on both alike.
    launch_rate_in_turns: Turns,
    sgemm: SgemmResult,
    /// Pooled from samples taken before and after the measurements.
    raw_tcp: TcpBaseline,
    raw_tcp_before_gbps: f64,
    raw_tcp_after_gbps: f64,
}

#[derive(Serialize)]
struct CopyResult {
    direction: &'static str,
    memory: &'static str,
    size_bytes: usize,
    native_gbps: f64,
    rgpu_gbps: f64,
    ratio_to_native: f64,
    ratio_to_raw_tcp: f64,
    /// Plain loopback TCP moving the same bytes from and into buffers of the copy's size.
    tcp_same_size_gbps: f64,
    ratio_to_tcp_same_size: f64,
}

#[derive(Serialize)]
struct Compared {
    name: &'static str,
    native: f64,
    rgpu: f64,
    ratio: f64,
}

#[derive(Serialize)]
struct Turns {
    native: Vec<f64>,
    rgpu: Vec<f64>,
    /// rgpu / native of each turn, and their median.
    ratios: Vec<f64>,
    median_ratio: f64,
}

#[derive(Serialize)]
struct SgemmResult {
    n: usize,
    native_ms: f64,
    rgpu_ms: f64,
    native_tflops: f64,
    rgpu_tflops: f64,
    ratio: f64,
}

/// Everything measured on one driver.
struct Samples {
    /// Per (direction, memory, size): GB/s of each repetition.
    copies: Vec<Vec<f64>>,
    small_read_us: Vec<f64>,
    launch_sync_us: Vec<f64>,
    launch_rate: Vec<f64>,
    launch_post_rate: Vec<f64>,
    sgemm_ms: Vec<f64>,
}

/// Bytes per run of the raw loopback TCP baseline.
const RAW_TCP_BYTES: u64 = 256 << 20;

const DIRECTIONS: [&str; 2] = ["host to device", "device to host"];
const MEMORY: [&str; 2] = ["pinned", "pageable"];

pub fn run(args: CudaBenchArgs, setup: &dyn ClientSetup) -> Result<ExitCode, String> {
    if args.repetitions == 0 || args.latency_calls == 0 || args.launches == 0 {
        return Err("--repetitions, --latency-calls and --launches must be positive".into());
    }
    if args.sgemm_n == 0 || !args.sgemm_n.is_multiple_of(64) {
        return Err("--sgemm-n must be a positive multiple of 64".into());
    }
    let tcp_error = |e: std::io::Error| format!("loopback TCP: {e}");
    eprintln!("measuring raw loopback TCP...");
    let raw_before = tcp::bandwidth_samples(RAW_TCP_BYTES, 3).map_err(tcp_error)?;
    let tcp_same_size = args
        .sizes
        .iter()
        .map(|&size| tcp::sized_bandwidth(size, copies_per_run(size), args.repetitions))
        .collect::<std::io::Result<Vec<f64>>>()
        .map_err(|e| format!("loopback TCP: {e}"))?;

    let (servers, local_server) = LocalServer::unless_given(args.servers.as_deref())?;
    let rgpu_library = setup
        .apply(&servers, args.token_file.as_deref())?
        .cuda_library
        .ok_or("cannot find librgpu_cuda.so beside the rgpu ICD")?;

    let native = Driver::load(None)?;
    let device = device_name(&native, args.device)?;
    eprintln!("measuring native: {device}");
    let native_samples = measure(&native, &args)?;
    let rgpu = Driver::load_any(Some(&rgpu_library), true)?;
    eprintln!("measuring rgpu: {device} via {servers}");
    let rgpu_samples = measure(&rgpu, &args)?;
    eprintln!("measuring launch rates in turns...");
    let turns = launch_rate_in_turns(&native, &rgpu, &args)?;
    // The loopback's speed drifts within a run (4.2 and 5.7 GB/s a minute apart have been
    // seen on the H100 host), so the raw baseline is sampled before and after the
    // measurements, and the ratios use all six samples.
    eprintln!("measuring raw loopback TCP again...");
    let raw_after = tcp::bandwidth_samples(RAW_TCP_BYTES, 3).map_err(tcp_error)?;
    let pooled: Vec<f64> = raw_before.iter().chain(&raw_after).copied().collect();
    let raw_tcp = tcp::baseline(&pooled, RAW_TCP_BYTES, 1000).map_err(tcp_error)?;

    let mut copies = Vec::new();
    let mut index = 0;
    for direction in DIRECTIONS {
        for memory in MEMORY {
            for (i, &size) in args.sizes.iter().enumerate() {
                let native_gbps = median(&native_samples.copies[index]);
                let rgpu_gbps = median(&rgpu_samples.copies[index]);
                copies.push(CopyResult {
                    direction,
                    memory,
                    size_bytes: size,
                    native_gbps,
                    rgpu_gbps,
                    ratio_to_native: rgpu_gbps / native_gbps,
                    ratio_to_raw_tcp: rgpu_gbps / raw_tcp.bandwidth_gbps,
                    tcp_same_size_gbps: tcp_same_size[i],
                    ratio_to_tcp_same_size: rgpu_gbps / tcp_same_size[i],
                });
                index += 1;
            }
        }
    }
    let compared = |name, native: &[f64], rgpu: &[f64]| {
        let (native, rgpu) = (median(native), median(rgpu));
        Compared {
            name,
            native,
            rgpu,
            ratio: rgpu / native,
        }
    };
    let flop = 2.0 * (args.sgemm_n as f64).powi(3);
    let (native_ms, rgpu_ms) = (
        median(&native_samples.sgemm_ms),
        median(&rgpu_samples.sgemm_ms),
    );
    let report = Report {
        device,
        rgpu_server: servers,
        repetitions: args.repetitions,
        copies,
        latency: vec![
            compared(
                "4-byte cuMemcpyDtoH (us)",
                &native_samples.small_read_us,
                &rgpu_samples.small_read_us,
            ),
            compared(
                "empty launch + cuStreamSynchronize (us)",
                &native_samples.launch_sync_us,
                &rgpu_samples.launch_sync_us,
            ),
        ],
        launch_rate_per_s: compared(
            "async empty-kernel launches per second",
            &native_samples.launch_rate,
            &rgpu_samples.launch_rate,
        ),
        launch_post_rate_per_s: compared(
            "  of which the launch loop alone (launches/s)",
            &native_samples.launch_post_rate,
            &rgpu_samples.launch_post_rate,
        ),
        launch_rate_in_turns: turns,
        raw_tcp_before_gbps: median(&raw_before),
        raw_tcp_after_gbps: median(&raw_after),
        sgemm: SgemmResult {
            n: args.sgemm_n,
            native_ms,
            rgpu_ms,
            native_tflops: flop / native_ms / 1e9,
            rgpu_tflops: flop / rgpu_ms / 1e9,
            ratio: native_ms / rgpu_ms,
        },
        raw_tcp,
    };
    crate::output::write_stdout(&render(&report).map_err(|e| e.to_string())?)?;
    let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    std::fs::write(&args.json, json + "\n")
        .map_err(|e| format!("cannot write {}: {e}", args.json.display()))?;
    eprintln!("wrote {}", args.json.display());
    if let Some(dir) = &args.plot {
        crate::output::write_plots(dir, &plots(&report))?;
    }
    // Never unloaded: both libraries have threads of their own that outlive the measurements.
    std::mem::forget(rgpu);
    std::mem::forget(native);
    drop(local_server);
    Ok(ExitCode::SUCCESS)
}

fn device_name(driver: &Driver, ordinal: i32) -> Result<String, String> {
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: the benchmark's own live handles and buffers.
    let status = unsafe { cu_call!(driver, cuDeviceGetName(name.as_mut_ptr(), 256, ordinal)) };
    cu_check("cuDeviceGetName", status)?;
    // SAFETY: the driver wrote a NUL-terminated name into the buffer.
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) };
    Ok(name.to_string_lossy().into_owned())
}

fn cu_check(what: &str, status: Status) -> Result<(), String> {
    check(status).map_err(|status| format!("{what} failed: CUDA error {status}"))
}

/// The objects one driver's measurements use; released on drop.
struct Session<'a> {
    driver: &'a Driver,
    device: CUdevice,
    stream: CUstream,
    module: CUmodule,
    empty: CUfunction,
    sgemm: CUfunction,
    device_buffer: CUdeviceptr,
    pinned: *mut c_void,
    pageable: Vec<u8>,
}

impl<'a> Session<'a> {
    fn open(driver: &'a Driver, ordinal: i32, buffer_size: usize) -> Result<Session<'a>, String> {
        let d = driver;
        let mut device = 0;
        cu_check(
            "cuDeviceGet",
            // SAFETY: the benchmark's own live handles and buffers.
            unsafe { cu_call!(d, cuDeviceGet(&mut device, ordinal)) },
        )?;
        let mut ctx = null_mut();
        cu_check(
            "cuDevicePrimaryCtxRetain",
            // SAFETY: the benchmark's own live handles and buffers.
            unsafe { cu_call!(d, cuDevicePrimaryCtxRetain(&mut ctx, device)) },
        )?;
        // SAFETY: the benchmark's own live handles and buffers.
        cu_check("cuCtxSetCurrent", unsafe {
            cu_call!(d, cuCtxSetCurrent(ctx))
        })?;
        let mut session = Session {
            driver,
            device,
            stream: null_mut(),
            module: null_mut(),
            empty: null_mut(),
            sgemm: null_mut(),
            device_buffer: 0,
            pinned: null_mut(),
            pageable: vec![1u8; buffer_size],
        };
        cu_check(
            "cuStreamCreate",
            // SAFETY: the benchmark's own live handles and buffers.
            unsafe { cu_call!(d, cuStreamCreate(&mut session.stream, 1)) },
        )?;
        let ptx = CString::new(KERNELS_PTX).expect("PTX has no NUL");
        cu_check(
            "cuModuleLoadData",
            // SAFETY: the benchmark's own live handles and buffers.
            unsafe {
                cu_call!(
                    d,
                    cuModuleLoadData(&mut session.module, ptx.as_ptr().cast())
                )
            },
        )?;
        for (name, slot) in [
            ("empty_kernel", &mut session.empty),
            ("sgemm", &mut session.sgemm),
        ] {
            let name = CString::new(name).unwrap();
            cu_check(
                "cuModuleGetFunction",
                // SAFETY: the benchmark's own live handles and buffers.
                unsafe { cu_call!(d, cuModuleGetFunction(slot, session.module, name.as_ptr())) },
            )?;
        }
        cu_check(
            "cuMemAlloc",
            // SAFETY: the benchmark's own live handles and buffers.
            unsafe { cu_call!(d, cuMemAlloc_v2(&mut session.device_buffer, buffer_size)) },
        )?;
        cu_check(
            "cuMemAllocHost",
            // SAFETY: the benchmark's own live handles and buffers.
            unsafe { cu_call!(d, cuMemAllocHost_v2(&mut session.pinned, buffer_size)) },
        )?;
        // SAFETY: the pinned buffer holds buffer_size bytes; touching it maps its pages.
        unsafe { std::ptr::write_bytes(session.pinned.cast::<u8>(), 1, buffer_size) };
        Ok(session)
    }

    fn sync(&self) -> Result<(), String> {
        cu_check(
            "cuStreamSynchronize",
            // SAFETY: the benchmark's own live handles and buffers.
            unsafe { cu_call!(self.driver, cuStreamSynchronize(self.stream)) },
        )
    }

    /// GB/s of `count` back-to-back async copies of `size` bytes, waited for at the end.
    fn copy_gbps(
        &self,
        to_device: bool,
        pinned: bool,
        size: usize,
        count: usize,
    ) -> Result<f64, String> {
        let d = self.driver;
        let host = if pinned {
            self.pinned.cast::<u8>()
        } else {
            self.pageable.as_ptr() as *mut u8
        };
        let start = Instant::now();
        for _ in 0..count {
            let status = if to_device {
                // SAFETY: the benchmark's own live handles and buffers.
                unsafe {
                    cu_call!(
                        d,
                        cuMemcpyHtoDAsync_v2(self.device_buffer, host.cast(), size, self.stream)
                    )
                }
            } else {
                // SAFETY: the benchmark's own live handles and buffers.
                unsafe {
                    cu_call!(
                        d,
                        cuMemcpyDtoHAsync_v2(host.cast(), self.device_buffer, size, self.stream)
                    )
                }
            };
            cu_check("cuMemcpyAsync", status)?;
        }
        self.sync()?;
        Ok((size * count) as f64 / start.elapsed().as_secs_f64() / 1e9)
    }

    fn launch_empty(&self) -> Result<(), String> {
        // SAFETY: the benchmark's own live handles and buffers.
        let status = unsafe {
            cu_call!(
                self.driver,
                cuLaunchKernel(
                    self.empty,
                    1,
                    1,
                    1,
                    32,
                    1,
                    1,
                    0,
                    self.stream,
                    null_mut(),
                    null_mut()
                )
            )
        };
        cu_check("cuLaunchKernel", status)
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        let d = self.driver;
        // SAFETY: the benchmark's own live handles and buffers.
        unsafe { cu_call!(d, cuMemFreeHost(self.pinned)) };
        // SAFETY: the benchmark's own live handles and buffers.
        unsafe { cu_call!(d, cuMemFree_v2(self.device_buffer)) };
        // SAFETY: the benchmark's own live handles and buffers.
        unsafe { cu_call!(d, cuModuleUnload(self.module)) };
        // SAFETY: the benchmark's own live handles and buffers.
        unsafe { cu_call!(d, cuStreamDestroy_v2(self.stream)) };
        // SAFETY: the benchmark's own live handles and buffers.
        unsafe { cu_call!(d, cuDevicePrimaryCtxRelease_v2(self.device)) };
    }
}

fn measure(driver: &Driver, args: &CudaBenchArgs) -> Result<Samples, String> {
    let largest = args.sizes.iter().copied().max().unwrap_or(1 << 20);
    let session = Session::open(driver, args.device, largest)?;
    let mut copies = Vec::new();
    for to_device in [true, false] {
        for pinned in [true, false] {
            for &size in &args.sizes {
                let count = copies_per_run(size);
                session.copy_gbps(to_device, pinned, size, 1)?; // warm-up
                let runs = (0..args.repetitions)
                    .map(|_| session.copy_gbps(to_device, pinned, size, count))
                    .collect::<Result<Vec<f64>, String>>()?;
                copies.push(runs);
            }
        }
    }

    let d = driver;
    let mut word = [0u8; 4];
    let small_read_us = time_calls(args.latency_calls, || {
        // SAFETY: the benchmark's own live handles and buffers.
        let status = unsafe {
            cu_call!(
                d,
                cuMemcpyDtoH_v2(word.as_mut_ptr().cast(), session.device_buffer, 4)
            )
        };
        cu_check("cuMemcpyDtoH", status)
    })?;
    let launch_sync_us = time_calls(args.latency_calls, || {
        session.launch_empty()?;
        session.sync()
    })?;
    let mut launch_post_rate = Vec::new();
    let launch_rate = (0..args.repetitions)
        .map(|_| {
            let (posted, rate) = launch_rate(&session, args.launches)?;
            launch_post_rate.push(posted);
            Ok(rate)
        })
        .collect::<Result<Vec<f64>, String>>()?;
    let sgemm_ms = sgemm(&session, args.sgemm_n, args.repetitions.min(3))?;
    Ok(Samples {
        copies,
        small_read_us,
        launch_sync_us,
        launch_rate,
        launch_post_rate,
        sgemm_ms,
    })
}

/// `launches` asynchronous empty-kernel launches, then a synchronization: (launches per
/// second of the loop alone, of the whole).
fn launch_rate(session: &Session, launches: usize) -> Result<(f64, f64), String> {
    let start = Instant::now();
    for _ in 0..launches {
        session.launch_empty()?;
    }
    let posted = launches as f64 / start.elapsed().as_secs_f64();
    session.sync()?;
    Ok((posted, launches as f64 / start.elapsed().as_secs_f64()))
}

/// The launch rate natively and through rgpu in turns (a warm-up turn, then at least five),
/// each driver in a session of its own held throughout.
fn launch_rate_in_turns(
    native: &Driver,
    rgpu: &Driver,
    args: &CudaBenchArgs,
) -> Result<Turns, String> {
    let sessions = [
        Session::open(native, args.device, 4096)?,
        Session::open(rgpu, args.device, 4096)?,
    ];
    let mut rates = [Vec::new(), Vec::new()];
    for turn in 0..=args.repetitions.max(5) {
        for (session, rates) in sessions.iter().zip(&mut rates) {
            // Each driver keeps its own current context per thread: set once, it stays.
            let rate = launch_rate(session, args.launches)?.1;
            if turn > 0 {
                rates.push(rate);
            }
        }
    }
    let [native, rgpu] = rates;
    let ratios: Vec<f64> = rgpu.iter().zip(&native).map(|(r, n)| r / n).collect();
    Ok(Turns {
        median_ratio: median(&ratios),
        native,
        rgpu,
        ratios,
    })
}

/// Copies per timed run: about 256 MiB in all, at least 2.
fn copies_per_run(size: usize) -> usize {
    ((256usize << 20) / size).clamp(2, 64)
}

fn time_calls(
    calls: usize,
    mut call: impl FnMut() -> Result<(), String>,
) -> Result<Vec<f64>, String> {
    for _ in 0..calls.min(20) {
        call()?;
    }
    (0..calls)
        .map(|_| {
            let start = Instant::now();
            call()?;
            Ok(start.elapsed().as_secs_f64() * 1e6)
        })
        .collect()
}

/// Milliseconds of each timed SGEMM (after one warm-up) on n x n matrices.
fn sgemm(session: &Session, n: usize, runs: usize) -> Result<Vec<f64>, String> {
    let d = session.driver;
    let bytes = n * n * 4;
    let mut matrices = [0u64; 3];
    for m in &mut matrices {
        // SAFETY: the benchmark's own live handles and buffers.
        cu_check("cuMemAlloc", unsafe {
            cu_call!(d, cuMemAlloc_v2(m, bytes))
        })?;
        // SAFETY: the benchmark's own live handles and buffers.
        let status =
            unsafe { cu_call!(d, cuMemsetD32Async(*m, 0x3c00_0000, n * n, session.stream)) };
        cu_check("cuMemsetD32Async", status)?;
    }
    let result = (|| {
        let mut n_arg = n as i32;
        let [mut a, mut b, mut c] = matrices;
        let mut params: [*mut c_void; 4] = [
            (&mut n_arg as *mut i32).cast(),
            (&mut a as *mut u64).cast(),
            (&mut b as *mut u64).cast(),
            (&mut c as *mut u64).cast(),
        ];
        let blocks = (n / 64) as u32;
        let mut launch = || {
            // SAFETY: the benchmark's own live handles and buffers.
            let status = unsafe {
                cu_call!(
                    d,
                    cuLaunchKernel(
                        session.sgemm,
                        blocks,
                        blocks,
                        1,
                        256,
                        1,
                        1,
                        0,
                        session.stream,
                        params.as_mut_ptr(),
                        null_mut()
                    )
                )
            };
            cu_check("cuLaunchKernel(sgemm)", status)?;
            session.sync()
        };
        launch()?;
        (0..runs)
            .map(|_| {
                let start = Instant::now();
                launch()?;
                Ok(start.elapsed().as_secs_f64() * 1e3)
            })
            .collect::<Result<Vec<f64>, String>>()
    })();
    for m in matrices {
        // SAFETY: the benchmark's own live handles and buffers.
        unsafe { cu_call!(d, cuMemFree_v2(m)) };
    }
    result
}

/// Copy bandwidth against the size (native and rgpu per direction and memory, loopback TCP
/// carrying the same sizes), the latencies, and the launch rate.
fn plots(report: &Report) -> Vec<(&'static str, String)> {
    use crate::output::{bar_chart, line_plot, Bar, Series};
    const COLORS: [[&str; 2]; 4] = [
        ["#1f77b4", "#aec7e8"],
        ["#d62728", "#ff9896"],
        ["#2ca02c", "#98df8a"],
        ["#ff7f0e", "#ffbb78"],
    ];
    let mut labels = Vec::new();
    for direction in DIRECTIONS {
        for memory in MEMORY {
            labels.push((direction, memory, format!("{direction} {memory}")));
        }
    }
    let mut series = Vec::new();
    for (i, (direction, memory, label)) in labels.iter().enumerate() {
        let copies = report
            .copies
            .iter()
            .filter(|c| c.direction == *direction && c.memory == *memory);
        series.push(Series {
            label,
            color: COLORS[i % 4][1],
            points: copies
                .clone()
                .map(|c| (c.size_bytes as u64, c.native_gbps))
                .collect(),
        });
        series.push(Series {
            label,
            color: COLORS[i % 4][0],
            points: copies.map(|c| (c.size_bytes as u64, c.rgpu_gbps)).collect(),
        });
    }
    let mut tcp: Vec<(u64, f64)> = report
        .copies
        .iter()
        .map(|c| (c.size_bytes as u64, c.tcp_same_size_gbps))
        .collect();
    tcp.sort_by_key(|p| p.0);
    tcp.dedup_by_key(|p| p.0);
    series.push(Series {
        label: "loopback TCP",
        color: "gray",
        points: tcp,
    });
    let bandwidth = line_plot(
        &format!("CUDA copies: {} (dark: rgpu, light: native)", report.device),
        "GB/s",
        &series,
    );
    let pair = |c: &Compared| {
        vec![
            Bar {
                label: "native",
                color: "#1f77b4",
                value: c.native,
            },
            Bar {
                label: "rgpu",
                color: "#d62728",
                value: c.rgpu,
            },
        ]
    };
    let latency = bar_chart(
        "CUDA latency (medians)",
        "µs",
        &report
            .latency
            .iter()
            .map(|c| (c.name, pair(c)))
            .collect::<Vec<_>>(),
    );
    let rate = bar_chart(
        "CUDA launch rate",
        "launches/s",
        &[(
            report.launch_rate_per_s.name,
            pair(&report.launch_rate_per_s),
        )],
    );
    vec![
        ("cuda-bandwidth.svg", bandwidth),
        ("cuda-latency.svg", latency),
        ("cuda-launch-rate.svg", rate),
    ]
}

fn render(report: &Report) -> Result<String, fmt::Error> {
    let mut out = String::new();
    writeln!(
        out,
        "rgpu bench cuda: {} (rgpu via {})",
        report.device, report.rgpu_server
    )?;
    writeln!(
        out,
        "raw loopback TCP: {:.2} GB/s (best {:.2}; before the measurements {:.2}, after {:.2}), \
         round trip {:.1} us (raw Unix socket: {:.1} us)",
        report.raw_tcp.bandwidth_gbps,
        report.raw_tcp.bandwidth_best_gbps,
        report.raw_tcp_before_gbps,
        report.raw_tcp_after_gbps,
        report.raw_tcp.round_trip_us,
        report.raw_tcp.unix_round_trip_us
    )?;
    writeln!(
        out,
        "TCP-same: plain loopback TCP moving the same bytes from and into buffers of the copy's size"
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<16} {:<9} {:>8} {:>11} {:>11} {:>9} {:>9} {:>10}",
        "copy", "memory", "size", "native GB/s", "rgpu GB/s", "/native", "/raw TCP", "/TCP-same"
    )?;
    for copy in &report.copies {
        writeln!(
            out,
            "{:<16} {:<9} {:>8} {:>11.2} {:>11.2} {:>9.2} {:>9.2} {:>10.2}",
            copy.direction,
            copy.memory,
            size_label(copy.size_bytes),
            copy.native_gbps,
            copy.rgpu_gbps,
            copy.ratio_to_native,
            copy.ratio_to_raw_tcp,
            copy.ratio_to_tcp_same_size
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:<44} {:>12} {:>12} {:>9}",
        "measure", "native", "rgpu", "ratio"
    )?;
    let rates = [&report.launch_rate_per_s, &report.launch_post_rate_per_s];
    for row in report.latency.iter().chain(rates) {
        writeln!(
            out,
            "{:<44} {:>12.1} {:>12.1} {:>9.2}",
            row.name, row.native, row.rgpu, row.ratio
        )?;
    }
    let turns = &report.launch_rate_in_turns;
    writeln!(
        out,
        "launch rate in turns, rgpu / native: {} (median {:.2})",
        turns
            .ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(" "),
        turns.median_ratio
    )?;
    for row in &report.latency {
        writeln!(
            out,
            "  {}: rgpu adds {:.1} us to native",
            row.name,
            row.rgpu - row.native
        )?;
    }
    let s = &report.sgemm;
    writeln!(
        out,
        "{:<44} {:>12.2} {:>12.2} {:>9.3}",
        format!("SGEMM {0}x{0} (ms; ratio native/rgpu)", s.n),
        s.native_ms,
        s.rgpu_ms,
        s.ratio
    )?;
    writeln!(
        out,
        "{:<44} {:>12.2} {:>12.2}",
        "SGEMM TFLOPS", s.native_tflops, s.rgpu_tflops
    )?;
    Ok(out)
}

fn size_label(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{}M", bytes >> 20)
    } else {
        format!("{}K", bytes >> 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compared(name: &'static str) -> Compared {
        Compared {
            name,
            native: 1.0,
            rgpu: 2.0,
            ratio: 2.0,
        }
    }

    #[test]
    fn the_report_renders_every_measure() {
        let report = Report {
            device: "GPU".into(),
            rgpu_server: "127.0.0.1:1".into(),
            repetitions: 1,
            copies: vec![CopyResult {
                direction: DIRECTIONS[0],
                memory: MEMORY[0],
                size_bytes: 64 << 20,
                native_gbps: 50.0,
                rgpu_gbps: 3.0,
                ratio_to_native: 0.06,
                ratio_to_raw_tcp: 0.95,
                tcp_same_size_gbps: 2.9,
                ratio_to_tcp_same_size: 1.03,
            }],
            latency: vec![compared("a"), compared("b")],
            launch_rate_per_s: compared("launches"),
            launch_post_rate_per_s: compared("posts"),
            launch_rate_in_turns: Turns {
                native: vec![1.0; 5],
                rgpu: vec![1.0; 5],
                ratios: vec![1.0; 5],
                median_ratio: 1.0,
            },
            sgemm: SgemmResult {
                n: 64,
                native_ms: 1.0,
                rgpu_ms: 1.0,
                native_tflops: 1.0,
                rgpu_tflops: 1.0,
                ratio: 1.0,
            },
            raw_tcp: TcpBaseline {
                bandwidth_gbps: 3.16,
                bandwidth_best_gbps: 3.2,
                bytes_per_run: 1,
                write_size: 1,
                round_trip_us: 40.0,
                round_trip_min_us: 30.0,
                unix_round_trip_us: 12.0,
                unix_round_trip_min_us: 10.0,
                ping_bytes: 64,
                pings: 1,
            },
            raw_tcp_before_gbps: 3.1,
            raw_tcp_after_gbps: 3.2,
        };
        let text = render(&report).unwrap();
        assert!(
            text.contains("before the measurements 3.10, after 3.20"),
            "{text}"
        );
        assert!(
            text.contains("host to device   pinned         64M"),
            "{text}"
        );
        assert!(text.contains("1.03"), "{text}");
        assert!(
            text.contains("launches") && text.contains("SGEMM 64x64"),
            "{text}"
        );
        assert!(serde_json::to_string(&report)
            .unwrap()
            .contains("ratio_to_tcp_same_size"));
    }
}
