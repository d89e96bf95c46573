//! OpenCL messages: a small set of device operations that the client front end maps the whole
//! OpenCL host API onto.
//!
//! Objects are named by ids. Platforms and devices get theirs from the server (in the
//! [`Inventory`]); every other object's id is chosen by the client when it creates the object,
//! so creation and use can be pipelined without waiting for a reply. Ids are per session: a
//! client can only ever name its own objects. Id 0 means "none".

use serde::{Deserialize, Serialize};

/// A session-local object id.
pub type Id = u64;

/// The kinds of object a session can create and release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ObjKind {
    Context,
    Queue,
    Mem,
    Sampler,
    Program,
    Kernel,
    Event,
}

/// Requests of the OpenCL front end. Which of them get a reply is fixed per variant
/// ([`ClRequest::expects_reply`]); the rest are fire-and-forget and report failures at the next
/// synchronizing call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ClRequest {
    /// Everything immutable about the server's platforms and devices. Reply: `Inventory`.
    GetInventory,
    /// Any clGet*Info query the client cannot answer from its own records. Reply: `Info`.
    GetInfo { query: InfoQuery, param: u32 },
    /// Reply: `Status`.
    CreateContext {
        id: Id,
        devices: Vec<Id>,
        /// Zero-terminated property list with the platform entry removed.
        properties: Vec<u64>,
    },
    /// Covers clCreateCommandQueue and clCreateCommandQueueWithProperties. Reply: `Status`.
    CreateQueue {
        id: Id,
        context: Id,
        device: Id,
        properties: Vec<u64>,
    },
    /// Bulk: the initial contents when the client passed a host pointer. Reply: `Status`.
    CreateBuffer {
        id: Id,
        context: Id,
        /// Flags as the server should see them (host-pointer flags become COPY_HOST_PTR).
        flags: u64,
        size: u64,
        properties: Vec<u64>,
    },
    /// Reply: `Status`.
    CreateSubBuffer {
        id: Id,
        parent: Id,
        flags: u64,
        origin: u64,
        size: u64,
    },
    /// Bulk: the initial contents, tightly packed. Reply: `Status`.
    CreateImage {
        id: Id,
        context: Id,
        flags: u64,
        format: ImageFormat,
        desc: ImageDesc,
        properties: Vec<u64>,
    },
    /// Reply: `ImageFormats`.
    GetSupportedImageFormats {
        context: Id,
        flags: u64,
        image_type: u32,
    },
    /// Reply: `Status`.
    CreateSampler {
        id: Id,
        context: Id,
        /// Zero-terminated sampler property list (1.2-style arguments are converted to it).
        properties: Vec<u64>,
    },
    /// Reply: `Status`.
    CreateProgramWithSource { id: Id, context: Id, source: String },
    /// Reply: `Binary`.
    CreateProgramWithBinary {
        id: Id,
        context: Id,
        devices: Vec<Id>,
        binaries: Vec<Vec<u8>>,
    },
    /// Reply: `Status`.
    CreateProgramWithIl { id: Id, context: Id, il: Vec<u8> },
    /// Reply: `Status`.
    CreateProgramWithBuiltInKernels {
        id: Id,
        context: Id,
        devices: Vec<Id>,
        kernel_names: String,
    },
    /// Reply: `Status`.
    BuildProgram {
        program: Id,
        devices: Vec<Id>,
        options: String,
        /// The headers of the options' `-I` directories, read on the client.
        includes: Vec<IncludeDir>,
    },
    /// Reply: `Status`.
    CompileProgram {
        program: Id,
        devices: Vec<Id>,
        options: String,
        /// Embedded headers: (program id, include name).
        headers: Vec<(Id, String)>,
        includes: Vec<IncludeDir>,
    },
    /// Reply: `Status`.
    LinkProgram {
        id: Id,
        context: Id,
        devices: Vec<Id>,
        options: String,
        inputs: Vec<Id>,
    },
    /// Reply: `Kernel`.
    CreateKernel { id: Id, program: Id, name: String },
    /// Creates every kernel of a program under the given ids (in the order the implementation
    /// lists them). Reply: `Kernels` with the names of those created.
    CreateKernelsInProgram { program: Id, ids: Vec<Id> },
    /// Reply: `Kernel`.
    CloneKernel { id: Id, source: Id },
    /// Sets kernel arguments ahead of a launch (before a query whose answer depends on them,
    /// such as CL_KERNEL_LOCAL_MEM_SIZE). No reply.
    SetKernelArgs {
        kernel: Id,
        args: Vec<(u32, KernelArg)>,
    },
    /// The client's reference count reached zero. No reply.
    Release { kind: ObjKind, id: Id },
    /// No reply.
    CreateUserEvent { id: Id, context: Id },
    /// No reply.
    SetUserEventStatus { event: Id, status: i32 },
    /// Reply: `Status` (CL_SUCCESS, or the first deferred error / failed event status).
    WaitForEvents { events: Vec<Id> },
    /// Asks for an `EventStatus` message once the event reaches `status` (or fails). No reply.
    NotifyEvent { event: Id, status: i32 },
    /// No reply.
    Flush { queue: Id },
    /// Reply: `Status`, including any error deferred from earlier fire-and-forget requests.
    Finish { queue: Id },
    /// A command for a queue. Reads reply with `Data` chunks then `Status`; the rest have no
    /// reply. `event` is the client id for the command's event (0 when the caller wants none).
    Enqueue {
        queue: Id,
        wait: Vec<Id>,
        event: Id,
        command: Command,
    },
}

impl ClRequest {
    /// Whether the server answers this request with a `Reply` frame.
    pub fn expects_reply(&self) -> bool {
        match self {
            ClRequest::Release { .. }
            | ClRequest::SetKernelArgs { .. }
            | ClRequest::CreateUserEvent { .. }
            | ClRequest::SetUserEventStatus { .. }
            | ClRequest::NotifyEvent { .. }
            | ClRequest::Flush { .. } => false,
            ClRequest::Enqueue { command, .. } => command.returns_data(),
            _ => true,
        }
    }
}

/// Queue commands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// Bulk: `size` bytes.
    WriteBuffer {
        buffer: Id,
        offset: u64,
        size: u64,
    },
    ReadBuffer {
        buffer: Id,
        offset: u64,
        size: u64,
    },
    /// Bulk: the host region packed tightly (row pitch region[0], slice pitch region[0]*region[1]).
    WriteBufferRect {
        buffer: Id,
        rect: BufferRect,
    },
    /// Data comes back packed tightly, as for `WriteBufferRect`.
    ReadBufferRect {
        buffer: Id,
        rect: BufferRect,
    },
    CopyBuffer {
        src: Id,
        dst: Id,
        src_offset: u64,
        dst_offset: u64,
        size: u64,
    },
    CopyBufferRect {
        src: Id,
        dst: Id,
        src_origin: [u64; 3],
        dst_origin: [u64; 3],
        region: [u64; 3],
        src_row_pitch: u64,
        src_slice_pitch: u64,
        dst_row_pitch: u64,
        dst_slice_pitch: u64,
    },
    FillBuffer {
        buffer: Id,
        pattern: Vec<u8>,
        offset: u64,
        size: u64,
    },
    /// Bulk: the region packed tightly.
    WriteImage {
        image: Id,
        origin: [u64; 3],
        region: [u64; 3],
    },
    /// Data comes back packed tightly.
    ReadImage {
        image: Id,
        origin: [u64; 3],
        region: [u64; 3],
    },
    CopyImage {
        src: Id,
        dst: Id,
        src_origin: [u64; 3],
        dst_origin: [u64; 3],
        region: [u64; 3],
    },
    FillImage {
        image: Id,
        color: [u8; 16],
        origin: [u64; 3],
        region: [u64; 3],
    },
    CopyImageToBuffer {
        src: Id,
        dst: Id,
        src_origin: [u64; 3],
        region: [u64; 3],
        dst_offset: u64,
    },
    CopyBufferToImage {
        src: Id,
        dst: Id,
        src_offset: u64,
        dst_origin: [u64; 3],
        region: [u64; 3],
    },
    /// Arguments changed since the kernel's previous launch travel with the launch.
    NdRange {
        kernel: Id,
        work_dim: u32,
        offset: Option<Vec<u64>>,
        global: Vec<u64>,
        local: Option<Vec<u64>>,
        args: Vec<(u32, KernelArg)>,
    },
    MarkerWithWaitList,
    BarrierWithWaitList,
    MigrateMemObjects {
        objects: Vec<Id>,
        flags: u64,
    },
}

impl Command {
    /// Reads stream data back to the client and end with a `Status` reply.
    pub fn returns_data(&self) -> bool {
        matches!(
            self,
            Command::ReadBuffer { .. } | Command::ReadBufferRect { .. } | Command::ReadImage { .. }
        )
    }
}

/// The geometry of a rectangular buffer transfer (device side).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferRect {
    pub buffer_origin: [u64; 3],
    pub region: [u64; 3],
    pub buffer_row_pitch: u64,
    pub buffer_slice_pitch: u64,
}

/// A kernel argument value as set by clSetKernelArg.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum KernelArg {
    /// Plain bytes (scalars, vectors, structs).
    Bytes(Vec<u8>),
    /// A memory object (0 for a NULL buffer argument).
    Mem(Id),
    Sampler(Id),
    /// A `__local` argument of this many bytes.
    Local(u64),
}

/// A `-I` directory of build options as the client named it, with the header files the client
/// found in it (paths relative to it). The directory need not exist on the server, which puts
/// the files in a directory of its own and points the option there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncludeDir {
    pub dir: String,
    pub files: Vec<(String, Vec<u8>)>,
}

/// What a kernel argument takes, from the implementation's argument info, so the client can
/// check clSetKernelArg values without a round trip.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ArgKind {
    /// No argument info: the server checks at launch.
    Unknown,
    /// A `__global`/`__constant` pointer, an image or a pipe: a memory object or NULL.
    MemObject,
    Sampler,
    /// A `__local` pointer: a size and a NULL value.
    Local,
    /// A value of this many bytes (None when the size is not known from the type name).
    Value {
        size: Option<u32>,
    },
}

/// What a kernel allows on one device of its program (clGetKernelWorkGroupInfo), so that the
/// client checks a launch's work-group size at enqueue time, as the API requires, without a
/// round trip.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkGroupLimits {
    pub device: Id,
    /// CL_KERNEL_WORK_GROUP_SIZE.
    pub max_size: u64,
    /// CL_KERNEL_COMPILE_WORK_GROUP_SIZE (`reqd_work_group_size`; zeros when not given).
    pub required: [u64; 3],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageFormat {
    pub channel_order: u32,
    pub channel_data_type: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageDesc {
    pub image_type: u32,
    pub width: u64,
    pub height: u64,
    pub depth: u64,
    pub array_size: u64,
    /// Device-side pitches are the server's choice; these are 0 unless the image wraps a buffer.
    pub row_pitch: u64,
    pub slice_pitch: u64,
    pub num_mip_levels: u32,
    pub num_samples: u32,
    /// The buffer or image this image is created from (0 for none).
    pub mem_object: Id,
}

/// What a GetInfo request asks about.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum InfoQuery {
    Platform(Id),
    Device(Id),
    Context(Id),
    Queue(Id),
    Mem(Id),
    Image(Id),
    Sampler(Id),
    Program(Id),
    ProgramBuild {
        program: Id,
        device: Id,
    },
    Kernel(Id),
    KernelWorkGroup {
        kernel: Id,
        device: Id,
    },
    KernelArg {
        kernel: Id,
        index: u32,
    },
    KernelSubGroup {
        kernel: Id,
        device: Id,
        input: Vec<u8>,
    },
    Event(Id),
    EventProfiling(Id),
}

/// Replies, matched to their request by the frame's seq.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ClReply {
    /// An OpenCL status code (CL_SUCCESS = 0).
    Status(i32),
    /// A clGet*Info result: the status and the raw value bytes.
    Info {
        status: i32,
        value: Vec<u8>,
    },
    Inventory(Inventory),
    ImageFormats {
        status: i32,
        formats: Vec<ImageFormat>,
    },
    /// clCreateProgramWithBinary: the call's status and each binary's status.
    Binary {
        status: i32,
        binary_status: Vec<i32>,
    },
    /// A created kernel and the facts the client caches about it.
    Kernel {
        status: i32,
        num_args: u32,
        args: Vec<ArgKind>,
        limits: Vec<WorkGroupLimits>,
    },
    Kernels {
        status: i32,
        names: Vec<String>,
        num_args: Vec<u32>,
        args: Vec<Vec<ArgKind>>,
        limits: Vec<Vec<WorkGroupLimits>>,
    },
}

/// A server's platforms and devices with all their immutable info, fetched once at connect.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    pub platforms: Vec<PlatformDesc>,
    pub devices: Vec<DeviceDesc>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlatformDesc {
    pub id: Id,
    /// (param, value bytes) for every parameter the platform answered.
    pub info: Vec<(u32, Vec<u8>)>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceDesc {
    pub id: Id,
    pub platform: Id,
    /// (param, value bytes) for every parameter the device answered.
    pub info: Vec<(u32, Vec<u8>)>,
}
