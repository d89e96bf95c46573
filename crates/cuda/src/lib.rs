//! `librgpu_cuda.so`: a drop-in `libcuda.so.1` that carries the CUDA driver API to the GPUs of
//! the servers in `RGPU_SERVERS`. `rgpu run` puts it first on `LD_LIBRARY_PATH` under the
//! driver's sonames, so unmodified programs (static cudart, cuBLAS, CuPy, PyTorch) use it.
//!
//! Layout: `api/` holds the entry points by API group; `servers.rs` the connections and the
//! device list taken at `cuInit`; `objects.rs` and `handles.rs` what each handle (context, stream, event, module,
//! function) knows on the client; `export_tables.rs` cudart's private tables, implemented here;
//! `proc_address.rs` `cuGetProcAddress`; `host_view/` the host's copy of managed memory, paged on
//! demand; `generated_exports.rs` (generated) every exported
//! driver symbol: the implemented ones with the driver's own signatures, through `boundary.rs`
//! (a panic becomes CUDA_ERROR_UNKNOWN, never an abort), the rest NOT_SUPPORTED stubs;
//! `nccl/` NCCL, run by the servers' NCCL, for rgpu's drop-in libnccl.so.2 (crates/nccl).

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]
#![allow(clippy::too_many_arguments)]

pub mod api;
mod boundary;
mod export_tables;
pub(crate) mod generated_exports;
mod handles;
mod host_view;
mod nccl;
mod objects;
mod peers;
pub mod proc_address;
mod ranges;
mod results;
mod servers;
mod unsupported;

/// Marks this library as rgpu's, so that a server never loads it as its driver.
#[no_mangle]
pub static rgpu_cuda_client: u8 = 1;

/// The processes of this program's CUDA session on device `ordinal` (as its server's NVML
/// lists them), for rgpu's libnvidia-ml in the same process: its own connection is another
/// session, whose worker holds no CUDA context. Writes how many there are and the GPU memory
/// they use; returns 0, or -1 when CUDA is not initialized here or the server cannot tell.
///
/// # Safety
/// `count` and `used` are valid for writing.
#[no_mangle]
pub unsafe extern "C" fn rgpu_cuda_session_processes(
    ordinal: i32,
    count: *mut u32,
    used: *mut u64,
) -> i32 {
    use rgpu_client::CudaClient;
    let found = std::panic::catch_unwind(|| {
        let device = servers::device(ordinal).ok()?;
        let status = device
            .link
            .connection()
            .cuda()
            .get_device_status(device.remote_ordinal)
            .ok()?
            .ok()?;
        let processes = status.processes?;
        let bytes = processes.iter().filter_map(|p| p.used_memory).sum::<u64>();
        Some((processes.len() as u32, bytes))
    });
    match found {
        Ok(Some((n, bytes))) if !count.is_null() && !used.is_null() => {
            // SAFETY: the caller's out-pointers, checked non-null.
            unsafe {
                count.write(n);
                used.write(bytes);
            }
            0
        }
        _ => -1,
    }
}
