//! Initialization and version.

use std::ffi::{c_int, c_uint};

use rgpu_cuda_api::sys::CUresult;

use super::{status, write_out};
use crate::servers;

/// Connects to the servers in `RGPU_SERVERS` (first call) and takes their device lists.
pub unsafe fn cuInit(flags: c_uint) -> CUresult {
    if flags != 0 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    status(servers::init().map(|_| ()))
}

pub unsafe fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
    status(unsafe { write_out(version, servers::driver_version()) })
}
