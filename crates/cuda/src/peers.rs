//! Device memory moved between servers for rgpu's MPI interposer (docs/mpi.md): a rank
//! exports a range of its device memory, another rank's server pulls it straight from the
//! exporting server. C entry points the interposer gets at cuInit (api/init.rs); each returns a
//! `CUresult`.

use rgpu_client::{CudaClient, Endpoint, ExportRecord};
use rgpu_cuda_api::sys::CUresult;
use rgpu_protocol::cuda::ExportKeep;

use crate::api::memory::context_of;
use crate::api::Outcome;

/// Runs `body`, a panic being CUDA_ERROR_UNKNOWN (never crossing into C).
fn guarded(body: impl FnOnce() -> Result<(), CUresult>) -> i32 {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => e as i32,
        Err(_) => CUresult::CUDA_ERROR_UNKNOWN as i32,
    }
}

/// Exports `size` bytes at device address `ptr` (after the earlier work of its context's
/// default stream) and describes the export in `out`. Nothing waits for the server.
///
/// # Safety
/// `out` is valid for writing.
#[no_mangle]
pub unsafe extern "C" fn rgpu_cuda_export(ptr: u64, size: u64, out: *mut ExportRecord) -> i32 {
    guarded(|| {
        if out.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = context_of(ptr)?;
        crate::api::managed::before_device_work(None);
        // Posted: the ticket is ours to choose, and the puller's link waits for the export.
        let ticket = rgpu_client::new_ticket();
        let record =
            ExportRecord::new(&ctx.conn, ticket).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        ctx.conn
            .cuda()
            .export_range(ctx.remote, 0, ptr, size, ticket, ExportKeep::Unguarded)
            .outcome()?;
        // SAFETY: the caller's out-pointer, checked non-null.
        unsafe { out.write(record) };
        Ok(())
    })
}

/// Fills `size` bytes at device address `dst` with the export `from` describes, pulled by
/// `dst`'s server from the exporting one.
///
/// # Safety
/// `from` is valid for reading.
#[no_mangle]
pub unsafe extern "C" fn rgpu_cuda_pull(dst: u64, size: u64, from: *const ExportRecord) -> i32 {
    guarded(|| {
        // SAFETY: the caller's record, checked non-null.
        let record = unsafe { from.as_ref() }.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let export = record.export().ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // RGPU_MPI_IPC=0: always over the network (to measure that path on one machine).
        let ipc =
            crate::api::fabric_ipc() && !std::env::var("RGPU_MPI_IPC").is_ok_and(|v| v == "0");
        let ctx = context_of(dst)?;
        let ipc = ipc
            && Endpoint::parse(&export.endpoint)
                .is_ok_and(|at| at.same_machine(ctx.conn.endpoint()));
        crate::api::managed::before_device_work(None);
        // Pulled in the background, ordered on the default stream; its end is ours to wait for
        // (a failed pull is reported there, and the interposer moves the bytes another way).
        ctx.conn
            .cuda()
            .pull_range(ctx.remote, Some(0), dst, size, export, ipc)
            .outcome()?;
        crate::api::stream::synchronize_stream(&ctx, 0)
    })
}

/// Withdraws an export of the memory at `ptr` that nobody pulled.
///
/// # Safety
/// `from` is valid for reading.
#[no_mangle]
pub unsafe extern "C" fn rgpu_cuda_unexport(ptr: u64, from: *const ExportRecord) -> i32 {
    guarded(|| {
        // SAFETY: the caller's record, checked non-null.
        let record = unsafe { from.as_ref() }.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let ctx = context_of(ptr)?;
        ctx.conn.cuda().unexport(record.ticket).outcome()
    })
}

/// Fills `size` bytes of host memory at `dst` with the export `from` describes, pulled by this
/// process straight from the exporting server.
///
/// # Safety
/// `from` is valid for reading, `dst` for writing `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn rgpu_cuda_pull_host(
    dst: *mut u8,
    size: u64,
    from: *const ExportRecord,
) -> i32 {
    guarded(|| {
        // SAFETY: the caller's record, checked non-null.
        let record = unsafe { from.as_ref() }.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if dst.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's buffer of `size` bytes.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst, size as usize) };
        rgpu_client::pull_to_host(record, dst).map_err(|e| {
            log::warn!("rgpu: pulling an export into host memory: {e}");
            CUresult::CUDA_ERROR_UNKNOWN
        })
    })
}
