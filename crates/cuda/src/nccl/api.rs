//! The NCCL entry points rgpu implements (the generator reads the `pub unsafe fn ncclX`
//! names here). Arguments are checked here as NCCL checks them, so that a bad one gets NCCL's
//! own error at once; what only the GPU can tell comes back as the communicator's
//! asynchronous error (`ncclCommGetAsyncError`), as NCCL reports a failed kernel.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rgpu_client::{ClientError, Connection, CudaClient};
use rgpu_cuda_api::nccl::*;
use rgpu_cuda_api::sys::CUstream;
use rgpu_protocol::cuda::{
    DevicePtr, Id, NcclAnswer, NcclEnd, NcclError, NcclKind, NcclOp, NcclScalar,
};

use crate::objects::{current_context, resolve_stream, Context, PrimaryContext};

/// A communicator of the program: a rank on one device, made on that device's server.
struct Comm {
    conn: Arc<Connection>,
    remote: Id,
    ctx: Arc<Context>,
    /// The program's device ordinal.
    device: i32,
    nranks: i32,
    rank: i32,
    /// The communicators made with it on other servers, when there are any.
    clique: Option<Arc<Clique>>,
    /// Until when `ncclCommGetAsyncError` may answer ncclSuccess without asking the server:
    /// set by a server's ncclSuccess, cleared by any other call naming the communicator (it
    /// may leave it in progress, which the program then polls for).
    healthy_until: Mutex<Option<Instant>>,
}

/// How long a server's "no asynchronous error" stands for a communicator nobody has used
/// since. PyTorch's watchdog thread asks for every communicator on each pass; NCCL itself
/// sets the error from its own threads at any moment, so an answer this old is one it could
/// have given.
const HEALTH_FRESH: Duration = Duration::from_millis(2);

/// Communicators that one group of this process made on several servers (ncclCommInitAll, a
/// group of inits or splits). NCCL's single-process programs end them one at a time from one
/// thread, which works in one process; here each rank lives in its server's worker, and the
/// first rank's end would wait for ranks not yet ending. So each finalize or destroy returns
/// at once until every member has asked for it, and then all go together. An abort is
/// carried out at once (it is how a program unblocks), and counts as that member's end.
struct Clique {
    size: usize,
    finalizing: Mutex<Vec<Member>>,
    /// Members ended: those still to destroy, and `None` for those aborted.
    ending: Mutex<Vec<Option<Member>>>,
}

/// A member of a clique: its server and its id there.
type Member = (Arc<Connection>, Id);

/// The program's communicators, by handle (`ncclComm_t`).
static COMMS: Mutex<Option<HashMap<usize, Arc<Comm>>>> = Mutex::new(None);

/// The communicator `handle` names, for a call that may change its state.
fn comm(handle: ncclComm_t) -> Result<Arc<Comm>, ncclResult_t> {
    let found = lookup(handle)?;
    *found.healthy_until.lock().unwrap() = None;
    Ok(found)
}

fn lookup(handle: ncclComm_t) -> Result<Arc<Comm>, ncclResult_t> {
    COMMS
        .lock()
        .unwrap()
        .as_ref()
        .and_then(|comms| comms.get(&(handle as usize)).cloned())
        .ok_or(NCCL_INVALID_ARGUMENT)
}

fn register(comm: Comm) -> ncclComm_t {
    let handle = crate::handles::new_handle();
    COMMS
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .insert(handle, Arc::new(comm));
    handle as ncclComm_t
}

/// One call of a group, for its server.
struct Queued {
    conn: Arc<Connection>,
    op: NcclOp,
    /// A communicator this call makes: where the program's handle goes, and what it is.
    makes: Option<Making>,
}

struct Making {
    out: *mut ncclComm_t,
    ctx: Arc<Context>,
    device: i32,
}

thread_local! {
    /// NCCL groups are per thread: how deep this thread is, and the calls queued since the
    /// outermost `ncclGroupStart`.
    static GROUP: RefCell<(u32, Vec<Queued>)> = const { RefCell::new((0, Vec::new())) };
    /// The text `ncclGetLastError` hands out, kept until the thread's next call of it.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn result(outcome: Result<(), ncclResult_t>) -> ncclResult_t {
    outcome.err().unwrap_or(NCCL_SUCCESS)
}

/// The answer of a call to a server: a lost connection is a system error, as NCCL reports a
/// dead socket.
fn answer<T>(reply: Result<NcclAnswer<T>, ClientError>) -> Result<T, ncclResult_t> {
    match reply {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(NcclError(code))) => Err(code),
        Err(e) => {
            log::error!("rgpu: NCCL: {e}");
            Err(NCCL_SYSTEM_ERROR)
        }
    }
}

/// The connection NCCL calls without a communicator go to: the current context's server,
/// else the first device's.
fn default_connection() -> Result<Arc<Connection>, ncclResult_t> {
    if let Ok(ctx) = current_context() {
        return Ok(ctx.conn.clone());
    }
    let servers = crate::servers::init().map_err(|_| NCCL_SYSTEM_ERROR)?;
    match servers.devices.first() {
        Some(device) => Ok(device.link.connection()),
        None => {
            log::warn!("rgpu: NCCL: no server offers a CUDA device");
            Err(NCCL_SYSTEM_ERROR)
        }
    }
}

/// The context NCCL works in for the calling thread: the current one, else device 0's primary
/// (as the CUDA runtime's current device defaults to 0).
fn working_context() -> Result<Arc<Context>, ncclResult_t> {
    if let Ok(ctx) = current_context() {
        return Ok(ctx);
    }
    primary_context(0)
}

fn primary_context(ordinal: c_int) -> Result<Arc<Context>, ncclResult_t> {
    let servers = crate::servers::init().map_err(|_| NCCL_SYSTEM_ERROR)?;
    if servers.devices.is_empty() {
        log::warn!("rgpu: NCCL: no server offers a CUDA device");
        return Err(NCCL_SYSTEM_ERROR);
    }
    let device = crate::servers::device(ordinal).map_err(|_| NCCL_INVALID_ARGUMENT)?;
    let primary = device.primary();
    primary.ensure_created().map_err(|_| NCCL_SYSTEM_ERROR)?;
    Ok(primary)
}

/// # Safety
/// `out` is null or valid for writing.
unsafe fn write<T>(out: *mut T, value: T) -> Result<(), ncclResult_t> {
    if out.is_null() {
        return Err(NCCL_INVALID_ARGUMENT);
    }
    // SAFETY: the caller's guarantee; checked non-null.
    unsafe { out.write(value) };
    Ok(())
}

pub unsafe fn ncclGetVersion(version: *mut c_int) -> ncclResult_t {
    static VERSION: OnceLock<Result<i32, ncclResult_t>> = OnceLock::new();
    let found = *VERSION.get_or_init(|| {
        let conn = default_connection()?;
        answer(conn.cuda().nccl_version())
    });
    // SAFETY: the program's out-pointer.
    result(found.and_then(|v| unsafe { write(version, v) }))
}

pub unsafe fn ncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t {
    result((|| {
        if uniqueId.is_null() {
            return Err(NCCL_INVALID_ARGUMENT);
        }
        let conn = default_connection()?;
        let bytes = answer(conn.cuda().nccl_unique_id())?;
        let id = ncclUniqueId::from_bytes(&bytes).ok_or(NCCL_INTERNAL_ERROR)?;
        // SAFETY: checked non-null; the program's id.
        unsafe { write(uniqueId, id) }
    })())
}

/// Queues a call in the thread's group, or carries it out now outside one.
fn queue_or_run(queued: Queued) -> Result<(), ncclResult_t> {
    let alone = GROUP.with(|group| {
        let mut group = group.borrow_mut();
        if group.0 == 0 {
            return Some(queued);
        }
        group.1.push(queued);
        None
    });
    match alone {
        Some(alone) => run(vec![alone]),
        None => Ok(()),
    }
}

/// Queues (in a group) or makes now a communicator of `ctx`'s device.
fn make(conn: Arc<Connection>, op: NcclOp, making: Making) -> Result<(), ncclResult_t> {
    queue_or_run(Queued {
        conn,
        op,
        makes: Some(making),
    })
}

pub unsafe fn ncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    result((|| {
        if comm.is_null() || nranks < 1 || rank < 0 || rank >= nranks {
            return Err(NCCL_INVALID_ARGUMENT);
        }
        // SAFETY: the program's config, null or made by NCCL_CONFIG_INITIALIZER.
        let config = unsafe { read_config(config) }?;
        let ctx = working_context()?;
        let op = NcclOp::InitRank {
            comm: ctx.conn.new_id(),
            ctx: ctx.remote,
            nranks,
            rank,
            unique_id: commId.bytes(),
            config,
        };
        let device = ctx.device;
        make(
            ctx.conn.clone(),
            op,
            Making {
                out: comm,
                ctx,
                device,
            },
        )
    })())
}

pub unsafe fn ncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    // SAFETY: the program's arguments; no config.
    unsafe { ncclCommInitRankConfig(comm, nranks, commId, rank, std::ptr::null_mut()) }
}

pub unsafe fn ncclCommInitRankScalable(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    myrank: c_int,
    nId: c_int,
    commIds: *mut ncclUniqueId,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    if commIds.is_null() || nId < 1 {
        return NCCL_INVALID_ARGUMENT;
    }
    if nId > 1 {
        // Several bootstrap roots: one is as correct (only slower to start at scale).
        log::debug!("rgpu: ncclCommInitRankScalable with {nId} roots uses the first");
    }
    // SAFETY: the program's ids (at least one).
    let first = unsafe { commIds.read() };
    // SAFETY: the program's arguments.
    unsafe { ncclCommInitRankConfig(newcomm, nranks, first, myrank, config) }
}

pub unsafe fn ncclCommInitAll(
    comm: *mut ncclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> ncclResult_t {
    result((|| {
        if comm.is_null() || ndev < 1 {
            return Err(NCCL_INVALID_ARGUMENT);
        }
        let devices: Vec<c_int> = match devlist.is_null() {
            true => (0..ndev).collect(),
            // SAFETY: the program lists `ndev` devices.
            false => unsafe { std::slice::from_raw_parts(devlist, ndev as usize) }.to_vec(),
        };
        let contexts = devices
            .iter()
            .map(|&d| primary_context(d))
            .collect::<Result<Vec<_>, _>>()?;
        let id = answer(contexts[0].conn.cuda().nccl_unique_id())?;
        let queued = contexts
            .into_iter()
            .enumerate()
            .map(|(rank, ctx)| Queued {
                conn: ctx.conn.clone(),
                op: NcclOp::InitRank {
                    comm: ctx.conn.new_id(),
                    ctx: ctx.remote,
                    nranks: ndev,
                    rank: rank as i32,
                    unique_id: id.clone(),
                    config: None,
                },
                makes: Some(Making {
                    // SAFETY: the program's array of `ndev` communicators.
                    out: unsafe { comm.add(rank) },
                    device: ctx.device,
                    ctx,
                }),
            })
            .collect();
        run(queued)
    })())
}

pub unsafe fn ncclCommSplit(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    result((|| {
        let parent = self::comm(comm)?;
        if newcomm.is_null() || (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
            return Err(NCCL_INVALID_ARGUMENT);
        }
        // SAFETY: the program's config, null or made by NCCL_CONFIG_INITIALIZER.
        let config = unsafe { read_config(config) }?;
        let op = NcclOp::Split {
            comm: parent.conn.new_id(),
            parent: parent.remote,
            color,
            key,
            config,
        };
        make(
            parent.conn.clone(),
            op,
            Making {
                out: newcomm,
                ctx: parent.ctx.clone(),
                device: parent.device,
            },
        )
    })())
}

/// Carries out queued calls: each server gets its own in one message; a group that makes
/// communicators waits for every server (at once, as the ranks wait for each other), one
/// without is posted.
fn run(queued: Vec<Queued>) -> Result<(), ncclResult_t> {
    let mut by_server: Vec<(Arc<Connection>, Vec<Queued>)> = Vec::new();
    for call in queued {
        match by_server
            .iter_mut()
            .find(|(c, _)| Arc::ptr_eq(c, &call.conn))
        {
            Some((_, calls)) => calls.push(call),
            None => by_server.push((call.conn.clone(), vec![call])),
        }
    }
    let makes = by_server
        .iter()
        .any(|(_, calls)| calls.iter().any(|c| c.makes.is_some()));
    if !makes {
        for (conn, calls) in by_server {
            let ops = calls.into_iter().map(|c| c.op).collect();
            conn.cuda().nccl_launch(ops).map_err(|e| {
                log::error!("rgpu: NCCL: {e}");
                NCCL_SYSTEM_ERROR
            })?;
        }
        return Ok(());
    }
    let outcomes: Vec<_> = std::thread::scope(|scope| {
        let waits: Vec<_> = by_server
            .iter()
            .map(|(conn, calls)| {
                let ops: Vec<NcclOp> = calls.iter().map(|c| c.op.clone()).collect();
                scope.spawn(move || answer(conn.cuda().nccl_create(ops)))
            })
            .collect();
        waits
            .into_iter()
            .map(|wait| wait.join().unwrap_or(Err(NCCL_INTERNAL_ERROR)))
            .collect()
    });
    let mut first_error = Ok(());
    let made_on = by_server
        .iter()
        .zip(&outcomes)
        .filter(|((_, calls), outcome)| outcome.is_ok() && calls.iter().any(|c| c.makes.is_some()))
        .count();
    let members = outcomes
        .iter()
        .flatten()
        .flatten()
        .filter(|(nranks, _)| *nranks > 0)
        .count();
    let clique = (made_on > 1).then(|| {
        Arc::new(Clique {
            size: members,
            finalizing: Mutex::new(Vec::new()),
            ending: Mutex::new(Vec::new()),
        })
    });
    for ((conn, calls), outcome) in by_server.into_iter().zip(outcomes) {
        let made = match outcome {
            Ok(made) => made,
            Err(code) => {
                first_error = first_error.and(Err(code));
                continue;
            }
        };
        let mut made = made.into_iter();
        for call in calls {
            let Some(making) = call.makes else { continue };
            let remote = match call.op {
                NcclOp::InitRank { comm, .. } | NcclOp::Split { comm, .. } => comm,
                NcclOp::Call { .. } => continue,
            };
            let (nranks, rank) = made.next().unwrap_or((0, -1));
            // A split rank given NCCL_SPLIT_NOCOLOR joins no communicator.
            let handle = match nranks {
                0 => std::ptr::null_mut(),
                _ => register(Comm {
                    conn: conn.clone(),
                    remote,
                    ctx: making.ctx,
                    device: making.device,
                    nranks,
                    rank,
                    clique: clique.clone(),
                    healthy_until: Mutex::new(None),
                }),
            };
            // SAFETY: the program's out-pointer for this communicator (checked non-null).
            let _ = unsafe { write(making.out, handle) };
        }
    }
    first_error
}

pub unsafe fn ncclGroupStart() -> ncclResult_t {
    GROUP.with(|group| group.borrow_mut().0 += 1);
    NCCL_SUCCESS
}

pub unsafe fn ncclGroupEnd() -> ncclResult_t {
    let queued = GROUP.with(|group| {
        let mut group = group.borrow_mut();
        match group.0 {
            0 => Err(NCCL_INVALID_USAGE),
            1 => {
                group.0 = 0;
                Ok(std::mem::take(&mut group.1))
            }
            _ => {
                group.0 -= 1;
                Ok(Vec::new())
            }
        }
    });
    result(queued.and_then(run))
}

fn end(comm: ncclComm_t, how: NcclEnd) -> ncclResult_t {
    result((|| {
        let found = self::comm(comm)?;
        if how != NcclEnd::Finalize {
            // Gone whatever the server says: the program will not name it again.
            if let Some(comms) = COMMS.lock().unwrap().as_mut() {
                comms.remove(&(comm as usize));
            }
        }
        let Some(clique) = &found.clique else {
            return answer(found.conn.cuda().nccl_end_comm(found.remote, how));
        };
        let (conn, remote) = (found.conn.clone(), found.remote);
        let (all, how) = match how {
            NcclEnd::Finalize => {
                let mut waiting = clique.finalizing.lock().unwrap();
                waiting.push((conn, remote));
                if waiting.len() < clique.size {
                    return Ok(());
                }
                (std::mem::take(&mut *waiting), how)
            }
            NcclEnd::Abort => {
                clique.ending.lock().unwrap().push(None);
                return answer(conn.cuda().nccl_end_comm(remote, how));
            }
            NcclEnd::Destroy => {
                let mut waiting = clique.ending.lock().unwrap();
                waiting.push(Some((conn, remote)));
                if waiting.len() < clique.size {
                    return Ok(());
                }
                (waiting.drain(..).flatten().collect(), how)
            }
        };
        std::thread::scope(|scope| {
            let ends: Vec<_> = all
                .iter()
                .map(|(conn, remote)| {
                    scope.spawn(move || answer(conn.cuda().nccl_end_comm(*remote, how)))
                })
                .collect();
            ends.into_iter()
                .map(|end| end.join().unwrap_or(Err(NCCL_INTERNAL_ERROR)))
                .fold(Ok(()), Result::and)
        })
    })())
}

pub unsafe fn ncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
    end(comm, NcclEnd::Finalize)
}

pub unsafe fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
    if comm.is_null() {
        return NCCL_SUCCESS;
    }
    end(comm, NcclEnd::Destroy)
}

pub unsafe fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    if comm.is_null() {
        return NCCL_SUCCESS;
    }
    end(comm, NcclEnd::Abort)
}

pub unsafe fn ncclCommGetAsyncError(
    comm: ncclComm_t,
    asyncError: *mut ncclResult_t,
) -> ncclResult_t {
    result((|| {
        let found = lookup(comm)?;
        let now = Instant::now();
        let fresh = found
            .healthy_until
            .lock()
            .unwrap()
            .is_some_and(|until| now < until);
        let code = if fresh {
            NCCL_SUCCESS
        } else {
            answer(found.conn.cuda().nccl_async_error(found.remote))?
        };
        if !fresh && code == NCCL_SUCCESS {
            *found.healthy_until.lock().unwrap() = Some(now + HEALTH_FRESH);
        }
        // SAFETY: the program's out-pointer.
        unsafe { write(asyncError, code) }
    })())
}

pub unsafe fn ncclGetErrorString(result: ncclResult_t) -> *const c_char {
    error_string(result).as_ptr()
}

pub unsafe fn ncclGetLastError(comm: ncclComm_t) -> *const c_char {
    // Without a communicator (NCCL allows null), the default server's NCCL answers.
    let target = match self::comm(comm) {
        Ok(found) => Ok((found.conn.clone(), found.remote)),
        Err(_) => default_connection().map(|conn| (conn, 0)),
    };
    let text = target
        .ok()
        .and_then(|(conn, remote)| answer(conn.cuda().nccl_last_error(remote)).ok())
        .unwrap_or_default();
    LAST_ERROR.with(|last| {
        *last.borrow_mut() = CString::new(text).unwrap_or_default();
        last.borrow().as_ptr()
    })
}

/// Writes one of the communicator's facts.
fn fact(comm: ncclComm_t, out: *mut c_int, of: impl Fn(&Comm) -> c_int) -> ncclResult_t {
    // SAFETY: the program's out-pointer.
    result(self::comm(comm).and_then(|found| unsafe { write(out, of(&found)) }))
}

pub unsafe fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    fact(comm, count, |c| c.nranks)
}

pub unsafe fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
    fact(comm, device, |c| c.device)
}

pub unsafe fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    fact(comm, rank, |c| c.rank)
}

pub unsafe fn ncclCommRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> ncclResult_t {
    result((|| {
        let found = self::comm(comm)?;
        if handle.is_null() {
            return Err(NCCL_INVALID_ARGUMENT);
        }
        let server = found.conn.cuda();
        let registration = answer(server.nccl_register(found.remote, buff as u64, size as u64))?;
        // SAFETY: the program's out-pointer (checked non-null).
        unsafe { write(handle, registration as *mut c_void) }
    })())
}

pub unsafe fn ncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
    result(self::comm(comm).and_then(|found| {
        answer(
            found
                .conn
                .cuda()
                .nccl_deregister(found.remote, handle as u64),
        )
    }))
}

pub unsafe fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
    result((|| {
        if ptr.is_null() {
            return Err(NCCL_INVALID_ARGUMENT);
        }
        let ctx = working_context()?;
        let address = answer(ctx.conn.cuda().nccl_mem_alloc(ctx.remote, size as u64))?;
        crate::api::record_device_range(address, size as u64, &ctx);
        // SAFETY: the program's out-pointer (checked non-null).
        unsafe { write(ptr, address as *mut c_void) }
    })())
}

pub unsafe fn ncclMemFree(ptr: *mut c_void) -> ncclResult_t {
    if ptr.is_null() {
        return NCCL_SUCCESS;
    }
    result((|| {
        let ctx = crate::api::allocation_context(ptr as u64)
            .ok()
            .flatten()
            .ok_or(NCCL_INVALID_ARGUMENT)?;
        answer(ctx.conn.cuda().nccl_mem_free(ctx.remote, ptr as u64))?;
        crate::api::forget_device_range(ptr as u64);
        Ok(())
    })())
}

pub unsafe fn ncclRedOpCreatePreMulSum(
    op: *mut ncclRedOp_t,
    scalar: *mut c_void,
    datatype: ncclDataType_t,
    residence: ncclScalarResidence_t,
    comm: ncclComm_t,
) -> ncclResult_t {
    result((|| {
        let found = self::comm(comm)?;
        let bytes = usize::try_from(datatype)
            .ok()
            .and_then(|d| DATA_TYPE_BYTES.get(d))
            .ok_or(NCCL_INVALID_ARGUMENT)?;
        if op.is_null() || scalar.is_null() {
            return Err(NCCL_INVALID_ARGUMENT);
        }
        let scalar = match residence {
            NCCL_SCALAR_HOST_IMMEDIATE => NcclScalar::Host(
                // SAFETY: the program's scalar of `datatype`, in host memory.
                unsafe { std::slice::from_raw_parts(scalar.cast::<u8>(), *bytes) }.to_vec(),
            ),
            NCCL_SCALAR_DEVICE => NcclScalar::Device(scalar as u64),
            _ => return Err(NCCL_INVALID_ARGUMENT),
        };
        let server = found.conn.cuda();
        let made = answer(server.nccl_pre_mul_sum(found.remote, scalar, datatype as u32))?;
        // SAFETY: the program's out-pointer (checked non-null).
        unsafe { write(op, made as ncclRedOp_t) }
    })())
}

pub unsafe fn ncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
    result(self::comm(comm).and_then(|found| {
        if op < NCCL_NUM_OPS {
            return Err(NCCL_INVALID_ARGUMENT);
        }
        answer(
            found
                .conn
                .cuda()
                .nccl_red_op_destroy(found.remote, op as u32),
        )
    }))
}

/// A collective or point-to-point call: checked, then queued in the thread's group or posted.
#[allow(clippy::too_many_arguments)]
fn call(
    kind: NcclKind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: CUstream,
) -> ncclResult_t {
    result((|| {
        let found = self::comm(comm)?;
        if !(0..NCCL_NUM_TYPES).contains(&datatype) || op < 0 {
            return Err(NCCL_INVALID_ARGUMENT);
        }
        let rooted = matches!(
            kind,
            NcclKind::Broadcast
                | NcclKind::Reduce
                | NcclKind::Gather
                | NcclKind::Scatter
                | NcclKind::Send
                | NcclKind::Recv
        );
        if rooted && !(0..found.nranks).contains(&root) {
            return Err(NCCL_INVALID_ARGUMENT);
        }
        let (ctx, stream) = resolve_stream(stream).map_err(|_| NCCL_INVALID_ARGUMENT)?;
        if !Arc::ptr_eq(&ctx.conn, &found.conn) {
            log::warn!("rgpu: NCCL: a stream of another server than the communicator's");
            return Err(NCCL_INVALID_ARGUMENT);
        }
        crate::api::managed::before_device_work(None);
        queue_or_run(Queued {
            conn: found.conn.clone(),
            op: NcclOp::Call {
                kind,
                comm: found.remote,
                ctx: ctx.remote,
                stream,
                send: send as DevicePtr,
                recv: recv as DevicePtr,
                count: count as u64,
                datatype: datatype as u32,
                op: op as u32,
                root,
            },
            makes: None,
        })
    })())
}

pub unsafe fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: CUstream,
) -> ncclResult_t {
    call(
        NcclKind::AllReduce,
        sendbuff,
        recvbuff,
        count,
        datatype,
        op,
        0,
        comm,
        stream,
    )
}

pub unsafe fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: CUstream,
) -> ncclResult_t {
    call(
        NcclKind::Reduce,
        sendbuff,
        recvbuff,
        count,
        datatype,
        op,
        root,
        comm,
        stream,
    )
}

pub unsafe fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: CUstream,
) -> ncclResult_t {
    call(
        NcclKind::Broadcast,
        sendbuff,
        recvbuff,
        count,
        datatype,
        0,
        root,
        comm,
        stream,
    )
}

pub unsafe fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: CUstream,
) -> ncclResult_t {
    call(
        NcclKind::Broadcast,
        buff,
        buff,
        count,
        datatype,
        0,
        root,
        comm,
        stream,
    )
}

pub unsafe fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: CUstream,
) -> ncclResult_t {
    call(
        NcclKind::ReduceScatter,
        sendbuff,
        recvbuff,
        recvcount,
        datatype,
        op,
        0,
        comm,
        stream,
    )
}

pub unsafe fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: CUstream,
) -> ncclResult_t {
    call(
        NcclKind::AllGather,
        sendbuff,
        recvbuff,
        sendcount,
        datatype,
        0,
        0,
        comm,
        stream,
    )
}

pub unsafe fn ncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: CUstream,
) -> ncclResult_t {
    call(
        NcclKind::AllToAll,
        sendbuff,
        recvbuff,
        count,
        datatype,
        0,
        0,
        comm,
        stream,
    )
}

pub unsafe fn ncclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: CUstream,
) -> ncclResult_t {
    call(
        NcclKind::Gather,
        sendbuff,
        recvbuff,
        count,
        datatype,
        0,
        root,
        comm,
        stream,
    )
}

pub unsafe fn ncclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: CUstream,
) -> ncclResult_t {
    call(
        NcclKind::Scatter,
        sendbuff,
        recvbuff,
        count,
        datatype,
        0,
        root,
        comm,
        stream,
    )
}

pub unsafe fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: CUstream,
) -> ncclResult_t {
    let none = std::ptr::null_mut();
    call(
        NcclKind::Send,
        sendbuff,
        none,
        count,
        datatype,
        0,
        peer,
        comm,
        stream,
    )
}

pub unsafe fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: CUstream,
) -> ncclResult_t {
    call(
        NcclKind::Recv,
        std::ptr::null(),
        recvbuff,
        count,
        datatype,
        0,
        peer,
        comm,
        stream,
    )
}
