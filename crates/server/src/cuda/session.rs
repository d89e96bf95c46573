//! A session's CUDA objects, and the carrying out of CUDA requests: [`Served`] implements the
//! CUDA table's server traits (`rgpu_protocol::cuda::serve`), one API group per file of this
//! folder, and `dispatch` routes each request to its method.
//!
//! Everything runs on the session's request thread, so the driver's per-thread current context
//! is this session's alone; `enter` switches it only when a request names another context.
//! Each session gets its own contexts (its stand-in for a device's primary context is a context
//! of its own, not the process's primary context), so a session's faults and leaks end with it:
//! destroying its contexts at close frees every allocation, module, stream and event it made.

use std::collections::HashMap;
use std::ptr::null_mut;
use std::sync::Arc;

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::{check, Status, INVALID_HANDLE, NOT_SUPPORTED, SUCCESS};
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{serve, Answer, CuReply, CuRequest, Id};
use rgpu_protocol::ServerMsg;

use super::owned::{self, Owned};
use super::staging::Staging;
use super::Backend;
use crate::limits::Usage;
use crate::session::{End, Session};

pub(super) const INVALID_CONTEXT: Status = cudaError_enum::CUDA_ERROR_INVALID_CONTEXT as u32;
pub(super) const INVALID_DEVICE: Status = cudaError_enum::CUDA_ERROR_INVALID_DEVICE as u32;
pub(super) const OUT_OF_MEMORY: Status = cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY as u32;
/// The largest module image a client may send.
pub(super) const MAX_IMAGE_BYTES: u64 = 4 << 30;

pub(super) struct Context {
    pub(super) raw: CUcontext,
    pub(super) device: u32,
}

pub(super) enum ImageHandle {
    Module(owned::Module),
    Library(owned::Library),
}

pub(super) struct Image {
    pub(super) handle: ImageHandle,
    /// The driver may read a library's image lazily, at first use of a kernel.
    pub(super) _bytes: Arc<Vec<u8>>,
}

/// A launchable: a module function or a library kernel (the driver takes either as CUfunction).
#[derive(Clone, Copy)]
pub(super) struct Function {
    pub(super) raw: CUfunction,
    pub(super) is_kernel: bool,
}

/// What a quota charge is kept by: a device pointer, or a VMM handle's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Charged {
    Pointer(u64),
    Handle(Id),
}

pub(crate) struct CudaSession {
    pub(super) backend: Arc<Backend>,
    pub(super) contexts: HashMap<Id, Context>,
    /// The primary context of each device whose primary context the program uses (the
    /// device's own, retained: see `retain_primary`).
    pub(super) primary: HashMap<u32, CUcontext>,
    pub(super) current: CUcontext,
    pub(super) current_device: u32,
    pub(super) streams: HashMap<Id, owned::Stream>,
    pub(super) events: HashMap<Id, owned::Event>,
    /// Records the client asked for, per event, and the events recorded since the client was
    /// last told they completed (`CuEventsDone`, sent with successful synchronizations).
    pub(super) record_generations: HashMap<Id, u64>,
    pub(super) unreported_records: std::collections::HashSet<Id>,
    pub(super) images: HashMap<Id, Image>,
    pub(super) functions: HashMap<Id, Function>,
    /// Each function's parameter offsets in its parameter buffer (graph kernel nodes pass
    /// parameters one by one: conditional bodies take no parameter buffer).
    pub(super) param_offsets: HashMap<Id, Vec<u32>>,
    /// Pointers to each parameter of a kernel node, reused.
    pub(super) param_pointers: Vec<*mut std::ffi::c_void>,
    /// Stream-ordered allocations not yet freed, with their context: they come from the
    /// device's pool, which outlives contexts, so the session frees them itself at the end.
    pub(super) async_allocations: HashMap<u64, CUcontext>,
    /// Bytes each allocation (plain, stream-ordered, VMM handle) counts against the session's
    /// memory quota.
    pub(super) charged: HashMap<Charged, u64>,
    /// The session's memory and object counts (shared with its OpenCL tables).
    pub(super) usage: Arc<Usage>,
    /// Graphs captured from streams, and their executable instances.
    pub(super) graphs: HashMap<Id, owned::Graph>,
    pub(super) graph_execs: HashMap<Id, owned::GraphExec>,
    /// Nodes of the session's graphs, and the body graphs of their conditional nodes.
    pub(super) graph_nodes: HashMap<Id, super::graphs::GraphNode>,
    pub(super) graph_bodies: HashMap<Id, super::graphs::GraphBody>,
    /// The last id the server gave a node the client never named (past SERVER_NODE_IDS).
    pub(super) next_node_id: u64,
    /// Arrays (with how they were made), and texture and surface objects, by value.
    pub(super) arrays: HashMap<Id, owned::Array>,
    pub(super) mipmapped_arrays: HashMap<Id, owned::MipmappedArray>,
    /// Levels of mipmapped arrays the client named: (the mipmapped array's id, the level's
    /// array, which the mipmapped array owns).
    pub(super) mipmap_levels: HashMap<Id, (Id, CUarray)>,
    pub(super) tex_objects: HashMap<u64, owned::TexObject>,
    pub(super) surf_objects: HashMap<u64, owned::SurfObject>,
    /// Memory pools the session made.
    pub(super) mem_pools: HashMap<Id, owned::MemPool>,
    /// JIT links in progress.
    pub(super) links: HashMap<Id, super::modules::Link>,
    /// Virtual memory management: physical allocations, mappings and address reservations.
    /// They belong to the device, not to a context, so the session undoes them at its end.
    pub(super) vmm_handles: HashMap<Id, CUmemGenericAllocationHandle>,
    pub(super) vmm_mappings: HashMap<u64, u64>,
    pub(super) vmm_reservations: HashMap<u64, u64>,
    /// Mapped pinned memory standing in for the program's page-locked host memory, by
    /// device address: (host address here, size, the context that owns it). Freed with the
    /// contexts (and forgotten with each: `forget_objects_of`).
    pub(super) host_mirrors: HashMap<u64, (usize, u64, CUcontext)>,
    /// The client's shared host-memory segments registered with the driver as page-locked
    /// (at their first copy): base address here -> length. The GPU's DMA reads and writes them
    /// in place.
    pub(super) registered_host: HashMap<usize, usize>,
    /// What the session shared by CUDA IPC, with each share's ticket (ipc.rs).
    pub(super) ipc_shares: HashMap<super::ipc::SharedObject, rgpu_protocol::LaneKey>,
    /// Allocations and pools the session shared by descriptor, with each share
    /// (shareable.rs).
    pub(super) fd_shares: HashMap<super::shareable::Exported, rgpu_protocol::cuda::Shareable>,
    /// Other sessions' allocations mapped by CUDA IPC, by address, with their context.
    pub(super) ipc_mappings: HashMap<u64, CUcontext>,
    pub(super) staging: Staging,
    /// The launch parameter buffer, reused across launches.
    pub(super) params: Vec<u8>,
    /// The first error of a fire-and-forget request since the last synchronizing reply.
    pub(super) deferred: Option<Status>,
    /// The thread posted launches are issued on (launcher.rs), from the first launch, where
    /// polling is on; `launcher_tried`: whether it was started (or found off).
    pub(super) launcher: Option<super::launcher::Launcher>,
    launcher_tried: bool,
    /// Stream captures begun and not ended: while one is, launches stay on the session thread
    /// (the capture's thread).
    pub(super) captures: u32,
    /// The first failure of the fabric's background pulls (peers.rs), reported like a
    /// deferred error.
    pub(super) fabric_failure: Arc<std::sync::Mutex<Option<Status>>>,
    /// NCCL communicators and registrations (nccl.rs).
    pub(super) nccl: super::nccl::NcclState,
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
            record_generations: HashMap::new(),
            unreported_records: std::collections::HashSet::new(),
            images: HashMap::new(),
            functions: HashMap::new(),
            param_offsets: HashMap::new(),
            param_pointers: Vec::new(),
            host_mirrors: HashMap::new(),
            registered_host: HashMap::new(),
            ipc_shares: HashMap::new(),
            ipc_mappings: HashMap::new(),
            fd_shares: HashMap::new(),
            async_allocations: HashMap::new(),
            graphs: HashMap::new(),
            graph_execs: HashMap::new(),
            graph_nodes: HashMap::new(),
            graph_bodies: HashMap::new(),
            next_node_id: 0,
            links: HashMap::new(),
            mem_pools: HashMap::new(),
            arrays: HashMap::new(),
            mipmapped_arrays: HashMap::new(),
            mipmap_levels: HashMap::new(),
            tex_objects: HashMap::new(),
            surf_objects: HashMap::new(),
            vmm_handles: HashMap::new(),
            vmm_mappings: HashMap::new(),
            vmm_reservations: HashMap::new(),
            staging: Staging::default(),
            params: Vec::new(),
            deferred: None,
            launcher: None,
            launcher_tried: false,
            captures: 0,
            fabric_failure: Arc::default(),
            nccl: Default::default(),
        }
    }

    /// Registers a shared segment (base address here, length) with the driver as page-locked
    /// memory of every context, once: copies then run in place, at the link's full rate.
    pub(super) fn register_host(&mut self, base: *mut u8, len: usize) -> Result<(), Status> {
        if self.registered_host.contains_key(&(base as usize)) {
            return Ok(());
        }
        let driver = &self.backend.driver;
        let flags = CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: a mapping this session keeps until the segment is let go (which unregisters
        // it first: `forget_host_memory`); the driver checks the range.
        check(unsafe { cu_call!(driver, cuMemHostRegister_v2(base.cast(), len, flags)) })?;
        self.registered_host.insert(base as usize, len);
        Ok(())
    }

    /// Before a shared segment's mapping goes (the client freed it): its copies finish and the
    /// driver lets it go.
    pub(crate) fn forget_host_memory(&mut self, base: *mut u8, _len: usize) {
        self.unregister_host_memory(Some(base as usize));
    }

    /// Waits for the session's device work and unregisters segment `which` (`None`: all).
    fn unregister_host_memory(&mut self, which: Option<usize>) {
        let bases: Vec<usize> = match which {
            Some(base) if self.registered_host.contains_key(&base) => vec![base],
            Some(_) => return,
            None => self.registered_host.keys().copied().collect(),
        };
        if bases.is_empty() {
            return;
        }
        let driver = &self.backend.driver;
        let mut raws: Vec<CUcontext> = self.primary.values().copied().collect();
        raws.extend(self.contexts.values().map(|c| c.raw));
        for &raw in &raws {
            // SAFETY: this session's live contexts.
            unsafe { cu_call!(driver, cuCtxSetCurrent(raw)) };
            // SAFETY: as above.
            unsafe { cu_call!(driver, cuCtxSynchronize()) };
        }
        for base in bases {
            self.registered_host.remove(&base);
            // SAFETY: registered by `register_host`, its mapping still in place.
            unsafe { cu_call!(driver, cuMemHostUnregister(base as *mut std::ffi::c_void)) };
        }
        // SAFETY: the session's current context (or none), as it was.
        unsafe { cu_call!(driver, cuCtxSetCurrent(self.current)) };
    }

    /// Destroys every context the session made (which frees everything in them). Returns how
    /// many objects the client had left.
    pub fn close(&mut self) -> usize {
        // Every launch handed over is issued, and the launch thread gone, before anything
        // goes.
        self.drain_launches();
        self.launcher = None;
        self.nccl.abort_all();
        self.unregister_host_memory(None);
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
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                unsafe { cu_call!(driver, cuCtxSetCurrent(any)) };
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                unsafe { cu_call!(driver, cuCtxSynchronize()) };
            }
        }
        for (ptr, size) in self.vmm_mappings.drain() {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            unsafe { cu_call!(driver, cuMemUnmap(ptr, size as usize)) };
        }
        for (_, handle) in self.vmm_handles.drain() {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            unsafe { cu_call!(driver, cuMemRelease(handle)) };
        }
        for (ptr, size) in self.vmm_reservations.drain() {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            unsafe { cu_call!(driver, cuMemAddressFree(ptr, size as usize)) };
        }
        // The owned objects go before their contexts (dropping destroys them).
        self.graph_execs.clear();
        self.graphs.clear();
        self.events.clear();
        self.streams.clear();
        self.functions.clear();
        self.param_offsets.clear();
        self.images.clear();
        for (ptr, ctx) in self.async_allocations.drain() {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            unsafe { cu_call!(driver, cuCtxSetCurrent(ctx)) };
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            unsafe { cu_call!(driver, cuMemFreeAsync(ptr, null_mut())) };
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            unsafe { cu_call!(driver, cuCtxSynchronize()) };
        }
        for &raw in &raws {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            unsafe { cu_call!(driver, cuCtxSetCurrent(raw)) };
            self.staging.forget_context(driver, raw);
        }
        // SAFETY: this session's live handles and local buffers; the driver checks addresses.
        unsafe { cu_call!(driver, cuCtxSetCurrent(null_mut())) };
        // `raws` holds the primary contexts first: those are reset below, never destroyed.
        for raw in raws.into_iter().skip(self.primary.len()) {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            let status = unsafe { cu_call!(driver, cuCtxDestroy_v2(raw)) };
            if status != SUCCESS {
                log::debug!("cuCtxDestroy at session end: CUDA error {status}");
            }
        }
        for &device in self.primary.keys() {
            // A reset frees everything in the primary context, whoever retained it.
            // SAFETY: a device of this server whose primary context the session retained.
            let status =
                unsafe { cu_call!(driver, cuDevicePrimaryCtxReset_v2(device as CUdevice)) };
            if status != SUCCESS {
                log::debug!("cuDevicePrimaryCtxReset at session end: CUDA error {status}");
            }
        }
        self.contexts.clear();
        self.primary.clear();
        self.current = null_mut();
        count
    }

    /// The launch thread, where posted launches go now (started at the first launch).
    pub(super) fn launcher(&mut self) -> Option<&mut super::launcher::Launcher> {
        if !self.launcher_tried {
            self.launcher_tried = true;
            self.launcher = super::launcher::Launcher::start(self.backend.clone());
        }
        self.launcher.as_mut().filter(|_| self.captures == 0)
    }

    /// Waits until every launch handed to the launch thread is issued (before anything else
    /// is served: the program's order); their first failure becomes a deferred error.
    pub(crate) fn drain_launches(&mut self) {
        let driver = &self.backend.driver;
        let current = self.current;
        if let Some(status) = self
            .launcher
            .as_mut()
            .and_then(|l| l.drain(driver, current))
        {
            self.defer("cuLaunchKernel", status);
        }
    }

    /// Before the session thread waits for the client: launches left for a sleeping launch
    /// thread get it woken.
    pub(crate) fn wake_launcher(&mut self) {
        if let Some(launcher) = self.launcher.as_mut() {
            launcher.wake_if_owed();
        }
    }

    pub(super) fn defer(&mut self, what: &str, status: Status) {
        if status != SUCCESS {
            log::debug!("{what} failed: CUDA error {status}; deferred");
            crate::flight::failed("cuda", status.into());
            self.deferred.get_or_insert(status);
        }
    }

    /// The status a synchronizing request reports: its own error, else a deferred one.
    pub(super) fn sync_status(&mut self, status: Status) -> Status {
        let background = self
            .fabric_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let deferred = self.deferred.take().or(background);
        if status != SUCCESS {
            status
        } else {
            deferred.unwrap_or(SUCCESS)
        }
    }

    /// Notes a record of event `id` the client asked for.
    pub(super) fn recorded(&mut self, id: Id) {
        *self.record_generations.entry(id).or_default() += 1;
        self.unreported_records.insert(id);
    }

    /// The events among those recorded since last told whose latest record has completed,
    /// as the frame that tells the client (`None`: none); they are then forgotten until
    /// recorded again.
    pub(super) fn take_done_records(&mut self) -> Option<ServerMsg> {
        if self.unreported_records.is_empty() {
            return None;
        }
        let (mut events, mut generations) = (Vec::new(), Vec::new());
        let driver = &self.backend.driver;
        let (known, generations_of) = (&self.events, &self.record_generations);
        self.unreported_records.retain(|id| {
            let Some(event) = known.get(id) else {
                return false;
            };
            // SAFETY: a live event of this session; a query only reads its state.
            match check(unsafe { cu_call!(driver, cuEventQuery(event.raw())) }) {
                Ok(()) => {
                    events.push(*id);
                    generations.push(generations_of.get(id).copied().unwrap_or(0));
                    false
                }
                // Not yet (CUDA_ERROR_NOT_READY), or failed: the client asks when it wants to.
                Err(status) => status == cudaError_enum::CUDA_ERROR_NOT_READY as u32,
            }
        });
        (!events.is_empty()).then_some(ServerMsg::CuEventsDone {
            events,
            generations,
        })
    }

    /// Makes the client's context `ctx` current on this thread.
    pub(super) fn enter(&mut self, ctx: Id) -> Result<(), Status> {
        let context = self.contexts.get(&ctx).ok_or(INVALID_CONTEXT)?;
        if context.raw != self.current {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe { cu_call!(self.backend.driver, cuCtxSetCurrent(context.raw)) })?;
            self.current = context.raw;
            self.current_device = context.device;
        }
        Ok(())
    }

    /// Makes a driver object in the client's context `ctx`: `make` fills in its handle.
    pub(super) fn create_in<T>(
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

    /// Destroys an object made by `create_in`, taken out of its table (`None`: an id the
    /// session does not hold, which the client's library never sends; nothing to do).
    pub(super) fn destroy(&self, taken: Option<impl Owned>) -> Answer<()> {
        let Some(object) = taken else {
            return Ok(());
        };
        self.usage.remove_objects(1);
        check(object.destroy())
    }

    /// The objects made in `ctx`, which was just destroyed and took them along: forgotten, not
    /// destroyed again.
    pub(super) fn forget_objects_of(&mut self, ctx: CUcontext) {
        fn forget_in<T: Owned>(table: &mut HashMap<Id, T>, ctx: CUcontext) -> usize {
            let gone: Vec<Id> = table
                .iter()
                .filter(|(_, object)| object.context() == ctx)
                .map(|(&id, _)| id)
                .collect();
            for id in &gone {
                if let Some(object) = table.remove(id) {
                    object.forget();
                }
            }
            gone.len()
        }
        let counted = forget_in(&mut self.streams, ctx)
            + forget_in(&mut self.events, ctx)
            + forget_in(&mut self.graphs, ctx)
            + forget_in(&mut self.graph_execs, ctx)
            + forget_in(&mut self.arrays, ctx)
            + forget_in(&mut self.mipmapped_arrays, ctx)
            + forget_in(&mut self.tex_objects, ctx)
            + forget_in(&mut self.surf_objects, ctx);
        self.usage.remove_objects(counted);
        // The driver freed the context's mirrors with it.
        let gone: Vec<u64> = self
            .host_mirrors
            .iter()
            .filter(|(_, &(_, _, owner))| owner == ctx)
            .map(|(&mirror, _)| mirror)
            .collect();
        for mirror in gone {
            self.host_mirrors.remove(&mirror);
            self.uncharge(Charged::Pointer(mirror));
        }
        // And unmapped the allocations it had opened by IPC.
        self.ipc_mappings.retain(|_, owner| *owner != ctx);
        let mipmaps = &self.mipmapped_arrays;
        self.mipmap_levels
            .retain(|_, (mipmap, _)| mipmaps.contains_key(mipmap));
        let modules: Vec<Id> = self
            .images
            .iter()
            .filter(
                |(_, image)| matches!(&image.handle, ImageHandle::Module(m) if m.context() == ctx),
            )
            .map(|(&id, _)| id)
            .collect();
        for id in modules {
            if let Some(Image {
                handle: ImageHandle::Module(module),
                ..
            }) = self.images.remove(&id)
            {
                module.forget();
            }
        }
    }

    /// Runs `allocate` if the memory quota has room for `size` more bytes, and keeps them
    /// counted (by the pointer or handle `allocate` returns) if it succeeds.
    pub(super) fn charged_allocation(
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
    pub(super) fn uncharge(&mut self, key: Charged) {
        if let Some(size) = self.charged.remove(&key) {
            self.usage.refund_memory(size);
        }
    }

    pub(super) fn stream(&self, id: Id) -> Result<CUstream, Status> {
        if id == 0 {
            return Ok(null_mut());
        }
        self.streams
            .get(&id)
            .map(owned::Stream::raw)
            .ok_or(INVALID_HANDLE)
    }

    pub(super) fn event(&self, id: Id) -> Result<CUevent, Status> {
        self.events
            .get(&id)
            .map(owned::Event::raw)
            .ok_or(INVALID_HANDLE)
    }

    pub(super) fn function(&self, id: Id) -> Result<Function, Status> {
        self.functions.get(&id).copied().ok_or(INVALID_HANDLE)
    }
}

/// A CUDA request being carried out: the session (its connection and bulk data) and its CUDA
/// state. The CUDA table's server traits are implemented on it, a group per file.
pub(crate) struct Served<'a> {
    pub session: &'a mut Session,
    pub cuda: &'a mut CudaSession,
}

impl serve::Server for Served<'_> {
    type End = End;

    fn reply(&mut self, seq: u64, reply: CuReply) -> Result<(), End> {
        // A successful synchronization: tell the client which recorded events have completed
        // first, so that it answers their queries itself.
        if matches!(
            reply,
            CuReply::Synchronize(SUCCESS)
                | CuReply::StreamSynchronize(SUCCESS)
                | CuReply::EventSynchronize(SUCCESS)
        ) {
            if let Some(done) = self.cuda.take_done_records() {
                self.session.send(&done, seq, &[])?;
            }
        }
        self.session.send(&ServerMsg::Cu(reply), seq, &[])
    }

    fn defer(&mut self, message: &'static str, status: Status) {
        self.cuda.defer(message, status);
    }

    fn unexpected_bulk(&mut self, message: &'static str, bulk_len: u64) -> End {
        End::Protocol(format!(
            "{bulk_len} bytes of bulk data with {message}, which takes none"
        ))
    }
}

impl Session {
    /// Carries out one CUDA request and sends its reply, if it has one. `Err` ends the session.
    pub(crate) fn handle_cuda(
        &mut self,
        seq: u64,
        bulk_len: u64,
        request: CuRequest,
    ) -> Result<(), End> {
        let Some(backend) = self.shared.cuda.clone() else {
            return self.refuse_cuda(seq, bulk_len, &request);
        };
        let mut cuda = self
            .cuda
            .take()
            .unwrap_or_else(|| Box::new(CudaSession::new(backend, self.usage.clone())));
        let mut served = Served {
            session: self,
            cuda: &mut cuda,
        };
        let result = serve::dispatch(&mut served, seq, bulk_len, request);
        self.cuda = Some(cuda);
        result
    }

    /// A server without CUDA: an empty inventory, and NOT_SUPPORTED for anything else.
    fn refuse_cuda(&mut self, seq: u64, bulk_len: u64, request: &CuRequest) -> Result<(), End> {
        if bulk_len > 0 && !request.takes_bulk() {
            return Err(End::Protocol(format!(
                "{bulk_len} bytes of bulk data with {}, which takes none",
                request.name()
            )));
        }
        self.drop_bulk()?;
        if request.reads() {
            let end = ServerMsg::ReadDone {
                status: NOT_SUPPORTED as i32,
            };
            return self.send(&end, seq, &[]);
        }
        match request.refusal(NOT_SUPPORTED) {
            Some(reply) => self.send(&ServerMsg::Cu(reply), seq, &[]),
            None => Ok(()),
        }
    }
}

/// The `CUresult` of an outcome: SUCCESS or the error.
pub(super) fn code(outcome: Result<(), Status>) -> Status {
    outcome.err().unwrap_or(SUCCESS)
}
