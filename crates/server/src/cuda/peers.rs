//! Device memory moved between servers (crate::exports): a session's export of a range, and a
//! pull of another server's export into device memory.

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::{check, Status};
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{serve, Answer, DevicePtr, Id};
use rgpu_protocol::{LaneKey, PeerExport};

use super::session::{code, Served};

/// The status a failed pull answers (the client falls back to moving the bytes itself).
const PULL_FAILED: Status = cudaError_enum::CUDA_ERROR_UNKNOWN as u32;

/// A context handle, used by the export's thread (the driver's handles are process-wide).
struct Context(CUcontext);
// SAFETY: a driver handle, valid on any thread (the driver is thread-safe).
unsafe impl Send for Context {}

impl Context {
    /// The handle (a method, so that closures capture the whole `Send` value).
    fn raw(&self) -> CUcontext {
        self.0
    }
}

impl serve::Peers for Served<'_> {
    fn export_range(&mut self, ctx: Id, ptr: DevicePtr, size: u64) -> Answer<LaneKey> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx)?;
        // Readable once the context's earlier work is done.
        // SAFETY: the session's current context.
        check(unsafe { cu_call!(cuda.backend.driver, cuCtxSynchronize()) })?;
        let backend = cuda.backend.clone();
        let context = Context(cuda.current);
        let read = Box::new(move |at: u64, out: &mut [u8]| {
            let driver = &backend.driver;
            // SAFETY: the exporting session's context, and a local buffer of `out.len()` bytes;
            // the driver checks the device range.
            let status = unsafe {
                let set = cu_call!(driver, cuCtxSetCurrent(context.raw()));
                if set != 0 {
                    set
                } else {
                    cu_call!(
                        driver,
                        cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), ptr + at, out.len())
                    )
                }
            };
            check(status).map_err(|s| format!("CUDA error {s}"))
        });
        let session = &self.session;
        session
            .shared
            .exports
            .add(session.id, size, read)
            .map_err(|_| PULL_FAILED)
    }

    fn unexport(&mut self, ticket: LaneKey) -> Answer<()> {
        self.session.shared.exports.remove(self.session.id, &ticket);
        Ok(())
    }

    fn pull_range(&mut self, ctx: Id, dst: DevicePtr, size: u64, from: PeerExport) -> Status {
        let cuda = &mut *self.cuda;
        let session = &self.session;
        let pulled = cuda.enter(ctx).and_then(|()| {
            let driver = &cuda.backend.driver;
            crate::exports::pull(&from, size, session.shared.token.as_ref(), |at, bytes| {
                // SAFETY: the session's current context and the pulled bytes; the driver
                // checks the device range.
                check(unsafe {
                    cu_call!(
                        driver,
                        cuMemcpyHtoD_v2(dst + at, bytes.as_ptr().cast(), bytes.len())
                    )
                })
                .map_err(|s| format!("CUDA error {s}"))
            })
            .map_err(|e| {
                log::warn!(
                    "session {}: pulling from {}: {e}",
                    session.id,
                    from.endpoint
                );
                PULL_FAILED
            })
        });
        code(pulled)
    }
}
