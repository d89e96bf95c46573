//! A CUDA driver library loaded at run time: NVIDIA's `libcuda.so.1` for the server (which
//! still serves OpenCL where there is none), either it or rgpu's own for the benchmark. Every
//! function of the generated driver list gets a slot, filled when the library exports it;
//! calls through a missing slot return `CUDA_ERROR_NOT_SUPPORTED`.

use std::path::PathBuf;

use crate::for_each_driver_function;
use crate::sys::*;

/// A `CUresult` as the driver returned it. Kept as an integer: a newer driver may return codes
/// this build does not know, which must not become an invalid enum value.
pub type Status = u32;

pub const SUCCESS: Status = 0;
pub const NOT_SUPPORTED: Status = cudaError_enum::CUDA_ERROR_NOT_SUPPORTED as u32;
pub const INVALID_VALUE: Status = cudaError_enum::CUDA_ERROR_INVALID_VALUE as u32;
pub const INVALID_HANDLE: Status = cudaError_enum::CUDA_ERROR_INVALID_HANDLE as u32;

macro_rules! define_driver {
    ($($name:ident($($arg:ident : $ty:ty),* $(,)?);)*) => {
        /// Entry points of the native driver, `None` where it lacks one. The whole list, not
        /// only what the server calls today.
        #[allow(dead_code)]
        #[allow(non_snake_case)]
        pub struct DriverFns {
            $(pub $name: Option<unsafe extern "C" fn($($ty),*) -> Status>,)*
        }

        impl DriverFns {
            fn load(library: &libloading::Library) -> DriverFns {
                DriverFns {
                    // SAFETY: each symbol is looked up by its C name and given the signature the
                    // driver's header declares for that name.
                    $($name: unsafe {
                        library
                            .get::<unsafe extern "C" fn($($ty),*) -> Status>(
                                concat!(stringify!($name), "\0").as_bytes(),
                            )
                            .ok()
                            .map(|symbol| *symbol)
                    },)*
                }
            }
        }
    };
}

for_each_driver_function!(define_driver);

// SAFETY: cuInit has no preconditions.
/// Calls a driver function by name: `unsafe { cu_call!(driver, cuCtxSynchronize()) }`.
/// Evaluates to the function's status, `NOT_SUPPORTED` if the driver lacks it. The caller
/// writes the `unsafe` block (and its SAFETY note): the arguments must be valid for the
/// function, which only the call site knows.
#[macro_export]
macro_rules! cu_call {
    ($driver:expr, $name:ident($($arg:expr),* $(,)?)) => {
        match $driver.fns.$name {
            Some(function) => function($($arg),*),
            None => $crate::native::NOT_SUPPORTED,
        }
    };
}

/// Calls a driver function whose enum parameters are passed as the integers a client sent
/// (never made into Rust enum values, which must hold a listed variant): the C ABI passes a
/// C enum as a 32-bit integer. The caller names the function's C parameter types:
/// `unsafe { cu_call_raw!(driver, cuStreamGetAttribute(stream: CUstream, attr: u32,
/// out: *mut CUstreamAttrValue)) }`. Evaluates to the status, `NOT_SUPPORTED` if the driver
/// lacks it.
#[macro_export]
macro_rules! cu_call_raw {
    ($driver:expr, $name:ident($($arg:tt : $ty:ty),* $(,)?)) => {
        match $driver.fns.$name {
            Some(function) => {
                let function: unsafe extern "C" fn($($ty),*) -> $crate::native::Status =
                    std::mem::transmute(function);
                function($($arg),*)
            }
            None => $crate::native::NOT_SUPPORTED,
        }
    };
}

/// Turns a status into a `Result`.
pub fn check(status: Status) -> Result<(), Status> {
    if status == SUCCESS {
        Ok(())
    } else {
        Err(status)
    }
}

pub struct Driver {
    pub fns: DriverFns,
    path: PathBuf,
    _library: libloading::Library,
}

impl Driver {
    /// Loads NVIDIA's driver (`library`, or `libcuda.so.1` from the system) and initializes
    /// it; refuses rgpu's own client library.
    pub fn load(library: Option<&std::path::Path>) -> Result<Driver, String> {
        Self::load_any(library, false)
    }

    /// Like [`Driver::load`], accepting rgpu's client library when `allow_rgpu`.
    pub fn load_any(library: Option<&std::path::Path>, allow_rgpu: bool) -> Result<Driver, String> {
        let name = library.map_or_else(|| PathBuf::from("libcuda.so.1"), |p| p.to_path_buf());
        // SAFETY: loading the CUDA driver runs its initializers, which have no preconditions.
        let loaded = unsafe { libloading::Library::new(&name) }
            .map_err(|e| format!("no CUDA driver ({}): {e}", name.display()))?;
        // SAFETY: a symbol lookup; the value is not used as a function.
        let is_rgpu = unsafe { loaded.get::<*const u8>(b"rgpu_cuda_client\0") }.is_ok();
        if is_rgpu && !allow_rgpu {
            return Err(format!(
                "{} is rgpu's own client library, not NVIDIA's driver; start the server \
                 without rgpu's lib folder on LD_LIBRARY_PATH",
                name.display()
            ));
        }
        let driver = Driver {
            fns: DriverFns::load(&loaded),
            path: name,
            _library: loaded,
        };
        // SAFETY: cuInit has no preconditions.
        check(unsafe { cu_call!(driver, cuInit(0)) })
            .map_err(|status| format!("cuInit failed with CUDA error {status}"))?;
        Ok(driver)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}
