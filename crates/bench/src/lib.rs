//! `rgpu bench`: benchmarks (not tests) of rgpu against the machine's own OpenCL and CUDA,
//! with the raw loopback TCP bandwidth measured in the same run. The CLI runs them
//! ([`run`]) and gives them its client environment ([`ClientSetup`]).

mod cuda;
mod fabric;
mod link;
mod local_server;
mod mpi;
mod nccl;
mod opencl;
pub mod output;
mod tcp;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// What the benchmarks need from the CLI: the environment that makes rgpu's libraries and the
/// servers visible to this very process (the ICD loader and the CUDA driver are loaded in it).
pub trait ClientSetup {
    /// Prepares that environment for `servers` (a comma list) and applies it to this process.
    fn apply(&self, servers: &str, token_file: Option<&Path>) -> Result<RgpuLibraries, String>;
}

/// Where rgpu's client libraries are.
pub struct RgpuLibraries {
    /// `librgpu_cuda.so`, the drop-in CUDA driver, if it is there.
    pub cuda_library: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
#[command(about = "Measure rgpu against native OpenCL or CUDA on this machine")]
pub struct BenchArgs {
    #[command(subcommand)]
    kind: BenchKind,
}

#[derive(clap::Subcommand, Debug)]
enum BenchKind {
    Opencl(opencl::OpenclBenchArgs),
    Cuda(cuda::CudaBenchArgs),
    Fabric(fabric::FabricBenchArgs),
    Mpi(mpi::MpiBenchArgs),
    Nccl(nccl::NcclBenchArgs),
    Link(link::LinkBenchArgs),
}

pub fn run(args: BenchArgs, setup: &dyn ClientSetup) -> Result<ExitCode, String> {
    // A server on this host stands in for a remote one: its clients stay on the path named
    // (TCP), not its same-host socket, unless RGPU_SAME_HOST says otherwise. Set before any
    // thread starts.
    if std::env::var_os("RGPU_SAME_HOST").is_none() {
        std::env::set_var("RGPU_SAME_HOST", "off");
    }
    match args.kind {
        BenchKind::Opencl(args) => opencl::run(args, setup),
        BenchKind::Cuda(args) => cuda::run(args, setup),
        BenchKind::Fabric(args) => fabric::run(args, setup),
        BenchKind::Mpi(args) => mpi::run(args),
        BenchKind::Nccl(args) => nccl::run(args, setup),
        BenchKind::Link(args) => link::run(args),
    }
}

/// The middle value (the mean of the two middle ones for an even count); 0 when empty.
fn median(samples: &[f64]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

fn max(samples: &[f64]) -> f64 {
    samples.iter().copied().fold(0.0, f64::max)
}

fn min(samples: &[f64]) -> f64 {
    samples.iter().copied().fold(f64::INFINITY, f64::min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(max(&[1.0, 5.0]), 5.0);
        assert_eq!(min(&[1.0, 5.0]), 1.0);
    }
}
