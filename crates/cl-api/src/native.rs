//! The machine's own OpenCL, loaded at run time (no link-time dependency on libOpenCL).
//!
//! [`NativeOpenCl::load`] opens the ICD loader and fills a dispatch table with every entry
//! point it exports (`None` for those it lacks). Calls go through [`cl_call!`]:
//!
//! ```no_run
//! use rgpu_cl_api::{cl_call, sys, NativeOpenCl};
//! let native = NativeOpenCl::load(None).unwrap();
//! let mut count = 0;
//! // SAFETY: a NULL platforms array with num_entries 0 only asks for the count.
//! let status = unsafe { cl_call!(native, clGetPlatformIDs(0, std::ptr::null_mut(), &mut count)) };
//! assert!(status == sys::CL_SUCCESS || status == sys::CL_PLATFORM_NOT_FOUND_KHR);
//! ```
//!
//! Platforms and devices are wrapped in [`Platform`] and [`Device`], which only this module
//! creates from handles the library returned, so the info helpers can be safe functions.

use std::ffi::c_void;
use std::path::{Path, PathBuf};

use libloading::Library;

use crate::errors::ClError;
use crate::sys::cl_icd::_cl_icd_dispatch;
use crate::sys::{cl_device_id, cl_device_type, cl_int, cl_platform_id, cl_uint};

/// Environment variable naming the OpenCL library to load instead of the system loader.
pub const OPENCL_LIBRARY_ENV: &str = "RGPU_OPENCL_LIBRARY";

/// The loaded library and its entry points.
pub struct NativeOpenCl {
    /// Every dispatch slot the library exports by name; `None` where it does not.
    pub api: _cl_icd_dispatch,
    path: PathBuf,
    // Keeps the code behind `api` mapped; never used directly.
    _lib: Library,
}

/// Calls an entry point of a [`NativeOpenCl`] by name:
/// `cl_call!(native, clGetPlatformIDs(0, null_mut(), &mut count))`.
///
/// The call is a native function call, so the expansion must sit in an `unsafe` block whose
/// `SAFETY:` comment says why the arguments are valid. When the library lacks the entry point
/// the result is what an OpenCL implementation answers for an unsupported call:
/// `CL_INVALID_OPERATION` for functions returning `cl_int`, NULL for those returning a handle
/// or pointer (their `errcode_ret` is left untouched, so check the handle for NULL), nothing
/// for `void` functions.
#[macro_export]
macro_rules! cl_call {
    ($native:expr, $name:ident($($arg:expr),* $(,)?)) => {
        match $native.api.$name {
            Some(entry) => entry($($arg),*),
            None => $crate::native::MissingEntry::missing(),
        }
    };
}

/// What [`cl_call!`] returns when the library lacks the entry point.
pub trait MissingEntry {
    fn missing() -> Self;
}

impl MissingEntry for cl_int {
    fn missing() -> Self {
        crate::sys::CL_INVALID_OPERATION
    }
}

impl<T> MissingEntry for *mut T {
    fn missing() -> Self {
        std::ptr::null_mut()
    }
}

impl MissingEntry for () {
    fn missing() -> Self {}
}

/// Copies one symbol of `lib` out as a function pointer of type `T` (inferred from the
/// dispatch table field it fills).
fn symbol<T: Copy>(lib: &Library, nul_terminated_name: &str) -> Option<T> {
    // SAFETY: `T` is the field type opencl-sys declares for this very entry point, so the
    // symbol, if present, has that type; the pointer stays valid while `lib` is loaded, which
    // NativeOpenCl guarantees by owning `lib`.
    unsafe { lib.get::<T>(nul_terminated_name.as_bytes()) }
        .ok()
        .map(|entry| *entry)
}

macro_rules! load_dispatch_table {
    ([$lib:ident] $($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        _cl_icd_dispatch {
            $($name: symbol($lib, concat!(stringify!($name), "\0")),)*
        }
    };
}

impl NativeOpenCl {
    /// Loads `explicit` if given, else the library named by `RGPU_OPENCL_LIBRARY`, else the
    /// system ICD loader. ocl-icd's full path is tried before the bare soname because the CUDA
    /// toolkit ships its own `libOpenCL.so.1` that ldconfig may list first, and that one has
    /// been seen to find no devices where ocl-icd finds them all.
    pub fn load(explicit: Option<&Path>) -> Result<NativeOpenCl, String> {
        if let Some(path) = explicit {
            return Self::load_from(path);
        }
        if let Some(path) = std::env::var_os(OPENCL_LIBRARY_ENV).filter(|p| !p.is_empty()) {
            return Self::load_from(Path::new(&path))
                .map_err(|e| format!("{e} (from {OPENCL_LIBRARY_ENV})"));
        }
        let mut failures = Vec::new();
        for candidate in default_candidates() {
            match Self::load_from(&candidate) {
                Ok(native) => return Ok(native),
                Err(e) => failures.push(e),
            }
        }
        Err(format!(
            "no OpenCL library found (install ocl-icd-libopencl1, or name one with \
             --opencl-library or {OPENCL_LIBRARY_ENV}): {}",
            failures.join("; ")
        ))
    }

    fn load_from(path: &Path) -> Result<NativeOpenCl, String> {
        // SAFETY: loading a shared library runs its initializers; an OpenCL ICD loader's are
        // plain C setup code with no preconditions on the caller.
        let lib = unsafe { Library::new(path) }
            .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
        let lib_ref = &lib;
        let api = crate::for_each_dispatch_slot!(load_dispatch_table, lib_ref);
        if api.clGetPlatformIDs.is_none() {
            return Err(format!(
                "{} is not an OpenCL library (no clGetPlatformIDs)",
                path.display()
            ));
        }
        log::debug!("loaded OpenCL from {}", path.display());
        Ok(NativeOpenCl {
            api,
            path: path.to_path_buf(),
            _lib: lib,
        })
    }

    /// The path or soname the library was loaded from.
    pub fn library_path(&self) -> &Path {
        &self.path
    }

    /// Every platform; empty when there is none (CL_PLATFORM_NOT_FOUND_KHR).
    pub fn platform_ids(&self) -> Result<Vec<Platform>, ClError> {
        let mut count: cl_uint = 0;
        // SAFETY: NULL output array with 0 entries asks only for the count.
        let status =
            unsafe { cl_call!(self, clGetPlatformIDs(0, std::ptr::null_mut(), &mut count)) };
        if status == crate::sys::CL_PLATFORM_NOT_FOUND_KHR || (status == 0 && count == 0) {
            return Ok(Vec::new());
        }
        ClError::check(status)?;
        let mut ids: Vec<cl_platform_id> = vec![std::ptr::null_mut(); count as usize];
        // SAFETY: `ids` has room for `count` handles.
        let status = unsafe {
            cl_call!(
                self,
                clGetPlatformIDs(count, ids.as_mut_ptr(), std::ptr::null_mut())
            )
        };
        ClError::check(status)?;
        Ok(ids.into_iter().map(Platform).collect())
    }

    /// The platform's devices of `device_type` (e.g. `CL_DEVICE_TYPE_ALL`); empty when there is
    /// none (CL_DEVICE_NOT_FOUND).
    pub fn device_ids(
        &self,
        platform: Platform,
        device_type: cl_device_type,
    ) -> Result<Vec<Device>, ClError> {
        let mut count: cl_uint = 0;
        // SAFETY: `platform` came from this library; NULL output with 0 entries asks the count.
        let status = unsafe {
            cl_call!(
                self,
                clGetDeviceIDs(platform.0, device_type, 0, std::ptr::null_mut(), &mut count)
            )
        };
        if status == crate::sys::CL_DEVICE_NOT_FOUND || (status == 0 && count == 0) {
            return Ok(Vec::new());
        }
        ClError::check(status)?;
        let mut ids: Vec<cl_device_id> = vec![std::ptr::null_mut(); count as usize];
        // SAFETY: as above; `ids` has room for `count` handles.
        let status = unsafe {
            cl_call!(
                self,
                clGetDeviceIDs(
                    platform.0,
                    device_type,
                    count,
                    ids.as_mut_ptr(),
                    std::ptr::null_mut()
                )
            )
        };
        ClError::check(status)?;
        Ok(ids.into_iter().map(Device).collect())
    }

    /// The raw value of a platform info parameter.
    pub fn platform_info(&self, platform: Platform, param: u32) -> Result<Vec<u8>, ClError> {
        query_info(|size, value, size_ret| {
            // SAFETY: `platform` came from this library; query_info passes a buffer of `size`
            // bytes (or NULL with size 0) and a valid size_ret.
            unsafe {
                cl_call!(
                    self,
                    clGetPlatformInfo(platform.0, param, size, value, size_ret)
                )
            }
        })
    }

    /// The raw value of a device info parameter.
    pub fn device_info(&self, device: Device, param: u32) -> Result<Vec<u8>, ClError> {
        query_info(|size, value, size_ret| {
            // SAFETY: as in platform_info, for a device handle from this library.
            unsafe {
                cl_call!(
                    self,
                    clGetDeviceInfo(device.0, param, size, value, size_ret)
                )
            }
        })
    }

    /// A string-valued platform parameter (CL_PLATFORM_NAME, ...).
    pub fn platform_info_string(&self, platform: Platform, param: u32) -> Result<String, ClError> {
        self.platform_info(platform, param)
            .map(|bytes| crate::params::decode_string(&bytes))
    }

    /// A string-valued device parameter (CL_DEVICE_NAME, ...).
    pub fn device_info_string(&self, device: Device, param: u32) -> Result<String, ClError> {
        self.device_info(device, param)
            .map(|bytes| crate::params::decode_string(&bytes))
    }

    /// An integer device parameter of any width up to 64 bits (cl_uint, cl_ulong, size_t,
    /// bitfields, cl_bool).
    pub fn device_info_u64(&self, device: Device, param: u32) -> Result<u64, ClError> {
        self.device_info(device, param)
            .map(|bytes| crate::params::decode_unsigned(&bytes))
    }
}

/// The ICD loader candidates, most trusted first.
fn default_candidates() -> Vec<PathBuf> {
    let mut candidates = Vec::new();
    let multiarch = format!(
        "/usr/lib/{}-linux-gnu/libOpenCL.so.1",
        std::env::consts::ARCH
    );
    if Path::new(&multiarch).exists() {
        candidates.push(PathBuf::from(multiarch));
    }
    candidates.push(PathBuf::from("libOpenCL.so.1"));
    candidates.push(PathBuf::from("libOpenCL.so"));
    candidates
}

/// Runs the two-call pattern of every clGet*Info function: ask the size, then the value.
/// `call(size, value, size_ret)` must invoke the query with those three arguments; it gets a
/// NULL `value` with size 0 first, then a buffer of the reported size.
pub fn query_info(
    mut call: impl FnMut(usize, *mut c_void, *mut usize) -> cl_int,
) -> Result<Vec<u8>, ClError> {
    let mut size = 0usize;
    ClError::check(call(0, std::ptr::null_mut(), &mut size))?;
    let mut value = vec![0u8; size];
    if size > 0 {
        ClError::check(call(size, value.as_mut_ptr().cast(), std::ptr::null_mut()))?;
    }
    Ok(value)
}

/// A platform of the loaded library.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Platform(cl_platform_id);

/// A root device of the loaded library (root devices are never released).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Device(cl_device_id);

// SAFETY: OpenCL platform and device handles may be used from any thread (OpenCL 1.1+ makes
// every API call except clSetKernelArg thread-safe), and these two are never freed.
unsafe impl Send for Platform {}
// SAFETY: as above.
unsafe impl Sync for Platform {}
// SAFETY: as above.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl Platform {
    pub fn raw(self) -> cl_platform_id {
        self.0
    }
}

impl Device {
    pub fn raw(self) -> cl_device_id {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys;

    fn ocl_icd_installed() -> bool {
        default_candidates()
            .first()
            .is_some_and(|p| p.is_absolute())
    }

    #[test]
    fn loads_the_system_loader() {
        if !ocl_icd_installed() {
            eprintln!("ocl-icd not installed; skipping");
            return;
        }
        let native = NativeOpenCl::load(None).expect("ocl-icd loads");
        assert!(native.api.clGetPlatformIDs.is_some());
        assert!(native.api.clEnqueueNDRangeKernel.is_some());
        // Enumeration works whether or not the machine has a platform.
        for platform in native.platform_ids().unwrap() {
            let name = native
                .platform_info_string(platform, sys::CL_PLATFORM_NAME)
                .unwrap();
            assert!(!name.is_empty());
            for device in native
                .device_ids(platform, sys::CL_DEVICE_TYPE_ALL)
                .unwrap()
            {
                let units = native
                    .device_info_u64(device, sys::CL_DEVICE_MAX_COMPUTE_UNITS)
                    .unwrap();
                assert!(units > 0);
            }
        }
    }

    #[test]
    fn missing_entries_fail_like_unsupported_calls() {
        if !ocl_icd_installed() {
            return;
        }
        let mut native = NativeOpenCl::load(None).unwrap();
        native.api.clGetPlatformIDs = None;
        native.api.clCreateBuffer = None;
        let mut errcode = 0;
        // SAFETY: the entries are None, so nothing native runs.
        let (status, buffer) = unsafe {
            (
                cl_call!(
                    native,
                    clGetPlatformIDs(0, std::ptr::null_mut(), std::ptr::null_mut())
                ),
                cl_call!(
                    native,
                    clCreateBuffer(
                        std::ptr::null_mut(),
                        0,
                        4,
                        std::ptr::null_mut(),
                        &mut errcode
                    )
                ),
            )
        };
        assert_eq!(status, sys::CL_INVALID_OPERATION);
        assert!(buffer.is_null());
    }

    #[test]
    fn explicit_path_errors_are_reported() {
        let err = NativeOpenCl::load(Some(Path::new("/nonexistent/libOpenCL.so")))
            .err()
            .unwrap();
        assert!(err.contains("/nonexistent/libOpenCL.so"), "{err}");
    }
}
