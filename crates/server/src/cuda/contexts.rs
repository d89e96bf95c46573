//! Devices and contexts: the inventory, contexts (a session's own, also for primary ones), peer
//! access and limits.

use std::ptr::null_mut;

use rgpu_cuda_api::generated::limit;
use rgpu_cuda_api::native::{check, Status, INVALID_VALUE, SUCCESS};
use rgpu_cuda_api::sys::*;
use rgpu_cuda_api::{cu_call, cu_call_raw};
use rgpu_protocol::cuda::{serve, Answer, CuInventory, Id, TensorMapRequest};

use super::session::{code, Context, CudaSession, Served, INVALID_CONTEXT, INVALID_DEVICE};

impl serve::Contexts for Served<'_> {
    fn profiler(&mut self, ctx: Id, start: bool) -> Answer<()> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx)?;
        let driver = &cuda.backend.driver;
        // SAFETY: no arguments; they apply to the current context.
        check(unsafe {
            if start {
                cu_call!(driver, cuProfilerStart())
            } else {
                cu_call!(driver, cuProfilerStop())
            }
        })
    }

    fn tensor_map(&mut self, request: TensorMapRequest) -> Answer<Vec<u8>> {
        encode_tensor_map(&self.cuda.backend.driver, request)
    }

    fn get_inventory(&mut self) -> CuInventory {
        self.cuda.backend.inventory.clone()
    }

    fn create_context(&mut self, id: Id, device: u32, flags: u32, primary: bool) -> Answer<()> {
        check(self.cuda.create_context(id, device, flags, primary))
    }

    fn destroy_context(&mut self, id: Id) -> Answer<()> {
        check(self.cuda.destroy_context(id))
    }

    fn synchronize(&mut self, ctx: Id) -> Status {
        let cuda = &mut *self.cuda;
        let status = cuda
            .enter(ctx)
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            .and_then(|()| check(unsafe { cu_call!(cuda.backend.driver, cuCtxSynchronize()) }));
        cuda.sync_status(code(status))
    }

    fn enable_peer_access(&mut self, ctx: Id, peer: Id, flags: u32) -> Status {
        code(self.cuda.peer_access(ctx, peer, Some(flags)))
    }

    fn disable_peer_access(&mut self, ctx: Id, peer: Id) -> Status {
        code(self.cuda.peer_access(ctx, peer, None))
    }

    fn get_limit(&mut self, ctx: Id, which: u32) -> Answer<u64> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx).and_then(|()| {
            let which = limit(which).ok_or(INVALID_VALUE)?;
            let mut value = 0usize;
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe { cu_call!(cuda.backend.driver, cuCtxGetLimit(&mut value, which)) })?;
            Ok(value as u64)
        })
    }

    fn reset_persisting_l2_cache(&mut self, ctx: Id) -> Answer<()> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx)?;
        // SAFETY: the session's context, current.
        check(unsafe { cu_call!(cuda.backend.driver, cuCtxResetPersistingL2Cache()) })
    }

    fn set_limit(&mut self, ctx: Id, which: u32, value: u64) -> Status {
        let cuda = &mut *self.cuda;
        code(cuda.enter(ctx).and_then(|()| {
            let which = limit(which).ok_or(INVALID_VALUE)?;
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe { cu_call!(cuda.backend.driver, cuCtxSetLimit(which, value as usize)) })
        }))
    }
}

impl CudaSession {
    fn create_context(&mut self, id: Id, device: u32, flags: u32, primary: bool) -> Status {
        let driver = &self.backend.driver;
        if device as usize >= self.backend.inventory.devices.len() {
            return INVALID_DEVICE;
        }
        let existing = primary
            .then(|| self.primary.get(&device).copied())
            .flatten();
        let raw = match existing {
            Some(raw) => raw,
            None if primary => match self.retain_primary(device, flags) {
                Ok(raw) => raw,
                Err(status) => return status,
            },
            None => {
                let mut raw = null_mut();
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                let status = unsafe {
                    cu_call!(
                        driver,
                        cuCtxCreate_v4(&mut raw, null_mut(), flags, device as CUdevice)
                    )
                };
                if status != SUCCESS {
                    return status;
                }
                // cuCtxCreate pushed the new context; keep the thread's state as recorded.
                let mut popped = null_mut();
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                unsafe { cu_call!(driver, cuCtxPopCurrent_v2(&mut popped)) };
                if !self.current.is_null() {
                    // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                    unsafe { cu_call!(driver, cuCtxSetCurrent(self.current)) };
                }
                raw
            }
        };
        self.contexts.insert(id, Context { raw, device });
        SUCCESS
    }

    /// The device's own primary context stands for the program's: libraries the worker runs
    /// for the program (NCCL) use the CUDA runtime, whose `cudaSetDevice` makes the primary
    /// context current, so their objects and the program's must live in that one context. The
    /// worker is the session's alone, so the primary context is too; `close` resets it.
    fn retain_primary(&mut self, device: u32, flags: u32) -> Result<CUcontext, Status> {
        let driver = &self.backend.driver;
        let dev = device as CUdevice;
        // SAFETY: a device of this server and the program's flags; the driver checks them.
        let set = unsafe { cu_call!(driver, cuDevicePrimaryCtxSetFlags_v2(dev, flags)) };
        if set != SUCCESS {
            log::debug!("cuDevicePrimaryCtxSetFlags({flags:#x}): CUDA error {set}");
        }
        let mut raw = null_mut();
        // SAFETY: a local out-value and a device of this server.
        check(unsafe { cu_call!(driver, cuDevicePrimaryCtxRetain(&mut raw, dev)) })?;
        self.primary.insert(device, raw);
        Ok(raw)
    }

    fn destroy_context(&mut self, id: Id) -> Status {
        let Some(context) = self.contexts.remove(&id) else {
            return INVALID_CONTEXT;
        };
        let shared = self.primary.values().any(|&p| p == context.raw);
        if shared {
            // The primary stand-in lives as long as the session.
            return SUCCESS;
        }
        let driver = &self.backend.driver;
        self.staging.forget_context(driver, context.raw);
        if self.current == context.raw {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            unsafe { cu_call!(driver, cuCtxSetCurrent(null_mut())) };
            self.current = null_mut();
        }
        // SAFETY: this session's live handles and local buffers; the driver checks addresses.
        let status = unsafe { cu_call!(driver, cuCtxDestroy_v2(context.raw)) };
        if status == SUCCESS {
            self.forget_objects_of(context.raw);
        }
        status
    }

    /// `cuCtxEnablePeerAccess` (`flags` given) or `cuCtxDisablePeerAccess` in `ctx` for `peer`.
    fn peer_access(&mut self, ctx: Id, peer: Id, flags: Option<u32>) -> Result<(), Status> {
        let peer = self.contexts.get(&peer).ok_or(INVALID_CONTEXT)?.raw;
        self.enter(ctx)?;
        let driver = &self.backend.driver;
        check(match flags {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            Some(flags) => unsafe { cu_call!(driver, cuCtxEnablePeerAccess(peer, flags)) },
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            None => unsafe { cu_call!(driver, cuCtxDisablePeerAccess(peer)) },
        })
    }
}

/// A tensor map made by the driver (host work: no context needed). The address is a device
/// address of the client's session on this server, as kernels will use it.
fn encode_tensor_map(driver: &super::Driver, request: TensorMapRequest) -> Answer<Vec<u8>> {
    // SAFETY: plain bytes, valid zeroed.
    let mut map: CUtensorMap = unsafe { std::mem::zeroed() };
    let out = &mut map as *mut CUtensorMap;
    let status = match request {
        TensorMapRequest::Tiled {
            data_type,
            address,
            dims,
            strides,
            box_dims,
            element_strides,
            modes,
        } => {
            let rank = dims.len() as u32;
            if rank == 0
                || strides.len() + 1 < dims.len()
                || box_dims.len() != dims.len()
                || element_strides.len() != dims.len()
            {
                return Err(INVALID_VALUE);
            }
            let address = address as *mut std::ffi::c_void;
            let (dims, strides) = (dims.as_ptr(), strides.as_ptr());
            let (boxes, elements) = (box_dims.as_ptr(), element_strides.as_ptr());
            let [interleave, swizzle, l2, oob] = modes;
            // SAFETY: local arrays of the lengths the rank needs; the enums are the client's
            // integers, which the driver checks.
            unsafe {
                cu_call_raw!(
                    driver,
                    cuTensorMapEncodeTiled(
                        out: *mut CUtensorMap,
                        data_type: u32,
                        rank: u32,
                        address: *mut std::ffi::c_void,
                        dims: *const u64,
                        strides: *const u64,
                        boxes: *const u32,
                        elements: *const u32,
                        interleave: u32,
                        swizzle: u32,
                        l2: u32,
                        oob: u32,
                    )
                )
            }
        }
        TensorMapRequest::Im2col {
            data_type,
            address,
            dims,
            strides,
            lower_corner,
            upper_corner,
            channels,
            pixels,
            element_strides,
            modes,
        } => {
            let rank = dims.len() as u32;
            if rank < 3
                || strides.len() + 1 < dims.len()
                || element_strides.len() != dims.len()
                || lower_corner.len() + 2 < dims.len()
                || upper_corner.len() + 2 < dims.len()
            {
                return Err(INVALID_VALUE);
            }
            let address = address as *mut std::ffi::c_void;
            let (dims, strides) = (dims.as_ptr(), strides.as_ptr());
            let (lower, upper) = (lower_corner.as_ptr(), upper_corner.as_ptr());
            let elements = element_strides.as_ptr();
            let [interleave, swizzle, l2, oob] = modes;
            // SAFETY: as above.
            unsafe {
                cu_call_raw!(
                    driver,
                    cuTensorMapEncodeIm2col(
                        out: *mut CUtensorMap,
                        data_type: u32,
                        rank: u32,
                        address: *mut std::ffi::c_void,
                        dims: *const u64,
                        strides: *const u64,
                        lower: *const i32,
                        upper: *const i32,
                        channels: u32,
                        pixels: u32,
                        elements: *const u32,
                        interleave: u32,
                        swizzle: u32,
                        l2: u32,
                        oob: u32,
                    )
                )
            }
        }
        TensorMapRequest::ReplaceAddress { map: old, address } => {
            if old.len() != std::mem::size_of::<CUtensorMap>() {
                return Err(INVALID_VALUE);
            }
            // SAFETY: `old` holds exactly one map's bytes.
            unsafe { std::ptr::copy_nonoverlapping(old.as_ptr(), out.cast::<u8>(), old.len()) };
            // SAFETY: a local map and an address the driver checks.
            unsafe {
                cu_call!(
                    driver,
                    cuTensorMapReplaceAddress(out, address as *mut std::ffi::c_void)
                )
            }
        }
    };
    check(status)?;
    // SAFETY: the map's bytes.
    let bytes =
        unsafe { std::slice::from_raw_parts(out.cast::<u8>(), std::mem::size_of::<CUtensorMap>()) };
    Ok(bytes.to_vec())
}
