//! CUDA driver messages: the device operations the drop-in `libcuda.so.1` maps the driver API
//! onto.
//!
//! Devices are numbered by the server (their ordinal on that server). Every other object
//! (context, stream, event, module, library, function, kernel) gets an id chosen by the client
//! when it creates the object, so creation and use pipeline without waiting for a reply. Ids are
//! per session. Stream id 0 is the context's default stream. Device pointers are the server's own
//! addresses: kernels receive them inside their parameters, which the client cannot rewrite.
//!
//! Requests without a reply ([`CuRequest::expects_reply`]) are fire-and-forget: the server
//! keeps the first error among them and returns it from the next synchronizing request, as the
//! driver reports asynchronous errors at the next synchronizing call.

use serde::{Deserialize, Serialize};

/// A session-local object id chosen by the client (0: none / default stream).
pub type Id = u64;
/// A device address on the server.
pub type DevicePtr = u64;
/// A `CUresult` value.
pub type Status = u32;

/// What a client needs to answer every device query locally.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CuInventory {
    /// `cuDriverGetVersion` on the server (e.g. 13000); 0 when the server has no CUDA.
    pub driver_version: i32,
    pub devices: Vec<CuDevice>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CuDevice {
    pub name: String,
    pub uuid: [u8; 16],
    pub total_mem: u64,
    /// `(attribute, value)` for every `CUdevice_attribute` the driver answers.
    pub attributes: Vec<(u32, i32)>,
    /// `cuDeviceGetPCIBusId`, e.g. "0000:1b:00.0".
    pub pci_bus_id: String,
    /// How this device reaches each other device of the same server.
    pub peers: Vec<CuPeer>,
}

/// What `cuDeviceCanAccessPeer` and `cuDeviceGetP2PAttribute` say of a device and `device`,
/// another device of the same server (devices of different servers never reach each other).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CuPeer {
    /// The other device's ordinal on the server.
    pub device: u32,
    pub can_access: bool,
    /// `(CUdevice_P2PAttribute, value)` for every attribute the driver answers.
    pub attributes: Vec<(u32, i32)>,
}

/// The shape of a copy: `depth` slices of `height` rows of `width` bytes. However the rows lie
/// in memory, they travel packed (row after row, slice after slice) as bulk or `Data` frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extent {
    pub width: u64,
    pub height: u64,
    pub depth: u64,
}

/// Where the rows of a copy lie in one side's memory: row `y` of slice `z` starts
/// `(z * slice_rows + y) * row` bytes after the copy's first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pitch {
    pub row: u64,
    pub slice_rows: u64,
}

impl Extent {
    /// `size` contiguous bytes.
    pub fn linear(size: u64) -> Extent {
        Extent {
            width: size,
            height: 1,
            depth: 1,
        }
    }

    /// Bytes copied (the packed size); `None` if it overflows.
    pub fn bytes(&self) -> Option<u64> {
        self.width.checked_mul(self.height)?.checked_mul(self.depth)
    }

    /// The pitch of these rows packed one after another.
    pub fn packed(&self) -> Pitch {
        Pitch {
            row: self.width,
            slice_rows: self.height,
        }
    }

    /// Whether rows laid out by `pitch` fit without overlapping (each row within its pitch,
    /// each slice within its rows) and the farthest byte is addressable.
    pub fn fits(&self, pitch: Pitch) -> bool {
        let rows_ok = self.height <= 1 || pitch.row >= self.width;
        let slices_ok = self.depth <= 1 || pitch.slice_rows >= self.height;
        rows_ok && slices_ok && self.span(pitch).is_some()
    }

    /// Bytes from the first byte to one past the last, rows laid out by `pitch`.
    pub fn span(&self, pitch: Pitch) -> Option<u64> {
        if self.bytes()? == 0 {
            return Some(0);
        }
        let last_row = (self.depth - 1)
            .checked_mul(pitch.slice_rows)?
            .checked_add(self.height - 1)?;
        last_row.checked_mul(pitch.row)?.checked_add(self.width)
    }

    /// Whether rows laid out by `pitch` are one contiguous run of bytes.
    pub fn is_contiguous(&self, pitch: Pitch) -> bool {
        (self.height <= 1 || pitch.row == self.width)
            && (self.depth <= 1 || pitch.slice_rows == self.height)
    }

    /// The offset of each row's first byte, rows laid out by `pitch`, in packed order.
    pub fn row_offsets(&self, pitch: Pitch) -> impl Iterator<Item = u64> {
        // Wrapping: with one slice the slice pitch is never used (and may be anything).
        let slice = pitch.row.wrapping_mul(pitch.slice_rows);
        let (height, row) = (self.height, pitch.row);
        (0..self.depth).flat_map(move |z| (0..height).map(move |y| z * slice + y * row))
    }
}

/// Whether a loaded image is a module (`cuModuleLoadData*`) or a library (`cuLibraryLoadData`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ImageKind {
    Module,
    Library,
}

/// One `cuLaunchKernelEx` attribute: its id and the raw bytes of its value union.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LaunchAttribute {
    pub id: u32,
    pub value: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum CuRequest {
    /// Reply: `Inventory`.
    GetInventory,
    /// A context on `device`. `primary`: the session's stand-in for the device's primary context
    /// (one per session and device, shared by every primary-context handle of the client).
    /// No reply.
    CreateContext {
        id: Id,
        device: u32,
        flags: u32,
        primary: bool,
    },
    /// No reply.
    DestroyContext { id: Id },
    /// `cuCtxSynchronize`. Reply: `Status`.
    Synchronize { ctx: Id },
    /// `cuCtxEnablePeerAccess`: `ctx` may use the memory of `peer` (a context of another
    /// device of this server). Reply: `Status`.
    EnablePeerAccess { ctx: Id, peer: Id, flags: u32 },
    /// `cuCtxDisablePeerAccess`. Reply: `Status`.
    DisablePeerAccess { ctx: Id, peer: Id },
    /// `cuCtxGetLimit`. Reply: `Value`.
    GetLimit { ctx: Id, limit: u32 },
    /// `cuCtxSetLimit`. Reply: `Status`.
    SetLimit { ctx: Id, limit: u32, value: u64 },
    /// Reply: `MemInfo`.
    MemGetInfo { ctx: Id },
    /// Reply: `Pointer`.
    MemAlloc { ctx: Id, size: u64 },
    /// Reply: `Status`.
    MemFree { ctx: Id, ptr: DevicePtr },
    /// `cuMemAllocAsync` from the device's default pool, ordered on `stream`. Reply: `Pointer`.
    MemAllocAsync { ctx: Id, stream: Id, size: u64 },
    /// `cuMemFreeAsync`. No reply.
    MemFreeAsync { ctx: Id, stream: Id, ptr: DevicePtr },
    /// Bulk: the rows to write at `dst` (laid out there by `pitch`), packed, in stream order.
    /// No reply.
    MemcpyHtoD {
        ctx: Id,
        stream: Id,
        dst: DevicePtr,
        extent: Extent,
        pitch: Pitch,
    },
    /// Reads the rows at `src` (laid out there by `pitch`). Replies: `Data` frames with the
    /// rows packed (offsets into the packed bytes), then `Status`.
    MemcpyDtoH {
        ctx: Id,
        stream: Id,
        src: DevicePtr,
        extent: Extent,
        pitch: Pitch,
    },
    /// Copies rows between device addresses of this server, ordered on `stream` of `ctx`.
    /// `src_ctx`: the context of `src` when it is not `ctx` (a peer copy), else 0. No reply.
    MemcpyDtoD {
        ctx: Id,
        stream: Id,
        dst: DevicePtr,
        dst_pitch: Pitch,
        src: DevicePtr,
        src_pitch: Pitch,
        src_ctx: Id,
        extent: Extent,
    },
    /// `cuMemsetD8/16/32[Async]` (`element_size` 1, 2 or 4) and their 2D forms (`height` > 1,
    /// rows `pitch` bytes apart, `width` elements each). No reply.
    Memset {
        ctx: Id,
        stream: Id,
        dst: DevicePtr,
        value: u32,
        element_size: u8,
        width: u64,
        height: u64,
        pitch: u64,
    },
    /// Loads an image whose SHA-256 is `hash`. Bulk: the image, or nothing when the client
    /// expects the server to hold it already. Reply: `Loaded`.
    LoadImage {
        id: Id,
        ctx: Id,
        kind: ImageKind,
        hash: [u8; 32],
    },
    /// No reply.
    UnloadImage { id: Id },
    /// `cuModuleGetFunction` (`module` a module) or `cuLibraryGetKernel` (a library). Reply:
    /// `Function`.
    GetFunction { id: Id, image: Id, name: String },
    /// `cuKernelGetFunction`: the function of a library kernel in `ctx`. Reply: `Function`.
    KernelGetFunction { id: Id, kernel: Id, ctx: Id },
    /// `cuModuleGetGlobal` / `cuLibraryGetGlobal`. Reply: `Global`.
    GetGlobal { ctx: Id, image: Id, name: String },
    /// `cuFuncSetAttribute` / `cuKernelSetAttribute` (`device` for kernels). Reply: `Status`.
    SetFunctionAttribute {
        function: Id,
        attribute: u32,
        value: i32,
        device: u32,
    },
    /// `cuFuncGetAttribute` / `cuKernelGetAttribute` for an attribute the function's cached
    /// table lacks. Reply: `Value`.
    GetFunctionAttribute {
        function: Id,
        attribute: u32,
        device: u32,
    },
    /// `cuFuncSetCacheConfig` and friends. No reply.
    SetFunctionCacheConfig { function: Id, config: u32 },
    /// Bulk: the kernel's parameter buffer, laid out as the function's parameter table says.
    /// No reply.
    Launch {
        ctx: Id,
        function: Id,
        stream: Id,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        attributes: Vec<LaunchAttribute>,
    },
    /// No reply.
    CreateStream {
        id: Id,
        ctx: Id,
        flags: u32,
        priority: i32,
    },
    /// No reply.
    DestroyStream { id: Id },
    /// Reply: `Status`.
    StreamSynchronize { ctx: Id, stream: Id },
    /// Reply: `Status` (`CUDA_ERROR_NOT_READY` while work is pending).
    StreamQuery { ctx: Id, stream: Id },
    /// No reply.
    StreamWaitEvent {
        ctx: Id,
        stream: Id,
        event: Id,
        flags: u32,
    },
    /// No reply.
    CreateEvent { id: Id, ctx: Id, flags: u32 },
    /// No reply.
    DestroyEvent { id: Id },
    /// No reply.
    RecordEvent {
        ctx: Id,
        event: Id,
        stream: Id,
        flags: u32,
    },
    /// Reply: `Status`.
    EventSynchronize { event: Id },
    /// Reply: `Status`.
    EventQuery { event: Id },
    /// Reply: `Elapsed`.
    EventElapsedTime { start: Id, end: Id },
    /// The occupancy calculator. Reply: `Value`.
    Occupancy { ctx: Id, query: OccupancyQuery },
    /// `cuStreamBeginCapture`: the stream's work from now on is recorded into a graph on the
    /// server. Reply: `Status`.
    BeginCapture { ctx: Id, stream: Id, mode: u32 },
    /// `cuStreamEndCapture`: the recorded graph becomes `graph`. Reply: `Status`.
    EndCapture { ctx: Id, stream: Id, graph: Id },
    /// `cuGraphInstantiateWithFlags`. Reply: `Status`.
    GraphInstantiate {
        ctx: Id,
        graph: Id,
        exec: Id,
        flags: u64,
    },
    /// `cuGraphLaunch` (`upload`: `cuGraphUpload`). No reply.
    GraphLaunch {
        ctx: Id,
        exec: Id,
        stream: Id,
        upload: bool,
    },
    /// No reply.
    GraphDestroy { graph: Id },
    /// No reply.
    GraphExecDestroy { exec: Id },
    /// The virtual memory management calls (`cuMem{GetAllocationGranularity,AddressReserve,
    /// Create,Map,SetAccess,Unmap,Release,AddressFree}`). Reply: `Value` (granularity),
    /// `Pointer` (reserve) or `Status`.
    Vmm { ctx: Id, op: VmmOp },
}

/// `CUmemAllocationProp`, with device ordinals already the server's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemProp {
    pub kind: u32,
    pub handle_types: u32,
    pub location_type: u32,
    pub location_id: i32,
    /// The `allocFlags` bytes (compression type, GPUDirect RDMA, usage).
    pub alloc_flags: [u8; 8],
}

/// `CUmemAccessDesc`, with device ordinals already the server's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemAccess {
    pub location_type: u32,
    pub location_id: i32,
    pub flags: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum VmmOp {
    Granularity {
        prop: MemProp,
        option: u32,
    },
    Reserve {
        size: u64,
        alignment: u64,
        addr: DevicePtr,
        flags: u64,
    },
    /// The physical allocation gets the client-chosen `handle` id.
    Create {
        handle: Id,
        size: u64,
        prop: MemProp,
        flags: u64,
    },
    Map {
        ptr: DevicePtr,
        size: u64,
        offset: u64,
        handle: Id,
        flags: u64,
    },
    SetAccess {
        ptr: DevicePtr,
        size: u64,
        access: Vec<MemAccess>,
    },
    Unmap {
        ptr: DevicePtr,
        size: u64,
    },
    Release {
        handle: Id,
    },
    AddressFree {
        ptr: DevicePtr,
        size: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum OccupancyQuery {
    /// `cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags`.
    MaxActiveBlocks {
        function: Id,
        block_size: i32,
        shared_mem: u64,
        flags: u32,
    },
    /// `cuOccupancyAvailableDynamicSMemPerBlock`.
    AvailableDynamicSharedMem {
        function: Id,
        num_blocks: i32,
        block_size: i32,
    },
    /// `cuOccupancyMaxPotentialBlockSize` without a size callback.
    MaxPotentialBlockSize {
        function: Id,
        shared_mem: u64,
        block_size_limit: i32,
        flags: u32,
    },
    /// `cuOccupancyMaxActiveClusters` with a launch configuration.
    MaxActiveClusters {
        function: Id,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        attributes: Vec<LaunchAttribute>,
    },
}

impl CuRequest {
    pub fn expects_reply(&self) -> bool {
        !matches!(
            self,
            CuRequest::CreateContext { .. }
                | CuRequest::DestroyContext { .. }
                | CuRequest::MemcpyHtoD { .. }
                | CuRequest::MemcpyDtoD { .. }
                | CuRequest::MemFreeAsync { .. }
                | CuRequest::Memset { .. }
                | CuRequest::UnloadImage { .. }
                | CuRequest::SetFunctionCacheConfig { .. }
                | CuRequest::Launch { .. }
                | CuRequest::CreateStream { .. }
                | CuRequest::DestroyStream { .. }
                | CuRequest::StreamWaitEvent { .. }
                | CuRequest::CreateEvent { .. }
                | CuRequest::DestroyEvent { .. }
                | CuRequest::RecordEvent { .. }
                | CuRequest::GraphLaunch { .. }
                | CuRequest::GraphDestroy { .. }
                | CuRequest::GraphExecDestroy { .. }
        )
    }

    /// Whether the request carries bulk data.
    pub fn takes_bulk(&self) -> bool {
        matches!(
            self,
            CuRequest::MemcpyHtoD { .. } | CuRequest::LoadImage { .. } | CuRequest::Launch { .. }
        )
    }
}

/// What a function's client needs to launch it and answer its attribute queries locally.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionInfo {
    /// `(offset, size)` of each parameter in the parameter buffer.
    pub params: Vec<(u32, u32)>,
    /// `(CUfunction_attribute, value)` for every attribute the driver answers.
    pub attributes: Vec<(u32, i32)>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum CuReply {
    Status(Status),
    Inventory(CuInventory),
    Value {
        status: Status,
        value: i64,
    },
    MemInfo {
        status: Status,
        free: u64,
        total: u64,
    },
    Pointer {
        status: Status,
        ptr: DevicePtr,
    },
    /// `need_image`: the server does not hold an image with that hash; send it.
    Loaded {
        status: Status,
        need_image: bool,
        log: String,
    },
    Function {
        status: Status,
        info: FunctionInfo,
    },
    Global {
        status: Status,
        ptr: DevicePtr,
        size: u64,
    },
    Elapsed {
        status: Status,
        milliseconds: f32,
    },
}
