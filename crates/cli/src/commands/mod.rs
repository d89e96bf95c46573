//! One module per subcommand.

pub mod cluster_status;
pub mod devices;
pub mod migrate;
pub mod model;
pub mod run;
pub mod server;
pub mod token;
pub mod top;
pub mod trace;

use std::path::Path;
use std::sync::Mutex;

use crate::rgpu_env::{RgpuEnv, CUDA_LIBRARY_NAME};

/// The client environment `rgpu bench` runs in (crates/bench), kept until the benchmark ends
/// (dropping it removes its private directories).
#[derive(Default)]
pub struct BenchSetup {
    env: Mutex<Option<RgpuEnv>>,
}

impl rgpu_bench::ClientSetup for BenchSetup {
    fn apply(
        &self,
        servers: &str,
        token_file: Option<&Path>,
    ) -> Result<rgpu_bench::RgpuLibraries, String> {
        let env = RgpuEnv::prepare(servers, token_file)?;
        env.apply_to_this_process();
        let cuda_library = env
            .icd_library()
            .parent()
            .map(|dir| dir.join(CUDA_LIBRARY_NAME))
            .filter(|path| path.exists());
        *self.env.lock().unwrap_or_else(|e| e.into_inner()) = Some(env);
        Ok(rgpu_bench::RgpuLibraries { cuda_library })
    }
}
