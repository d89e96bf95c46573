//! The environment that makes the `rgpu` OpenCL platform appear beside the machine's own:
//! a private vendors directory holding `rgpu.icd` (naming `librgpu_opencl.so`) and copies of the
//! machine's ICD files, named by `OCL_ICD_VENDORS`, plus `RGPU_SERVERS` and `RGPU_TOKEN_FILE`
//! for the rgpu ICD; and a private `lib` directory, first on `LD_LIBRARY_PATH`, where
//! `libcuda.so.1` is rgpu's CUDA driver library (`librgpu_cuda.so`), `libnvidia-ml.so.1`
//! rgpu's NVML (`librgpu_nvml.so`) and `libnccl.so.2` rgpu's NCCL (`librgpu_nccl.so`). Used by `rgpu run` (for the child), `rgpu devices` and `rgpu bench` (for
//! the ICD loader they load in-process).

use std::ffi::OsString;
use std::fs::DirBuilder;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use rgpu_transport::{Endpoint, Token};

/// Where clients look for servers when nothing else is said.
pub const DEFAULT_SERVERS: &str = "127.0.0.1:7450";
/// The rgpu ICD library, built next to the `rgpu` executable.
pub const ICD_LIBRARY_NAME: &str = "librgpu_opencl.so";
/// rgpu's drop-in CUDA driver, built next to the ICD.
pub const CUDA_LIBRARY_NAME: &str = "librgpu_cuda.so";
/// The names programs load the CUDA driver by.
const CUDA_SONAMES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];
/// rgpu's drop-in NVML, built next to the ICD.
pub const NVML_LIBRARY_NAME: &str = "librgpu_nvml.so";
/// rgpu's drop-in NCCL, built next to the ICD, preloaded by `rgpu run`.
pub const NCCL_LIBRARY_NAME: &str = "librgpu_nccl.so";
/// The names programs load NCCL by.
const NCCL_SONAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];
/// rgpu's MPI interposer (mpi/rgpu_mpi.c), preloaded by `rgpu run --mpi`.
pub const MPI_LIBRARY_NAME: &str = "librgpu_mpi.so";
/// The names programs load NVML by (nvidia-smi and pynvml `libnvidia-ml.so.1`, some tools
/// the development name).
const NVML_SONAMES: [&str; 2] = ["libnvidia-ml.so.1", "libnvidia-ml.so"];
/// Overrides the directory searched for [`ICD_LIBRARY_NAME`].
pub const LIBRARY_DIR_ENV: &str = "RGPU_LIBRARY_DIR";
/// The system's ICD files.
const SYSTEM_VENDORS_DIR: &str = "/etc/OpenCL/vendors";

/// Server and token options shared by the client-side subcommands.
#[derive(clap::Args, Clone, Debug)]
pub struct ClientOptions {
    /// Servers whose devices the rgpu platform shows: host:port or unix:/path, comma-separated.
    /// Default: in a SLURM job, the job's servers (started by rgpu's prolog, with the job's
    /// token and their certificates); else 127.0.0.1:7450.
    #[arg(long, value_name = "LIST", env = "RGPU_SERVERS")]
    pub servers: Option<String>,

    /// File holding the token the servers require (passed on as RGPU_TOKEN_FILE, read and
    /// checked here first; RGPU_TOKEN in the environment works too).
    #[arg(long, value_name = "FILE", env = "RGPU_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
}

impl ClientOptions {
    /// The environment for these options: the servers given, else the SLURM job's, else the
    /// local default.
    pub fn environment(&self) -> Result<RgpuEnv, String> {
        if let Some(servers) = &self.servers {
            return RgpuEnv::prepare(servers, self.token_file.as_deref());
        }
        match crate::slurm::job_servers()? {
            Some(job) => {
                let token = self.token_file.as_deref().unwrap_or(&job.token_file);
                let mut env = RgpuEnv::prepare(&job.servers, Some(token))?;
                // The job's servers' certificates, beside any the user pins.
                let mut pins = OsString::from(job.fingerprints);
                if let Some(own) = std::env::var_os("RGPU_TLS_FINGERPRINT") {
                    pins.push(",");
                    pins.push(own);
                }
                env.vars.push(("RGPU_TLS_FINGERPRINT", pins));
                Ok(env)
            }
            None => RgpuEnv::prepare(DEFAULT_SERVERS, self.token_file.as_deref()),
        }
    }
}

/// A prepared environment. The vendors directory is removed when this is dropped.
pub struct RgpuEnv {
    vendors_dir: PathBuf,
    icd_library: PathBuf,
    vars: Vec<(&'static str, OsString)>,
}

impl RgpuEnv {
    /// Validates the options and writes the vendors directory.
    pub fn prepare(servers: &str, token_file: Option<&Path>) -> Result<RgpuEnv, String> {
        let endpoints = Endpoint::parse_list(servers).map_err(|e| format!("--servers: {e}"))?;
        if endpoints.is_empty() {
            return Err("--servers: no server given".into());
        }
        let icd_library = find_icd_library()?;
        let mut vars = vec![("RGPU_SERVERS", OsString::from(servers))];
        if let Some(token_file) = token_file {
            // Read it now so a wrong path fails here and not inside the OpenCL program.
            Token::from_file(token_file)?;
            let absolute = std::fs::canonicalize(token_file)
                .map_err(|e| format!("token file {}: {e}", token_file.display()))?;
            vars.push(("RGPU_TOKEN_FILE", absolute.into_os_string()));
        }
        if std::env::var_os("RGPU_APP_ID").is_none() {
            vars.push(("RGPU_APP_ID", OsString::from(application_id())));
        }

        // Built before filling, so that a failure below removes the directory again.
        let mut env = RgpuEnv {
            vendors_dir: create_private_dir()?,
            icd_library,
            vars,
        };
        env.fill_vendors_dir()?;
        if let Some(lib_dir) = env.fill_cuda_lib_dir()? {
            env.vars
                .push(("LD_LIBRARY_PATH", library_path_with(&lib_dir)));
        }
        env.vars
            .push(("OCL_ICD_VENDORS", env.vendors_dir.clone().into_os_string()));
        // The loader reads only OCL_ICD_FILENAMES when it is set (some images set it
        // globally): the rgpu library must then be named there too.
        if let Some(list) = icd_filenames_with(&env.icd_library) {
            env.vars.push(("OCL_ICD_FILENAMES", list));
        }
        log::debug!(
            "rgpu environment: vendors {} with {}; servers {servers}",
            env.vendors_dir.display(),
            env.icd_library.display()
        );
        Ok(env)
    }

    fn fill_vendors_dir(&self) -> Result<(), String> {
        let write = |name: &str, contents: &[u8]| {
            let path = self.vendors_dir.join(name);
            std::fs::write(&path, contents).map_err(|e| format!("{}: {e}", path.display()))
        };
        let mut line = self.icd_library.as_os_str().as_encoded_bytes().to_vec();
        line.push(b'\n');
        write("rgpu.icd", &line)?;
        for source in machine_icd_files() {
            let Ok(contents) = std::fs::read(&source) else {
                log::warn!("cannot read ICD file {}; skipped", source.display());
                continue;
            };
            let Some(name) = source.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            // An rgpu.icd from an enclosing `rgpu run` would list the rgpu platform twice.
            let names_rgpu = String::from_utf8_lossy(&contents).contains(ICD_LIBRARY_NAME);
            if name == "rgpu.icd" || names_rgpu {
                continue;
            }
            write(name, &contents)?;
        }
        Ok(())
    }

    /// Links the driver's sonames to rgpu's CUDA library, and NVML's to rgpu's NVML, in a
    /// `lib` directory of the private directory; `None` when neither was built (OpenCL still
    /// works).
    fn fill_cuda_lib_dir(&self) -> Result<Option<PathBuf>, String> {
        let lib_dir = self.vendors_dir.join("lib");
        let mut linked = false;
        for (library, sonames) in [
            (CUDA_LIBRARY_NAME, &CUDA_SONAMES),
            (NVML_LIBRARY_NAME, &NVML_SONAMES),
            (NCCL_LIBRARY_NAME, &NCCL_SONAMES),
        ] {
            let Some(path) = self
                .icd_library
                .parent()
                .map(|dir| dir.join(library))
                .filter(|path| path.exists())
            else {
                log::debug!("no {library} beside {}", self.icd_library.display());
                continue;
            };
            if !linked {
                std::fs::create_dir(&lib_dir).map_err(|e| format!("{}: {e}", lib_dir.display()))?;
                linked = true;
            }
            for name in sonames {
                let link = lib_dir.join(name);
                std::os::unix::fs::symlink(&path, &link)
                    .map_err(|e| format!("{}: {e}", link.display()))?;
            }
        }
        Ok(linked.then_some(lib_dir))
    }

    /// rgpu's NCCL under NCCL's soname in the private lib directory, for `rgpu run` to
    /// preload: programs that find NCCL through an RPATH (PyTorch's libtorch_cuda) would not
    /// see it on `LD_LIBRARY_PATH`, and a preloaded library of that soname stands for it.
    pub fn nccl_preload(&self) -> Option<PathBuf> {
        Some(self.vendors_dir.join("lib").join(NCCL_SONAMES[0])).filter(|path| path.exists())
    }

    /// rgpu's MPI interposer (`librgpu_mpi.so`, built by scripts/build-mpi.sh beside the other
    /// libraries), for `rgpu run --mpi`.
    pub fn mpi_library(&self) -> Result<PathBuf, String> {
        self.icd_library
            .parent()
            .map(|dir| dir.join(MPI_LIBRARY_NAME))
            .filter(|path| path.exists())
            .ok_or_else(|| {
                format!(
                    "--mpi: no {MPI_LIBRARY_NAME} beside {} (build it with scripts/build-mpi.sh, \
                     which needs mpicc)",
                    self.icd_library.display()
                )
            })
    }

    /// Sets the variables for a child process.
    pub fn apply_to(&self, command: &mut Command) {
        for (name, value) in &self.vars {
            command.env(name, value);
        }
    }

    /// Sets the variables in this process, for an OpenCL loader loaded afterwards. Call it
    /// before starting threads that read the environment.
    pub fn apply_to_this_process(&self) {
        for (name, value) in &self.vars {
            std::env::set_var(name, value);
        }
    }

    /// The servers the program is given (RGPU_SERVERS).
    pub fn servers(&self) -> String {
        self.vars
            .iter()
            .find(|(name, _)| *name == "RGPU_SERVERS")
            .map(|(_, value)| value.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    pub fn icd_library(&self) -> &Path {
        &self.icd_library
    }
}

impl Drop for RgpuEnv {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.vendors_dir);
    }
}

/// The application the command run belongs to, for servers whose devices are used by one
/// application at a time: the SLURM job (its steps and MPI ranks share the job's devices), else
/// this `rgpu run` (the command and its children: MPI ranks it starts, worker processes).
fn application_id() -> String {
    match std::env::var("SLURM_JOB_ID") {
        Ok(job) if !job.trim().is_empty() => format!("slurm-job-{}", job.trim()),
        _ => {
            let host = rgpu_transport::host_name().unwrap_or_else(|| "localhost".into());
            format!("{host}:rgpu-run-{}", std::process::id())
        }
    }
}

/// `librgpu_opencl.so` (and beside it `librgpu_cuda.so`): in `RGPU_LIBRARY_DIR`, else the
/// first of [`icd_library_candidates`] of the `rgpu` executable that exists.
pub fn find_icd_library() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os(LIBRARY_DIR_ENV).filter(|d| !d.is_empty()) {
        let path = Path::new(&dir).join(ICD_LIBRARY_NAME);
        return std::fs::canonicalize(&path)
            .map_err(|e| format!("{} (from {LIBRARY_DIR_ENV}): {e}", path.display()));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate rgpu itself: {e}"))?;
    let exe_dir = exe.parent().unwrap_or(Path::new("."));
    icd_library_candidates(exe_dir)
        .iter()
        .find_map(|path| std::fs::canonicalize(path).ok())
        .ok_or_else(|| {
            format!(
                "cannot find {ICD_LIBRARY_NAME} next to {exe} nor in ../lib/rgpu or ../lib of it \
                 (build it with `cargo build --release`, which puts it beside target/release/rgpu; \
                 the packages install it in /usr/lib/rgpu; or set {LIBRARY_DIR_ENV})",
                exe = exe.display()
            )
        })
}

/// Where `librgpu_opencl.so` may be, for an `rgpu` executable in `exe_dir`, in order: beside it
/// (cargo builds both into the same directory), in `../lib/rgpu` (the installed layout:
/// `/usr/bin/rgpu` and `/usr/lib/rgpu/`, or `bin/` and `lib/rgpu/` of the tarball; a private
/// directory, because `librgpu_cuda.so` carries the soname `libcuda.so.1` and must stay out of
/// the directories ldconfig scans), and in `../lib`.
fn icd_library_candidates(exe_dir: &Path) -> [PathBuf; 3] {
    [
        exe_dir.join(ICD_LIBRARY_NAME),
        exe_dir.join("../lib/rgpu").join(ICD_LIBRARY_NAME),
        exe_dir.join("../lib").join(ICD_LIBRARY_NAME),
    ]
}

/// `LD_LIBRARY_PATH` with `dir` first, so the program's `libcuda.so.1` is rgpu's.
fn library_path_with(dir: &Path) -> OsString {
    let mut list = dir.as_os_str().to_os_string();
    if let Some(current) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
        list.push(":");
        list.push(current);
    }
    list
}

/// An existing non-empty `OCL_ICD_FILENAMES` with `library` added (unless it names an rgpu
/// library already).
fn icd_filenames_with(library: &Path) -> Option<OsString> {
    let current = std::env::var_os("OCL_ICD_FILENAMES").filter(|v| !v.is_empty())?;
    let kept: Vec<&str> = current
        .to_str()?
        .split(':')
        .filter(|entry| !entry.is_empty() && !entry.contains(ICD_LIBRARY_NAME))
        .collect();
    let mut list = OsString::from(kept.join(":"));
    if !kept.is_empty() {
        list.push(":");
    }
    list.push(library.as_os_str());
    Some(list)
}

/// The ICD files the machine's loader would read: those of an existing `OCL_ICD_VENDORS` (a
/// directory or one .icd file), else those in /etc/OpenCL/vendors.
fn machine_icd_files() -> Vec<PathBuf> {
    let source = std::env::var_os("OCL_ICD_VENDORS")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(SYSTEM_VENDORS_DIR));
    if source.is_file() {
        return vec![source];
    }
    let Ok(entries) = std::fs::read_dir(&source) else {
        log::info!("no ICD files in {}", source.display());
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "icd"))
        .collect();
    files.sort();
    files
}

/// The prefix of the directories `rgpu run` makes for the ICD loader, followed by its pid.
const VENDORS_DIR_PREFIX: &str = "rgpu-vendors-";

/// A new directory only this user can read, under the system temp dir (after removing those
/// an `rgpu run` that was killed left there).
fn create_private_dir() -> Result<PathBuf, String> {
    let base = std::env::temp_dir();
    remove_stale_dirs(&base);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    for attempt in 0..100u32 {
        let path = base.join(format!(
            "{VENDORS_DIR_PREFIX}{}-{stamp:08x}-{attempt}",
            std::process::id()
        ));
        match DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("cannot create {}: {e}", path.display())),
        }
    }
    Err(format!(
        "cannot create a private directory in {}",
        base.display()
    ))
}

/// Removes this user's vendor directories in `base` whose `rgpu run` is gone (killed: it
/// removes its own when it ends). A directory whose pid now belongs to another live process
/// stays until that one ends too; one of another user's is never touched.
fn remove_stale_dirs(base: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    // SAFETY: a plain system call.
    let me = unsafe { libc::geteuid() };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(VENDORS_DIR_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let path = entry.path();
        // Not followed: a link planted under that name is not a directory of ours.
        let ours = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir() && m.uid() == me);
        if ours && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vendor directory left by a process that is gone is removed by the next `rgpu run`;
    /// one of a live process stays.
    #[test]
    fn vendor_dirs_of_killed_runs_are_removed() {
        let base = std::env::temp_dir().join(format!("rgpu-stale-test-{}", std::process::id()));
        std::fs::create_dir_all(&base).unwrap();
        // Above any pid_max: never a live process.
        let stale = base.join(format!("{VENDORS_DIR_PREFIX}4294967294-0-0"));
        let live = base.join(format!("{VENDORS_DIR_PREFIX}{}-0-0", std::process::id()));
        for dir in [&stale, &live] {
            std::fs::create_dir_all(dir.join("lib")).unwrap();
            std::fs::write(dir.join("rgpu.icd"), b"x").unwrap();
        }
        remove_stale_dirs(&base);
        assert!(!stale.exists());
        assert!(live.exists());
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn vendors_dir_has_rgpu_and_machine_icds_and_is_removed() {
        let lib_dir = create_private_dir().unwrap();
        std::fs::write(lib_dir.join(ICD_LIBRARY_NAME), b"").unwrap();
        std::env::set_var(LIBRARY_DIR_ENV, &lib_dir);
        let env = RgpuEnv::prepare("127.0.0.1:1,unix:/tmp/x", None).unwrap();
        let dir = env.vendors_dir.clone();
        let rgpu_icd = std::fs::read_to_string(dir.join("rgpu.icd")).unwrap();
        assert_eq!(rgpu_icd.trim(), env.icd_library().to_str().unwrap());
        for system_icd in machine_icd_files() {
            assert!(dir.join(system_icd.file_name().unwrap()).exists());
        }
        let vars: Vec<&str> = env.vars.iter().map(|(n, _)| *n).collect();
        let app = std::env::var_os("RGPU_APP_ID").is_none();
        let expected: &[&str] = if app {
            &["RGPU_SERVERS", "RGPU_APP_ID", "OCL_ICD_VENDORS"]
        } else {
            &["RGPU_SERVERS", "OCL_ICD_VENDORS"]
        };
        assert_eq!(vars, expected);
        drop(env);
        assert!(!dir.exists());
        std::fs::remove_dir_all(lib_dir).unwrap();
    }

    #[test]
    fn cuda_and_nvml_libraries_are_linked_under_the_drivers_names() {
        let lib_dir = std::fs::canonicalize(create_private_dir().unwrap()).unwrap();
        for name in [ICD_LIBRARY_NAME, CUDA_LIBRARY_NAME, NVML_LIBRARY_NAME] {
            std::fs::write(lib_dir.join(name), b"").unwrap();
        }
        let env = RgpuEnv {
            vendors_dir: create_private_dir().unwrap(),
            icd_library: lib_dir.join(ICD_LIBRARY_NAME),
            vars: Vec::new(),
        };
        let linked = env.fill_cuda_lib_dir().unwrap().expect("a lib directory");
        for (soname, target) in [
            ("libcuda.so.1", CUDA_LIBRARY_NAME),
            ("libcuda.so", CUDA_LIBRARY_NAME),
            ("libnvidia-ml.so.1", NVML_LIBRARY_NAME),
            ("libnvidia-ml.so", NVML_LIBRARY_NAME),
        ] {
            let link = std::fs::read_link(linked.join(soname)).unwrap();
            assert_eq!(link, lib_dir.join(target), "{soname}");
        }
        drop(env);
        std::fs::remove_dir_all(lib_dir).unwrap();
    }

    #[test]
    fn icd_library_is_found_in_the_installed_layout() {
        // Canonical, as the paths found are.
        let root = std::fs::canonicalize(create_private_dir().unwrap()).unwrap();
        let bin = root.join("usr/bin");
        let private_lib = root.join("usr/lib/rgpu");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&private_lib).unwrap();
        let find = || {
            icd_library_candidates(&bin)
                .iter()
                .find_map(|path| std::fs::canonicalize(path).ok())
        };
        assert_eq!(find(), None);
        std::fs::write(root.join("usr/lib").join(ICD_LIBRARY_NAME), b"").unwrap();
        assert_eq!(find(), Some(root.join("usr/lib").join(ICD_LIBRARY_NAME)));
        // The private directory wins over ../lib, and the executable's own directory over both.
        std::fs::write(private_lib.join(ICD_LIBRARY_NAME), b"").unwrap();
        assert_eq!(find(), Some(private_lib.join(ICD_LIBRARY_NAME)));
        std::fs::write(bin.join(ICD_LIBRARY_NAME), b"").unwrap();
        assert_eq!(find(), Some(bin.join(ICD_LIBRARY_NAME)));
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn bad_server_lists_are_refused() {
        assert!(RgpuEnv::prepare("", None).is_err());
        assert!(RgpuEnv::prepare("no-port", None).is_err());
    }
}
