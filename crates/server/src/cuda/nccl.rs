//! NCCL on the server (the `Nccl` group): the machine's own NCCL library, loaded by the worker
//! at the session's first NCCL request, runs the program's NCCL calls on its device pointers
//! and streams, in its contexts. Communicators bootstrap among the servers' workers directly
//! (NCCL's sockets; the interface is NCCL's choice, or `NCCL_SOCKET_IFNAME` in the server's
//! environment), and their data moves by NVLink, PCIe, shared memory or the network between
//! servers, never through a client.
//!
//! Calls the client posts (collectives, sends, receives) never fail the session: a failure
//! becomes the communicator's asynchronous error, which `ncclCommGetAsyncError` reports, as
//! NCCL reports a failed kernel. The worker ends with the session, and NCCL with it.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::null_mut;
use std::sync::OnceLock;

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::nccl::*;
use rgpu_cuda_api::sys::CUstream;
use rgpu_protocol::cuda::{
    serve, DevicePtr, Id, NcclAnswer, NcclEnd, NcclError, NcclKind, NcclOp, NcclScalar, Status,
    NCCL_SYSTEM_ERROR as NO_NCCL,
};

use super::session::{CudaSession, Served};

/// The NCCL library the server loads: this variable (from the server's environment), else
/// the loader's `libnccl.so.2`.
pub const LIBRARY_ENV: &str = "RGPU_NCCL_LIBRARY";

type Comm = ncclComm_t;
type Stream = CUstream;

/// The functions of the machine's NCCL the server calls; `None`: that NCCL predates them.
struct Library {
    _library: libloading::Library,
    get_version: unsafe extern "C" fn(*mut c_int) -> ncclResult_t,
    get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> ncclResult_t,
    init_rank_config:
        unsafe extern "C" fn(*mut Comm, c_int, ncclUniqueId, c_int, *mut c_void) -> ncclResult_t,
    split: Option<unsafe extern "C" fn(Comm, c_int, c_int, *mut Comm, *mut c_void) -> ncclResult_t>,
    finalize: Option<unsafe extern "C" fn(Comm) -> ncclResult_t>,
    destroy: unsafe extern "C" fn(Comm) -> ncclResult_t,
    abort: unsafe extern "C" fn(Comm) -> ncclResult_t,
    async_error: unsafe extern "C" fn(Comm, *mut ncclResult_t) -> ncclResult_t,
    last_error: Option<unsafe extern "C" fn(Comm) -> *const c_char>,
    count: unsafe extern "C" fn(Comm, *mut c_int) -> ncclResult_t,
    user_rank: unsafe extern "C" fn(Comm, *mut c_int) -> ncclResult_t,
    group_start: unsafe extern "C" fn() -> ncclResult_t,
    group_end: unsafe extern "C" fn() -> ncclResult_t,
    /// AllReduce and ReduceScatter.
    all_reduce: Reduction,
    reduce_scatter: Reduction,
    reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        c_int,
        Comm,
        Stream,
    ) -> ncclResult_t,
    broadcast: Rooted,
    all_gather: Gathering,
    all_to_all: Option<Gathering>,
    gather: Option<Rooted>,
    scatter: Option<Rooted>,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, Stream) -> ncclResult_t,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> ncclResult_t,
    pre_mul_sum:
        Option<unsafe extern "C" fn(*mut c_int, *mut c_void, c_int, c_int, Comm) -> ncclResult_t>,
    red_op_destroy: Option<unsafe extern "C" fn(c_int, Comm) -> ncclResult_t>,
    mem_alloc: Option<unsafe extern "C" fn(*mut *mut c_void, usize) -> ncclResult_t>,
    mem_free: Option<unsafe extern "C" fn(*mut c_void) -> ncclResult_t>,
    register:
        Option<unsafe extern "C" fn(Comm, *mut c_void, usize, *mut *mut c_void) -> ncclResult_t>,
    deregister: Option<unsafe extern "C" fn(Comm, *mut c_void) -> ncclResult_t>,
}

type Reduction = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    Stream,
) -> ncclResult_t;
type Rooted = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    Stream,
) -> ncclResult_t;
type Gathering =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> ncclResult_t;

impl Library {
    fn load() -> Result<Library, String> {
        let name = std::env::var_os(LIBRARY_ENV).unwrap_or_else(|| "libnccl.so.2".into());
        // SAFETY: loading the machine's NCCL runs its initializers, as any NCCL program does.
        let library = unsafe { libloading::Library::new(&name) }
            .map_err(|e| format!("cannot load NCCL ({}): {e}", name.to_string_lossy()))?;
        // SAFETY: a lookup of a plain symbol.
        if unsafe { library.get::<*const u8>(b"rgpu_nccl_client\0") }.is_ok() {
            return Err(format!(
                "{} is rgpu's libnccl.so.2, not NCCL (set {LIBRARY_ENV})",
                name.to_string_lossy()
            ));
        }
        macro_rules! optional {
            ($name:literal) => {
                // SAFETY: NCCL's function of this name has the type of the field it fills
                // (nccl.h); the library stays loaded with the table.
                unsafe { library.get(concat!($name, "\0").as_bytes()) }
                    .ok()
                    .map(|symbol: libloading::Symbol<_>| *symbol)
            };
        }
        macro_rules! required {
            ($name:literal) => {
                optional!($name).ok_or(concat!("NCCL without ", $name))?
            };
        }
        Ok(Library {
            get_version: required!("ncclGetVersion"),
            get_unique_id: required!("ncclGetUniqueId"),
            init_rank_config: required!("ncclCommInitRankConfig"),
            split: optional!("ncclCommSplit"),
            finalize: optional!("ncclCommFinalize"),
            destroy: required!("ncclCommDestroy"),
            abort: required!("ncclCommAbort"),
            async_error: required!("ncclCommGetAsyncError"),
            last_error: optional!("ncclGetLastError"),
            count: required!("ncclCommCount"),
            user_rank: required!("ncclCommUserRank"),
            group_start: required!("ncclGroupStart"),
            group_end: required!("ncclGroupEnd"),
            all_reduce: required!("ncclAllReduce"),
            reduce_scatter: required!("ncclReduceScatter"),
            reduce: required!("ncclReduce"),
            broadcast: required!("ncclBroadcast"),
            all_gather: required!("ncclAllGather"),
            all_to_all: optional!("ncclAlltoAll"),
            gather: optional!("ncclGather"),
            scatter: optional!("ncclScatter"),
            send: required!("ncclSend"),
            recv: required!("ncclRecv"),
            pre_mul_sum: optional!("ncclRedOpCreatePreMulSum"),
            red_op_destroy: optional!("ncclRedOpDestroy"),
            mem_alloc: optional!("ncclMemAlloc"),
            mem_free: optional!("ncclMemFree"),
            register: optional!("ncclCommRegister"),
            deregister: optional!("ncclCommDeregister"),
            _library: library,
        })
    }
}

/// This worker's NCCL, loaded at the first request (a failure is logged once and answered
/// ncclSystemError).
fn library() -> Result<&'static Library, NcclError> {
    static LIBRARY: OnceLock<Result<Library, String>> = OnceLock::new();
    LIBRARY
        .get_or_init(|| {
            let loaded = Library::load();
            if let Err(e) = &loaded {
                log::warn!("{e}");
            }
            loaded
        })
        .as_ref()
        .map_err(|_| NO_NCCL)
}

fn nccl(code: ncclResult_t) -> NcclAnswer<()> {
    match code {
        NCCL_SUCCESS => Ok(()),
        code => Err(NcclError(code)),
    }
}

/// A function the machine's NCCL lacks.
fn missing<T>(name: &str) -> NcclAnswer<T> {
    log::warn!("this server's NCCL has no {name}");
    Err(NcclError(NCCL_INVALID_USAGE))
}

/// A communicator of the session.
struct Communicator {
    raw: Comm,
    ctx: Id,
    /// The first failure of a posted call on it.
    failure: Option<ncclResult_t>,
}

/// The session's NCCL objects.
#[derive(Default)]
pub(crate) struct NcclState {
    comms: HashMap<Id, Communicator>,
    /// `ncclCommRegister` registrations, by the number the client holds.
    registrations: HashMap<u64, (Id, usize)>,
    next_registration: u64,
}

impl NcclState {
    fn comm(&self, id: Id) -> Result<&Communicator, NcclError> {
        self.comms.get(&id).ok_or(NcclError(NCCL_INVALID_ARGUMENT))
    }

    /// Aborts the communicators left at the session's end (before its contexts go), so that
    /// no rank of another session waits for this one's.
    pub(crate) fn abort_all(&mut self) {
        let Ok(lib) = library() else { return };
        for (_, comm) in self.comms.drain() {
            // SAFETY: a live communicator of the session.
            unsafe { (lib.abort)(comm.raw) };
        }
    }
}

/// One communicator made by a group, kept at a fixed address until the group ends (NCCL
/// writes it then).
struct Made {
    comm: Id,
    ctx: Id,
    raw: Box<Comm>,
}

impl CudaSession {
    /// Runs NCCL work, then makes the session's current context the thread's again: NCCL
    /// calls `cudaSetDevice`, which makes the device's primary context current behind the
    /// session's back (later requests would make their objects there).
    fn settled<T>(&mut self, work: impl FnOnce(&mut CudaSession) -> T) -> T {
        let done = work(self);
        let mut now = null_mut();
        let driver = &self.backend.driver;
        // SAFETY: a local out-value; then the session's own current context (or none).
        unsafe {
            cu_call!(driver, cuCtxGetCurrent(&mut now));
            if now != self.current {
                cu_call!(driver, cuCtxSetCurrent(self.current));
            }
        }
        done
    }

    fn nccl_enter(&mut self, ctx: Id) -> NcclAnswer<()> {
        self.enter(ctx)
            .map_err(|_| NcclError(NCCL_INVALID_ARGUMENT))
    }

    /// Runs a group's calls (in one NCCL group when more than one); returns the size and rank
    /// of each communicator made. `Err`: the first failure (the group still ends).
    fn nccl_run(&mut self, ops: Vec<NcclOp>) -> NcclAnswer<Vec<(i32, i32)>> {
        let lib = library()?;
        let grouped = ops.len() > 1;
        if grouped {
            // SAFETY: a plain NCCL call.
            nccl(unsafe { (lib.group_start)() })?;
        }
        let mut made = Vec::new();
        let mut configs = Vec::new();
        let mut outcome = Ok(());
        for op in ops {
            let done = self.nccl_one(lib, op, &mut made, &mut configs);
            outcome = outcome.and(done);
        }
        if grouped {
            // SAFETY: ends the group begun above.
            outcome = outcome.and(nccl(unsafe { (lib.group_end)() }));
        }
        let mut shapes = Vec::new();
        for one in made {
            let raw = *one.raw;
            if raw.is_null() || outcome.is_err() {
                shapes.push((0, -1));
                continue;
            }
            let (mut count, mut rank) = (0, -1);
            // SAFETY: a communicator NCCL just made, and local out-values.
            unsafe {
                (lib.count)(raw, &mut count);
                (lib.user_rank)(raw, &mut rank);
            }
            self.nccl.comms.insert(
                one.comm,
                Communicator {
                    raw,
                    ctx: one.ctx,
                    failure: None,
                },
            );
            shapes.push((count, rank));
        }
        outcome.map(|()| shapes)
    }

    fn nccl_one(
        &mut self,
        lib: &Library,
        op: NcclOp,
        made: &mut Vec<Made>,
        configs: &mut Vec<(Box<ConfigLayout>, Vec<CString>)>,
    ) -> NcclAnswer<()> {
        // The program's config, kept until the group ends.
        let mut config = |wire: Option<rgpu_protocol::cuda::NcclConfig>| -> *mut c_void {
            let Some(wire) = wire else { return null_mut() };
            let mut strings = Vec::new();
            let mut layout = Box::new(ConfigLayout::from_wire(&wire, &mut strings));
            let ptr = std::ptr::addr_of_mut!(*layout).cast();
            configs.push((layout, strings));
            ptr
        };
        match op {
            NcclOp::InitRank {
                comm,
                ctx,
                nranks,
                rank,
                unique_id,
                config: wire,
            } => {
                self.nccl_enter(ctx)?;
                let id =
                    ncclUniqueId::from_bytes(&unique_id).ok_or(NcclError(NCCL_INVALID_ARGUMENT))?;
                let config = config(wire);
                let mut one = Made {
                    comm,
                    ctx,
                    raw: Box::new(null_mut()),
                };
                // SAFETY: a local out-value at a fixed address, the program's id and config.
                let code =
                    unsafe { (lib.init_rank_config)(&mut *one.raw, nranks, id, rank, config) };
                made.push(one);
                nccl(code)
            }
            NcclOp::Split {
                comm,
                parent,
                color,
                key,
                config: wire,
            } => {
                let split = lib.split.map_or_else(|| missing("ncclCommSplit"), Ok)?;
                let (raw, ctx) = {
                    let parent = self.nccl.comm(parent)?;
                    (parent.raw, parent.ctx)
                };
                self.nccl_enter(ctx)?;
                let config = config(wire);
                let mut one = Made {
                    comm,
                    ctx,
                    raw: Box::new(null_mut()),
                };
                // SAFETY: a live communicator, a local out-value at a fixed address.
                let code = unsafe { split(raw, color, key, &mut *one.raw, config) };
                made.push(one);
                nccl(code)
            }
            NcclOp::Call {
                kind,
                comm,
                ctx,
                stream,
                send,
                recv,
                count,
                datatype,
                op,
                root,
            } => {
                let raw = self.nccl.comm(comm)?.raw;
                self.nccl_enter(ctx)?;
                let stream = self
                    .stream(stream)
                    .map_err(|_| NcclError(NCCL_INVALID_ARGUMENT))?;
                let code = call(
                    lib, kind, raw, stream, send, recv, count, datatype, op, root,
                );
                if let Err(NcclError(code)) = code {
                    if let Some(failed) = self.nccl.comms.get_mut(&comm) {
                        failed.failure.get_or_insert(code);
                    }
                }
                code
            }
        }
    }
}

/// One collective or point-to-point call.
#[allow(clippy::too_many_arguments)]
fn call(
    lib: &Library,
    kind: NcclKind,
    comm: Comm,
    stream: Stream,
    send: DevicePtr,
    recv: DevicePtr,
    count: u64,
    datatype: u32,
    op: u32,
    root: i32,
) -> NcclAnswer<()> {
    let (send, recv) = (send as *const c_void, recv as *mut c_void);
    let (count, datatype, op) = (count as usize, datatype as c_int, op as c_int);
    let optional = |f: Option<Rooted>| f.ok_or(());
    // SAFETY: the program's device addresses and stream and a live communicator, in NCCL's
    // prototype of each function: the GPU checks the addresses, NCCL the rest.
    let code = unsafe {
        match kind {
            NcclKind::AllReduce => Ok((lib.all_reduce)(
                send, recv, count, datatype, op, comm, stream,
            )),
            NcclKind::ReduceScatter => Ok((lib.reduce_scatter)(
                send, recv, count, datatype, op, comm, stream,
            )),
            NcclKind::Reduce => Ok((lib.reduce)(
                send, recv, count, datatype, op, root, comm, stream,
            )),
            NcclKind::Broadcast => Ok((lib.broadcast)(
                send, recv, count, datatype, root, comm, stream,
            )),
            NcclKind::Gather => {
                optional(lib.gather).map(|f| f(send, recv, count, datatype, root, comm, stream))
            }
            NcclKind::Scatter => {
                optional(lib.scatter).map(|f| f(send, recv, count, datatype, root, comm, stream))
            }
            NcclKind::AllGather => Ok((lib.all_gather)(send, recv, count, datatype, comm, stream)),
            NcclKind::AllToAll => match lib.all_to_all {
                Some(f) => Ok(f(send, recv, count, datatype, comm, stream)),
                None => Err(()),
            },
            NcclKind::Send => Ok((lib.send)(send, count, datatype, root, comm, stream)),
            NcclKind::Recv => Ok((lib.recv)(recv, count, datatype, root, comm, stream)),
        }
    };
    match code {
        Ok(code) => nccl(code),
        Err(()) => missing(&format!("{kind:?}")),
    }
}

impl serve::Nccl for Served<'_> {
    fn nccl_version(&mut self) -> NcclAnswer<i32> {
        self.cuda.settled(|_| {
            let lib = library()?;
            let mut version = 0;
            // SAFETY: a local out-value.
            nccl(unsafe { (lib.get_version)(&mut version) })?;
            Ok(version)
        })
    }

    fn nccl_unique_id(&mut self) -> NcclAnswer<Vec<u8>> {
        self.cuda.settled(|_| {
            let lib = library()?;
            let mut id = ncclUniqueId {
                internal: [0; NCCL_UNIQUE_ID_BYTES],
            };
            // SAFETY: a local out-value; NCCL starts the bootstrap root in this worker.
            nccl(unsafe { (lib.get_unique_id)(&mut id) })?;
            Ok(id.bytes())
        })
    }

    fn nccl_create(&mut self, ops: Vec<NcclOp>) -> NcclAnswer<Vec<(i32, i32)>> {
        self.cuda.settled(|cuda| cuda.nccl_run(ops))
    }

    fn nccl_launch(&mut self, ops: Vec<NcclOp>) -> Result<(), Status> {
        self.cuda.settled(|cuda| {
            // Failures are the communicators' (nccl_one); they never fail the session's CUDA.
            if let Err(NcclError(code)) = cuda.nccl_run(ops) {
                log::debug!("a posted NCCL call failed: {code}");
            }
            Ok(())
        })
    }

    fn nccl_async_error(&mut self, comm: Id) -> NcclAnswer<i32> {
        self.cuda.settled(|cuda| {
            let lib = library()?;
            let found = cuda.nccl.comm(comm)?;
            if let Some(failure) = found.failure {
                return Ok(failure);
            }
            let mut code = NCCL_SUCCESS;
            // SAFETY: a live communicator, a local out-value.
            nccl(unsafe { (lib.async_error)(found.raw, &mut code) })?;
            Ok(code)
        })
    }

    fn nccl_last_error(&mut self, comm: Id) -> NcclAnswer<String> {
        self.cuda.settled(|cuda| {
            let lib = library()?;
            let raw = cuda.nccl.comm(comm).map_or(null_mut(), |c| c.raw);
            let Some(last_error) = lib.last_error else {
                return Ok(String::new());
            };
            // SAFETY: a live communicator or null, as NCCL allows.
            let text = unsafe { last_error(raw) };
            if text.is_null() {
                return Ok(String::new());
            }
            // SAFETY: NCCL's NUL-terminated text.
            Ok(unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned())
        })
    }

    fn nccl_end_comm(&mut self, comm: Id, how: NcclEnd) -> NcclAnswer<()> {
        self.cuda.settled(|cuda| {
            let lib = library()?;
            let (raw, ctx) = {
                let found = cuda.nccl.comm(comm)?;
                (found.raw, found.ctx)
            };
            // Its context may be gone already (a program destroys contexts first at exit).
            let _ = cuda.nccl_enter(ctx);
            let code = match how {
                NcclEnd::Finalize => match lib.finalize {
                    // SAFETY: a live communicator.
                    Some(finalize) => unsafe { finalize(raw) },
                    None => NCCL_SUCCESS,
                },
                // SAFETY: a live communicator, forgotten here.
                NcclEnd::Destroy => unsafe { (lib.destroy)(raw) },
                // SAFETY: as above.
                NcclEnd::Abort => unsafe { (lib.abort)(raw) },
            };
            if how != NcclEnd::Finalize {
                cuda.nccl.comms.remove(&comm);
                cuda.nccl.registrations.retain(|_, (c, _)| *c != comm);
            }
            nccl(code)
        })
    }

    fn nccl_pre_mul_sum(&mut self, comm: Id, scalar: NcclScalar, datatype: u32) -> NcclAnswer<u32> {
        self.cuda.settled(|cuda| {
            let lib = library()?;
            let create = lib
                .pre_mul_sum
                .map_or_else(|| missing("ncclRedOpCreatePreMulSum"), Ok)?;
            let raw = cuda.nccl.comm(comm)?.raw;
            let mut bytes = Vec::new();
            let (ptr, residence) = match scalar {
                NcclScalar::Host(value) => {
                    bytes = value;
                    (bytes.as_mut_ptr().cast(), NCCL_SCALAR_HOST_IMMEDIATE)
                }
                NcclScalar::Device(ptr) => (ptr as *mut c_void, NCCL_SCALAR_DEVICE),
            };
            let width = usize::try_from(datatype)
                .ok()
                .and_then(|d| DATA_TYPE_BYTES.get(d))
                .ok_or(NcclError(NCCL_INVALID_ARGUMENT))?;
            if residence == NCCL_SCALAR_HOST_IMMEDIATE && bytes.len() != *width {
                return Err(NcclError(NCCL_INVALID_ARGUMENT));
            }
            let mut op = 0;
            // SAFETY: a live communicator, the scalar (read now when on the host), a local out.
            nccl(unsafe { create(&mut op, ptr, datatype as c_int, residence, raw) })?;
            Ok(op as u32)
        })
    }

    fn nccl_red_op_destroy(&mut self, comm: Id, op: u32) -> NcclAnswer<()> {
        self.cuda.settled(|cuda| {
            let lib = library()?;
            let destroy = lib
                .red_op_destroy
                .map_or_else(|| missing("ncclRedOpDestroy"), Ok)?;
            let raw = cuda.nccl.comm(comm)?.raw;
            // SAFETY: a live communicator; NCCL checks the reduction's number.
            nccl(unsafe { destroy(op as c_int, raw) })
        })
    }

    fn nccl_mem_alloc(&mut self, ctx: Id, size: u64) -> NcclAnswer<DevicePtr> {
        self.cuda.settled(|cuda| {
            let lib = library()?;
            let alloc = lib.mem_alloc.map_or_else(|| missing("ncclMemAlloc"), Ok)?;
            cuda.nccl_enter(ctx)?;
            let mut failed = NCCL_SUCCESS;
            let charged = cuda.charged_allocation(size, |_| {
                let mut ptr = null_mut();
                // SAFETY: a local out-value; NCCL allocates on the current context's device.
                failed = unsafe { alloc(&mut ptr, size as usize) };
                match failed {
                    NCCL_SUCCESS => Ok(super::session::Charged::Pointer(ptr as u64)),
                    _ => Err(super::session::OUT_OF_MEMORY),
                }
            });
            match (charged, failed) {
                (Ok(ptr), _) => Ok(ptr),
                (Err(_), NCCL_SUCCESS) => Err(NcclError(NCCL_SYSTEM_ERROR)),
                (Err(_), code) => Err(NcclError(code)),
            }
        })
    }

    fn nccl_mem_free(&mut self, ctx: Id, ptr: DevicePtr) -> NcclAnswer<()> {
        self.cuda.settled(|cuda| {
            let lib = library()?;
            let free = lib.mem_free.map_or_else(|| missing("ncclMemFree"), Ok)?;
            cuda.nccl_enter(ctx)?;
            // SAFETY: NCCL checks that the address is one of its allocations.
            nccl(unsafe { free(ptr as *mut c_void) })?;
            cuda.uncharge(super::session::Charged::Pointer(ptr));
            Ok(())
        })
    }

    fn nccl_register(&mut self, comm: Id, ptr: DevicePtr, size: u64) -> NcclAnswer<u64> {
        self.cuda.settled(|cuda| {
            let lib = library()?;
            let register = lib
                .register
                .map_or_else(|| missing("ncclCommRegister"), Ok)?;
            let raw = cuda.nccl.comm(comm)?.raw;
            let mut handle = null_mut();
            // SAFETY: a live communicator, the program's device range, a local out-value.
            nccl(unsafe { register(raw, ptr as *mut c_void, size as usize, &mut handle) })?;
            let state = &mut cuda.nccl;
            state.next_registration += 1;
            let number = state.next_registration;
            state.registrations.insert(number, (comm, handle as usize));
            Ok(number)
        })
    }

    fn nccl_deregister(&mut self, comm: Id, registration: u64) -> NcclAnswer<()> {
        self.cuda.settled(|cuda| {
            let lib = library()?;
            let deregister = lib
                .deregister
                .map_or_else(|| missing("ncclCommDeregister"), Ok)?;
            let raw = cuda.nccl.comm(comm)?.raw;
            let state = &mut cuda.nccl;
            let handle = match state.registrations.get(&registration) {
                Some(&(owner, handle)) if owner == comm => handle,
                _ => return Err(NcclError(NCCL_INVALID_ARGUMENT)),
            };
            state.registrations.remove(&registration);
            // SAFETY: a live communicator and one of its registrations.
            nccl(unsafe { deregister(raw, handle as *mut c_void) })
        })
    }
}
