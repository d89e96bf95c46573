//! `rgpu run -- CMD ARGS...`: run a program with the rgpu platform beside the local ones.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::iterator::{Handle, SignalsInfo};
use signal_hook::low_level::siginfo::Cause;

use crate::rgpu_env::ClientOptions;

#[derive(clap::Args, Debug)]
#[command(
    about = "Run a program with the servers' OpenCL devices and CUDA GPUs available",
    long_about = "Run a program with the rgpu OpenCL platform available beside this machine's \
                  own platforms, and the servers' CUDA GPUs as its CUDA devices: \
                  `rgpu run -- clinfo`, `rgpu run -- python3 train.py`.\n\n\
                  The program's environment gets OCL_ICD_VENDORS (a private copy of the \
                  machine's ICD files plus rgpu.icd), LD_LIBRARY_PATH with a private lib \
                  directory first (libcuda.so.1 there is rgpu's), RGPU_SERVERS and, with \
                  --token-file, \
                  RGPU_TOKEN_FILE. rgpu exits with the program's exit status (128+N when a \
                  signal N ended it) and passes on signals sent to rgpu itself.",
    trailing_var_arg = true
)]
pub struct RunArgs {
    #[command(flatten)]
    client: ClientOptions,

    /// Preload rgpu's MPI interposer (librgpu_mpi.so), so that MPI calls take rgpu device
    /// buffers: CUDA device pointers, and OpenCL buffers marked by their datatype.
    #[arg(long)]
    mpi: bool,

    /// The program to run and its arguments.
    #[arg(required = true, allow_hyphen_values = true, value_name = "CMD")]
    command: Vec<OsString>,
}

pub fn run(args: RunArgs) -> Result<ExitCode, String> {
    let env = args.client.environment()?;
    let (program, program_args) = args.command.split_first().expect("clap requires CMD");
    let mut command = Command::new(program);
    command.args(program_args);
    env.apply_to(&mut command);
    // rgpu's NCCL always (it does nothing until a program calls NCCL), its MPI interposer
    // when asked for, then what the caller preloads.
    let mut preloads = Vec::new();
    if args.mpi {
        preloads.push(env.mpi_library()?.into_os_string());
    }
    preloads.extend(env.nccl_preload().map(PathBuf::into_os_string));
    preloads.extend(std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()));
    if !preloads.is_empty() {
        command.env("LD_PRELOAD", preloads.join(std::ffi::OsStr::new(":")));
    }

    // While the program starts: whether any server can be reached at all.
    let probe = probe_servers(&env.servers());
    // Installed before the child starts so that no signal meant for it is lost.
    let forwarder = SignalForwarder::install()?;
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("rgpu: cannot run {}: {e}", program.to_string_lossy());
            // The shell's codes: 127 for a program that is not there, 126 for one that
            // cannot be run.
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return Ok(ExitCode::from(code));
        }
    };
    forwarder.set_child(child.id());
    // Forwarding must stop while the child's pid still belongs to it: wait for the exit
    // without reaping, stop forwarding, then reap.
    let exited = wait_for_exit_without_reaping(child.id());
    forwarder.stop();
    let status = exited.and_then(|()| child.wait());
    let _ = probe.join();
    drop(env);
    let status = status.map_err(|e| format!("waiting for {}: {e}", program.to_string_lossy()))?;
    Ok(exit_code(status))
}

/// How long `rgpu run` tries to reach each server before it says none answers.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Tries to connect to each server, beside the program: when none can be reached, says so on
/// stderr (the program then sees no rgpu device, and only its libraries' log would say why).
fn probe_servers(servers: &str) -> JoinHandle<()> {
    let endpoints = rgpu_transport::Endpoint::parse_list(servers).unwrap_or_default();
    std::thread::spawn(move || {
        let mut failures = Vec::new();
        for endpoint in &endpoints {
            match rgpu_transport::Stream::connect(endpoint, PROBE_TIMEOUT) {
                Ok(_) => return,
                Err(e) => failures.push(format!("{endpoint}: {e}")),
            }
        }
        if !failures.is_empty() {
            eprintln!(
                "rgpu: no server can be reached ({}); the program sees no rgpu device",
                failures.join("; ")
            );
        }
    })
}

/// Blocks until the process `pid` (our child) has exited, leaving it to be reaped.
fn wait_for_exit_without_reaping(pid: u32) -> std::io::Result<()> {
    loop {
        // SAFETY: siginfo_t is plain data, valid when zeroed.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a writable siginfo_t; WNOWAIT leaves the child unreaped.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// The shell convention: the exit code, or 128 + the signal that ended the program.
fn exit_code(status: ExitStatus) -> ExitCode {
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(code as u8),
        (None, Some(signal)) => ExitCode::from((128 + signal).min(255) as u8),
        (None, None) => ExitCode::FAILURE,
    }
}

/// Passes signals sent to rgpu on to the child. Signals the kernel generated (Ctrl-C, a
/// terminal hangup) are not passed on: the terminal sends those to the whole foreground
/// process group, so the child has its own copy already.
struct SignalForwarder {
    child_pid: Arc<AtomicI32>,
    handle: Handle,
    thread: JoinHandle<()>,
}

impl SignalForwarder {
    fn install() -> Result<SignalForwarder, String> {
        let mut signals =
            SignalsInfo::<WithOrigin>::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2])
                .map_err(|e| format!("cannot catch signals: {e}"))?;
        let handle = signals.handle();
        let child_pid = Arc::new(AtomicI32::new(0));
        let target = Arc::clone(&child_pid);
        let thread = std::thread::Builder::new()
            .name("rgpu-run-signals".into())
            .spawn(move || {
                for origin in signals.forever() {
                    let pid = target.load(Ordering::SeqCst);
                    if pid <= 0 || matches!(origin.cause, Cause::Kernel) {
                        continue;
                    }
                    // SAFETY: kill() has no memory-safety preconditions; the pid is our own
                    // child, not yet reaped (stop() runs before the reaping wait()).
                    unsafe { libc::kill(pid, origin.signal) };
                }
            })
            .map_err(|e| format!("cannot start the signal thread: {e}"))?;
        Ok(SignalForwarder {
            child_pid,
            handle,
            thread,
        })
    }

    fn set_child(&self, pid: u32) {
        self.child_pid.store(pid as i32, Ordering::SeqCst);
    }

    /// Stops forwarding; called once the child has exited but before it is reaped, so its pid
    /// cannot have been reused.
    fn stop(self) {
        self.child_pid.store(0, Ordering::SeqCst);
        self.handle.close();
        let _ = self.thread.join();
    }
}
