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
//! (a panic becomes CUDA_ERROR_UNKNOWN, never an abort), the rest NOT_SUPPORTED stubs.

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]
#![allow(clippy::too_many_arguments)]

pub mod api;
mod boundary;
mod export_tables;
mod generated_exports;
mod handles;
mod host_view;
mod objects;
pub mod proc_address;
mod ranges;
mod results;
mod servers;
mod unsupported;

/// Marks this library as rgpu's, so that a server never loads it as its driver.
#[no_mangle]
pub static rgpu_cuda_client: u8 = 1;
