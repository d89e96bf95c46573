//! The objects behind the handles, with what the client knows about each without asking the
//! server (its parents, its creation parameters, cached immutable info).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use opencl_sys::*;
use rgpu_client::Connection;
use rgpu_client::OpenClClient;
use rgpu_protocol::opencl::{ArgKind, Id, ImageDesc, ImageFormat, KernelArg, ObjKind};

use crate::handle::{ClObject, Kind, Ref};

/// Posts a Release for a server object (fire-and-forget).
pub(crate) fn release_remote(conn: &Connection, kind: ObjKind, id: Id) {
    if let Err(e) = conn.opencl().release(kind, id) {
        log::debug!("release of {kind:?} {id} not sent: {e}");
    }
}

pub struct Platform {
    pub devices: Vec<Ref<Device>>,
}

impl ClObject for Platform {
    const KIND: Kind = Kind::Platform;
    const INVALID: cl_int = CL_INVALID_PLATFORM;
}

pub struct Device {
    /// Its server, and the session new contexts on it use.
    pub link: Arc<rgpu_client::ServerLink>,
    pub id: Id,
    /// Every info value the server reported, with rgpu's adjustments applied.
    pub info: HashMap<u32, Vec<u8>>,
    pub device_type: cl_device_type,
}

impl ClObject for Device {
    const KIND: Kind = Kind::Device;
    const INVALID: cl_int = CL_INVALID_DEVICE;
}

pub type ContextNotify =
    unsafe extern "C" fn(*const std::ffi::c_char, *const c_void, usize, *mut c_void);
pub type DestructorCallback = unsafe extern "C" fn(*mut c_void, *mut c_void);

/// A C callback with its user data, movable to the callback thread.
#[derive(Clone, Copy)]
pub struct UserCallback<F: Copy> {
    pub func: F,
    pub user_data: usize,
}

pub struct Context {
    pub conn: Arc<Connection>,
    pub id: Id,
    pub devices: Vec<Ref<Device>>,
    /// The properties as the application gave them (zero-terminated, or empty).
    pub properties: Vec<cl_context_properties>,
    pub notify: Option<UserCallback<ContextNotify>>,
    pub destructors: Mutex<Vec<UserCallback<DestructorCallback>>>,
    /// Its parts on other servers, for a context over devices of several (spanning.rs).
    pub spanning: Option<crate::spanning::Spanning>,
}

impl Context {
    pub fn has_device(&self, device: &Ref<Device>) -> bool {
        self.devices.iter().any(|d| Arc::ptr_eq(d, device))
    }
}

impl ClObject for Context {
    const KIND: Kind = Kind::Context;
    const INVALID: cl_int = CL_INVALID_CONTEXT;
    fn on_last_release(&self, handle: *mut c_void) {
        release_remote(&self.conn, ObjKind::Context, self.id);
        if let Some(spanning) = &self.spanning {
            spanning.release();
        }
        run_destructors(&self.destructors, handle);
    }
}

/// Runs destructor callbacks in reverse order of registration, as the specification says.
fn run_destructors(callbacks: &Mutex<Vec<UserCallback<DestructorCallback>>>, handle: *mut c_void) {
    let callbacks = std::mem::take(&mut *callbacks.lock().unwrap());
    for cb in callbacks.into_iter().rev() {
        // SAFETY: the application registered this callback for this object; the handle is
        // passed only as an identifier.
        unsafe { (cb.func)(handle, cb.user_data as *mut c_void) };
    }
}

pub struct Queue {
    pub conn: Arc<Connection>,
    pub id: Id,
    pub context: Ref<Context>,
    pub device: Ref<Device>,
    pub properties: cl_command_queue_properties,
    /// The property list as given to clCreateCommandQueueWithProperties (for
    /// CL_QUEUE_PROPERTIES_ARRAY), empty otherwise.
    pub properties_array: Vec<cl_queue_properties>,
    /// Reads whose data has not all arrived yet: clFinish waits for them too.
    pub pending_reads: Pending,
}

impl ClObject for Queue {
    const KIND: Kind = Kind::Queue;
    const INVALID: cl_int = CL_INVALID_COMMAND_QUEUE;
    fn on_last_release(&self, _handle: *mut c_void) {
        release_remote(&self.conn, ObjKind::Queue, self.id);
    }
}

/// A counter of outstanding work that can be waited for.
#[derive(Default)]
pub struct Pending {
    count: Mutex<u64>,
    idle: Condvar,
}

impl Pending {
    pub fn add(&self) {
        *self.count.lock().unwrap() += 1;
    }

    pub fn done(&self) {
        let mut count = self.count.lock().unwrap();
        *count = count.saturating_sub(1);
        if *count == 0 {
            self.idle.notify_all();
        }
    }

    /// Waits until nothing is outstanding; false on timeout.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut count = self.count.lock().unwrap();
        while *count > 0 {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            count = self.idle.wait_timeout(count, deadline - now).unwrap().0;
        }
        true
    }
}

pub enum MemKind {
    Buffer {
        /// For a sub-buffer: its parent and origin.
        parent: Option<(Ref<Mem>, usize)>,
    },
    Image(ImageInfo),
}

#[derive(Clone)]
pub struct ImageInfo {
    pub format: ImageFormat,
    pub desc: ImageDesc,
    pub element_size: usize,
    /// The row and slice pitch of the application's host memory (CL_IMAGE_ROW_PITCH etc.).
    pub row_pitch: usize,
    pub slice_pitch: usize,
    /// The buffer or image the image was made from.
    pub source: Option<Ref<Mem>>,
}

/// A live mapping of a memory object.
pub struct Mapping {
    pub flags: cl_map_flags,
    /// Byte offset and size for buffers; origin and region for images.
    pub origin: [usize; 3],
    pub region: [usize; 3],
    /// Host memory rgpu allocated for the mapping (None when it is the USE_HOST_PTR memory).
    pub owned: Option<AlignedBuf>,
    /// Pitches of the mapped host memory (images).
    pub row_pitch: usize,
    pub slice_pitch: usize,
}

pub struct Mem {
    pub conn: Arc<Connection>,
    pub id: Id,
    pub context: Ref<Context>,
    pub flags: cl_mem_flags,
    pub size: usize,
    pub host_ptr: usize,
    /// Where the buffer's memory lies in host memory shared with its server (an
    /// `ALLOC_HOST_PTR` buffer of a client on the server's host; a sub-buffer's, inside its
    /// parent's), else 0: maps return it and only synchronize it with the device.
    pub shared_host: usize,
    pub properties: Vec<cl_mem_properties>,
    pub kind: MemKind,
    /// Live mappings by host address (one address may be mapped more than once).
    pub maps: Mutex<Vec<(usize, Mapping)>>,
    pub destructors: Mutex<Vec<UserCallback<DestructorCallback>>>,
    /// Its replicas on other servers and where its contents are current (spanning.rs).
    pub residence: crate::spanning::Residence,
}

impl Mem {
    pub fn image(&self) -> Option<&ImageInfo> {
        match &self.kind {
            MemKind::Image(info) => Some(info),
            MemKind::Buffer { .. } => None,
        }
    }

    pub fn map_count(&self) -> u32 {
        self.maps.lock().unwrap().len() as u32
    }
}

impl ClObject for Mem {
    const KIND: Kind = Kind::Mem;
    const INVALID: cl_int = CL_INVALID_MEM_OBJECT;
    fn on_last_release(&self, handle: *mut c_void) {
        release_remote(&self.conn, ObjKind::Mem, self.id);
        if self.shared_host != 0 && matches!(self.kind, MemKind::Buffer { parent: None }) {
            // After the release: the server keeps its own mapping until its implementation
            // is done with the buffer.
            self.conn.unshare_host_memory(self.shared_host as *mut u8);
        }
        self.residence.release();
        run_destructors(&self.destructors, handle);
    }
}

/// Page-aligned host memory rgpu owns (map buffers).
pub struct AlignedBuf {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: plain owned memory.
unsafe impl Send for AlignedBuf {}
// SAFETY: plain owned memory; access is coordinated by the OpenCL map contract.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn new(size: usize) -> Option<AlignedBuf> {
        let layout = std::alloc::Layout::from_size_align(size.max(1), 4096).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        (!ptr.is_null()).then_some(AlignedBuf { ptr, layout })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

pub struct Sampler {
    pub conn: Arc<Connection>,
    pub id: Id,
    pub context: Ref<Context>,
    pub normalized_coords: cl_bool,
    pub addressing_mode: cl_addressing_mode,
    pub filter_mode: cl_filter_mode,
    /// As given to clCreateSamplerWithProperties (for CL_SAMPLER_PROPERTIES), else empty.
    pub properties: Vec<cl_sampler_properties>,
    /// The whole property list the server was given (to make it again elsewhere).
    pub wire_properties: Vec<u64>,
}

impl ClObject for Sampler {
    const KIND: Kind = Kind::Sampler;
    const INVALID: cl_int = CL_INVALID_SAMPLER;
    fn on_last_release(&self, _handle: *mut c_void) {
        release_remote(&self.conn, ObjKind::Sampler, self.id);
    }
}

pub struct Program {
    pub conn: Arc<Connection>,
    pub id: Id,
    pub context: Ref<Context>,
    pub devices: Vec<Ref<Device>>,
    pub source: Option<String>,
    /// Directories of headers the source includes by absolute path, sent with each build
    /// as `-I` directories (the server gets the source naming them by file name; includes.rs).
    pub include_dirs: Vec<String>,
    pub il: Option<Vec<u8>>,
    /// Kernels created from the program and not yet released (a rebuild is then invalid).
    pub live_kernels: AtomicU32,
    /// The options of the last build or compile, as the application gave them: the server
    /// builds with `-cl-kernel-arg-info` added, which CL_PROGRAM_BUILD_OPTIONS must not show.
    pub options: Mutex<Option<String>>,
    /// Its replicas on other servers (spanning.rs).
    pub replicas: crate::spanning::Replicas,
}

impl ClObject for Program {
    const KIND: Kind = Kind::Program;
    const INVALID: cl_int = CL_INVALID_PROGRAM;
    fn on_last_release(&self, _handle: *mut c_void) {
        release_remote(&self.conn, ObjKind::Program, self.id);
        self.replicas.release(ObjKind::Program);
    }
}

/// The arguments of a kernel as last set, and which changed since the last launch.
#[derive(Clone, Default)]
pub struct KernelArgs {
    pub values: Vec<Option<KernelArg>>,
    pub dirty: Vec<bool>,
}

pub struct Kernel {
    pub conn: Arc<Connection>,
    pub id: Id,
    pub program: Ref<Program>,
    pub name: String,
    pub num_args: u32,
    /// What each argument takes (from the server's argument info), for checking
    /// clSetKernelArg without a round trip.
    pub arg_kinds: Vec<ArgKind>,
    /// Its work-group limits on each device of its program, for checking launches locally.
    pub work_group_limits: Vec<rgpu_protocol::opencl::WorkGroupLimits>,
    /// The largest work-group the implementation took on each device although it was over
    /// the kernel's CL_KERNEL_WORK_GROUP_SIZE (enqueue.rs, `check_work_sizes`).
    pub accepted_group_sizes: Mutex<HashMap<Id, u64>>,
    pub args: Mutex<KernelArgs>,
    /// Immutable info fetched once: (query kind, device id or arg index, param) -> value.
    pub info_cache: Mutex<HashMap<(u8, u64, u32), Vec<u8>>>,
    /// In a context over several servers (spanning.rs): its replicas on other servers, and
    /// the buffers its arguments name.
    pub replicas: Mutex<Vec<(Arc<Connection>, Arc<crate::spanning::KernelReplica>)>>,
    pub mem_args: Mutex<HashMap<u32, std::sync::Weak<crate::handle::Handle<Mem>>>>,
}

impl Kernel {
    /// The largest work-group size over the kernel's reported limit that the implementation
    /// took on `device` (0: none yet).
    pub fn accepted_group_size(&self, device: Id) -> u64 {
        let accepted = self.accepted_group_sizes.lock().unwrap();
        accepted.get(&device).copied().unwrap_or(0)
    }

    pub fn accept_group_size(&self, device: Id, total: u64) {
        let mut accepted = self.accepted_group_sizes.lock().unwrap();
        let size = accepted.entry(device).or_insert(0);
        *size = (*size).max(total);
    }
}

impl ClObject for Kernel {
    const KIND: Kind = Kind::Kernel;
    const INVALID: cl_int = CL_INVALID_KERNEL;
    fn on_last_release(&self, _handle: *mut c_void) {
        self.program.live_kernels.fetch_sub(1, Ordering::Relaxed);
        release_remote(&self.conn, ObjKind::Kernel, self.id);
        crate::spanning::release_kernel_replicas(self);
    }
}

pub type EventCallback = unsafe extern "C" fn(cl_event, cl_int, *mut c_void);

/// How the client learns that an event finished.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Completion {
    /// Only the server knows; ask it.
    Remote,
    /// The client completes it itself (reads whose data it receives, user events).
    Local,
}

pub struct EventState {
    /// The execution status as far as the client knows (CL_QUEUED until it learns more).
    pub status: cl_int,
    pub callbacks: Vec<(cl_int, UserCallback<EventCallback>)>,
    /// Whether the server was asked to notify completion.
    pub notify_requested: bool,
    /// Profiling values, cached once the event completed (they no longer change).
    pub profiling: HashMap<u32, Vec<u8>>,
}

pub struct Event {
    pub conn: Arc<Connection>,
    pub id: Id,
    pub context: Ref<Context>,
    pub queue: Option<Ref<Queue>>,
    pub command_type: cl_command_type,
    pub completion: Completion,
    pub state: Mutex<EventState>,
    pub changed: Condvar,
}

impl ClObject for Event {
    const KIND: Kind = Kind::Event;
    const INVALID: cl_int = CL_INVALID_EVENT;
    fn on_last_release(&self, _handle: *mut c_void) {
        release_remote(&self.conn, ObjKind::Event, self.id);
    }
}

impl Event {
    pub fn known_status(&self) -> cl_int {
        self.state.lock().unwrap().status
    }

    /// Whether the event reached CL_COMPLETE or failed, as far as the client knows.
    pub fn is_final(&self) -> bool {
        self.known_status() <= CL_COMPLETE
    }
}
