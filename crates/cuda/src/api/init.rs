//! Initialization and version.

use std::ffi::{c_int, c_uint, c_void};

use rgpu_cuda_api::sys::CUresult;

use super::{status, write_out};
use crate::servers;

/// Connects to the servers in `RGPU_SERVERS` (first call) and takes their device lists.
pub unsafe fn cuInit(flags: c_uint) -> CUresult {
    if flags != 0 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    let initialized = servers::init().map(|_| ());
    if initialized.is_ok() {
        static REGISTER: std::sync::Once = std::sync::Once::new();
        REGISTER.call_once(register_with_mpi);
    }
    status(initialized)
}

/// `rgpu_mpi_register_cuda` of librgpu_mpi.so (mpi/rgpu_mpi.c).
type RegisterCuda = unsafe extern "C" fn(*const c_void, *const c_void, *const c_void);
/// `rgpu_mpi_register_cuda_peers` of librgpu_mpi.so.
type RegisterPeers =
    unsafe extern "C" fn(*const c_void, *const c_void, *const c_void, *const c_void);

/// `rgpu_mpi_register_cuda_batch` of librgpu_mpi.so.
type RegisterBatch = unsafe extern "C" fn(*const c_void);

/// Tells rgpu's MPI interposer, when the program has it (`rgpu run --mpi`), how to recognise
/// and copy this library's device memory: from now on MPI calls take CUDA buffers.
fn register_with_mpi() {
    // SAFETY: looks a symbol up among the libraries loaded globally (LD_PRELOAD puts it there).
    let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"rgpu_mpi_register_cuda".as_ptr()) };
    if symbol.is_null() {
        return;
    }
    // SAFETY: librgpu_mpi.so exports it with this signature.
    let register: RegisterCuda = unsafe { std::mem::transmute(symbol) };
    use crate::generated_exports as exports;
    // SAFETY: this library's own entry points, which live as long as the process.
    unsafe {
        register(
            exports::cuPointerGetAttribute as *const c_void,
            exports::cuMemcpyDtoH_v2 as *const c_void,
            exports::cuMemcpyHtoD_v2 as *const c_void,
        )
    };
    // SAFETY: as above, for the transfers between servers (crate::peers).
    let symbol =
        unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"rgpu_mpi_register_cuda_peers".as_ptr()) };
    if !symbol.is_null() {
        // SAFETY: librgpu_mpi.so exports it with this signature.
        let register: RegisterPeers = unsafe { std::mem::transmute(symbol) };
        // SAFETY: this library's own entry points, which live as long as the process.
        unsafe {
            register(
                crate::peers::rgpu_cuda_export as *const c_void,
                crate::peers::rgpu_cuda_pull as *const c_void,
                crate::peers::rgpu_cuda_unexport as *const c_void,
                crate::peers::rgpu_cuda_pull_host as *const c_void,
            )
        };
    }
    // SAFETY: as above, for pulls of several messages at once (an interposer without it
    // pulls one at a time).
    let symbol =
        unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"rgpu_mpi_register_cuda_batch".as_ptr()) };
    if !symbol.is_null() {
        // SAFETY: librgpu_mpi.so exports it with this signature.
        let register: RegisterBatch = unsafe { std::mem::transmute(symbol) };
        // SAFETY: this library's own entry point, which lives as long as the process.
        unsafe { register(crate::peers::rgpu_cuda_pull_batch as *const c_void) };
    }
}

pub unsafe fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
    status(unsafe { write_out(version, servers::driver_version()) })
}
