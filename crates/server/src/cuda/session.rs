//! A session's CUDA objects and the carrying out of CUDA requests.
//!
//! Everything runs on the session's request thread, so the driver's per-thread current context
//! is this session's alone; `enter` switches it only when a request names another context.
//! Each session gets its own contexts (its stand-in for a device's primary context is a context
//! of its own, not the process's primary context), so a session's faults and leaks end with it:
//! destroying its contexts at close frees every allocation, module, stream and event it made.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::ptr::null_mut;
use std::sync::Arc;

use rgpu_cuda_api::generated::{func_cache, function_attribute, limit, FUNCTION_ATTRIBUTE_VALUES};
use rgpu_cuda_api::launch_param;
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{
    CuReply, CuRequest, Extent, FunctionInfo, Id, ImageKind, LaunchAttribute, MemAccess, MemProp,
    OccupancyQuery, Pitch, VmmOp,
};
use rgpu_protocol::ServerMsg;
use sha2::{Digest, Sha256};

use super::pieces::{pieces, Piece};
use super::staging::{Staging, CHUNK};
use super::Backend;
use crate::limits::Usage;
use crate::session::{End, Session};
use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::{check, Status, INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED, SUCCESS};

const INVALID_CONTEXT: Status = cudaError_enum::CUDA_ERROR_INVALID_CONTEXT as u32;
const INVALID_DEVICE: Status = cudaError_enum::CUDA_ERROR_INVALID_DEVICE as u32;
const OUT_OF_MEMORY: Status = cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY as u32;
/// The largest module image a client may send.
const MAX_IMAGE_BYTES: u64 = 4 << 30;

struct Context {
    raw: CUcontext,
    device: u32,
}

enum ImageHandle {
    Module(CUmodule),
    Library(CUlibrary),
}

struct Image {
    handle: ImageHandle,
    /// The driver may read a library's image lazily, at first use of a kernel.
    _bytes: Arc<Vec<u8>>,
}

/// A launchable: a module function or a library kernel (the driver takes either as CUfunction).
#[derive(Clone, Copy)]
struct Function {
    raw: CUfunction,
    is_kernel: bool,
}

/// The rows of a device-to-device copy: `extent`, lying `src_pitch` / `dst_pitch` apart.
#[derive(Clone, Copy)]
struct DeviceCopy {
    dst: u64,
    dst_pitch: Pitch,
    src: u64,
    src_pitch: Pitch,
    extent: Extent,
}

impl DeviceCopy {
    fn descriptor(&self) -> CUDA_MEMCPY3D {
        let device = CUmemorytype::CU_MEMORYTYPE_DEVICE;
        // With one slice the rows per slice do not matter; the driver still wants them to hold
        // the copy's rows.
        let slice_rows = |pitch: Pitch| match self.extent.depth {
            0 | 1 => pitch.slice_rows.max(self.extent.height) as usize,
            _ => pitch.slice_rows as usize,
        };
        CUDA_MEMCPY3D {
            srcXInBytes: 0,
            srcY: 0,
            srcZ: 0,
            srcLOD: 0,
            srcMemoryType: device,
            srcHost: std::ptr::null(),
            srcDevice: self.src,
            srcArray: null_mut(),
            reserved0: null_mut(),
            srcPitch: self.src_pitch.row as usize,
            srcHeight: slice_rows(self.src_pitch),
            dstXInBytes: 0,
            dstY: 0,
            dstZ: 0,
            dstLOD: 0,
            dstMemoryType: device,
            dstHost: null_mut(),
            dstDevice: self.dst,
            dstArray: null_mut(),
            reserved1: null_mut(),
            dstPitch: self.dst_pitch.row as usize,
            dstHeight: slice_rows(self.dst_pitch),
            WidthInBytes: self.extent.width as usize,
            Height: self.extent.height as usize,
            Depth: self.extent.depth as usize,
        }
    }

    fn peer_descriptor(&self, dst_ctx: CUcontext, src_ctx: CUcontext) -> CUDA_MEMCPY3D_PEER {
        let d = self.descriptor();
        CUDA_MEMCPY3D_PEER {
            srcXInBytes: 0,
            srcY: 0,
            srcZ: 0,
            srcLOD: 0,
            srcMemoryType: d.srcMemoryType,
            srcHost: d.srcHost,
            srcDevice: d.srcDevice,
            srcArray: null_mut(),
            srcContext: src_ctx,
            srcPitch: d.srcPitch,
            srcHeight: d.srcHeight,
            dstXInBytes: 0,
            dstY: 0,
            dstZ: 0,
            dstLOD: 0,
            dstMemoryType: d.dstMemoryType,
            dstHost: d.dstHost,
            dstDevice: d.dstDevice,
            dstArray: null_mut(),
            dstContext: dst_ctx,
            dstPitch: d.dstPitch,
            dstHeight: d.dstHeight,
            WidthInBytes: d.WidthInBytes,
            Height: d.Height,
            Depth: d.Depth,
        }
    }
}

/// What a quota charge is kept by: a device pointer, or a VMM handle's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Charged {
    Pointer(u64),
    Handle(Id),
}

pub(crate) struct CudaSession {
    backend: Arc<Backend>,
    contexts: HashMap<Id, Context>,
    /// The session's stand-in for each device's primary context.
    primary: HashMap<u32, CUcontext>,
    current: CUcontext,
    current_device: u32,
    streams: HashMap<Id, CUstream>,
    events: HashMap<Id, CUevent>,
    images: HashMap<Id, Image>,
    functions: HashMap<Id, Function>,
    /// Stream-ordered allocations not yet freed, with their context: they come from the
    /// device's pool, which outlives contexts, so the session frees them itself at the end.
    async_allocations: HashMap<u64, CUcontext>,
    /// Bytes each allocation (plain, stream-ordered, VMM handle) counts against the session's
    /// memory quota.
    charged: HashMap<Charged, u64>,
    /// The session's memory and object counts (shared with its OpenCL tables).
    usage: Arc<Usage>,
    /// Graphs captured from streams, and their executable instances.
    graphs: HashMap<Id, CUgraph>,
    graph_execs: HashMap<Id, CUgraphExec>,
    /// Virtual memory management: physical allocations, mappings and address reservations.
    /// They belong to the device, not to a context, so the session undoes them at its end.
    vmm_handles: HashMap<Id, CUmemGenericAllocationHandle>,
    vmm_mappings: HashMap<u64, u64>,
    vmm_reservations: HashMap<u64, u64>,
    staging: Staging,
    /// The launch parameter buffer, reused across launches.
    params: Vec<u8>,
    /// The first error of a fire-and-forget request since the last synchronizing reply.
    deferred: Option<Status>,
}

impl CudaSession {
    pub fn new(backend: Arc<Backend>, usage: Arc<Usage>) -> CudaSession {
        CudaSession {
            charged: HashMap::new(),
            usage,
            backend,
            contexts: HashMap::new(),
            primary: HashMap::new(),
            current: null_mut(),
            current_device: 0,
            streams: HashMap::new(),
            events: HashMap::new(),
            images: HashMap::new(),
            functions: HashMap::new(),
            async_allocations: HashMap::new(),
            graphs: HashMap::new(),
            graph_execs: HashMap::new(),
            vmm_handles: HashMap::new(),
            vmm_mappings: HashMap::new(),
            vmm_reservations: HashMap::new(),
            staging: Staging::default(),
            params: Vec::new(),
            deferred: None,
        }
    }

    /// Destroys every context the session made (which frees everything in them). Returns how
    /// many objects the client had left.
    pub fn close(&mut self) -> usize {
        let driver = &self.backend.driver;
        let count = self.streams.len()
            + self.events.len()
            + self.images.len()
            + self.functions.len()
            + self.contexts.len();
        let mut raws: Vec<CUcontext> = self.primary.values().copied().collect();
        raws.extend(
            self.contexts
                .values()
                .map(|c| c.raw)
                .filter(|raw| !self.primary.values().any(|p| p == raw)),
        );
        if !self.vmm_mappings.is_empty() || !self.vmm_handles.is_empty() {
            if let Some(&any) = raws.first() {
                cu_call!(driver, cuCtxSetCurrent(any));
                cu_call!(driver, cuCtxSynchronize());
            }
        }
        for (ptr, size) in self.vmm_mappings.drain() {
            cu_call!(driver, cuMemUnmap(ptr, size as usize));
        }
        for (_, handle) in self.vmm_handles.drain() {
            cu_call!(driver, cuMemRelease(handle));
        }
        for (ptr, size) in self.vmm_reservations.drain() {
            cu_call!(driver, cuMemAddressFree(ptr, size as usize));
        }
        for (_, exec) in self.graph_execs.drain() {
            cu_call!(driver, cuGraphExecDestroy(exec));
        }
        for (_, graph) in self.graphs.drain() {
            cu_call!(driver, cuGraphDestroy(graph));
        }
        for (ptr, ctx) in self.async_allocations.drain() {
            cu_call!(driver, cuCtxSetCurrent(ctx));
            cu_call!(driver, cuMemFreeAsync(ptr, null_mut()));
            cu_call!(driver, cuCtxSynchronize());
        }
        for &raw in &raws {
            cu_call!(driver, cuCtxSetCurrent(raw));
            self.staging.forget_context(driver, raw);
        }
        cu_call!(driver, cuCtxSetCurrent(null_mut()));
        for raw in raws {
            let status = cu_call!(driver, cuCtxDestroy_v2(raw));
            if status != SUCCESS {
                log::debug!("cuCtxDestroy at session end: CUDA error {status}");
            }
        }
        self.contexts.clear();
        self.primary.clear();
        self.streams.clear();
        self.events.clear();
        self.images.clear();
        self.functions.clear();
        self.current = null_mut();
        count
    }

    fn defer(&mut self, what: &str, status: Status) {
        if status != SUCCESS {
            log::debug!("{what} failed: CUDA error {status}; deferred");
            self.deferred.get_or_insert(status);
        }
    }

    /// The status a synchronizing request reports: its own error, else a deferred one.
    fn sync_status(&mut self, status: Status) -> Status {
        let deferred = self.deferred.take();
        if status != SUCCESS {
            status
        } else {
            deferred.unwrap_or(SUCCESS)
        }
    }

    /// Makes the client's context `ctx` current on this thread.
    fn enter(&mut self, ctx: Id) -> Result<(), Status> {
        let context = self.contexts.get(&ctx).ok_or(INVALID_CONTEXT)?;
        if context.raw != self.current {
            check(cu_call!(self.backend.driver, cuCtxSetCurrent(context.raw)))?;
            self.current = context.raw;
            self.current_device = context.device;
        }
        Ok(())
    }

    /// Makes a driver object in the client's context `ctx`: `make` fills in its handle.
    fn create_in<T>(
        &mut self,
        ctx: Id,
        make: impl FnOnce(&CudaSession, &mut *mut T) -> Result<(), Status>,
    ) -> Result<*mut T, Status> {
        self.enter(ctx)?;
        if !self.usage.has_room_for_object() {
            return Err(OUT_OF_MEMORY);
        }
        let mut raw = null_mut();
        make(self, &mut raw)?;
        self.usage.add_objects(1);
        Ok(raw)
    }

    /// An object made by `create_in` was destroyed.
    fn destroyed(&self) {
        self.usage.remove_objects(1);
    }

    /// Runs `allocate` if the memory quota has room for `size` more bytes, and keeps them
    /// counted (by the pointer or handle `allocate` returns) if it succeeds.
    fn charged_allocation(
        &mut self,
        size: u64,
        allocate: impl FnOnce(&mut CudaSession) -> Result<Charged, Status>,
    ) -> Result<u64, Status> {
        if !self.usage.charge_memory(size) {
            return Err(OUT_OF_MEMORY);
        }
        match allocate(self) {
            Ok(key) => {
                self.charged.insert(key, size);
                Ok(match key {
                    Charged::Pointer(ptr) => ptr,
                    Charged::Handle(id) => id,
                })
            }
            Err(status) => {
                self.usage.refund_memory(size);
                Err(status)
            }
        }
    }

    /// Gives back what the allocation `key` counted.
    fn uncharge(&mut self, key: Charged) {
        if let Some(size) = self.charged.remove(&key) {
            self.usage.refund_memory(size);
        }
    }

    fn stream(&self, id: Id) -> Result<CUstream, Status> {
        if id == 0 {
            return Ok(null_mut());
        }
        self.streams.get(&id).copied().ok_or(INVALID_HANDLE)
    }

    fn event(&self, id: Id) -> Result<CUevent, Status> {
        self.events.get(&id).copied().ok_or(INVALID_HANDLE)
    }

    fn function(&self, id: Id) -> Result<Function, Status> {
        self.functions.get(&id).copied().ok_or(INVALID_HANDLE)
    }

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
            None => {
                let mut raw = null_mut();
                let status = cu_call!(
                    driver,
                    cuCtxCreate_v4(&mut raw, null_mut(), flags, device as CUdevice)
                );
                if status != SUCCESS {
                    return status;
                }
                // cuCtxCreate pushed the new context; keep the thread's state as recorded.
                let mut popped = null_mut();
                cu_call!(driver, cuCtxPopCurrent_v2(&mut popped));
                if !self.current.is_null() {
                    cu_call!(driver, cuCtxSetCurrent(self.current));
                }
                if primary {
                    self.primary.insert(device, raw);
                }
                raw
            }
        };
        self.contexts.insert(id, Context { raw, device });
        SUCCESS
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
            cu_call!(driver, cuCtxSetCurrent(null_mut()));
            self.current = null_mut();
        }
        cu_call!(driver, cuCtxDestroy_v2(context.raw))
    }

    /// A device-to-device copy on `stream` of `ctx`; `src_ctx` (when not 0) is the context of
    /// `src`, of another device of this server (a peer copy).
    fn copy_on_device(
        &mut self,
        ctx: Id,
        stream: Id,
        src_ctx: Id,
        copy: DeviceCopy,
    ) -> Result<(), Status> {
        if !copy.extent.fits(copy.src_pitch) || !copy.extent.fits(copy.dst_pitch) {
            return Err(INVALID_VALUE);
        }
        let peer = match src_ctx {
            0 => None,
            id => Some(self.contexts.get(&id).ok_or(INVALID_CONTEXT)?.raw),
        };
        self.enter(ctx)?;
        let stream = self.stream(stream)?;
        let driver = &self.backend.driver;
        let DeviceCopy {
            dst, src, extent, ..
        } = copy;
        let contiguous =
            extent.is_contiguous(copy.src_pitch) && extent.is_contiguous(copy.dst_pitch);
        let size = extent.bytes().ok_or(INVALID_VALUE)? as usize;
        let status = match (peer, contiguous) {
            (None, true) => cu_call!(driver, cuMemcpyDtoDAsync_v2(dst, src, size, stream)),
            (Some(src_ctx), true) => cu_call!(
                driver,
                cuMemcpyPeerAsync(dst, self.current, src, src_ctx, size, stream)
            ),
            (None, false) => cu_call!(driver, cuMemcpy3DAsync_v2(&copy.descriptor(), stream)),
            (Some(src_ctx), false) => {
                let peer_copy = copy.peer_descriptor(self.current, src_ctx);
                cu_call!(driver, cuMemcpy3DPeerAsync(&peer_copy, stream))
            }
        };
        check(status)
    }

    /// `cuCtxEnablePeerAccess` (`flags` given) or `cuCtxDisablePeerAccess` in `ctx` for `peer`.
    fn peer_access(&mut self, ctx: Id, peer: Id, flags: Option<u32>) -> Result<(), Status> {
        let peer = self.contexts.get(&peer).ok_or(INVALID_CONTEXT)?.raw;
        self.enter(ctx)?;
        let driver = &self.backend.driver;
        check(match flags {
            Some(flags) => cu_call!(driver, cuCtxEnablePeerAccess(peer, flags)),
            None => cu_call!(driver, cuCtxDisablePeerAccess(peer)),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn memset(
        &mut self,
        stream: CUstream,
        dst: u64,
        value: u32,
        element_size: u8,
        width: usize,
        height: usize,
        pitch: usize,
    ) -> Status {
        let driver = &self.backend.driver;
        match (element_size, height > 1) {
            (1, false) => cu_call!(driver, cuMemsetD8Async(dst, value as u8, width, stream)),
            (2, false) => cu_call!(driver, cuMemsetD16Async(dst, value as u16, width, stream)),
            (4, false) => cu_call!(driver, cuMemsetD32Async(dst, value, width, stream)),
            (1, true) => cu_call!(
                driver,
                cuMemsetD2D8Async(dst, pitch, value as u8, width, height, stream)
            ),
            (2, true) => cu_call!(
                driver,
                cuMemsetD2D16Async(dst, pitch, value as u16, width, height, stream)
            ),
            (4, true) => cu_call!(
                driver,
                cuMemsetD2D32Async(dst, pitch, value, width, height, stream)
            ),
            _ => INVALID_VALUE,
        }
    }

    fn load_image(&mut self, id: Id, ctx: Id, kind: ImageKind, bytes: Arc<Vec<u8>>) -> Status {
        if let Err(status) = self.enter(ctx) {
            return status;
        }
        let driver = &self.backend.driver;
        let code = bytes.as_ptr().cast();
        let handle = match kind {
            ImageKind::Module => {
                let mut module = null_mut();
                let status = cu_call!(driver, cuModuleLoadData(&mut module, code));
                if status != SUCCESS {
                    return status;
                }
                ImageHandle::Module(module)
            }
            ImageKind::Library => {
                let mut library = null_mut();
                let status = cu_call!(
                    driver,
                    cuLibraryLoadData(
                        &mut library,
                        code,
                        null_mut(),
                        null_mut(),
                        0,
                        null_mut(),
                        null_mut(),
                        0
                    )
                );
                if status != SUCCESS {
                    return status;
                }
                ImageHandle::Library(library)
            }
        };
        self.images.insert(
            id,
            Image {
                handle,
                _bytes: bytes,
            },
        );
        SUCCESS
    }

    fn unload_image(&mut self, id: Id) -> Status {
        let driver = &self.backend.driver;
        match self.images.remove(&id) {
            Some(Image {
                handle: ImageHandle::Module(module),
                ..
            }) => cu_call!(driver, cuModuleUnload(module)),
            Some(Image {
                handle: ImageHandle::Library(library),
                ..
            }) => cu_call!(driver, cuLibraryUnload(library)),
            None => INVALID_HANDLE,
        }
    }

    fn get_function(&mut self, id: Id, image: Id, name: &str) -> Result<FunctionInfo, Status> {
        let name = CString::new(name).map_err(|_| INVALID_VALUE)?;
        let driver = &self.backend.driver;
        let function = match self.images.get(&image).map(|i| &i.handle) {
            Some(ImageHandle::Module(module)) => {
                let mut raw = null_mut();
                check(cu_call!(
                    driver,
                    cuModuleGetFunction(&mut raw, *module, name.as_ptr())
                ))?;
                Function {
                    raw,
                    is_kernel: false,
                }
            }
            Some(ImageHandle::Library(library)) => {
                let mut kernel = null_mut();
                check(cu_call!(
                    driver,
                    cuLibraryGetKernel(&mut kernel, *library, name.as_ptr())
                ))?;
                Function {
                    raw: kernel.cast(),
                    is_kernel: true,
                }
            }
            None => return Err(INVALID_HANDLE),
        };
        let info = self.describe_function(function);
        self.functions.insert(id, function);
        Ok(info)
    }

    fn kernel_get_function(&mut self, id: Id, kernel: Id, ctx: Id) -> Result<FunctionInfo, Status> {
        self.enter(ctx)?;
        let kernel = self.function(kernel)?;
        if !kernel.is_kernel {
            return Err(INVALID_HANDLE);
        }
        let mut raw = null_mut();
        check(cu_call!(
            self.backend.driver,
            cuKernelGetFunction(&mut raw, kernel.raw.cast())
        ))?;
        let function = Function {
            raw,
            is_kernel: false,
        };
        let info = self.describe_function(function);
        self.functions.insert(id, function);
        Ok(info)
    }

    /// The parameter layout and attributes the client caches for a function.
    fn describe_function(&self, function: Function) -> FunctionInfo {
        let driver = &self.backend.driver;
        let mut params = Vec::new();
        loop {
            let (mut offset, mut size) = (0usize, 0usize);
            let index = params.len();
            let status = if function.is_kernel {
                cu_call!(
                    driver,
                    cuKernelGetParamInfo(function.raw.cast(), index, &mut offset, &mut size)
                )
            } else {
                cu_call!(
                    driver,
                    cuFuncGetParamInfo(function.raw, index, &mut offset, &mut size)
                )
            };
            if status != SUCCESS {
                break;
            }
            params.push((offset as u32, size as u32));
        }
        let device = self.current_device;
        let attributes = FUNCTION_ATTRIBUTE_VALUES
            .iter()
            .filter_map(|&value| {
                let answer = function_attribute_raw(driver, function, value, device).ok()?;
                Some((value, answer))
            })
            .collect();
        FunctionInfo { params, attributes }
    }

    fn get_global(&mut self, ctx: Id, image: Id, name: &str) -> Result<(u64, u64), Status> {
        self.enter(ctx)?;
        let name = CString::new(name).map_err(|_| INVALID_VALUE)?;
        let driver = &self.backend.driver;
        let (mut ptr, mut size) = (0u64, 0usize);
        let status = match self.images.get(&image).map(|i| &i.handle) {
            Some(ImageHandle::Module(module)) => cu_call!(
                driver,
                cuModuleGetGlobal_v2(&mut ptr, &mut size, *module, name.as_ptr())
            ),
            Some(ImageHandle::Library(library)) => cu_call!(
                driver,
                cuLibraryGetGlobal(&mut ptr, &mut size, *library, name.as_ptr())
            ),
            None => INVALID_HANDLE,
        };
        check(status).map(|()| (ptr, size as u64))
    }

    fn set_function_attribute(
        &mut self,
        function: Id,
        attribute: u32,
        value: i32,
        device: u32,
    ) -> Status {
        let (Ok(function), Some(attribute)) =
            (self.function(function), function_attribute(attribute))
        else {
            return INVALID_VALUE;
        };
        let driver = &self.backend.driver;
        if function.is_kernel {
            cu_call!(
                driver,
                cuKernelSetAttribute(attribute, value, function.raw.cast(), device as CUdevice)
            )
        } else {
            cu_call!(driver, cuFuncSetAttribute(function.raw, attribute, value))
        }
    }

    /// Launches with the parameter buffer in `self.params`.
    fn launch(
        &mut self,
        function: Id,
        stream: Id,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        attributes: &[LaunchAttribute],
    ) -> Status {
        let (function, stream) = match (self.function(function), self.stream(stream)) {
            (Ok(f), Ok(s)) => (f, s),
            (Err(e), _) | (_, Err(e)) => return e,
        };
        let mut size = self.params.len();
        let mut extra = [
            launch_param::BUFFER_POINTER as *mut c_void,
            self.params.as_mut_ptr().cast(),
            launch_param::BUFFER_SIZE as *mut c_void,
            (&mut size as *mut usize).cast(),
            launch_param::END as *mut c_void,
        ];
        let driver = &self.backend.driver;
        if attributes.is_empty() {
            return cu_call!(
                driver,
                cuLaunchKernel(
                    function.raw,
                    grid[0],
                    grid[1],
                    grid[2],
                    block[0],
                    block[1],
                    block[2],
                    shared_mem,
                    stream,
                    null_mut(),
                    extra.as_mut_ptr()
                )
            );
        }
        let Some(mut attrs) = launch_attributes(attributes) else {
            return INVALID_VALUE;
        };
        let config = launch_config(grid, block, shared_mem, stream, &mut attrs);
        cu_call!(
            driver,
            cuLaunchKernelEx(&config, function.raw, null_mut(), extra.as_mut_ptr())
        )
    }

    fn occupancy(&mut self, ctx: Id, query: &OccupancyQuery) -> Result<i64, Status> {
        self.enter(ctx)?;
        let driver = &self.backend.driver;
        match *query {
            OccupancyQuery::MaxActiveBlocks {
                function,
                block_size,
                shared_mem,
                flags,
            } => {
                let function = self.function(function)?;
                let mut blocks = 0;
                check(cu_call!(
                    driver,
                    cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
                        &mut blocks,
                        function.raw,
                        block_size,
                        shared_mem as usize,
                        flags
                    )
                ))?;
                Ok(blocks as i64)
            }
            OccupancyQuery::AvailableDynamicSharedMem {
                function,
                num_blocks,
                block_size,
            } => {
                let function = self.function(function)?;
                let mut bytes = 0usize;
                check(cu_call!(
                    driver,
                    cuOccupancyAvailableDynamicSMemPerBlock(
                        &mut bytes,
                        function.raw,
                        num_blocks,
                        block_size
                    )
                ))?;
                Ok(bytes as i64)
            }
            OccupancyQuery::MaxPotentialBlockSize {
                function,
                shared_mem,
                block_size_limit,
                flags,
            } => {
                let function = self.function(function)?;
                let (mut min_grid, mut block) = (0, 0);
                check(cu_call!(
                    driver,
                    cuOccupancyMaxPotentialBlockSizeWithFlags(
                        &mut min_grid,
                        &mut block,
                        function.raw,
                        None,
                        shared_mem as usize,
                        block_size_limit,
                        flags
                    )
                ))?;
                // Both answers in one value: min grid size high, block size low.
                Ok(((min_grid as i64) << 32) | block as u32 as i64)
            }
            OccupancyQuery::MaxActiveClusters {
                function,
                grid,
                block,
                shared_mem,
                ref attributes,
            } => {
                let function = self.function(function)?;
                let mut attrs = launch_attributes(attributes).ok_or(INVALID_VALUE)?;
                let config = launch_config(grid, block, shared_mem, null_mut(), &mut attrs);
                let mut clusters = 0;
                check(cu_call!(
                    driver,
                    cuOccupancyMaxActiveClusters(&mut clusters, function.raw, &config)
                ))?;
                Ok(clusters as i64)
            }
        }
    }
}

impl CudaSession {
    /// The virtual memory management calls, in the current context.
    fn vmm(&mut self, op: VmmOp) -> CuReply {
        let driver = &self.backend.driver;
        match op {
            VmmOp::Granularity { prop, option } => {
                let prop = allocation_prop(&prop);
                let mut granularity = 0usize;
                let Some(entry) = driver.fns.cuMemGetAllocationGranularity else {
                    return CuReply::Status(NOT_SUPPORTED);
                };
                // SAFETY: the option enum is a 32-bit integer in the C ABI; the driver checks it.
                let entry: unsafe extern "C" fn(
                    *mut usize,
                    *const CUmemAllocationProp,
                    u32,
                ) -> Status = unsafe { std::mem::transmute(entry) };
                // SAFETY: valid out-pointer and property struct.
                let status = unsafe { entry(&mut granularity, &prop, option) };
                value_reply(check(status).map(|()| granularity as i64))
            }
            VmmOp::Reserve {
                size,
                alignment,
                addr,
                flags,
            } => {
                let mut ptr = 0u64;
                let status = cu_call!(
                    driver,
                    cuMemAddressReserve(&mut ptr, size as usize, alignment as usize, addr, flags)
                );
                if status == SUCCESS {
                    self.vmm_reservations.insert(ptr, size);
                }
                CuReply::Pointer { status, ptr }
            }
            VmmOp::Create {
                handle,
                size,
                prop,
                flags,
            } => {
                let prop = allocation_prop(&prop);
                let created = self.charged_allocation(size, |cuda| {
                    let mut raw = 0;
                    check(cu_call!(
                        cuda.backend.driver,
                        cuMemCreate(&mut raw, size as usize, &prop, flags)
                    ))?;
                    cuda.vmm_handles.insert(handle, raw);
                    Ok(Charged::Handle(handle))
                });
                CuReply::Status(code(created.map(drop)))
            }
            VmmOp::Map {
                ptr,
                size,
                offset,
                handle,
                flags,
            } => {
                let Some(&raw) = self.vmm_handles.get(&handle) else {
                    return CuReply::Status(INVALID_HANDLE);
                };
                let status = cu_call!(
                    driver,
                    cuMemMap(ptr, size as usize, offset as usize, raw, flags)
                );
                if status == SUCCESS {
                    self.vmm_mappings.insert(ptr, size);
                }
                CuReply::Status(status)
            }
            VmmOp::SetAccess { ptr, size, access } => {
                let descs: Vec<CUmemAccessDesc> = access.iter().map(access_desc).collect();
                CuReply::Status(cu_call!(
                    driver,
                    cuMemSetAccess(ptr, size as usize, descs.as_ptr(), descs.len())
                ))
            }
            VmmOp::Unmap { ptr, size } => {
                let status = cu_call!(driver, cuMemUnmap(ptr, size as usize));
                if status == SUCCESS {
                    self.vmm_mappings.remove(&ptr);
                }
                CuReply::Status(status)
            }
            VmmOp::Release { handle } => match self.vmm_handles.remove(&handle) {
                Some(raw) => {
                    let status = cu_call!(driver, cuMemRelease(raw));
                    self.uncharge(Charged::Handle(handle));
                    CuReply::Status(status)
                }
                None => CuReply::Status(INVALID_HANDLE),
            },
            VmmOp::AddressFree { ptr, size } => {
                let status = cu_call!(driver, cuMemAddressFree(ptr, size as usize));
                if status == SUCCESS {
                    self.vmm_reservations.remove(&ptr);
                }
                CuReply::Status(status)
            }
        }
    }
}

// `allocation_prop` writes the allocation flags as 8 bytes.
const _: () = assert!(std::mem::size_of::<CUmemAllocationProp_st__bindgen_ty_1>() == 8);

/// `CUmemAllocationProp` from its wire form. Its enum fields are written as the integers the
/// client sent (the driver checks them), never as Rust enum values.
fn allocation_prop(prop: &MemProp) -> CUmemAllocationProp {
    // SAFETY: plain data for which all-zero bytes are valid; fields are written through raw
    // pointers at their offsets, each an integer of the written width.
    unsafe {
        let mut raw: CUmemAllocationProp = std::mem::zeroed();
        let base = std::ptr::addr_of_mut!(raw);
        std::ptr::addr_of_mut!((*base).type_)
            .cast::<u32>()
            .write(prop.kind);
        std::ptr::addr_of_mut!((*base).requestedHandleTypes)
            .cast::<u32>()
            .write(prop.handle_types);
        std::ptr::addr_of_mut!((*base).location.type_)
            .cast::<u32>()
            .write(prop.location_type);
        (*base).location.id = prop.location_id;
        std::ptr::addr_of_mut!((*base).allocFlags)
            .cast::<[u8; 8]>()
            .write_unaligned(prop.alloc_flags);
        raw
    }
}

fn access_desc(access: &MemAccess) -> CUmemAccessDesc {
    // SAFETY: as in `allocation_prop`.
    unsafe {
        let mut raw: CUmemAccessDesc = std::mem::zeroed();
        let base = std::ptr::addr_of_mut!(raw);
        std::ptr::addr_of_mut!((*base).location.type_)
            .cast::<u32>()
            .write(access.location_type);
        (*base).location.id = access.location_id;
        std::ptr::addr_of_mut!((*base).flags)
            .cast::<u32>()
            .write(access.flags);
        raw
    }
}

fn launch_config(
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    stream: CUstream,
    attrs: &mut [CUlaunchAttribute],
) -> CUlaunchConfig {
    CUlaunchConfig {
        gridDimX: grid[0],
        gridDimY: grid[1],
        gridDimZ: grid[2],
        blockDimX: block[0],
        blockDimY: block[1],
        blockDimZ: block[2],
        sharedMemBytes: shared_mem,
        hStream: stream,
        attrs: attrs.as_mut_ptr(),
        numAttrs: attrs.len() as u32,
    }
}

/// Rebuilds launch attributes from their wire form; `None` if one is malformed.
fn launch_attributes(attributes: &[LaunchAttribute]) -> Option<Vec<CUlaunchAttribute>> {
    let value_offset = std::mem::offset_of!(CUlaunchAttribute, value);
    let value_size = std::mem::size_of::<CUlaunchAttributeValue>();
    attributes
        .iter()
        .map(|attribute| {
            if attribute.value.len() > value_size {
                return None;
            }
            // SAFETY: CUlaunchAttribute is plain data for which all-zero bytes are valid (id 0
            // is CU_LAUNCH_ATTRIBUTE_IGNORE); the id and value bytes are written inside it.
            unsafe {
                let mut raw: CUlaunchAttribute = std::mem::zeroed();
                let base = (&mut raw as *mut CUlaunchAttribute).cast::<u8>();
                base.cast::<u32>().write_unaligned(attribute.id);
                std::ptr::copy_nonoverlapping(
                    attribute.value.as_ptr(),
                    base.add(value_offset),
                    attribute.value.len(),
                );
                Some(raw)
            }
        })
        .collect()
}

impl Session {
    /// Carries out one CUDA request and sends its reply, if it has one. `Err` ends the session.
    pub(crate) fn handle_cuda(
        &mut self,
        seq: u64,
        bulk_len: u64,
        request: CuRequest,
    ) -> Result<(), End> {
        if bulk_len > 0 && !request.takes_bulk() {
            return Err(End::Protocol(format!(
                "{bulk_len} bytes of bulk data with a request that takes none"
            )));
        }
        let Some(backend) = self.shared.cuda.clone() else {
            return self.refuse_cuda(seq, &request);
        };
        let mut cuda = self
            .cuda
            .take()
            .unwrap_or_else(|| CudaSession::new(backend, self.handles.usage.clone()));
        let result = self.carry_out(&mut cuda, seq, bulk_len, request);
        self.cuda = Some(cuda);
        result
    }

    /// A server without CUDA: an empty inventory, and NOT_SUPPORTED for anything else.
    fn refuse_cuda(&mut self, seq: u64, request: &CuRequest) -> Result<(), End> {
        self.drop_bulk()?;
        match request {
            CuRequest::GetInventory => self.cu_reply(seq, CuReply::Inventory(Default::default())),
            request if request.expects_reply() => {
                self.cu_reply(seq, CuReply::Status(NOT_SUPPORTED))
            }
            _ => Ok(()),
        }
    }

    fn cu_reply(&self, seq: u64, reply: CuReply) -> Result<(), End> {
        self.send(&ServerMsg::Cu(reply), seq, &[])
    }

    fn carry_out(
        &mut self,
        cuda: &mut CudaSession,
        seq: u64,
        bulk_len: u64,
        request: CuRequest,
    ) -> Result<(), End> {
        let status_reply = |status: Result<(), Status>| CuReply::Status(code(status));
        match request {
            CuRequest::GetInventory => {
                self.cu_reply(seq, CuReply::Inventory(cuda.backend.inventory.clone()))
            }
            CuRequest::CreateContext {
                id,
                device,
                flags,
                primary,
            } => {
                let status = cuda.create_context(id, device, flags, primary);
                cuda.defer("context creation", status);
                Ok(())
            }
            CuRequest::DestroyContext { id } => {
                let status = cuda.destroy_context(id);
                cuda.defer("cuCtxDestroy", status);
                Ok(())
            }
            CuRequest::Synchronize { ctx } => {
                let status = cuda
                    .enter(ctx)
                    .and_then(|()| check(cu_call!(cuda.backend.driver, cuCtxSynchronize())));
                let status = cuda.sync_status(code(status));
                self.cu_reply(seq, CuReply::Status(status))
            }
            CuRequest::GetLimit { ctx, limit: which } => {
                let result = cuda.enter(ctx).and_then(|()| {
                    let which = limit(which).ok_or(INVALID_VALUE)?;
                    let mut value = 0usize;
                    check(cu_call!(
                        cuda.backend.driver,
                        cuCtxGetLimit(&mut value, which)
                    ))?;
                    Ok(value as i64)
                });
                self.cu_reply(seq, value_reply(result))
            }
            CuRequest::SetLimit {
                ctx,
                limit: which,
                value,
            } => {
                let result = cuda.enter(ctx).and_then(|()| {
                    let which = limit(which).ok_or(INVALID_VALUE)?;
                    check(cu_call!(
                        cuda.backend.driver,
                        cuCtxSetLimit(which, value as usize)
                    ))
                });
                self.cu_reply(seq, status_reply(result))
            }
            CuRequest::MemGetInfo { ctx } => {
                let (mut free, mut total) = (0usize, 0usize);
                let status = cuda.enter(ctx).and_then(|()| {
                    check(cu_call!(
                        cuda.backend.driver,
                        cuMemGetInfo_v2(&mut free, &mut total)
                    ))
                });
                let reply = CuReply::MemInfo {
                    status: code(status),
                    free: free as u64,
                    total: total as u64,
                };
                self.cu_reply(seq, reply)
            }
            CuRequest::MemAlloc { ctx, size } => {
                let allocated = cuda.enter(ctx).and_then(|()| {
                    cuda.charged_allocation(size, |cuda| {
                        let mut ptr = 0u64;
                        check(cu_call!(
                            cuda.backend.driver,
                            cuMemAlloc_v2(&mut ptr, size as usize)
                        ))
                        .map(|()| Charged::Pointer(ptr))
                    })
                });
                let reply = CuReply::Pointer {
                    status: code(allocated.map(drop)),
                    ptr: allocated.unwrap_or(0),
                };
                self.cu_reply(seq, reply)
            }
            CuRequest::MemFree { ctx, ptr } => {
                let status = cuda
                    .enter(ctx)
                    .and_then(|()| check(cu_call!(cuda.backend.driver, cuMemFree_v2(ptr))));
                if status.is_ok() {
                    cuda.uncharge(Charged::Pointer(ptr));
                }
                self.cu_reply(seq, status_reply(status))
            }
            CuRequest::MemAllocAsync { ctx, stream, size } => {
                let allocated = cuda.enter(ctx).and_then(|()| {
                    let stream = cuda.stream(stream)?;
                    cuda.charged_allocation(size, |cuda| {
                        let mut ptr = 0u64;
                        check(cu_call!(
                            cuda.backend.driver,
                            cuMemAllocAsync(&mut ptr, size as usize, stream)
                        ))
                        .map(|()| Charged::Pointer(ptr))
                    })
                });
                if let Ok(ptr) = allocated {
                    cuda.async_allocations.insert(ptr, cuda.current);
                }
                let reply = CuReply::Pointer {
                    status: code(allocated.map(drop)),
                    ptr: allocated.unwrap_or(0),
                };
                self.cu_reply(seq, reply)
            }
            CuRequest::MemFreeAsync { ctx, stream, ptr } => {
                let status = cuda.enter(ctx).and_then(|()| {
                    let stream = cuda.stream(stream)?;
                    check(cu_call!(cuda.backend.driver, cuMemFreeAsync(ptr, stream)))
                });
                if status.is_ok() {
                    cuda.async_allocations.remove(&ptr);
                    cuda.uncharge(Charged::Pointer(ptr));
                }
                cuda.defer("cuMemFreeAsync", code(status));
                Ok(())
            }
            CuRequest::MemcpyHtoD {
                ctx,
                stream,
                dst,
                extent,
                pitch,
            } => {
                let status =
                    self.write_to_device(cuda, ctx, stream, dst, extent, pitch, bulk_len)?;
                cuda.defer("host-to-device copy", status);
                Ok(())
            }
            CuRequest::MemcpyDtoH {
                ctx,
                stream,
                src,
                extent,
                pitch,
            } => self.read_from_device(cuda, seq, ctx, stream, src, extent, pitch),
            CuRequest::MemcpyDtoD {
                ctx,
                stream,
                dst,
                dst_pitch,
                src,
                src_pitch,
                src_ctx,
                extent,
            } => {
                let copy = DeviceCopy {
                    dst,
                    dst_pitch,
                    src,
                    src_pitch,
                    extent,
                };
                let status = cuda.copy_on_device(ctx, stream, src_ctx, copy);
                cuda.defer("device-to-device copy", code(status));
                Ok(())
            }
            CuRequest::EnablePeerAccess { ctx, peer, flags } => {
                let status = cuda.peer_access(ctx, peer, Some(flags));
                self.cu_reply(seq, status_reply(status))
            }
            CuRequest::DisablePeerAccess { ctx, peer } => {
                let status = cuda.peer_access(ctx, peer, None);
                self.cu_reply(seq, status_reply(status))
            }
            CuRequest::Memset {
                ctx,
                stream,
                dst,
                value,
                element_size,
                width,
                height,
                pitch,
            } => {
                let status = match cuda.enter(ctx).and_then(|()| cuda.stream(stream)) {
                    Ok(stream) => cuda.memset(
                        stream,
                        dst,
                        value,
                        element_size,
                        width as usize,
                        height as usize,
                        pitch as usize,
                    ),
                    Err(status) => status,
                };
                cuda.defer("memset", status);
                Ok(())
            }
            CuRequest::LoadImage {
                id,
                ctx,
                kind,
                hash,
            } => {
                let bytes = if bulk_len == 0 {
                    match cuda.backend.image(&hash) {
                        Some(bytes) => bytes,
                        None => {
                            let reply = CuReply::Loaded {
                                status: SUCCESS,
                                need_image: true,
                                log: String::new(),
                            };
                            return self.cu_reply(seq, reply);
                        }
                    }
                } else {
                    if bulk_len > MAX_IMAGE_BYTES {
                        return Err(End::Protocol(format!("a {bulk_len}-byte module image")));
                    }
                    let mut bytes = vec![0u8; bulk_len as usize];
                    self.take_bulk(&mut bytes)?;
                    if Sha256::digest(&bytes).as_slice() != hash {
                        return Err(End::Protocol("module image does not match its hash".into()));
                    }
                    let bytes = Arc::new(bytes);
                    cuda.backend.keep_image(hash, bytes.clone());
                    bytes
                };
                let status = cuda.load_image(id, ctx, kind, bytes);
                let reply = CuReply::Loaded {
                    status,
                    need_image: false,
                    log: String::new(),
                };
                self.cu_reply(seq, reply)
            }
            CuRequest::UnloadImage { id } => {
                let status = cuda.unload_image(id);
                cuda.defer("module unload", status);
                Ok(())
            }
            CuRequest::GetFunction { id, image, name } => {
                let result = cuda.get_function(id, image, &name);
                self.cu_reply(seq, function_reply(result))
            }
            CuRequest::KernelGetFunction { id, kernel, ctx } => {
                let result = cuda.kernel_get_function(id, kernel, ctx);
                self.cu_reply(seq, function_reply(result))
            }
            CuRequest::GetGlobal { ctx, image, name } => {
                let reply = match cuda.get_global(ctx, image, &name) {
                    Ok((ptr, size)) => CuReply::Global {
                        status: SUCCESS,
                        ptr,
                        size,
                    },
                    Err(status) => CuReply::Global {
                        status,
                        ptr: 0,
                        size: 0,
                    },
                };
                self.cu_reply(seq, reply)
            }
            CuRequest::SetFunctionAttribute {
                function,
                attribute,
                value,
                device,
            } => {
                let status = cuda.set_function_attribute(function, attribute, value, device);
                self.cu_reply(seq, CuReply::Status(status))
            }
            CuRequest::GetFunctionAttribute {
                function,
                attribute,
                device,
            } => {
                let result = cuda.function(function).and_then(|f| {
                    let value = function_attribute_raw(&cuda.backend.driver, f, attribute, device);
                    value.map(i64::from)
                });
                self.cu_reply(seq, value_reply(result))
            }
            CuRequest::SetFunctionCacheConfig { function, config } => {
                let status = match (cuda.function(function), func_cache(config)) {
                    (Ok(f), Some(config)) if !f.is_kernel => {
                        cu_call!(cuda.backend.driver, cuFuncSetCacheConfig(f.raw, config))
                    }
                    _ => SUCCESS,
                };
                cuda.defer("cuFuncSetCacheConfig", status);
                Ok(())
            }
            CuRequest::Launch {
                ctx,
                function,
                stream,
                grid,
                block,
                shared_mem,
                attributes,
            } => {
                let mut params = std::mem::take(&mut cuda.params);
                params.resize(bulk_len as usize, 0);
                let read = self.take_bulk(&mut params);
                cuda.params = params;
                read?;
                let status = match cuda.enter(ctx) {
                    Ok(()) => cuda.launch(function, stream, grid, block, shared_mem, &attributes),
                    Err(status) => status,
                };
                cuda.defer("kernel launch", status);
                Ok(())
            }
            CuRequest::CreateStream {
                id,
                ctx,
                flags,
                priority,
            } => {
                let made = cuda.create_in(ctx, |cuda, raw| {
                    check(cu_call!(
                        cuda.backend.driver,
                        cuStreamCreateWithPriority(raw, flags, priority)
                    ))
                });
                match made {
                    Ok(raw) => {
                        cuda.streams.insert(id, raw);
                    }
                    Err(status) => cuda.defer("cuStreamCreate", status),
                }
                Ok(())
            }
            CuRequest::DestroyStream { id } => {
                if let Some(raw) = cuda.streams.remove(&id) {
                    cuda.destroyed();
                    let status = cu_call!(cuda.backend.driver, cuStreamDestroy_v2(raw));
                    cuda.defer("cuStreamDestroy", status);
                }
                Ok(())
            }
            CuRequest::StreamSynchronize { ctx, stream } => {
                let status = cuda.enter(ctx).and_then(|()| {
                    let stream = cuda.stream(stream)?;
                    check(cu_call!(cuda.backend.driver, cuStreamSynchronize(stream)))
                });
                let status = cuda.sync_status(code(status));
                self.cu_reply(seq, CuReply::Status(status))
            }
            CuRequest::StreamQuery { ctx, stream } => {
                let status = cuda.enter(ctx).and_then(|()| {
                    let stream = cuda.stream(stream)?;
                    check(cu_call!(cuda.backend.driver, cuStreamQuery(stream)))
                });
                let status = cuda.sync_status(code(status));
                self.cu_reply(seq, CuReply::Status(status))
            }
            CuRequest::StreamWaitEvent {
                ctx,
                stream,
                event,
                flags,
            } => {
                let status = cuda.enter(ctx).and_then(|()| {
                    let (stream, event) = (cuda.stream(stream)?, cuda.event(event)?);
                    check(cu_call!(
                        cuda.backend.driver,
                        cuStreamWaitEvent(stream, event, flags)
                    ))
                });
                cuda.defer("cuStreamWaitEvent", code(status));
                Ok(())
            }
            CuRequest::CreateEvent { id, ctx, flags } => {
                let made = cuda.create_in(ctx, |cuda, raw| {
                    check(cu_call!(cuda.backend.driver, cuEventCreate(raw, flags)))
                });
                match made {
                    Ok(raw) => {
                        cuda.events.insert(id, raw);
                    }
                    Err(status) => cuda.defer("cuEventCreate", status),
                }
                Ok(())
            }
            CuRequest::DestroyEvent { id } => {
                if let Some(raw) = cuda.events.remove(&id) {
                    cuda.destroyed();
                    let status = cu_call!(cuda.backend.driver, cuEventDestroy_v2(raw));
                    cuda.defer("cuEventDestroy", status);
                }
                Ok(())
            }
            CuRequest::RecordEvent {
                ctx,
                event,
                stream,
                flags,
            } => {
                let status = cuda.enter(ctx).and_then(|()| {
                    let (stream, event) = (cuda.stream(stream)?, cuda.event(event)?);
                    check(cu_call!(
                        cuda.backend.driver,
                        cuEventRecordWithFlags(event, stream, flags)
                    ))
                });
                cuda.defer("cuEventRecord", code(status));
                Ok(())
            }
            CuRequest::EventSynchronize { event } => {
                let status = cuda.event(event).and_then(|event| {
                    check(cu_call!(cuda.backend.driver, cuEventSynchronize(event)))
                });
                let status = cuda.sync_status(code(status));
                self.cu_reply(seq, CuReply::Status(status))
            }
            CuRequest::EventQuery { event } => {
                let status = cuda
                    .event(event)
                    .and_then(|event| check(cu_call!(cuda.backend.driver, cuEventQuery(event))));
                self.cu_reply(seq, status_reply(status))
            }
            CuRequest::EventElapsedTime { start, end } => {
                let mut milliseconds = 0f32;
                let status = cuda.event(start).and_then(|start| {
                    let end = cuda.event(end)?;
                    check(cu_call!(
                        cuda.backend.driver,
                        cuEventElapsedTime_v2(&mut milliseconds, start, end)
                    ))
                });
                let reply = CuReply::Elapsed {
                    status: code(status),
                    milliseconds,
                };
                self.cu_reply(seq, reply)
            }
            CuRequest::Occupancy { ctx, query } => {
                let result = cuda.occupancy(ctx, &query);
                self.cu_reply(seq, value_reply(result))
            }
            CuRequest::BeginCapture { ctx, stream, mode } => {
                let status = cuda.enter(ctx).and_then(|()| {
                    let stream = cuda.stream(stream)?;
                    let mode = capture_mode(mode).ok_or(INVALID_VALUE)?;
                    check(cu_call!(
                        cuda.backend.driver,
                        cuStreamBeginCapture_v2(stream, mode)
                    ))
                });
                self.cu_reply(seq, status_reply(status))
            }
            CuRequest::EndCapture { ctx, stream, graph } => {
                let made = cuda.create_in(ctx, |cuda, raw| {
                    let stream = cuda.stream(stream)?;
                    check(cu_call!(
                        cuda.backend.driver,
                        cuStreamEndCapture(stream, raw)
                    ))
                });
                let status = made.map(|raw| {
                    cuda.graphs.insert(graph, raw);
                });
                self.cu_reply(seq, status_reply(status))
            }
            CuRequest::GraphInstantiate {
                ctx,
                graph,
                exec,
                flags,
            } => {
                let made = cuda.create_in(ctx, |cuda, raw| {
                    let graph = *cuda.graphs.get(&graph).ok_or(INVALID_HANDLE)?;
                    check(cu_call!(
                        cuda.backend.driver,
                        cuGraphInstantiateWithFlags(raw, graph, flags)
                    ))
                });
                let status = made.map(|raw| {
                    cuda.graph_execs.insert(exec, raw);
                });
                self.cu_reply(seq, status_reply(status))
            }
            CuRequest::GraphLaunch {
                ctx,
                exec,
                stream,
                upload,
            } => {
                let status = cuda.enter(ctx).and_then(|()| {
                    let stream = cuda.stream(stream)?;
                    let exec = *cuda.graph_execs.get(&exec).ok_or(INVALID_HANDLE)?;
                    let driver = &cuda.backend.driver;
                    check(if upload {
                        cu_call!(driver, cuGraphUpload(exec, stream))
                    } else {
                        cu_call!(driver, cuGraphLaunch(exec, stream))
                    })
                });
                cuda.defer("cuGraphLaunch", code(status));
                Ok(())
            }
            CuRequest::GraphDestroy { graph } => {
                if let Some(raw) = cuda.graphs.remove(&graph) {
                    cuda.destroyed();
                    let status = cu_call!(cuda.backend.driver, cuGraphDestroy(raw));
                    cuda.defer("cuGraphDestroy", status);
                }
                Ok(())
            }
            CuRequest::Vmm { ctx, op } => {
                let reply = match cuda.enter(ctx) {
                    Ok(()) => cuda.vmm(op),
                    Err(status) => CuReply::Status(status),
                };
                self.cu_reply(seq, reply)
            }
            CuRequest::GraphExecDestroy { exec } => {
                if let Some(raw) = cuda.graph_execs.remove(&exec) {
                    cuda.destroyed();
                    let status = cu_call!(cuda.backend.driver, cuGraphExecDestroy(raw));
                    cuda.defer("cuGraphExecDestroy", status);
                }
                Ok(())
            }
        }
    }

    /// Streams the request's bulk data (`extent`'s rows, packed) to `dst`, where the rows lie
    /// `pitch` apart, through the staging buffers. Returns the copy's status (the bulk is
    /// consumed whatever happens); `Err` only if the connection failed.
    #[allow(clippy::too_many_arguments)]
    fn write_to_device(
        &mut self,
        cuda: &mut CudaSession,
        ctx: Id,
        stream: Id,
        dst: u64,
        extent: Extent,
        pitch: Pitch,
        len: u64,
    ) -> Result<Status, End> {
        let target = cuda.enter(ctx).and_then(|()| cuda.stream(stream));
        let stream = match target {
            Ok(_) if !extent.fits(pitch) || extent.bytes() != Some(len) => Err(INVALID_VALUE),
            other => other,
        };
        let stream = match stream {
            Ok(stream) => stream,
            Err(status) => {
                self.drop_bulk()?;
                return Ok(status);
            }
        };
        let driver = &cuda.backend.driver;
        for piece in pieces(extent, pitch, CHUNK) {
            let slot = cuda
                .staging
                .next_slot(driver, cuda.current)
                .and_then(|slot| Ok((slot, cuda.staging.buffer(driver, slot)?)));
            let (slot, buffer) = match slot {
                Ok(found) => found,
                Err(status) => {
                    self.drop_bulk()?;
                    return Ok(status);
                }
            };
            let buffer = &mut buffer[..piece.bytes()];
            self.take_bulk(buffer)?;
            let copied = copy_piece(driver, Direction::ToDevice, dst, piece, buffer, stream)
                .and_then(|()| cuda.staging.guard(driver, slot, cuda.current, stream));
            if let Err(status) = copied {
                self.drop_bulk()?;
                return Ok(status);
            }
        }
        Ok(SUCCESS)
    }

    /// Sends `extent`'s rows at `src` (lying `pitch` apart) to the client, packed, in chunks:
    /// several chunks are in flight on the GPU while earlier ones are sent. Ends with the
    /// status (deferred errors included), in the same write as the last chunk.
    #[allow(clippy::too_many_arguments)]
    fn read_from_device(
        &mut self,
        cuda: &mut CudaSession,
        seq: u64,
        ctx: Id,
        stream: Id,
        src: u64,
        extent: Extent,
        pitch: Pitch,
    ) -> Result<(), End> {
        let (status, last) = match cuda.enter(ctx).and_then(|()| cuda.stream(stream)) {
            Ok(_) if !extent.fits(pitch) => (INVALID_VALUE, None),
            Ok(stream) => self.stream_out(cuda, seq, stream, src, extent, pitch)?,
            Err(status) => (status, None),
        };
        let mut status = cuda.sync_status(status);
        let driver = &cuda.backend.driver;
        let data = match last {
            Some((slot, offset, len)) if status == SUCCESS => {
                match cuda.staging.buffer(driver, slot) {
                    Ok(buffer) => Some((offset, &buffer[..len])),
                    Err(error) => {
                        status = error;
                        None
                    }
                }
            }
            _ => None,
        };
        let reply = ServerMsg::Cu(CuReply::Status(status));
        self.send_read(seq, data, &reply)
    }

    /// Issues the copies to staging and sends every piece but the last, which it returns as
    /// (staging slot, packed offset, length), with the status so far.
    #[allow(clippy::type_complexity)]
    fn stream_out(
        &mut self,
        cuda: &mut CudaSession,
        seq: u64,
        stream: CUstream,
        src: u64,
        extent: Extent,
        pitch: Pitch,
    ) -> Result<(Status, Option<(usize, u64, usize)>), End> {
        let driver = &cuda.backend.driver;
        let mut to_issue = pieces(extent, pitch, CHUNK);
        // (slot, packed offset, bytes) of the pieces on their way to staging, oldest first.
        let mut in_flight = std::collections::VecDeque::with_capacity(super::staging::SLOTS);
        let mut packed_offset = 0u64;
        loop {
            // Keep the pipeline full: staging slots minus the one being sent.
            while in_flight.len() < super::staging::SLOTS - 1 {
                let Some(piece) = to_issue.next() else { break };
                let issue = cuda
                    .staging
                    .next_slot(driver, cuda.current)
                    .and_then(|slot| {
                        let buffer = cuda.staging.buffer(driver, slot)?;
                        let buffer = &mut buffer[..piece.bytes()];
                        copy_piece(driver, Direction::FromDevice, src, piece, buffer, stream)?;
                        cuda.staging.guard(driver, slot, cuda.current, stream)?;
                        Ok(slot)
                    });
                match issue {
                    Ok(slot) => in_flight.push_back((slot, packed_offset, piece.bytes())),
                    Err(status) => return Ok((status, None)),
                }
                packed_offset += piece.bytes() as u64;
            }
            let Some((slot, offset, len)) = in_flight.pop_front() else {
                return Ok((SUCCESS, None));
            };
            if in_flight.is_empty() {
                return Ok((SUCCESS, Some((slot, offset, len))));
            }
            let buffer = match cuda.staging.buffer(driver, slot) {
                Ok(buffer) => buffer,
                Err(status) => return Ok((status, None)),
            };
            self.send(&ServerMsg::Data { offset }, seq, &buffer[..len])?;
        }
    }
}

#[derive(Clone, Copy)]
enum Direction {
    ToDevice,
    FromDevice,
}

/// Issues on `stream` the copy of one piece between `staging` (its rows packed) and the device
/// rows at `base + piece.device_offset`: one 1D copy for a single row, else one 2D copy.
fn copy_piece(
    driver: &rgpu_cuda_api::native::Driver,
    direction: Direction,
    base: u64,
    piece: Piece,
    staging: &mut [u8],
    stream: CUstream,
) -> Result<(), Status> {
    let device = base + piece.device_offset;
    let host = staging.as_mut_ptr().cast::<c_void>();
    let status = match (direction, piece.rows) {
        (Direction::ToDevice, 1) => cu_call!(
            driver,
            cuMemcpyHtoDAsync_v2(device, host, piece.width, stream)
        ),
        (Direction::FromDevice, 1) => cu_call!(
            driver,
            cuMemcpyDtoHAsync_v2(host, device, piece.width, stream)
        ),
        (direction, rows) => {
            let (host_type, device_type) = (
                CUmemorytype::CU_MEMORYTYPE_HOST,
                CUmemorytype::CU_MEMORYTYPE_DEVICE,
            );
            let to_device = matches!(direction, Direction::ToDevice);
            let copy = CUDA_MEMCPY2D {
                srcXInBytes: 0,
                srcY: 0,
                srcMemoryType: if to_device { host_type } else { device_type },
                srcHost: host,
                srcDevice: device,
                srcArray: null_mut(),
                srcPitch: if to_device { piece.width } else { piece.pitch },
                dstXInBytes: 0,
                dstY: 0,
                dstMemoryType: if to_device { device_type } else { host_type },
                dstHost: host,
                dstDevice: device,
                dstArray: null_mut(),
                dstPitch: if to_device { piece.pitch } else { piece.width },
                WidthInBytes: piece.width,
                Height: rows,
            };
            cu_call!(driver, cuMemcpy2DAsync_v2(&copy, stream))
        }
    };
    check(status)
}

/// A function attribute by number, whether or not this build's enum knows it (the wire carries
/// numbers a newer driver may define).
fn function_attribute_raw(
    driver: &rgpu_cuda_api::native::Driver,
    function: Function,
    attribute: u32,
    device: u32,
) -> Result<i32, Status> {
    let mut value = 0;
    // A library kernel's attributes are those of its function in the current context (asking
    // the kernel itself refers to the device's primary context, which sessions do not use).
    let mut in_context = null_mut();
    let function = if function.is_kernel
        && cu_call!(
            driver,
            cuKernelGetFunction(&mut in_context, function.raw.cast())
        ) == SUCCESS
    {
        Function {
            raw: in_context,
            is_kernel: false,
        }
    } else {
        function
    };
    let status = if function.is_kernel {
        let Some(entry) = driver.fns.cuKernelGetAttribute else {
            return Err(NOT_SUPPORTED);
        };
        // SAFETY: the enum parameter is a 32-bit integer in the C ABI; the driver checks the
        // number itself.
        let entry: unsafe extern "C" fn(*mut i32, u32, CUkernel, CUdevice) -> Status =
            unsafe { std::mem::transmute(entry) };
        // SAFETY: a valid out-pointer and kernel handle.
        unsafe {
            entry(
                &mut value,
                attribute,
                function.raw.cast(),
                device as CUdevice,
            )
        }
    } else {
        let Some(entry) = driver.fns.cuFuncGetAttribute else {
            return Err(NOT_SUPPORTED);
        };
        // SAFETY: as above.
        let entry: unsafe extern "C" fn(*mut i32, u32, CUfunction) -> Status =
            unsafe { std::mem::transmute(entry) };
        // SAFETY: a valid out-pointer and function handle.
        unsafe { entry(&mut value, attribute, function.raw) }
    };
    check(status).map(|()| value)
}

/// The `CUresult` of an outcome: SUCCESS or the error.
fn code(outcome: Result<(), Status>) -> Status {
    outcome.err().unwrap_or(SUCCESS)
}

/// `CUstreamCaptureMode` from the wire.
fn capture_mode(mode: u32) -> Option<CUstreamCaptureMode> {
    use CUstreamCaptureMode_enum::*;
    Some(match mode {
        0 => CU_STREAM_CAPTURE_MODE_GLOBAL,
        1 => CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        2 => CU_STREAM_CAPTURE_MODE_RELAXED,
        _ => return None,
    })
}

fn value_reply(result: Result<i64, Status>) -> CuReply {
    match result {
        Ok(value) => CuReply::Value {
            status: SUCCESS,
            value,
        },
        Err(status) => CuReply::Value { status, value: 0 },
    }
}

fn function_reply(result: Result<FunctionInfo, Status>) -> CuReply {
    match result {
        Ok(info) => CuReply::Function {
            status: SUCCESS,
            info,
        },
        Err(status) => CuReply::Function {
            status,
            info: FunctionInfo::default(),
        },
    }
}
