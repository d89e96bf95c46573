//! Device memory moved between servers (crate::exports): a session's export of a range, and a
//! pull of another server's export into device memory.

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::{check, Status};
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{serve, Answer, DevicePtr, Id};
use rgpu_protocol::{LaneKey, PeerExport};
use rgpu_transport::peer::{IpcCopy, IPC_HANDLE_BYTES};

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
        let ipc = ipc_of(&self.cuda.backend.driver, ptr);
        let session = &self.session;
        Ok(session.shared.exports.add(session.id, size, read, ipc))
    }

    fn unexport(&mut self, ticket: LaneKey) -> Answer<()> {
        self.session.shared.exports.remove(self.session.id, &ticket);
        Ok(())
    }

    fn pull_range(
        &mut self,
        ctx: Id,
        dst: DevicePtr,
        size: u64,
        from: PeerExport,
        ipc: bool,
    ) -> Status {
        let cuda = &mut *self.cuda;
        let session = &self.session;
        let pulled = cuda.enter(ctx).and_then(|()| {
            let driver = &cuda.backend.driver;
            // An exporting session on this machine: a device-to-device copy.
            let mut by_ipc = |handle: &[u8; IPC_HANDLE_BYTES], offset: u64| {
                copy_by_ipc(driver, handle, offset, dst, size)
            };
            let ipc: Option<IpcCopy> = if ipc { Some(&mut by_ipc) } else { None };
            crate::exports::pull(
                &from,
                size,
                session.shared.token.as_ref(),
                ipc,
                |at, bytes| {
                    // SAFETY: the session's current context and the pulled bytes; the driver
                    // checks the device range.
                    check(unsafe {
                        cu_call!(
                            driver,
                            cuMemcpyHtoD_v2(dst + at, bytes.as_ptr().cast(), bytes.len())
                        )
                    })
                    .map_err(|s| format!("CUDA error {s}"))
                },
            )
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

/// The IPC handle of the allocation holding `ptr` and `ptr`'s offset in it (`None` where the
/// driver gives none: memory that cannot be shared between processes).
fn ipc_of(
    driver: &rgpu_cuda_api::native::Driver,
    ptr: DevicePtr,
) -> Option<([u8; IPC_HANDLE_BYTES], u64)> {
    let (mut base, mut len) = (0u64, 0usize);
    // SAFETY: the session's current context and local out-values.
    check(unsafe { cu_call!(driver, cuMemGetAddressRange_v2(&mut base, &mut len, ptr)) }).ok()?;
    // SAFETY: plain bytes, valid zeroed.
    let mut handle: CUipcMemHandle = unsafe { std::mem::zeroed() };
    // SAFETY: a local out-struct and the allocation's base.
    check(unsafe { cu_call!(driver, cuIpcGetMemHandle(&mut handle, base)) }).ok()?;
    Some((handle.reserved.map(|b| b as u8), ptr - base))
}

/// Copies `size` bytes at `offset` of the allocation an IPC handle names to `dst`, device to
/// device; false when the driver will not open the handle (another machine's, or memory it
/// cannot share), and the bytes must be pulled.
fn copy_by_ipc(
    driver: &rgpu_cuda_api::native::Driver,
    handle: &[u8; IPC_HANDLE_BYTES],
    offset: u64,
    dst: DevicePtr,
    size: u64,
) -> bool {
    let handle = CUipcMemHandle {
        reserved: handle.map(|b| b as std::ffi::c_char),
    };
    let mut base = 0u64;
    // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS.
    // SAFETY: a handle by value and a local out-pointer; the driver checks the handle.
    let opened = unsafe { cu_call!(driver, cuIpcOpenMemHandle_v2(&mut base, handle, 1)) };
    if opened != 0 {
        return false;
    }
    // SAFETY: the session's current context; the driver checks both ranges.
    let copied = unsafe { cu_call!(driver, cuMemcpyDtoD_v2(dst, base + offset, size as usize)) };
    // SAFETY: the mapping opened above, closed once.
    unsafe { cu_call!(driver, cuIpcCloseMemHandle(base)) };
    copied == 0
}
