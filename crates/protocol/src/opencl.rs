//! OpenCL messages: a small set of device operations that the client front end maps the whole
//! OpenCL host API onto.
//!
//! Objects are named by ids. Platforms and devices get theirs from the server (in the
//! [`Inventory`]); every other object's id is chosen by the client when it creates the object,
//! so creation and use can be pipelined without waiting for a reply. Ids are per session: a
//! client can only ever name its own objects. Id 0 means "none".

use serde::{Deserialize, Serialize};

use crate::{LaneKey, PeerExport};

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

/// An OpenCL status code (CL_SUCCESS = 0).
pub type Status = i32;
/// A request's outcome: its value, or the status of its failure.
pub type Answer<T> = Result<T, Status>;

wire_api! {
    request: ClRequest,
    reply: ClReply,
    status: Status,
    client: OpenClClient;

    /// The inventory, queries and releases of any object.
    group Objects {
        /// Everything immutable about the server's platforms and devices.
        call GetInventory get_inventory() -> Inventory;
        /// Any clGet*Info query the client cannot answer from its own records: the raw value.
        call GetInfo get_info(query: InfoQuery, param: u32) -> Answer<Vec<u8>>;
        /// The client's reference count reached zero.
        post Release release(kind: ObjKind, id: Id);
    }

    /// Contexts and queues.
    group Contexts {
        /// `properties`: zero-terminated, with the platform entry removed.
        call CreateContext create_context(id: Id, devices: Vec<Id>, properties: Vec<u64>) -> Answer<()>;
        /// Covers clCreateCommandQueue and clCreateCommandQueueWithProperties.
        call CreateQueue create_queue(id: Id, context: Id, device: Id, properties: Vec<u64>)
            -> Answer<()>;
        post Flush flush(queue: Id);
        /// Once the queue's work is done: its status, including any error deferred from earlier
        /// posted requests.
        wait Finish finish(queue: Id) -> Answer<()>;
    }

    /// Buffers, images and samplers.
    group Memory {
        /// `flags` as the server should see them (host-pointer flags become COPY_HOST_PTR). Bulk:
        /// the initial contents when the client passed a host pointer.
        call [bulk] CreateBuffer create_buffer(
            id: Id,
            context: Id,
            flags: u64,
            size: u64,
            properties: Vec<u64>,
        ) -> Answer<()>;
        call CreateSubBuffer create_sub_buffer(
            id: Id,
            parent: Id,
            flags: u64,
            origin: u64,
            size: u64,
        ) -> Answer<()>;
        /// Bulk: the initial contents, tightly packed.
        call [bulk] CreateImage create_image(
            id: Id,
            context: Id,
            flags: u64,
            format: ImageFormat,
            desc: ImageDesc,
            properties: Vec<u64>,
        ) -> Answer<()>;
        call GetSupportedImageFormats get_supported_image_formats(
            context: Id,
            flags: u64,
            image_type: u32,
        ) -> Answer<Vec<ImageFormat>>;
        /// `properties`: the zero-terminated sampler property list (1.2-style arguments are
        /// converted to it).
        call CreateSampler create_sampler(id: Id, context: Id, properties: Vec<u64>) -> Answer<()>;
    }

    /// Programs.
    group Programs {
        call CreateProgramWithSource create_program_with_source(id: Id, context: Id, source: String)
            -> Answer<()>;
        call CreateProgramWithBinary create_program_with_binary(
            id: Id,
            context: Id,
            devices: Vec<Id>,
            binaries: Vec<Vec<u8>>,
        ) -> BinaryStatus;
        call CreateProgramWithIl create_program_with_il(id: Id, context: Id, il: Vec<u8>) -> Answer<()>;
        call CreateProgramWithBuiltInKernels create_program_with_built_in_kernels(
            id: Id,
            context: Id,
            devices: Vec<Id>,
            kernel_names: String,
        ) -> Answer<()>;
        /// `includes`: the headers of the options' `-I` directories, read on the client.
        call BuildProgram build_program(
            program: Id,
            devices: Vec<Id>,
            options: String,
            includes: Vec<IncludeDir>,
        ) -> Answer<()>;
        /// `headers`: the embedded headers (program id, include name).
        call CompileProgram compile_program(
            program: Id,
            devices: Vec<Id>,
            options: String,
            headers: Vec<(Id, String)>,
            includes: Vec<IncludeDir>,
        ) -> Answer<()>;
        call LinkProgram link_program(
            id: Id,
            context: Id,
            devices: Vec<Id>,
            options: String,
            inputs: Vec<Id>,
        ) -> Answer<()>;
    }

    /// Kernels and their arguments.
    group Kernels {
        /// A kernel and the facts the client caches about it.
        call CreateKernel create_kernel(id: Id, program: Id, name: String) -> Answer<KernelFacts>;
        /// Creates every kernel of a program under the given ids (in the order the
        /// implementation lists them): the name and facts of each one created.
        call CreateKernelsInProgram create_kernels_in_program(program: Id, ids: Vec<Id>)
            -> Answer<Vec<(String, KernelFacts)>>;
        call CloneKernel clone_kernel(id: Id, source: Id) -> Answer<KernelFacts>;
        /// Sets kernel arguments ahead of a launch (before a query whose answer depends on them,
        /// such as CL_KERNEL_LOCAL_MEM_SIZE).
        post SetKernelArgs set_kernel_args(kernel: Id, args: Vec<(u32, KernelArg)>);
    }

    /// Events.
    group Events {
        post CreateUserEvent create_user_event(id: Id, context: Id);
        post SetUserEventStatus set_user_event_status(event: Id, status: i32);
        /// CL_SUCCESS, or the first deferred error or failed event status, once every event is
        /// complete.
        wait WaitForEvents wait_for_events(events: Vec<Id>) -> Answer<()>;
        /// Asks for an `EventStatus` message once the event reaches `status` (or fails).
        post NotifyEvent notify_event(event: Id, status: i32);
    }

    /// Buffers moved between servers over the fabric (MPI transfers: docs/mpi.md).
    group Peers {
        /// Lets another server pull `size` bytes of `buffer` from `offset` once the queue's
        /// earlier commands are done, under `ticket` (the client's random choice).
        post ExportBuffer export_buffer(
            queue: Id,
            buffer: Id,
            offset: u64,
            size: u64,
            ticket: LaneKey,
        );
        /// Withdraws an export nobody pulled.
        post UnexportBuffer unexport_buffer(ticket: LaneKey);
        /// Fills `size` bytes of `buffer` from `offset` with another server's export, pulled by
        /// this server straight from that one, in the queue's order.
        call PullBuffer pull_buffer(queue: Id, buffer: Id, offset: u64, size: u64, from: PeerExport)
            -> Answer<()>;
        /// Lets another server wait for `event`: an export of no bytes under `ticket`, ready
        /// once the event has completed.
        post ExportEvent export_event(event: Id, ticket: LaneKey);
        /// Completes the user event `event` (made by CreateUserEvent) once another server's
        /// export `from` is ready (an `ExportEvent`: that server's event completed), or fails
        /// it if that event failed: a wait across servers, resolved between the servers.
        post AwaitExport await_export(event: Id, from: PeerExport);
    }

    /// Commands for queues.
    group Commands {
        /// A command for a queue. `event` is the client's id for the command's event (0 when
        /// the caller wants none).
        post Enqueue enqueue(queue: Id, wait: Vec<Id>, event: Id, command: Command);
        /// As `Enqueue`, answered at once with the implementation's verdict: a launch the
        /// client cannot judge (a work-group larger than the kernel's CL_KERNEL_WORK_GROUP_SIZE,
        /// which NVIDIA's implementation takes up to the device's limit and PoCL refuses).
        call EnqueueNow enqueue_now(queue: Id, wait: Vec<Id>, event: Id, command: Command)
            -> Answer<()>;
        /// A write of a memory object's bytes, as `Enqueue`. Bulk: the bytes, packed tightly.
        post [bulk] EnqueueWrite enqueue_write(
            queue: Id,
            wait: Vec<Id>,
            event: Id,
            transfer: Transfer,
        );
        /// A read of a memory object's bytes, as `Enqueue`: the data comes packed tightly.
        read EnqueueRead enqueue_read(queue: Id, wait: Vec<Id>, event: Id, transfer: Transfer);
    }

    /// A session moving here from another server (docs/migration.md).
    group Migration {
        /// Before anything else in the session: the client keeps naming devices by the ids
        /// the other server gave them; each `(alias, device)` says which served device an id
        /// stands for. Ids not listed then name no device.
        call AliasDevices alias_devices(aliases: Vec<(Id, Id)>) -> Answer<()>;
    }
}

/// Where the bytes of a read or write lie in a memory object; they travel packed tightly
/// (rectangles: row pitch `region[0]`, slice pitch `region[0] * region[1]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Transfer {
    Buffer {
        buffer: Id,
        offset: u64,
        size: u64,
    },
    BufferRect {
        buffer: Id,
        rect: BufferRect,
    },
    Image {
        image: Id,
        origin: [u64; 3],
        region: [u64; 3],
    },
}

/// The answer to `CreateProgramWithBinary`: the call's status and each binary's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BinaryStatus {
    pub status: Status,
    pub binary_status: Vec<Status>,
}

/// What the client caches about a kernel: its arguments, and its work-group limits on each
/// device of its program.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelFacts {
    pub num_args: u32,
    pub args: Vec<ArgKind>,
    pub limits: Vec<WorkGroupLimits>,
}

/// Queue commands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Command {
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
    /// For a buffer made in the client's shared host memory (a `CL_MEM_ALLOC_HOST_PTR` buffer
    /// of a client on the server's host): makes that memory and the device agree on the range,
    /// the device's contents copied to it (a map for reading) or its contents to the device
    /// (`to_device`: an unmap after writing). No data crosses the connection.
    SyncHostMemory {
        buffer: Id,
        offset: u64,
        size: u64,
        to_device: bool,
    },
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
    /// `output_size`: the caller's `param_value_size` (0: it asks only the size), which
    /// `CL_KERNEL_LOCAL_SIZE_FOR_SUB_GROUP_COUNT` answers in as many dimensions.
    KernelSubGroup {
        kernel: Id,
        device: Id,
        input: Vec<u8>,
        output_size: u64,
    },
    Event(Id),
    EventProfiling(Id),
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

impl crate::table::FromStatus<Status> for BinaryStatus {
    fn from_status(status: Status) -> Self {
        BinaryStatus {
            status,
            binary_status: Vec::new(),
        }
    }

    fn failure(&self) -> Option<i64> {
        crate::table::failure_of(self.status)
    }
}

impl crate::table::FromStatus<Status> for Inventory {
    fn from_status(_: Status) -> Self {
        Inventory::default()
    }
}

sample_struct! {
    BinaryStatus { status, binary_status },
    KernelFacts { num_args, args, limits },
    BufferRect { buffer_origin, region, buffer_row_pitch, buffer_slice_pitch },
    IncludeDir { dir, files },
    WorkGroupLimits { device, max_size, required },
    ImageFormat { channel_order, channel_data_type },
    ImageDesc {
        image_type, width, height, depth, array_size, row_pitch, slice_pitch, num_mip_levels,
        num_samples, mem_object,
    },
    Inventory { platforms, devices },
    PlatformDesc { id, info },
    DeviceDesc { id, platform, info },
}

sample_enum!(ObjKind {
    Context,
    Queue,
    Mem,
    Sampler,
    Program,
    Kernel,
    Event
});
sample_enum!(Transfer {
    Buffer { buffer, offset, size },
    BufferRect { buffer, rect },
    Image { image, origin, region },
});
sample_enum!(Command {
    CopyBuffer { src, dst, src_offset, dst_offset, size },
    CopyBufferRect {
        src, dst, src_origin, dst_origin, region, src_row_pitch, src_slice_pitch,
        dst_row_pitch, dst_slice_pitch,
    },
    FillBuffer { buffer, pattern, offset, size },
    CopyImage { src, dst, src_origin, dst_origin, region },
    FillImage { image, color, origin, region },
    CopyImageToBuffer { src, dst, src_origin, region, dst_offset },
    CopyBufferToImage { src, dst, src_offset, dst_origin, region },
    NdRange { kernel, work_dim, offset, global, local, args },
    MarkerWithWaitList,
    BarrierWithWaitList,
    MigrateMemObjects { objects, flags },
    SyncHostMemory { buffer, offset, size, to_device },
});
sample_enum!(KernelArg { Bytes(bytes), Mem(mem), Sampler(sampler), Local(size) });
sample_enum!(ArgKind { Unknown, MemObject, Sampler, Local, Value { size } });
sample_enum!(InfoQuery {
    Platform(id),
    Device(id),
    Context(id),
    Queue(id),
    Mem(id),
    Image(id),
    Sampler(id),
    Program(id),
    ProgramBuild { program, device },
    Kernel(id),
    KernelWorkGroup { kernel, device },
    KernelArg { kernel, index },
    KernelSubGroup { kernel, device, input, output_size },
    Event(id),
    EventProfiling(id),
});
