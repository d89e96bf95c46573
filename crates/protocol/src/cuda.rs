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

use crate::nvml::{DeviceStatus, NvmlAnswer, NvmlInventory, NvmlQuery};
use crate::{LaneKey, PeerExport};

/// The largest page-locked host allocation a kernel may reach through a mirror
/// (`HostMirror`): its bytes travel whole at each synchronization.
pub const HOST_MIRROR_MAX: u64 = 64 << 20;

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

/// A request's outcome: its value, or the `CUresult` of its failure.
pub type Answer<T> = Result<T, Status>;

/// `cuMemGetInfo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemInfo {
    pub free: u64,
    pub total: u64,
}

/// Another session's allocation as `IpcOpenMemory` mapped it: its address here and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpcMapping {
    pub ptr: DevicePtr,
    pub size: u64,
}

/// A driver file descriptor a session lodged with its worker for other sessions of this machine
/// (`cuMemExportToShareableHandle`, `cuMemPoolExportToShareableHandle`): the worker's share
/// socket (an abstract Unix socket name, random) and the ticket it gives the descriptor for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shareable {
    pub socket: [u8; 16],
    pub ticket: crate::LaneKey,
}

/// A graph node's parameters as `GraphNodeGetParams` reads them back: the node's kind's
/// parameters, a kernel node's parameter buffer (laid out as for `Launch`), and a graph
/// allocation's address.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeState {
    pub params: NodeParams,
    pub kernel_params: Vec<u8>,
    pub address: DevicePtr,
}

/// A capture as `cuStreamGetCaptureInfo` describes it: its `CUstreamCaptureStatus` and the
/// nodes (ids and `CUgraphNodeType`s) the stream's next work will depend on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureState {
    pub status: u32,
    pub dependencies: Vec<(Id, u32)>,
}

/// A module's or library's global.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Global {
    pub ptr: DevicePtr,
    pub size: u64,
}

/// The answer to `LoadImage`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Loaded {
    pub status: Status,
    /// The server does not hold an image with that hash; send it.
    pub need_image: bool,
    /// What the JIT compiler said.
    pub logs: JitLogs,
}

/// One `CUjit_option` with a value (a number: the log buffers and symbol tables, which hold
/// host addresses, stay on the client).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JitOption {
    pub option: u32,
    pub value: u64,
}

/// The JIT compiler's or linker's logs and time (`CU_JIT_INFO_LOG_BUFFER`,
/// `CU_JIT_ERROR_LOG_BUFFER`, `CU_JIT_WALL_TIME`), for the client to hand the program.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JitLogs {
    pub info: String,
    pub error: String,
    pub wall_time_ms: f32,
}

/// The answer to `LinkAddData` and `LinkComplete`: the status, the logs so far and, once
/// complete, the linked cubin (the program gets it as host memory).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Linked {
    pub status: Status,
    pub logs: JitLogs,
    pub cubin: Vec<u8>,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayDesc {
    pub width: u64,
    pub height: u64,
    pub depth: u64,
    /// `CUarray_format`.
    pub format: u32,
    pub channels: u32,
    pub flags: u32,
}

impl ArrayDesc {
    /// Bytes of one element (`format` and `channels`); `None` for a format rgpu does not know.
    pub fn element_bytes(&self) -> Option<u64> {
        let format = match self.format {
            0x01 | 0x08 => 1,        // unsigned / signed 8-bit
            0x02 | 0x09 | 0x10 => 2, // 16-bit integers, half
            0x03 | 0x0a | 0x20 => 4, // 32-bit integers, float
            _ => return None,
        };
        Some(format * self.channels as u64)
    }
}

/// One side of a copy between device memory and arrays of a server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Place {
    /// Device memory: rows from `ptr`, laid out by `pitch`.
    Device { ptr: DevicePtr, pitch: Pitch },
    /// An array, from `origin` (x in bytes, row, slice).
    Array { id: Id, origin: [u64; 3] },
}

/// One pull of a [`PullRanges`](CuRequest::PullRanges) request: the fields of a `PullRange`
/// but the context.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangePull {
    pub stream: Option<Id>,
    pub dst: DevicePtr,
    pub size: u64,
    pub from: PeerExport,
    pub ipc: bool,
}

/// How an export of device memory is kept from changing, and ordered, while it is pulled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExportKeep {
    /// Not at all: the client waits for the pull before the memory can change (MPI, or a
    /// copy the client waits for).
    Unguarded,
    /// A copy in the stream's order, for a puller on the same machine that copies device to
    /// device through the allocation's IPC handle: later work on the stream waits until it
    /// has.
    Hold,
    /// A copy in the stream's order, over the network: the stream itself reads the range into
    /// page-locked buffers as the puller takes them, then waits until the puller has the
    /// bytes in its device memory.
    Staged,
}

/// A memory pool: a device's default pool, or one the session made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Pool {
    /// The default pool of the server's device.
    Default(u32),
    Created(Id),
}

/// `CUmemPoolProps`, with the device ordinal already the server's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolProps {
    pub alloc_type: u32,
    pub handle_types: u32,
    pub location_type: u32,
    pub location_id: i32,
    pub max_size: u64,
    pub usage: u16,
}

/// A tensor map to encode, as `cuTensorMapEncodeTiled` / `Im2col` take it, or a map whose
/// address to replace.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TensorMapRequest {
    Tiled {
        data_type: u32,
        address: DevicePtr,
        dims: Vec<u64>,
        strides: Vec<u64>,
        box_dims: Vec<u32>,
        element_strides: Vec<u32>,
        /// Interleave, swizzle, L2 promotion and out-of-bounds fill.
        modes: [u32; 4],
    },
    Im2col {
        data_type: u32,
        address: DevicePtr,
        dims: Vec<u64>,
        strides: Vec<u64>,
        lower_corner: Vec<i32>,
        upper_corner: Vec<i32>,
        channels: u32,
        pixels: u32,
        element_strides: Vec<u32>,
        modes: [u32; 4],
    },
    ReplaceAddress {
        map: Vec<u8>,
        address: DevicePtr,
    },
}

/// `CUgraphEdgeData`: the ports an edge joins and its type (e.g. programmatic, for
/// programmatic dependent launch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Edge {
    pub from_port: u8,
    pub to_port: u8,
    pub kind: u8,
}

/// An edge of a graph (`GraphEdges`): its nodes' ids and `CUgraphNodeType`s, and its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedEdge {
    pub from: Id,
    pub from_kind: u32,
    pub to: Id,
    pub to_kind: u32,
    pub data: Edge,
}

/// Which nodes of a graph `GraphNodes` lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeQuery {
    All,
    Roots,
    DependenciesOf(Id),
    DependentsOf(Id),
}

/// The first id the server gives a node the client never named.
pub const SERVER_NODE_IDS: Id = 1 << 63;

/// What a graph node does (`CUgraphNodeParams`, with the client's handles as session ids).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum NodeParams {
    /// A kernel; its parameter buffer is the request's bulk (laid out as for `Launch`).
    Kernel {
        function: Id,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
    },
    /// As `Memset`.
    Memset {
        dst: DevicePtr,
        value: u32,
        element_size: u8,
        width: u64,
        height: u64,
        pitch: u64,
    },
    /// A copy between device addresses of this server.
    Copy {
        dst: DevicePtr,
        dst_pitch: Pitch,
        src: DevicePtr,
        src_pitch: Pitch,
        extent: Extent,
    },
    Empty,
    EventRecord {
        event: Id,
    },
    EventWait {
        event: Id,
    },
    /// A copy of graph `graph` as a child graph.
    Child {
        graph: Id,
    },
    /// A conditional node on `handle` (the server's `CUgraphConditionalHandle`); the driver
    /// makes its `bodies.len()` body graphs, which take the ids in `bodies`.
    Conditional {
        handle: u64,
        kind: u32,
        bodies: Vec<Id>,
    },
    /// A graph allocation of `size` bytes from a pool like `props`, accessible as `access`
    /// says; its address comes from `GraphMemAllocNodeAddress`.
    MemAlloc {
        props: PoolProps,
        access: Vec<MemAccess>,
        size: u64,
    },
    /// Frees the graph allocation at `dptr`.
    MemFree {
        dptr: DevicePtr,
    },
}

/// A failed NCCL call: its `ncclResult_t` (never `ncclSuccess`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NcclError(pub i32);

/// `ncclSystemError`: what a server without NCCL (or without CUDA) answers.
pub const NCCL_SYSTEM_ERROR: NcclError = NcclError(2);

/// An NCCL call's answer.
pub type NcclAnswer<T> = Result<T, NcclError>;

/// A server that refuses an NCCL request (one without CUDA) has no NCCL.
impl<T> crate::table::FromStatus<Status> for NcclAnswer<T> {
    fn from_status(_: Status) -> Self {
        Err(NCCL_SYSTEM_ERROR)
    }

    fn failure(&self) -> Option<i64> {
        self.as_ref().err().map(|e| e.0.into())
    }
}

/// A communicator's configuration (`ncclConfig_t`) as the program set it: its version, then
/// its integer fields in the header's order (`blocking`, `cgaClusterSize`, `minCTAs`,
/// `maxCTAs`, `splitShare`, `trafficClass`, `collnetEnable`, `CTAPolicy`, ...: as many as the
/// program's struct holds; unset ones `NCCL_CONFIG_UNDEF_INT`) and its two strings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NcclConfig {
    pub version: u32,
    pub ints: Vec<i32>,
    pub net_name: Option<String>,
    pub comm_name: Option<String>,
}

/// What a collective or point-to-point call does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NcclKind {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Gather,
    Scatter,
    Send,
    Recv,
}

/// One NCCL call of a group (or alone).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum NcclOp {
    /// `ncclCommInitRankConfig` on `ctx`'s device: communicator `comm`, rank `rank` of `nranks`,
    /// over the bootstrap `unique_id` names.
    InitRank {
        comm: Id,
        ctx: Id,
        nranks: i32,
        rank: i32,
        unique_id: Vec<u8>,
        config: Option<NcclConfig>,
    },
    /// `ncclCommSplit` of `parent` into `comm` (none made when `color` is NCCL_SPLIT_NOCOLOR).
    Split {
        comm: Id,
        parent: Id,
        color: i32,
        key: i32,
        config: Option<NcclConfig>,
    },
    /// A collective (or send, receive) on `stream` of `ctx`: `root` is the root or the peer;
    /// `op` the reduction (a built-in or one of `ncclRedOpCreatePreMulSum`).
    Call {
        kind: NcclKind,
        comm: Id,
        ctx: Id,
        stream: Id,
        send: DevicePtr,
        recv: DevicePtr,
        count: u64,
        datatype: u32,
        op: u32,
        root: i32,
    },
}

/// How a communicator ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NcclEnd {
    Finalize,
    Destroy,
    Abort,
}

/// The scalar of `ncclRedOpCreatePreMulSum`: its bytes (host memory), or a device address
/// that holds it when the reduction runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NcclScalar {
    Host(Vec<u8>),
    Device(DevicePtr),
}

wire_api! {
    request: CuRequest,
    reply: CuReply,
    status: Status,
    client: CudaClient;

    /// Devices and contexts.
    group Contexts {
        /// What a client needs to answer every device query locally.
        call GetInventory get_inventory() -> CuInventory;
        /// A context on `device`. `primary`: the session's stand-in for the device's primary
        /// context (one per session and device, shared by every primary-context handle of the
        /// client).
        post CreateContext create_context(id: Id, device: u32, flags: u32, primary: bool);
        post DestroyContext destroy_context(id: Id);
        /// `cuCtxSynchronize`; also reports the first deferred failure.
        call Synchronize synchronize(ctx: Id) -> Status;
        /// `cuCtxEnablePeerAccess`: `ctx` may use the memory of `peer` (a context of another
        /// device of this server).
        call EnablePeerAccess enable_peer_access(ctx: Id, peer: Id, flags: u32) -> Status;
        /// `cuCtxDisablePeerAccess`.
        call DisablePeerAccess disable_peer_access(ctx: Id, peer: Id) -> Status;
        /// `cuCtxGetLimit`.
        call GetLimit get_limit(ctx: Id, limit: u32) -> Answer<u64>;
        /// `cuCtxSetLimit`.
        call SetLimit set_limit(ctx: Id, limit: u32, value: u64) -> Status;
        /// `cuCtxResetPersistingL2Cache`.
        post ResetPersistingL2Cache reset_persisting_l2_cache(ctx: Id);
        /// `cuProfilerStart` / `cuProfilerStop` for `ctx` (a profiler on the server sees them).
        post Profiler profiler(ctx: Id, start: bool);
        /// `cuTensorMapEncode*` / `cuTensorMapReplaceAddress`: the 128-byte descriptor. Host
        /// work, but its format is the driver's own, so the server's driver makes it.
        call TensorMap tensor_map(request: TensorMapRequest) -> Answer<Vec<u8>>;
    }

    /// Allocations and memsets.
    group Memory {
        /// `cuMemGetInfo`.
        call MemGetInfo mem_get_info(ctx: Id) -> Answer<MemInfo>;
        /// `cuMemAlloc`.
        call MemAlloc mem_alloc(ctx: Id, size: u64) -> Answer<DevicePtr>;
        /// `cuMemFree`.
        call MemFree mem_free(ctx: Id, ptr: DevicePtr) -> Status;
        /// Stands in on the device for page-locked host memory of the program that a kernel
        /// argument points to ("zero-copy"): mapped pinned memory of the server's, `size`
        /// bytes, zeroed; its device address (crate rgpu-cuda's host_mirror.rs keeps the two
        /// in step).
        call HostMirror host_mirror(ctx: Id, size: u64) -> Answer<DevicePtr>;
        /// The program's bytes of a mirror from `offset` (the bulk), written at once (a
        /// running kernel may be waiting for them).
        post [bulk] HostMirrorWrite host_mirror_write(mirror: DevicePtr, offset: u64);
        /// A mirror's bytes as the device left them.
        call HostMirrorRead host_mirror_read(mirror: DevicePtr) -> Answer<Vec<u8>>;
        /// Frees a mirror.
        post HostMirrorFree host_mirror_free(mirror: DevicePtr);
        /// Device memory staging a graph's copy with a host side: as `MemAlloc`, but also while
        /// a stream captures in global mode (the call relaxes the thread's capture mode).
        call StagingAlloc staging_alloc(ctx: Id, size: u64) -> Answer<DevicePtr>;
        /// `cuMemAllocAsync` from the device's default pool, ordered on `stream`.
        call MemAllocAsync mem_alloc_async(ctx: Id, stream: Id, size: u64) -> Answer<DevicePtr>;
        /// `cuMemFreeAsync`.
        post MemFreeAsync mem_free_async(ctx: Id, stream: Id, ptr: DevicePtr);
        /// `cuMemPoolCreate`: pool `id`.
        call MemPoolCreate mem_pool_create(ctx: Id, id: Id, props: PoolProps) -> Status;
        post MemPoolDestroy mem_pool_destroy(id: Id);
        /// `cuMemAllocFromPoolAsync`.
        call MemAllocFromPool mem_alloc_from_pool(ctx: Id, stream: Id, pool: Pool, size: u64)
            -> Answer<DevicePtr>;
        /// `cuMemPoolSetAttribute` (values of every attribute fit 64 bits).
        call MemPoolSetAttribute mem_pool_set_attribute(pool: Pool, attribute: u32, value: u64)
            -> Status;
        /// `cuMemPoolGetAttribute`.
        call MemPoolGetAttribute mem_pool_get_attribute(pool: Pool, attribute: u32) -> Answer<u64>;
        /// `cuMemPoolTrimTo`.
        post MemPoolTrim mem_pool_trim(pool: Pool, keep: u64);
        /// `cuMemPoolSetAccess`.
        call MemPoolSetAccess mem_pool_set_access(pool: Pool, access: Vec<MemAccess>) -> Status;
        /// `cuMemPoolGetAccess` from a device of this server: the `CUmemAccess_flags`.
        call MemPoolGetAccess mem_pool_get_access(pool: Pool, device: u32) -> Answer<u32>;
        /// `cuDeviceSetMemPool`: `cuMemAllocAsync` on `device` takes from `pool` from now on.
        call DeviceSetMemPool device_set_mem_pool(device: u32, pool: Pool) -> Status;
        /// `cuMemsetD8/16/32[Async]` (`element_size` 1, 2 or 4) and their 2D forms (`height` > 1,
        /// rows `pitch` bytes apart, `width` elements each).
        post Memset memset(
            ctx: Id,
            stream: Id,
            dst: DevicePtr,
            value: u32,
            element_size: u8,
            width: u64,
            height: u64,
            pitch: u64,
        );
        /// `cuMemAllocManaged` (`flags`: `CU_MEM_ATTACH_GLOBAL` or `CU_MEM_ATTACH_HOST`). The
        /// client keeps the host view of the memory at the same address (crate rgpu-cuda's
        /// host_view).
        call MemAllocManaged mem_alloc_managed(ctx: Id, size: u64, flags: u32)
            -> Answer<DevicePtr>;
        /// `cuMemPrefetchAsync_v2` of managed memory to a `CUmemLocation` of this server.
        post MemPrefetch mem_prefetch(
            ctx: Id,
            stream: Id,
            ptr: DevicePtr,
            size: u64,
            location_type: u32,
            location_id: i32,
        );
        /// `cuMemAdvise_v2` on managed memory.
        call MemAdvise mem_advise(
            ctx: Id,
            ptr: DevicePtr,
            size: u64,
            advice: u32,
            location_type: u32,
            location_id: i32,
        ) -> Status;
        /// `cuStreamAttachMemAsync`.
        post StreamAttachMem stream_attach_mem(
            ctx: Id,
            stream: Id,
            ptr: DevicePtr,
            size: u64,
            flags: u32,
        );
        /// `cuMemRangeGetAttribute`: the attribute's value, `data_size` bytes.
        call MemRangeGetAttribute mem_range_get_attribute(
            ctx: Id,
            ptr: DevicePtr,
            size: u64,
            attribute: u32,
            data_size: u32,
        ) -> Answer<Vec<u8>>;
    }

    /// Copies to, from and between devices.
    group Copies {
        /// Bulk: the rows to write at `dst` (laid out there by `pitch`), packed, in stream order.
        post [bulk] MemcpyHtoD memcpy_htod(
            ctx: Id,
            stream: Id,
            dst: DevicePtr,
            extent: Extent,
            pitch: Pitch,
        );
        /// Reads the rows at `src` (laid out there by `pitch`): the data comes packed (offsets
        /// into the packed bytes).
        read MemcpyDtoH memcpy_dtoh(
            ctx: Id,
            stream: Id,
            src: DevicePtr,
            extent: Extent,
            pitch: Pitch,
        );
        /// Copies rows between device addresses of this server, ordered on `stream` of `ctx`.
        /// `src_ctx`: the context of `src` when it is not `ctx` (a peer copy), else 0.
        post MemcpyDtoD memcpy_dtod(
            ctx: Id,
            stream: Id,
            dst: DevicePtr,
            dst_pitch: Pitch,
            src: DevicePtr,
            src_pitch: Pitch,
            src_ctx: Id,
            extent: Extent,
        );
    }

    /// Device memory moved between servers over the fabric (crates/server/src/fabric.rs):
    /// copies between GPUs of different servers, waits on another server's events, MPI
    /// transfers (docs/mpi.md). None waits for the network: failures are reported by the
    /// session's next synchronizing request.
    group Peers {
        /// Lets another server pull `size` bytes at `ptr` once the earlier work of `stream`
        /// (0: the context's default stream) is done, under `ticket` (the client's random
        /// choice). `keep`: how later work on `stream` is kept from changing the bytes before
        /// they have been pulled (a copy ordered on that stream).
        post ExportRange export_range(
            ctx: Id,
            stream: Id,
            ptr: DevicePtr,
            size: u64,
            ticket: LaneKey,
            keep: ExportKeep,
        );
        /// Lets another server wait for `event` as recorded now: an export of no bytes, ready
        /// once the event has completed (`cuStreamWaitEvent` across servers).
        post ExportEvent export_event(ctx: Id, event: Id, ticket: LaneKey);
        /// Withdraws an export nobody pulled.
        post Unexport unexport(ticket: LaneKey);
        /// Fills `size` bytes at `dst` with another server's export, in `stream`'s order
        /// (`None`: a stream of the fabric's own, for a copy the exporter's stream orders): the
        /// server pulls it in the background, and later work on the stream waits for the
        /// bytes (size 0: waits for an `ExportEvent`). `ipc`: the exporting session is on
        /// this machine; copy device to device through the allocation's IPC handle.
        post PullRange pull_range(
            ctx: Id,
            stream: Option<Id>,
            dst: DevicePtr,
            size: u64,
            from: PeerExport,
            ipc: bool,
        );
        /// Several `PullRange`s in `ctx` at once (the MPI interposer's window of messages),
        /// each as that request would be: the server asks each exporting session for the IPC
        /// handles of all of its exports together, one round trip for the lot.
        post PullRanges pull_ranges(ctx: Id, pulls: Vec<RangePull>);
        /// Lets a server on this machine copy `size` bytes into `dst` through the allocation's
        /// IPC handle (`PushRange`), under `ticket`. Should it not, this server pulls `from`
        /// (the pusher's export of the bytes) into `dst` on a stream of the fabric's own
        /// (through its IPC handle when `ipc`), as `PullRange` would.
        post LandRange land_range(
            ctx: Id,
            dst: DevicePtr,
            size: u64,
            ticket: LaneKey,
            from: PeerExport,
            ipc: bool,
        );
        /// Copies `size` bytes at `src`, in `stream`'s order, into another server's `LandRange`
        /// `to` (a server on this machine), device to device through the destination
        /// allocation's IPC handle: the copy that native `cuMemcpyPeerAsync` makes on the
        /// source's stream. Where that cannot be, exports the bytes under `ticket` (held on
        /// `stream` until delivered) and has the destination pull them.
        post PushRange push_range(
            ctx: Id,
            stream: Id,
            src: DevicePtr,
            size: u64,
            to: PeerExport,
            ticket: LaneKey,
        );
    }

    /// Modules, libraries, functions and kernels.
    group Modules {
        /// Loads an image whose SHA-256 is `hash`, compiled with the JIT options `jit`. Bulk:
        /// the image, or nothing when the client expects the server to hold it already.
        call [bulk] LoadImage load_image(
            id: Id,
            ctx: Id,
            kind: ImageKind,
            hash: [u8; 32],
            jit: Vec<JitOption>,
        ) -> Loaded;
        /// `cuLinkCreate`: a JIT link in `ctx`.
        post LinkCreate link_create(id: Id, ctx: Id, jit: Vec<JitOption>);
        /// `cuLinkAddData` / `cuLinkAddFile` (the client reads the file). Bulk: the input.
        call [bulk] LinkAddData link_add_data(link: Id, input: u32, name: String, jit: Vec<JitOption>)
            -> Linked;
        /// `cuLinkComplete`: the linked cubin. The server also keeps it as an image, so that
        /// loading it next travels as its hash.
        call LinkComplete link_complete(link: Id) -> Linked;
        post LinkDestroy link_destroy(link: Id);
        /// The names of a module's functions (a library's kernels), in the driver's order
        /// (`cuModuleEnumerateFunctions`, and the module iterator cuFFT uses).
        call ImageFunctions image_functions(image: Id) -> Answer<Vec<String>>;
        post UnloadImage unload_image(id: Id);
        /// `cuModuleGetFunction` (`image` a module) or `cuLibraryGetKernel` (a library).
        call GetFunction get_function(id: Id, image: Id, name: String) -> Answer<FunctionInfo>;
        /// `cuKernelGetFunction`: the function of a library kernel in `ctx`.
        call KernelGetFunction kernel_get_function(id: Id, kernel: Id, ctx: Id)
            -> Answer<FunctionInfo>;
        /// `cuModuleGetGlobal` / `cuLibraryGetGlobal`.
        call GetGlobal get_global(ctx: Id, image: Id, name: String) -> Answer<Global>;
        /// `cuFuncSetAttribute` / `cuKernelSetAttribute` (`device` for kernels).
        call SetFunctionAttribute set_function_attribute(
            function: Id,
            attribute: u32,
            value: i32,
            device: u32,
        ) -> Status;
        /// `cuFuncGetAttribute` / `cuKernelGetAttribute` for an attribute the function's cached
        /// table lacks.
        call GetFunctionAttribute get_function_attribute(function: Id, attribute: u32, device: u32)
            -> Answer<i32>;
        /// `cuFuncSetCacheConfig` and friends.
        post SetFunctionCacheConfig set_function_cache_config(function: Id, config: u32);
    }

    /// Kernel launches and the occupancy calculator.
    group Launches {
        /// Bulk: the kernel's parameter buffer, laid out as the function's parameter table says.
        post [bulk] Launch launch(
            ctx: Id,
            function: Id,
            stream: Id,
            grid: [u32; 3],
            block: [u32; 3],
            shared_mem: u32,
            attributes: Vec<LaunchAttribute>,
        );
        /// The occupancy calculator.
        call Occupancy occupancy(ctx: Id, query: OccupancyQuery) -> Answer<i64>;
    }

    /// Streams.
    group Streams {
        post CreateStream create_stream(id: Id, ctx: Id, flags: u32, priority: i32);
        /// `cuStreamSetAttribute`: the attribute's id and the bytes of its value union.
        post StreamSetAttribute stream_set_attribute(ctx: Id, stream: Id, attribute: LaunchAttribute);
        /// `cuStreamGetAttribute`: the bytes of the value union.
        call StreamGetAttribute stream_get_attribute(ctx: Id, stream: Id, id: u32) -> Answer<Vec<u8>>;
        post DestroyStream destroy_stream(id: Id);
        /// Also reports the first deferred failure.
        call StreamSynchronize stream_synchronize(ctx: Id, stream: Id) -> Status;
        /// `CUDA_ERROR_NOT_READY` while work is pending.
        call StreamQuery stream_query(ctx: Id, stream: Id) -> Status;
        post StreamWaitEvent stream_wait_event(ctx: Id, stream: Id, event: Id, flags: u32);
    }

    /// Events.
    group Events {
        post CreateEvent create_event(id: Id, ctx: Id, flags: u32);
        post DestroyEvent destroy_event(id: Id);
        post RecordEvent record_event(ctx: Id, event: Id, stream: Id, flags: u32);
        /// `cuCtxRecordEvent`: the event completes once the work of every stream of the
        /// context before it has.
        post CtxRecordEvent ctx_record_event(ctx: Id, event: Id);
        /// `cuCtxWaitEvent`: the later work of every stream of the context waits for the
        /// event.
        post CtxWaitEvent ctx_wait_event(ctx: Id, event: Id);
        /// Also reports the first deferred failure.
        call EventSynchronize event_synchronize(event: Id) -> Status;
        call EventQuery event_query(event: Id) -> Status;
        /// `cuEventElapsedTime`, in milliseconds.
        call EventElapsedTime event_elapsed_time(start: Id, end: Id) -> Answer<f32>;
    }

    /// Graphs: by stream capture, or built node by node.
    group Graphs {
        /// `cuStreamBeginCapture`: the stream's work from now on is recorded into a graph on the
        /// server; `into` (`cuStreamBeginCaptureToGraph`): into that existing graph, after the
        /// nodes `after`, else 0.
        call BeginCapture begin_capture(ctx: Id, stream: Id, mode: u32, into: Id, after: Vec<Id>)
            -> Status;
        /// `cuStreamEndCapture`: the recorded graph becomes `graph`.
        call EndCapture end_capture(ctx: Id, stream: Id, graph: Id) -> Status;
        /// `cuStreamGetCaptureInfo` asking for the graph or the dependencies: the capture's
        /// status and the nodes the stream's next work will depend on (ids and types). The
        /// graph being built is known as `graph` from then on (the session holds it, the
        /// capture owns it until `EndCapture` names it).
        call CaptureInfo capture_info(ctx: Id, stream: Id, graph: Id) -> Answer<CaptureState>;
        /// `cuStreamUpdateCaptureDependencies`: `flags` 0 adds `nodes` to the stream's
        /// dependencies, 1 replaces them.
        call UpdateCaptureDependencies update_capture_dependencies(ctx: Id, stream: Id,
            nodes: Vec<Id>, flags: u32) -> Status;
        /// `cuGraphInstantiateWithFlags`.
        call GraphInstantiate graph_instantiate(ctx: Id, graph: Id, exec: Id, flags: u64) -> Status;
        /// `cuGraphLaunch` (`upload`: `cuGraphUpload`).
        post GraphLaunch graph_launch(ctx: Id, exec: Id, stream: Id, upload: bool);
        post GraphDestroy graph_destroy(graph: Id);
        post GraphExecDestroy graph_exec_destroy(exec: Id);
        /// `cuGraphCreate`.
        post GraphCreate graph_create(ctx: Id, graph: Id, flags: u32);
        /// `cuGraphAdd*Node`: node `node` of `graph`, after the nodes `after` (`edges`: the
        /// data of each of those edges, or empty for plain ones). Bulk: a kernel node's
        /// parameter buffer.
        post [bulk] GraphAddNode graph_add_node(
            ctx: Id,
            graph: Id,
            node: Id,
            after: Vec<Id>,
            edges: Vec<Edge>,
            params: NodeParams,
        );
        /// `cuGraph*NodeSetParams` (`exec` 0) and `cuGraphExec*NodeSetParams`: new parameters
        /// for node `node` of the same kind. Bulk: as for `GraphAddNode`.
        post [bulk] GraphNodeSetParams graph_node_set_params(
            ctx: Id,
            exec: Id,
            node: Id,
            params: NodeParams,
        );
        /// `cuGraphNodeSetEnabled`.
        post GraphNodeSetEnabled graph_node_set_enabled(exec: Id, node: Id, enabled: bool);
        /// `cuGraphAddDependencies` (`remove`: `cuGraphRemoveDependencies`), pairwise, with
        /// each edge's data (or empty for plain edges).
        post GraphDependencies graph_dependencies(
            graph: Id,
            from: Vec<Id>,
            to: Vec<Id>,
            edges: Vec<Edge>,
            remove: bool,
        );
        /// `cuGraphConditionalHandleCreate`: the server's handle, which kernels receive.
        call GraphConditionalHandle graph_conditional_handle(
            ctx: Id,
            graph: Id,
            default_value: u32,
            flags: u32,
        ) -> Answer<u64>;
        /// `cuGraphExecUpdate`: the `CUgraphExecUpdateResult`, and the status.
        call GraphExecUpdate graph_exec_update(ctx: Id, exec: Id, graph: Id) -> Answer<u32>;
        /// `cuGraphGetNodes` (how many).
        call GraphNodeCount graph_node_count(graph: Id) -> Answer<u64>;
        /// `cuGraphGetNodes`, `cuGraphGetRootNodes`, `cuGraphNodeGetDependencies` and
        /// `cuGraphNodeGetDependentNodes`: each node's id and `CUgraphNodeType`. Nodes the
        /// client never named (made by stream capture) get ids of the server's (high bit set).
        call GraphNodes graph_nodes(graph: Id, query: NodeQuery) -> Answer<Vec<(Id, u32)>>;
        /// `cuGraphGetEdges`: every edge, its nodes named as `GraphNodes` names them.
        call GraphEdges graph_edges(graph: Id) -> Answer<Vec<ListedEdge>>;
        /// `cuGraphClone`: a copy of `graph` as graph `clone` (its nodes are the server's to
        /// name, as a captured graph's).
        call GraphClone graph_clone(graph: Id, clone: Id) -> Status;
        /// `cuGraphNodeFindInClone`: the node of `clone` that `node` of its original became.
        call GraphNodeFindInClone graph_node_find_in_clone(clone: Id, node: Id)
            -> Answer<(Id, u32)>;
        /// `cuGraphDestroyNode`.
        call GraphDestroyNode graph_destroy_node(node: Id) -> Status;
        /// `cuGraphNodeGetEnabled`.
        call GraphNodeGetEnabled graph_node_get_enabled(exec: Id, node: Id) -> Answer<bool>;
        /// `cuDeviceGraphMemTrim`.
        call GraphMemTrim graph_mem_trim(device: u32) -> Status;
        /// `cuDeviceGetGraphMemAttribute`, or with `reset` `cuDeviceSetGraphMemAttribute` to 0
        /// (the one value the driver takes: a high watermark's reset).
        call GraphMemAttribute graph_mem_attribute(device: u32, attribute: u32, reset: bool)
            -> Answer<u64>;
        /// The address of the allocation a `MemAlloc` node makes (the driver fixes it when the
        /// node is added).
        call GraphMemAllocNodeAddress graph_mem_alloc_node_address(node: Id) -> Answer<DevicePtr>;
        /// `cuGraph*NodeGetParams`, `cuGraphEvent*NodeGetEvent`, `cuGraphChildGraphNodeGetGraph`:
        /// the node's parameters as the driver has them (kernel, memset, empty, event, child
        /// graph, graph allocation and free nodes; others are not supported). A child graph
        /// the client never named gets an id of the server's.
        call GraphNodeGetParams graph_node_get_params(node: Id) -> Answer<NodeState>;
        /// `cuGraphKernelNodeSetAttribute` (the value union's bytes, as for streams).
        call GraphKernelNodeSetAttribute graph_kernel_node_set_attribute(node: Id,
            attribute: LaunchAttribute) -> Status;
        /// `cuGraphKernelNodeGetAttribute`: the value union's bytes.
        call GraphKernelNodeGetAttribute graph_kernel_node_get_attribute(node: Id, id: u32)
            -> Answer<Vec<u8>>;
        /// `cuGraphKernelNodeCopyAttributes`.
        call GraphKernelNodeCopyAttributes graph_kernel_node_copy_attributes(dst: Id, src: Id)
            -> Status;
    }

    /// CUDA arrays, and texture and surface objects.
    group Arrays {
        /// `cuArray3DCreate` (`cuArrayCreate`: depth 0): array `id`.
        call ArrayCreate array_create(ctx: Id, id: Id, desc: ArrayDesc) -> Status;
        post ArrayDestroy array_destroy(id: Id);
        /// `cuMipmappedArrayCreate`: mipmapped array `id` of `levels` levels.
        call MipmappedArrayCreate mipmapped_array_create(ctx: Id, id: Id, desc: ArrayDesc, levels: u32)
            -> Status;
        /// `cuMipmappedArrayDestroy` (its levels go with it).
        post MipmappedArrayDestroy mipmapped_array_destroy(id: Id);
        /// `cuMipmappedArrayGetLevel`: level `level` of `mipmap` becomes array `id` (owned by
        /// the mipmapped array); its descriptor.
        call MipmappedArrayGetLevel mipmapped_array_get_level(mipmap: Id, level: u32, id: Id)
            -> Answer<ArrayDesc>;
        /// Bulk: the rows to write into `array` from `origin` (x in bytes, row, slice),
        /// packed, in stream order.
        post [bulk] MemcpyHtoA memcpy_htoa(
            ctx: Id,
            stream: Id,
            array: Id,
            origin: [u64; 3],
            extent: Extent,
        );
        /// Reads rows of `array` from `origin`: the data comes packed.
        read MemcpyAtoH memcpy_atoh(ctx: Id, stream: Id, array: Id, origin: [u64; 3], extent: Extent);
        /// A copy between arrays and device memory of this server, in stream order.
        post MemcpyArray memcpy_array(ctx: Id, stream: Id, src: Place, dst: Place, extent: Extent);
        /// `cuTexObjectCreate`: `CUDA_RESOURCE_DESC`, `CUDA_TEXTURE_DESC` and
        /// `CUDA_RESOURCE_VIEW_DESC` (empty: none) as their bytes, an array's (or mipmapped
        /// array's) session id in place of its handle; the object, as kernels receive it.
        call TexObjectCreate tex_object_create(
            ctx: Id,
            resource: Vec<u8>,
            texture: Vec<u8>,
            view: Vec<u8>,
        ) -> Answer<u64>;
        /// `cuSurfObjectCreate`, likewise.
        call SurfObjectCreate surf_object_create(ctx: Id, resource: Vec<u8>) -> Answer<u64>;
        /// `cuTexObjectDestroy` / `cuSurfObjectDestroy`.
        post ObjectDestroy object_destroy(object: u64, surface: bool);
    }

    /// Virtual memory management.
    group VirtualMemory {
        /// `cuMemGetAllocationGranularity`.
        call VmmGranularity vmm_granularity(ctx: Id, prop: MemProp, option: u32) -> Answer<u64>;
        /// `cuMemAddressReserve`.
        call VmmReserve vmm_reserve(ctx: Id, size: u64, alignment: u64, addr: DevicePtr, flags: u64)
            -> Answer<DevicePtr>;
        /// `cuMemCreate`: the physical allocation gets the client-chosen `handle` id.
        call VmmCreate vmm_create(ctx: Id, handle: Id, size: u64, prop: MemProp, flags: u64)
            -> Status;
        /// `cuMemMap`.
        call VmmMap vmm_map(ctx: Id, ptr: DevicePtr, size: u64, offset: u64, handle: Id, flags: u64)
            -> Status;
        /// `cuMemSetAccess`.
        call VmmSetAccess vmm_set_access(ctx: Id, ptr: DevicePtr, size: u64, access: Vec<MemAccess>)
            -> Status;
        /// `cuMemUnmap`.
        call VmmUnmap vmm_unmap(ctx: Id, ptr: DevicePtr, size: u64) -> Status;
        /// `cuMemRelease`.
        call VmmRelease vmm_release(ctx: Id, handle: Id) -> Status;
        /// `cuMemAddressFree`.
        call VmmAddressFree vmm_address_free(ctx: Id, ptr: DevicePtr, size: u64) -> Status;
    }

    /// CUDA IPC: device memory and events of one program's session shared with the sessions
    /// of other processes (`cuIpcGetMemHandle` and the like). A shared object is an export of
    /// the fabric (crates/server/src/fabric.rs) that lasts while the object does, under a
    /// ticket this server chose; the importing session's server asks the exporting session for
    /// the driver's IPC handle over a fabric link, presenting the ticket, and opens it. Only a
    /// server of the exporter's machine can: the handle maps the memory into whoever opens it.
    group Ipc {
        /// `cuIpcGetMemHandle`: shares the allocation holding `ptr` (the same ticket each time
        /// for one allocation, as the driver gives the same handle).
        call IpcShareMemory ipc_share_memory(ctx: Id, ptr: DevicePtr) -> Answer<LaneKey>;
        /// `cuIpcGetEventHandle` (an event made with `CU_EVENT_INTERPROCESS`).
        call IpcShareEvent ipc_share_event(event: Id) -> Answer<LaneKey>;
        /// `cuIpcOpenMemHandle`: maps another session's shared allocation `from` into `ctx`.
        call IpcOpenMemory ipc_open_memory(ctx: Id, from: PeerExport, flags: u32)
            -> Answer<IpcMapping>;
        /// `cuIpcCloseMemHandle`.
        call IpcCloseMemory ipc_close_memory(ctx: Id, ptr: DevicePtr) -> Status;
        /// `cuIpcOpenEventHandle`: another session's shared event, as event `id` of `ctx`.
        call IpcOpenEvent ipc_open_event(ctx: Id, id: Id, from: PeerExport) -> Status;
    }

    /// Shareable handles of physical allocations and memory pools (POSIX file descriptors),
    /// for other processes of the machine. The driver's descriptor never leaves the exporting
    /// worker except to another server process of its user on this machine, which presents the
    /// ticket on the worker's share socket; the client gets only the socket's name and the
    /// ticket (crates/server/src/cuda/shareable.rs).
    group SharedHandles {
        /// `cuMemExportToShareableHandle` of physical allocation `handle` (the same share each
        /// time).
        call ShareAllocation share_allocation(ctx: Id, handle: Id) -> Answer<Shareable>;
        /// `cuMemImportFromShareableHandle`: another session's shared allocation, as physical
        /// allocation `handle` of this session; its properties (device ordinals the server's).
        call ImportAllocation import_allocation(ctx: Id, handle: Id, from: Shareable)
            -> Answer<MemProp>;
        /// `cuMemPoolExportToShareableHandle`.
        call SharePool share_pool(pool: Pool) -> Answer<Shareable>;
        /// `cuMemPoolImportFromShareableHandle`: another session's shared pool, as pool `id`.
        call ImportPool import_pool(ctx: Id, id: Id, from: Shareable) -> Status;
        /// `cuMemPoolExportPointer`: the driver's export data of an allocation from a shared
        /// pool (64 bytes, meaningful only to an importer of the pool).
        call PoolExportPointer pool_export_pointer(ctx: Id, ptr: DevicePtr) -> Answer<Vec<u8>>;
        /// `cuMemPoolImportPointer`: the allocation `data` describes, from imported pool
        /// `pool`, mapped in `ctx`: its address and size.
        call PoolImportPointer pool_import_pointer(ctx: Id, pool: Pool, data: Vec<u8>)
            -> Answer<IpcMapping>;
    }

    /// NVML's view of the devices, for the drop-in `libnvidia-ml.so.1` (crate::nvml).
    group Monitoring {
        /// The server's NVML versions and each device's fixed facts (CUDA device order).
        call GetNvmlInventory get_nvml_inventory() -> NvmlInventory;
        /// One device's live values (memory, utilization, sensors, this session's processes).
        call GetDeviceStatus get_device_status(device: u32) -> Answer<DeviceStatus>;
        /// One call of the server's own NVML, of the forwarding table (crate::nvml::forwarded).
        call ForwardNvml forward_nvml(query: NvmlQuery) -> NvmlAnswer;
    }

    /// NCCL run by the server's own NCCL library on the session's devices, for the drop-in
    /// `libnccl.so.2` (crates/cuda/src/nccl; crates/server/src/cuda/nccl.rs).
    group Nccl {
        /// `ncclGetVersion` of the server's NCCL.
        call NcclVersion nccl_version() -> NcclAnswer<i32>;
        /// `ncclGetUniqueId`: the id names a bootstrap root in this session's worker, which
        /// the other ranks' servers reach directly.
        call NcclUniqueId nccl_unique_id() -> NcclAnswer<Vec<u8>>;
        /// Communicators made together (one NCCL group when more than one, with any other
        /// calls of the program's group), returning when all their ranks have joined: the
        /// size and rank of each made, in order (`(0, -1)`: none, for NCCL_SPLIT_NOCOLOR).
        call NcclCreate nccl_create(ops: Vec<NcclOp>) -> NcclAnswer<Vec<(i32, i32)>>;
        /// Collectives and point-to-point calls (one NCCL group when more than one), in their
        /// streams' order; a failure becomes the communicator's asynchronous error.
        post NcclLaunch nccl_launch(ops: Vec<NcclOp>);
        /// `ncclCommGetAsyncError` (or the first failure of a posted launch): the code.
        call NcclAsyncError nccl_async_error(comm: Id) -> NcclAnswer<i32>;
        /// `ncclGetLastError` of the server's NCCL.
        call NcclLastError nccl_last_error(comm: Id) -> NcclAnswer<String>;
        /// `ncclCommFinalize`, `ncclCommDestroy` or `ncclCommAbort`.
        call NcclEndComm nccl_end_comm(comm: Id, how: NcclEnd) -> NcclAnswer<()>;
        /// `ncclRedOpCreatePreMulSum`: the new reduction's number.
        call NcclPreMulSum nccl_pre_mul_sum(comm: Id, scalar: NcclScalar, datatype: u32)
            -> NcclAnswer<u32>;
        /// `ncclRedOpDestroy`.
        call NcclRedOpDestroy nccl_red_op_destroy(comm: Id, op: u32) -> NcclAnswer<()>;
        /// `ncclMemAlloc` on `ctx`'s device.
        call NcclMemAlloc nccl_mem_alloc(ctx: Id, size: u64) -> NcclAnswer<DevicePtr>;
        /// `ncclMemFree`.
        call NcclMemFree nccl_mem_free(ctx: Id, ptr: DevicePtr) -> NcclAnswer<()>;
        /// `ncclCommRegister`: the registration's number.
        call NcclRegister nccl_register(comm: Id, ptr: DevicePtr, size: u64) -> NcclAnswer<u64>;
        /// `ncclCommDeregister`.
        call NcclDeregister nccl_deregister(comm: Id, registration: u64) -> NcclAnswer<()>;
    }
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

/// What a function's client needs to launch it and answer its attribute queries locally.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionInfo {
    /// `(offset, size)` of each parameter in the parameter buffer.
    pub params: Vec<(u32, u32)>,
    /// `(CUfunction_attribute, value)` for every attribute the driver answers.
    pub attributes: Vec<(u32, i32)>,
}

impl crate::table::FromStatus<Status> for Loaded {
    fn from_status(status: Status) -> Self {
        Loaded {
            status,
            need_image: false,
            logs: JitLogs::default(),
        }
    }

    fn failure(&self) -> Option<i64> {
        crate::table::failure_of(self.status)
    }
}

impl Loaded {
    /// A load that failed before the image was looked at.
    pub fn from_status_only(status: Status) -> Loaded {
        crate::table::FromStatus::from_status(status)
    }
}

impl Linked {
    /// A link step that failed before the linker ran.
    pub fn from_status_only(status: Status) -> Linked {
        crate::table::FromStatus::from_status(status)
    }
}

impl crate::table::FromStatus<Status> for Linked {
    fn from_status(status: Status) -> Self {
        Linked {
            status,
            ..Linked::default()
        }
    }

    fn failure(&self) -> Option<i64> {
        crate::table::failure_of(self.status)
    }
}

/// A server without CUDA has no devices.
impl crate::table::FromStatus<Status> for CuInventory {
    fn from_status(_: Status) -> Self {
        CuInventory::default()
    }
}

sample_struct! {
    CuInventory { driver_version, devices },
    CuDevice { name, uuid, total_mem, attributes, pci_bus_id, peers },
    CuPeer { device, can_access, attributes },
    Extent { width, height, depth },
    Pitch { row, slice_rows },
    LaunchAttribute { id, value },
    MemProp { kind, handle_types, location_type, location_id, alloc_flags },
    MemAccess { location_type, location_id, flags },
    FunctionInfo { params, attributes },
    MemInfo { free, total },
    IpcMapping { ptr, size },
    Shareable { socket, ticket },
    CaptureState { status, dependencies },
    NodeState { params, kernel_params, address },
    Global { ptr, size },
    Loaded { status, need_image, logs },
    JitOption { option, value },
    ArrayDesc { width, height, depth, format, channels, flags },
    Edge { from_port, to_port, kind },
    ListedEdge { from, from_kind, to, to_kind, data },
    PoolProps { alloc_type, handle_types, location_type, location_id, max_size, usage },
    JitLogs { info, error, wall_time_ms },
    Linked { status, logs, cubin },
}

impl crate::sample::Sample for NcclError {
    fn sample() -> Self {
        NcclError(5)
    }
}
sample_struct!(NcclConfig {
    version,
    ints,
    net_name,
    comm_name
});
sample_enum!(NcclKind {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Gather,
    Scatter,
    Send,
    Recv
});
sample_enum!(NcclOp {
    InitRank { comm, ctx, nranks, rank, unique_id, config },
    Split { comm, parent, color, key, config },
    Call { kind, comm, ctx, stream, send, recv, count, datatype, op, root },
});
sample_enum!(NcclEnd {
    Finalize,
    Destroy,
    Abort
});
sample_enum!(NcclScalar { Host(bytes), Device(ptr) });
sample_enum!(ImageKind { Module, Library });
sample_enum!(Pool { Default(device), Created(id) });
sample_struct!(RangePull {
    stream,
    dst,
    size,
    from,
    ipc
});
sample_enum!(ExportKeep {
    Unguarded,
    Hold,
    Staged
});
sample_enum!(Place { Device { ptr, pitch }, Array { id, origin } });
sample_enum!(NodeQuery { All, Roots, DependenciesOf(node), DependentsOf(node) });
sample_enum!(TensorMapRequest {
    Tiled { data_type, address, dims, strides, box_dims, element_strides, modes },
    Im2col {
        data_type, address, dims, strides, lower_corner, upper_corner, channels, pixels,
        element_strides, modes,
    },
    ReplaceAddress { map, address },
});
sample_enum!(NodeParams {
    Kernel { function, grid, block, shared_mem },
    Memset { dst, value, element_size, width, height, pitch },
    Copy { dst, dst_pitch, src, src_pitch, extent },
    Empty,
    EventRecord { event },
    EventWait { event },
    Child { graph },
    Conditional { handle, kind, bodies },
    MemAlloc { props, access, size },
    MemFree { dptr },
});
sample_enum!(OccupancyQuery {
    MaxActiveBlocks { function, block_size, shared_mem, flags },
    AvailableDynamicSharedMem { function, num_blocks, block_size },
    MaxPotentialBlockSize { function, shared_mem, block_size_limit, flags },
    MaxActiveClusters { function, grid, block, shared_mem, attributes },
});
