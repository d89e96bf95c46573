//! Platform queries and the ICD loader's entry points.

use std::ffi::{c_char, c_void, CStr};

use opencl_sys::*;

use crate::handle::{self, Ref};
use crate::objects::Platform;
use crate::runtime::runtime;
use crate::util::{bytes_of, guard, string_bytes, write_info};
use crate::util::{name_version, version_number};

const PLATFORM_VERSION: &str = concat!("OpenCL 3.0 rgpu ", env!("CARGO_PKG_VERSION"));
const PLATFORM_EXTENSIONS: &str = "cl_khr_icd";

/// The platform handle if `platform` names it (NULL picks it too, as implementations may).
pub fn platform_from(platform: cl_platform_id) -> Result<Ref<Platform>, cl_int> {
    let rt = runtime().ok_or(CL_INVALID_PLATFORM)?;
    if platform.is_null() {
        return Ok(rt.platform.clone());
    }
    handle::lookup::<Platform>(platform)
}

fn list_platforms(
    num_entries: cl_uint,
    platforms: *mut cl_platform_id,
    num_platforms: *mut cl_uint,
) -> cl_int {
    if (num_entries == 0 && !platforms.is_null())
        || (platforms.is_null() && num_platforms.is_null())
    {
        return CL_INVALID_VALUE;
    }
    let count = runtime().map_or(0, |_| 1);
    if !num_platforms.is_null() {
        // SAFETY: checked non-null; the caller provides a cl_uint.
        unsafe { *num_platforms = count };
    }
    if let (Some(rt), false) = (runtime(), platforms.is_null()) {
        // SAFETY: num_entries >= 1 writable entries.
        unsafe { *platforms = handle::raw(&rt.platform) };
    }
    if count == 0 && num_platforms.is_null() {
        return CL_PLATFORM_NOT_FOUND_KHR;
    }
    CL_SUCCESS
}

/// The ICD loader's way to list this library's platforms.
#[no_mangle]
pub unsafe extern "C" fn clIcdGetPlatformIDsKHR(
    num_entries: cl_uint,
    platforms: *mut cl_platform_id,
    num_platforms: *mut cl_uint,
) -> cl_int {
    crate::boundary::guard(
        "clIcdGetPlatformIDsKHR",
        || CL_OUT_OF_HOST_MEMORY,
        || list_platforms(num_entries, platforms, num_platforms),
    )
}

pub unsafe extern "C" fn clGetPlatformIDs(
    num_entries: cl_uint,
    platforms: *mut cl_platform_id,
    num_platforms: *mut cl_uint,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        list_platforms(num_entries, platforms, num_platforms)
    })
}

pub unsafe extern "C" fn clGetPlatformInfo(
    platform: cl_platform_id,
    param_name: cl_platform_info,
    param_value_size: usize,
    param_value: *mut c_void,
    param_value_size_ret: *mut usize,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        if let Err(code) = platform_from(platform) {
            return code;
        }
        let value = match param_name {
            CL_PLATFORM_PROFILE => string_bytes("FULL_PROFILE"),
            CL_PLATFORM_VERSION => string_bytes(PLATFORM_VERSION),
            CL_PLATFORM_NAME => string_bytes("rgpu"),
            CL_PLATFORM_VENDOR => string_bytes("rgpu"),
            CL_PLATFORM_EXTENSIONS => string_bytes(PLATFORM_EXTENSIONS),
            CL_PLATFORM_ICD_SUFFIX_KHR => string_bytes("RGPU"),
            CL_PLATFORM_HOST_TIMER_RESOLUTION => bytes_of(&0u64),
            CL_PLATFORM_NUMERIC_VERSION => bytes_of(&version_number(3, 0, 0)),
            CL_PLATFORM_EXTENSIONS_WITH_VERSION => {
                name_version("cl_khr_icd", version_number(1, 0, 0))
            }
            _ => return CL_INVALID_VALUE,
        };
        // SAFETY: the application's out-pointers for this query.
        unsafe { write_info(&value, param_value_size, param_value, param_value_size_ret) }
    })
}

/// Extension functions rgpu offers by name (the KHR aliases of core functions).
fn extension_function(name: &str) -> *mut c_void {
    match name {
        "clIcdGetPlatformIDsKHR" => clIcdGetPlatformIDsKHR as *mut c_void,
        // The exported (guarded) entry points.
        "clCreateCommandQueueWithPropertiesKHR" => {
            crate::generated_dispatch::clCreateCommandQueueWithProperties as *mut c_void
        }
        "clGetKernelSubGroupInfoKHR" => {
            crate::generated_dispatch::clGetKernelSubGroupInfo as *mut c_void
        }
        // rgpu's own, for its MPI interposer (crate::api::peers).
        "rgpu_opencl_export" => crate::api::peers::rgpu_opencl_export as *mut c_void,
        "rgpu_opencl_pull" => crate::api::peers::rgpu_opencl_pull as *mut c_void,
        "rgpu_opencl_unexport" => crate::api::peers::rgpu_opencl_unexport as *mut c_void,
        "rgpu_opencl_pull_host" => crate::api::peers::rgpu_opencl_pull_host as *mut c_void,
        // Live migration (docs/migration.md).
        "rgpu_opencl_migrate" => crate::api::peers::rgpu_opencl_migrate as *mut c_void,
        _ => std::ptr::null_mut(),
    }
}

pub unsafe extern "C" fn clGetExtensionFunctionAddress(func_name: *const c_char) -> *mut c_void {
    if func_name.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a NUL-terminated name from the application.
    let name = unsafe { CStr::from_ptr(func_name) }.to_string_lossy();
    extension_function(&name)
}

pub unsafe extern "C" fn clGetExtensionFunctionAddressForPlatform(
    platform: cl_platform_id,
    func_name: *const c_char,
) -> *mut c_void {
    if platform_from(platform).is_err() {
        return std::ptr::null_mut();
    }
    // SAFETY: forwarded as received.
    unsafe { clGetExtensionFunctionAddress(func_name) }
}

pub unsafe extern "C" fn clUnloadPlatformCompiler(platform: cl_platform_id) -> cl_int {
    match platform_from(platform) {
        Ok(_) => CL_SUCCESS,
        Err(code) => code,
    }
}

pub unsafe extern "C" fn clUnloadCompiler() -> cl_int {
    CL_SUCCESS
}
