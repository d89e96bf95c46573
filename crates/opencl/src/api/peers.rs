//! Buffers moved between servers for rgpu's MPI interposer (docs/mpi.md), offered as extension
//! functions of the rgpu platform (`clGetExtensionFunctionAddressForPlatform`): a rank exports
//! a buffer range, another rank's server pulls it straight from the exporting server; and a
//! program's sessions moved whole to another server (docs/migration.md). Each returns an
//! OpenCL status.

use opencl_sys::*;
use rgpu_client::{ExportRecord, OpenClClient};

use crate::api::enqueue::{buffer_of_queue, check_range};
use crate::api::queue::queue_from;
use crate::util::{guard, status, Outcome};

/// Runs an entry point's body: its status, a panic being CL_OUT_OF_HOST_MEMORY.
fn entry(body: impl FnOnce() -> Result<(), cl_int>) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || status(body()))
}

/// `rgpu_opencl_export`: exports `size` bytes of `buffer` from `offset` (after the earlier
/// commands of `queue`) and describes the export in `out`.
///
/// # Safety
/// `out` is valid for writing.
pub unsafe extern "C" fn rgpu_opencl_export(
    queue: cl_command_queue,
    buffer: cl_mem,
    offset: usize,
    size: usize,
    out: *mut ExportRecord,
) -> cl_int {
    entry(|| {
        if out.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        let queue = queue_from(queue)?;
        let mem = buffer_of_queue(&queue, buffer)?;
        check_range(&mem, offset, size)?;
        // Posted: the ticket is ours to choose, and the puller's link waits for the export.
        let ticket = rgpu_client::new_ticket();
        let record = ExportRecord::new(&queue.conn, ticket).ok_or(CL_INVALID_VALUE)?;
        queue
            .conn
            .opencl()
            .export_buffer(queue.id, mem.id, offset as u64, size as u64, ticket)
            .outcome()?;
        // Sent now: the puller is about to ask for it.
        queue.conn.flush().map_err(|_| CL_OUT_OF_RESOURCES)?;
        // SAFETY: the caller's out-pointer, checked non-null.
        unsafe { out.write(record) };
        Ok(())
    })
}

/// `rgpu_opencl_pull`: fills `size` bytes of `buffer` from `offset` with the export `from`
/// describes, pulled by the buffer's server from the exporting one, in `queue`'s order.
///
/// # Safety
/// `from` is valid for reading.
pub unsafe extern "C" fn rgpu_opencl_pull(
    queue: cl_command_queue,
    buffer: cl_mem,
    offset: usize,
    size: usize,
    from: *const ExportRecord,
) -> cl_int {
    entry(|| {
        // SAFETY: the caller's record, checked non-null.
        let record = unsafe { from.as_ref() }.ok_or(CL_INVALID_VALUE)?;
        let export = record.export().ok_or(CL_INVALID_VALUE)?;
        let queue = queue_from(queue)?;
        let mem = buffer_of_queue(&queue, buffer)?;
        check_range(&mem, offset, size)?;
        queue
            .conn
            .opencl()
            .pull_buffer(queue.id, mem.id, offset as u64, size as u64, export)
            .outcome()
    })
}

/// `rgpu_opencl_unexport`: withdraws an export made through `queue` that nobody pulled.
///
/// # Safety
/// `from` is valid for reading.
pub unsafe extern "C" fn rgpu_opencl_unexport(
    queue: cl_command_queue,
    from: *const ExportRecord,
) -> cl_int {
    entry(|| {
        // SAFETY: the caller's record, checked non-null.
        let record = unsafe { from.as_ref() }.ok_or(CL_INVALID_VALUE)?;
        let queue = queue_from(queue)?;
        queue.conn.opencl().unexport_buffer(record.ticket).outcome()
    })
}

/// `rgpu_opencl_pull_host`: fills `size` bytes of host memory at `dst` with the export `from`
/// describes, pulled by this process straight from the exporting server.
///
/// # Safety
/// `from` is valid for reading, `dst` for writing `size` bytes.
pub unsafe extern "C" fn rgpu_opencl_pull_host(
    dst: *mut u8,
    size: usize,
    from: *const ExportRecord,
) -> cl_int {
    entry(|| {
        // SAFETY: the caller's record, checked non-null.
        let record = unsafe { from.as_ref() }.ok_or(CL_INVALID_VALUE)?;
        if dst.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: the caller's buffer of `size` bytes.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst, size) };
        rgpu_client::pull_to_host(record, dst).map_err(|e| {
            log::warn!("rgpu: pulling an export into host memory: {e}");
            CL_OUT_OF_RESOURCES
        })
    })
}

/// `rgpu_opencl_migrate`: moves the program's sessions with server `from` to server `to`
/// (addresses as in `RGPU_SERVERS`), every handle staying valid; on failure nothing moved and
/// `why` (when not null, `why_len` bytes) says why, NUL-terminated.
///
/// # Safety
/// `from` and `to` are NUL-terminated; `why` is null or valid for writing `why_len` bytes.
pub unsafe extern "C" fn rgpu_opencl_migrate(
    from: *const std::ffi::c_char,
    to: *const std::ffi::c_char,
    why: *mut std::ffi::c_char,
    why_len: usize,
) -> cl_int {
    entry(|| {
        if from.is_null() || to.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: NUL-terminated, as the caller promises.
        let (from, to) = unsafe {
            (
                std::ffi::CStr::from_ptr(from).to_string_lossy(),
                std::ffi::CStr::from_ptr(to).to_string_lossy(),
            )
        };
        crate::migration::migrate(&from, &to)
            .map(|_| ())
            .map_err(|reason| {
                log::warn!("rgpu: moving sessions from {from} to {to}: {reason}");
                if !why.is_null() && why_len > 0 {
                    let bytes = reason.as_bytes();
                    let n = bytes.len().min(why_len - 1);
                    // SAFETY: the caller's buffer of `why_len` bytes; n + 1 <= why_len.
                    unsafe {
                        std::ptr::copy_nonoverlapping(bytes.as_ptr(), why.cast::<u8>(), n);
                        why.add(n).write(0);
                    }
                }
                CL_INVALID_OPERATION
            })
    })
}
