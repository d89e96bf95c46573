//! What each driver handle is on the client. A handle given to the program is a value looked up
//! in its type's registry (crate::handles) before use, so a wrong-type, stale or made-up handle
//! is an error and an object destroyed by another thread meanwhile stays valid for the calls
//! using it. Each object knows its server connection and its session id there (chosen by the
//! client, so creation never waits for the network).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rgpu_client::{Connection, CudaClient};
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{FunctionInfo, Id, ImageKind};

use crate::handles::{new_handle, Registry};
use crate::servers::Device;

/// An id for a stream capture, unique in the process (0 means "not capturing").
pub fn next_capture_id() -> u64 {
    next_unique_id()
}

/// A value for the `*Id` queries (cuCtxGetId, cuStreamGetId): unique in the process.
fn next_unique_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Gives a type of object a [`Registry`] and the handle conversions: `from_handle` (the live
/// object, or `None`), `into_handle` / `register` (make it reachable), `destroy` (kill the
/// handle). Each object keeps its own handle value (`handle`), chosen when it is made.
macro_rules! registered {
    ($type:ty, $handle:ty) => {
        impl $type {
            fn registry() -> &'static Registry<$type> {
                static REGISTRY: Registry<$type> = Registry::new();
                &REGISTRY
            }

            /// The object behind a handle, if it is a live one of this type.
            pub fn from_handle(handle: $handle) -> Option<Arc<$type>> {
                Self::registry().get(handle as usize)
            }

            /// Makes the object reachable through its handle; returns it shared.
            pub fn register(self) -> Arc<$type> {
                let handle = self.handle;
                let object = Arc::new(self);
                Self::registry().insert(handle, object.clone());
                object
            }

            /// Gives the object to the program as a handle.
            #[allow(dead_code)]
            pub fn into_handle(self) -> $handle {
                let handle = self.handle;
                self.register();
                handle as $handle
            }

            /// A live object `matches` takes (a walk over all of them).
            #[allow(dead_code)]
            pub fn find(matches: impl Fn(&$type) -> bool) -> Option<Arc<$type>> {
                Self::registry().find(matches)
            }

            /// Takes the object back from the program, killing the handle (calls that hold the
            /// object already finish with it).
            #[allow(dead_code)]
            pub fn destroy(handle: $handle) -> Option<Arc<$type>> {
                Self::registry().remove(handle as usize)
            }
        }
    };
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ContextKind {
    /// A device's primary context: one per device, retained and released by count.
    Primary,
    /// A context of `cuCtxCreate`.
    Explicit,
}

pub struct Context {
    /// The handle the program holds (see crate::handles).
    pub handle: usize,
    pub conn: Arc<Connection>,
    /// The device ordinal in the program (over all servers).
    pub device: i32,
    pub kind: ContextKind,
    pub remote: Id,
    pub flags: AtomicU32,
    /// Primary contexts: retain count.
    pub retained: AtomicU32,
    created: AtomicBool,
    create_lock: Mutex<()>,
    pub unique_id: u64,
    /// Values of cuCtxSetCacheConfig / cuCtxSetSharedMemConfig, answered locally.
    pub cache_config: AtomicU32,
}
registered!(Context, CUcontext);

impl Context {
    pub fn new(conn: &Arc<Connection>, device: i32, kind: ContextKind, flags: u32) -> Context {
        Context {
            handle: new_handle(),
            conn: conn.clone(),
            device,
            kind,
            remote: conn.new_id(),
            flags: AtomicU32::new(flags),
            retained: AtomicU32::new(0),
            created: AtomicBool::new(false),
            create_lock: Mutex::new(()),
            unique_id: next_unique_id(),
            cache_config: AtomicU32::new(0),
        }
    }

    pub fn handle(&self) -> CUcontext {
        self.handle as CUcontext
    }

    /// Makes the server-side context if not made yet (posted: nothing waits for it).
    pub fn ensure_created(&self) -> Result<(), CUresult> {
        if self.created.load(Ordering::Acquire) {
            return Ok(());
        }
        let _guard = self.create_lock.lock().unwrap();
        if self.created.load(Ordering::Acquire) {
            return Ok(());
        }
        let device = crate::servers::device(self.device)?;
        let (flags, primary) = (
            self.flags.load(Ordering::Relaxed),
            self.kind == ContextKind::Primary,
        );
        let server = self.conn.cuda();
        server
            .create_context(self.remote, device.remote_ordinal, flags, primary)
            .map_err(crate::results::client_error)?;
        self.created.store(true, Ordering::Release);
        Ok(())
    }
}

thread_local! {
    /// This thread's current context handle (null: none). A plain integer, which keeps no
    /// destructor: runtimes ask for it at process exit, after destructors ran (libgomp's
    /// device finalization calls cuCtxGetDevice then).
    static CURRENT: Cell<usize> = const { Cell::new(0) };
    /// The contexts pushed beneath the current one (cuCtxPushCurrent), oldest first.
    static BENEATH: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// The calling thread's current context handle (null when none).
pub fn current_handle() -> CUcontext {
    CURRENT.with(|current| current.get() as CUcontext)
}

/// Replaces the current context (cuCtxSetCurrent); null pops it.
pub fn set_current(ctx: CUcontext) {
    if ctx.is_null() {
        pop_current();
    } else {
        CURRENT.with(|current| current.set(ctx as usize));
    }
}

pub fn push_current(ctx: CUcontext) {
    let below = CURRENT.with(|current| current.replace(ctx as usize));
    if below != 0 {
        // After the thread's destructors ran, what was beneath is forgotten.
        let _ = BENEATH.try_with(|stack| stack.borrow_mut().push(below));
    }
}

pub fn pop_current() -> Option<CUcontext> {
    let next = BENEATH
        .try_with(|stack| stack.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or(0);
    let popped = CURRENT.with(|current| current.replace(next));
    (popped != 0).then_some(popped as CUcontext)
}

/// The calling thread's current context, made on the server if need be.
pub fn current_context() -> Result<Arc<Context>, CUresult> {
    crate::servers::servers()?;
    let ctx = Context::from_handle(current_handle()).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    ctx.ensure_created()?;
    Ok(ctx)
}

/// `ctx`, or the current context when `ctx` is null.
pub fn context_or_current(ctx: CUcontext) -> Result<Arc<Context>, CUresult> {
    if ctx.is_null() {
        return current_context();
    }
    let ctx = Context::from_handle(ctx).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    ctx.ensure_created()?;
    Ok(ctx)
}

pub struct Stream {
    /// The handle the program holds (see crate::handles).
    pub handle: usize,
    /// Its context's handle.
    pub ctx: usize,
    pub remote: Id,
    pub flags: u32,
    pub priority: i32,
    pub unique_id: u64,
    /// The id of the capture in progress on this stream (0: not capturing).
    pub capture: AtomicU64,
}
registered!(Stream, CUstream);

impl Stream {
    pub fn new(ctx: &Context, flags: u32, priority: i32) -> Stream {
        Stream {
            handle: new_handle(),
            ctx: ctx.handle,
            remote: ctx.conn.new_id(),
            flags,
            priority,
            unique_id: next_unique_id(),
            capture: AtomicU64::new(0),
        }
    }
}

/// The special stream handles of the driver API.
const STREAM_LEGACY: usize = 0x1;
const STREAM_PER_THREAD: usize = 0x2;

/// A stream argument resolved: its context and its id on that context's server (0: the
/// context's default stream; the legacy and per-thread default streams both map to it).
pub fn resolve_stream(stream: CUstream) -> Result<(Arc<Context>, Id), CUresult> {
    match stream as usize {
        0 | STREAM_LEGACY | STREAM_PER_THREAD => Ok((current_context()?, 0)),
        _ => {
            let stream = Stream::from_handle(stream).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
            let ctx = context_or_current(stream.ctx as CUcontext)?;
            Ok((ctx, stream.remote))
        }
    }
}

pub struct Event {
    /// The handle the program holds (see crate::handles).
    pub handle: usize,
    /// Its context's handle.
    pub ctx: usize,
    pub remote: Id,
    /// Records the program asked for (`cuEventRecord`, `cuCtxRecordEvent`).
    pub records: std::sync::atomic::AtomicU64,
    /// Whether its completion may be answered in the client (api/event.rs, `known_complete`):
    /// not for events other processes may record (IPC).
    pub local_answers: bool,
}
registered!(Event, CUevent);

impl Event {
    /// An event of `ctx` (its flags go to the server, which keeps the event's behavior).
    pub fn new(ctx: &Context) -> Event {
        Event {
            handle: new_handle(),
            ctx: ctx.handle,
            remote: ctx.conn.new_id(),
            records: std::sync::atomic::AtomicU64::new(0),
            local_answers: false,
        }
    }

    pub fn context(&self) -> Result<Arc<Context>, CUresult> {
        context_or_current(self.ctx as CUcontext)
    }
}

/// A module (of one context) or a library (of every context: loaded on the server of the
/// context it was loaded in, and on another server the first time a context there uses it).
pub struct Image {
    /// The handle the program holds (see crate::handles).
    pub handle: usize,
    pub conn: Arc<Connection>,
    pub kind: ImageKind,
    pub remote: Id,
    pub hash: [u8; 32],
    /// A library's image, kept when there are several servers to load it on later.
    pub bytes: Option<Arc<[u8]>>,
    /// Its id on servers other than `conn`'s, by [`server_key`].
    pub other_servers: Mutex<HashMap<usize, Id>>,
    /// Functions (modules) or kernels (libraries) already looked up, by name.
    pub functions: Mutex<HashMap<String, usize>>,
    /// Every function of the image, in the driver's order, once listed: its handle and its
    /// name, whose address the program may keep as long as the image is loaded.
    pub listed: std::sync::OnceLock<Vec<(usize, std::ffi::CString)>>,
}
registered!(Image, *mut std::ffi::c_void);

impl Image {
    pub fn new(
        conn: &Arc<Connection>,
        kind: ImageKind,
        hash: [u8; 32],
        bytes: Option<Arc<[u8]>>,
    ) -> Image {
        Image {
            handle: new_handle(),
            conn: conn.clone(),
            kind,
            remote: conn.new_id(),
            hash,
            bytes,
            other_servers: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            listed: std::sync::OnceLock::new(),
        }
    }
}

/// Names a server connection in the per-server maps of images and kernels.
pub fn server_key(conn: &Arc<Connection>) -> usize {
    Arc::as_ptr(conn) as usize
}

/// A module function or a library kernel; the driver lets either be launched.
pub struct Function {
    /// The handle the program holds (see crate::handles).
    pub handle: usize,
    pub conn: Arc<Connection>,
    pub remote: Id,
    pub is_kernel: bool,
    pub name: String,
    /// Library kernels: the library's handle, to find the kernel on other servers.
    pub library: usize,
    /// Functions of a module: the module's handle (`cuFuncGetModule`); 0 for kernels.
    pub module: usize,
    /// A library kernel's function in a context (`cuKernelGetFunction`): the kernel's handle.
    pub kernel: usize,
    /// Library kernels: the kernel's id on servers other than `conn`'s, by [`server_key`].
    pub other_servers: Mutex<HashMap<usize, Id>>,
    /// `(offset, size)` of each parameter.
    pub params: Vec<(u32, u32)>,
    /// Bytes of the packed parameter buffer.
    pub params_size: usize,
    /// `CUfunction_attribute` values, indexed by attribute (`None`: not answered yet; -1 is a
    /// value, e.g. the default shared memory carveout).
    pub attributes: Mutex<Vec<Option<i32>>>,
    /// Library kernels: the function made for each context (by context id).
    pub per_context: Mutex<HashMap<Id, usize>>,
    /// Occupancy answers already fetched, by query.
    pub occupancy: Mutex<HashMap<(u8, i64, i64, u32), i64>>,
}
registered!(Function, *mut std::ffi::c_void);

impl Function {
    pub fn new(
        conn: &Arc<Connection>,
        remote: Id,
        is_kernel: bool,
        name: &str,
        info: FunctionInfo,
    ) -> Box<Function> {
        let params_size = info
            .params
            .iter()
            .map(|&(offset, size)| (offset + size) as usize)
            .max()
            .unwrap_or(0);
        let slots = info.attributes.iter().map(|&(a, _)| a as usize + 1).max();
        let mut attributes = vec![None; slots.unwrap_or(0)];
        for (attribute, value) in info.attributes {
            attributes[attribute as usize] = Some(value);
        }
        Box::new(Function {
            handle: new_handle(),
            conn: conn.clone(),
            remote,
            is_kernel,
            name: name.to_string(),
            library: 0,
            module: 0,
            kernel: 0,
            other_servers: Mutex::new(HashMap::new()),
            params: info.params,
            params_size,
            attributes: Mutex::new(attributes),
            per_context: Mutex::new(HashMap::new()),
            occupancy: Mutex::new(HashMap::new()),
        })
    }

    pub fn attribute(&self, attribute: u32) -> Option<i32> {
        let attributes = self.attributes.lock().unwrap();
        attributes.get(attribute as usize).copied().flatten()
    }

    pub fn set_attribute(&self, attribute: u32, value: i32) {
        let mut attributes = self.attributes.lock().unwrap();
        if attributes.len() <= attribute as usize {
            attributes.resize(attribute as usize + 1, None);
        }
        attributes[attribute as usize] = Some(value);
    }
}

/// A graph on a server (captured or built node by node).
pub struct Graph {
    /// The handle the program holds (see crate::handles).
    pub handle: usize,
    pub conn: Arc<Connection>,
    pub remote: Id,
    /// Handles of the nodes the program has seen, by id, so that a node listed twice is
    /// one handle.
    pub nodes: Mutex<HashMap<Id, usize>>,
    /// Its copies with a host side, which each launch carries out (graph_host_work.rs).
    pub host_work: crate::api::graph_host_work::HostWork,
    /// A conditional node's body (run any number of times per launch: no host copies).
    pub conditional_body: bool,
}
registered!(Graph, CUgraph);

/// A CUDA array on the server of the context it was made in.
pub struct Array {
    /// The handle the program holds (see crate::handles).
    pub handle: usize,
    pub remote: Id,
    pub ctx: Arc<Context>,
    /// How it was made (`cuArray3DGetDescriptor` answers from it).
    pub desc: rgpu_protocol::cuda::ArrayDesc,
}
registered!(Array, CUarray);

/// A mipmapped array on the server of the context it was made in.
pub struct MipmappedArray {
    /// The handle the program holds (see crate::handles).
    pub handle: usize,
    pub remote: Id,
    pub ctx: Arc<Context>,
    /// The level arrays the program asked for (level -> array handle), which go with it.
    pub levels: Mutex<HashMap<u32, usize>>,
}
registered!(MipmappedArray, CUmipmappedArray);

/// A memory pool: a device's default pool or one the program made, on the device's server.
pub struct MemPool {
    /// The handle the program holds (see crate::handles).
    pub handle: usize,
    pub conn: Arc<Connection>,
    pub pool: rgpu_protocol::cuda::Pool,
    /// The device's ordinal in the program.
    pub device: i32,
}
registered!(MemPool, CUmemoryPool);

/// A JIT link in progress on a server.
pub struct Link {
    /// The handle the program holds (see crate::handles).
    pub handle: usize,
    pub conn: Arc<Connection>,
    pub remote: Id,
    /// Where the program wants the link's logs (its `cuLinkCreate` options).
    pub jit: crate::api::jit::JitRequest,
    /// The linked cubin, once complete: the program reads it until it destroys the link.
    pub cubin: Mutex<Option<Box<[u8]>>>,
}
registered!(Link, CUlinkState);

/// A node of a graph built node by node.
pub struct GraphNode {
    /// The handle the program holds (see crate::handles).
    pub handle: usize,
    pub conn: Arc<Connection>,
    pub remote: Id,
    /// Its graph's handle.
    pub graph: usize,
    /// Its `CUgraphNodeType`.
    pub kind: u32,
    /// A conditional node's body graph handles: the array the program reads `phGraph_out` from,
    /// valid for the node's lifetime.
    pub bodies: Box<[usize]>,
}
registered!(GraphNode, CUgraphNode);

/// An executable graph on a server.
pub struct GraphExec {
    /// The handle the program holds (see crate::handles).
    pub handle: usize,
    pub conn: Arc<Connection>,
    pub remote: Id,
    /// The host copies of the graph it was made from (or last updated from).
    pub host_work: crate::api::graph_host_work::HostWork,
    /// The flags it was instantiated with (`cuGraphExecGetFlags`).
    pub flags: u64,
}
registered!(GraphExec, CUgraphExec);

impl Graph {
    pub fn new(conn: &Arc<Connection>) -> Graph {
        Graph::known_as(conn, conn.new_id())
    }

    /// A graph the server already knows as `remote`.
    pub fn known_as(conn: &Arc<Connection>, remote: Id) -> Graph {
        Graph {
            handle: new_handle(),
            conn: conn.clone(),
            remote,
            nodes: Mutex::new(HashMap::new()),
            host_work: Mutex::new(Vec::new()),
            conditional_body: false,
        }
    }
}

impl GraphExec {
    pub fn new(conn: &Arc<Connection>, flags: u64) -> GraphExec {
        GraphExec {
            handle: new_handle(),
            conn: conn.clone(),
            remote: conn.new_id(),
            host_work: Mutex::new(Vec::new()),
            flags,
        }
    }
}

/// The id of the capture in progress on `stream` (0: none; default streams never capture).
pub fn capture_of(stream: CUstream) -> u64 {
    match stream as usize {
        0 | STREAM_LEGACY | STREAM_PER_THREAD => 0,
        _ => Stream::from_handle(stream).map_or(0, |s| s.capture.load(Ordering::Acquire)),
    }
}

/// `cuCtxGetId`-style unique id of a context handle (for cudart's private tables).
pub fn context_unique_id(ctx: CUcontext) -> Option<u64> {
    Context::from_handle(ctx).map(|c| c.unique_id)
}

/// `cuStreamGetId`-style unique id of a stream handle; default streams get their context's.
pub fn stream_unique_id(stream: CUstream) -> Option<u64> {
    match stream as usize {
        0 | STREAM_LEGACY | STREAM_PER_THREAD => {
            Context::from_handle(current_handle()).map(|c| c.unique_id)
        }
        _ => Stream::from_handle(stream).map(|s| s.unique_id),
    }
}

/// Each device's primary context: it exists before anything retains it (cudart asks for it
/// through a private table); the server-side context is made on first use. A reset after the
/// session was lost puts a new one, in a new session, in its place; the old one stays (the
/// program may still name it) and fails with device-lost errors.
static PRIMARY_CONTEXTS: RwLock<BTreeMap<i32, Arc<Context>>> = RwLock::new(BTreeMap::new());

/// The primary context of a device (kept here, with the other handles, rather than in the
/// device list, which knows nothing of contexts).
pub trait PrimaryContext {
    /// The device's primary context.
    fn primary(&self) -> Arc<Context>;
    /// `cuDevicePrimaryCtxReset`: when the primary context's session was lost, the next one
    /// lives in a new session (if the server is back). Returns the (new) primary context.
    fn reset_primary(&self) -> Arc<Context>;
}

impl PrimaryContext for Device {
    fn primary(&self) -> Arc<Context> {
        let known = PRIMARY_CONTEXTS
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&self.ordinal)
            .cloned();
        if let Some(context) = known {
            return context;
        }
        let mut contexts = PRIMARY_CONTEXTS.write().unwrap_or_else(|e| e.into_inner());
        contexts
            .entry(self.ordinal)
            .or_insert_with(|| {
                Context::new(&self.link.current(), self.ordinal, ContextKind::Primary, 0).register()
            })
            .clone()
    }

    fn reset_primary(&self) -> Arc<Context> {
        let old = self.primary();
        if old.conn.is_alive() {
            return old;
        }
        let conn = self.link.connection();
        if Arc::ptr_eq(&conn, &old.conn) {
            return old;
        }
        let fresh = Context::new(&conn, self.ordinal, ContextKind::Primary, 0);
        fresh
            .flags
            .store(old.flags.load(Ordering::Relaxed), Ordering::Relaxed);
        let fresh = fresh.register();
        PRIMARY_CONTEXTS
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(self.ordinal, fresh.clone());
        log::warn!(
            "rgpu: device {} has a new primary context on server {}",
            self.ordinal,
            self.link.endpoint()
        );
        fresh
    }
}
