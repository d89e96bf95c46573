//! CUDA graphs by stream capture. The server records a capturing stream's work into a graph of
//! its own (the program's launches and device copies reach it in order anyway); the client
//! keeps each stream's capture state, and holds graphs and executable graphs as handles.
//! Graphs built node by node are in graph_nodes.rs.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_uint};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use rgpu_client::CudaClient;
use rgpu_cuda_api::sys::*;

use super::{status, write_out, Outcome};
use crate::objects::{resolve_stream, Context, Graph, GraphExec, Stream};

thread_local! {
    /// This thread's capture interaction mode (cuThreadExchangeStreamCaptureMode).
    static CAPTURE_MODE: Cell<c_uint> = const { Cell::new(0) };
}

/// CU_STREAM_CAPTURE_MODE_RELAXED, the largest mode value.
const LAST_CAPTURE_MODE: c_uint = 2;

/// Captures into a graph the program already holds, by capture id: the graph's handle, which
/// `cuStreamEndCapture` hands back. The program's own graph (`cuStreamBeginCaptureToGraph`),
/// or the one `cuStreamGetCaptureInfo` gave it while the capture was building it.
static CAPTURED_INTO: Mutex<BTreeMap<u64, usize>> = Mutex::new(BTreeMap::new());

/// A capture in progress.
struct Capture {
    /// The streams taking part: the one that began it, and those that joined it by waiting on
    /// an event recorded in it (they leave it with its end).
    streams: Vec<usize>,
    /// The dependency list `cuStreamGetCaptureInfo` last gave out, valid until the next.
    listed: Box<[usize]>,
}

/// The captures in progress, by id.
static CAPTURES: Mutex<BTreeMap<u64, Capture>> = Mutex::new(BTreeMap::new());
/// Events whose last record was in a capture in progress, with its id.
static CAPTURED_EVENTS: Mutex<BTreeMap<usize, u64>> = Mutex::new(BTreeMap::new());

/// `event` was recorded on a stream in capture `capture` (0: on one not capturing).
pub(crate) fn note_record(event: usize, capture: u64) {
    let mut events = CAPTURED_EVENTS.lock().unwrap();
    if capture != 0 && CAPTURES.lock().unwrap().contains_key(&capture) {
        events.insert(event, capture);
    } else {
        events.remove(&event);
    }
}

/// `stream` waits on `event`: if the event was recorded in a capture in progress, the stream
/// joins it, as with the driver (its work is captured too, until the capture ends).
pub(crate) fn note_wait(stream: CUstream, event: usize) {
    let Some(&capture) = CAPTURED_EVENTS.lock().unwrap().get(&event) else {
        return;
    };
    let Some(object) = Stream::from_handle(stream) else {
        return;
    };
    let mut captures = CAPTURES.lock().unwrap();
    let Some(joined) = captures.get_mut(&capture) else {
        return;
    };
    if object
        .capture
        .compare_exchange(0, capture, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        joined.streams.push(stream as usize);
    }
}

/// Capture `capture` ended: the streams that joined it leave it.
fn forget_capture(capture: u64) {
    if let Some(ended) = CAPTURES.lock().unwrap().remove(&capture) {
        for stream in ended.streams {
            if let Some(object) = Stream::from_handle(stream as CUstream) {
                let _ = object.capture.compare_exchange(
                    capture,
                    0,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
            }
        }
    }
    CAPTURED_EVENTS
        .lock()
        .unwrap()
        .retain(|_, &mut of| of != capture);
}

pub unsafe fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_uint) -> CUresult {
    // SAFETY: no dependencies to read.
    unsafe { begin_capture(stream, mode, std::ptr::null_mut(), std::ptr::null(), 0) }
}

pub unsafe fn cuStreamBeginCaptureToGraph(
    stream: CUstream,
    graph: CUgraph,
    deps: *const CUgraphNode,
    edges: *const CUgraphEdgeData,
    count: usize,
    mode: c_uint,
) -> CUresult {
    if graph.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the program's edge list, as long as its dependency list.
    if !unsafe { super::graph_nodes::read_edges(edges, count) }.is_empty() {
        return crate::unsupported::not_supported(
            "graph edges with data (cuStreamBeginCaptureToGraph)",
        );
    }
    // SAFETY: the program's dependency list, valid as the API requires.
    unsafe { begin_capture(stream, mode, graph, deps, count) }
}

/// Begins a capture on `stream`: into a new graph, or into `into` after `deps`.
///
/// # Safety
/// `deps` holds `count` node handles (or is null with `count` 0).
unsafe fn begin_capture(
    stream: CUstream,
    mode: c_uint,
    into: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
) -> CUresult {
    status((|| {
        // The default streams cannot be captured.
        let object =
            Stream::from_handle(stream).ok_or(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)?;
        if mode > LAST_CAPTURE_MODE {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if object.capture.load(Ordering::Acquire) != 0 {
            return Err(CUresult::CUDA_ERROR_ILLEGAL_STATE);
        }
        let (ctx, id) = resolve_stream(stream)?;
        let (graph, after) = if into.is_null() {
            (0, Vec::new())
        } else {
            let graph = Graph::from_handle(into).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            // SAFETY: the caller's guarantee.
            let after = unsafe { super::graph_nodes::node_ids(deps, count, &graph.conn)? };
            (graph.remote, after)
        };
        ctx.conn
            .cuda()
            .begin_capture(ctx.remote, id, mode, graph, after)
            .outcome()?;
        let capture = crate::objects::next_capture_id();
        if !into.is_null() {
            CAPTURED_INTO.lock().unwrap().insert(capture, into as usize);
        }
        let taking_part = Capture {
            streams: vec![stream as usize],
            listed: Box::new([]),
        };
        CAPTURES.lock().unwrap().insert(capture, taking_part);
        object.capture.store(capture, Ordering::Release);
        Ok(())
    })())
}

pub unsafe fn cuStreamBeginCapture(stream: CUstream) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuStreamBeginCapture_v2(stream, 0) }
}

pub unsafe fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph) -> CUresult {
    status((|| {
        let object = Stream::from_handle(stream).ok_or(CUresult::CUDA_ERROR_ILLEGAL_STATE)?;
        let capture = object.capture.load(Ordering::Acquire);
        if capture == 0 {
            return Err(CUresult::CUDA_ERROR_ILLEGAL_STATE);
        }
        let into = CAPTURED_INTO.lock().unwrap().get(&capture).copied();
        // A capture into a graph the program holds may leave the graph unasked for.
        if graph.is_null() && into.is_none() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        CAPTURED_INTO.lock().unwrap().remove(&capture);
        let (ctx, id) = resolve_stream(stream)?;
        let existing = into.and_then(|handle| Graph::from_handle(handle as CUgraph));
        // Into an existing graph, the same graph comes back; else a new one.
        let (remote, fresh) = match &existing {
            Some(graph) => (graph.remote, None),
            None => {
                let graph = Graph::new(&ctx.conn);
                (graph.remote, Some(graph))
            }
        };
        let server = ctx.conn.cuda();
        let ended = server.end_capture(ctx.remote, id, remote).outcome();
        // The capture is over either way (the driver ends it, also on failure).
        object.capture.store(0, Ordering::Release);
        forget_capture(capture);
        let host_work = super::graph_host_work::take_captured(capture);
        ended?;
        if let Some(graph) = fresh.as_ref().or(existing.as_deref()) {
            graph.host_work.lock().unwrap().extend(host_work);
        }
        let handle = match (fresh, existing) {
            (Some(graph), _) => graph.into_handle(),
            (None, Some(graph)) => graph.handle as CUgraph,
            (None, None) => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        if graph.is_null() {
            return Ok(());
        }
        // SAFETY: an out-pointer from the caller, checked non-null, writable as the API requires.
        unsafe { write_out(graph, handle) }
    })())
}

/// `cuStreamGetCaptureInfo` of a stream in capture `capture`, when the program asks for the
/// graph being built or the dependencies of the stream's next work: the server names the
/// graph (the handle the program gets here is the one `cuStreamEndCapture` hands back) and
/// the nodes.
///
/// # Safety
/// Each out-pointer is null or writable; `dependencies` gets a list valid until the next call
/// for the capture.
pub(crate) unsafe fn capture_info(
    stream: CUstream,
    capture: u64,
    capture_status: *mut c_uint,
    graph_out: *mut CUgraph,
    dependencies: *mut *const CUgraphNode,
    count: *mut usize,
) -> Result<(), CUresult> {
    let (ctx, id) = resolve_stream(stream)?;
    let known = CAPTURED_INTO.lock().unwrap().get(&capture).copied();
    let graph = match known.and_then(|handle| Graph::from_handle(handle as CUgraph)) {
        Some(graph) => graph,
        None => {
            let handle = Graph::new(&ctx.conn).into_handle();
            CAPTURED_INTO
                .lock()
                .unwrap()
                .insert(capture, handle as usize);
            Graph::from_handle(handle).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?
        }
    };
    let state = ctx
        .conn
        .cuda()
        .capture_info(ctx.remote, id, graph.remote)
        .outcome()?;
    let active = state.status == 1;
    let handles: Box<[usize]> = state
        .dependencies
        .iter()
        .map(|&(node, kind)| super::graph_nodes::node_handle(&graph, node, kind))
        .collect();
    let listed = handles.len();
    let list = {
        let mut captures = CAPTURES.lock().unwrap();
        match captures.get_mut(&capture) {
            Some(entry) => {
                entry.listed = handles;
                entry.listed.as_ptr() as *const CUgraphNode
            }
            None => std::ptr::null(),
        }
    };
    // SAFETY: the caller's out-pointers, each null (skipped) or writable.
    unsafe {
        super::stream::for_optional(capture_status, state.status);
        super::stream::for_optional(
            graph_out,
            if active {
                graph.handle as CUgraph
            } else {
                std::ptr::null_mut()
            },
        );
        super::stream::for_optional(
            dependencies,
            if listed > 0 { list } else { std::ptr::null() },
        );
        super::stream::for_optional(count, listed);
    }
    Ok(())
}

pub unsafe fn cuStreamUpdateCaptureDependencies_v2(
    hStream: CUstream,
    dependencies: *mut CUgraphNode,
    dependencyData: *const CUgraphEdgeData,
    numDependencies: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the program's edge list, as long as its dependency list.
    if !unsafe { super::graph_nodes::read_edges(dependencyData, numDependencies) }.is_empty() {
        return crate::unsupported::not_supported(
            "graph edges with data (cuStreamUpdateCaptureDependencies)",
        );
    }
    status((|| {
        if crate::objects::capture_of(hStream) == 0 {
            return Err(CUresult::CUDA_ERROR_ILLEGAL_STATE);
        }
        let (ctx, id) = resolve_stream(hStream)?;
        // SAFETY: the program's dependency list, valid as the API requires.
        let nodes =
            unsafe { super::graph_nodes::node_ids(dependencies, numDependencies, &ctx.conn)? };
        ctx.conn
            .cuda()
            .update_capture_dependencies(ctx.remote, id, nodes, flags)
            .outcome()
    })())
}

/// The CUDA 11.3 form, without edge data.
pub unsafe fn cuStreamUpdateCaptureDependencies(
    hStream: CUstream,
    dependencies: *mut CUgraphNode,
    numDependencies: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe {
        cuStreamUpdateCaptureDependencies_v2(
            hStream,
            dependencies,
            std::ptr::null(),
            numDependencies,
            flags,
        )
    }
}

pub unsafe fn cuThreadExchangeStreamCaptureMode(mode: *mut c_uint) -> CUresult {
    if mode.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null, and the API contract makes it a valid in/out mode.
    let wanted = unsafe { mode.read() };
    if wanted > LAST_CAPTURE_MODE {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    let previous = CAPTURE_MODE.with(|current| current.replace(wanted));
    // SAFETY: as above.
    unsafe { mode.write(previous) };
    CUresult::CUDA_SUCCESS
}

/// The context whose server holds `graph`: the current one, which must be on that server.
fn graph_context(graph: &Graph) -> Result<Arc<Context>, CUresult> {
    let ctx = crate::objects::current_context()?;
    if !std::sync::Arc::ptr_eq(&ctx.conn, &graph.conn) {
        return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    Ok(ctx)
}

fn instantiate(graph: CUgraph, flags: u64) -> Result<CUgraphExec, CUresult> {
    let graph = Graph::from_handle(graph).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let ctx = graph_context(&graph)?;
    let exec = GraphExec::new(&ctx.conn, flags);
    let server = ctx.conn.cuda();
    server
        .graph_instantiate(ctx.remote, graph.remote, exec.remote, flags)
        .outcome()?;
    *exec.host_work.lock().unwrap() = graph.host_work.lock().unwrap().clone();
    Ok(exec.into_handle())
}

pub unsafe fn cuGraphInstantiateWithFlags(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: u64,
) -> CUresult {
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
    status(instantiate(graph, flags).and_then(|handle| unsafe { write_out(exec, handle) }))
}

pub unsafe fn cuGraphExecGetFlags(exec: CUgraphExec, flags: *mut u64) -> CUresult {
    let Some(object) = GraphExec::from_handle(exec) else {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    };
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable.
    status(unsafe { write_out(flags, object.flags) })
}

/// The CUDA 10 and 11 entry points: no flags, and an error node and log the driver fills only
/// on failure (rgpu's failures come back as a status: no node, an empty log).
pub unsafe fn cuGraphInstantiate_v2(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    if !error_node.is_null() {
        // SAFETY: the caller's out-pointer, non-null.
        unsafe { error_node.write(std::ptr::null_mut()) };
    }
    if !log.is_null() && log_size > 0 {
        // SAFETY: the caller's buffer of `log_size` bytes.
        unsafe { log.write(0) };
    }
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuGraphInstantiateWithFlags(exec, graph, 0) }
}

pub unsafe fn cuGraphInstantiate(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    // SAFETY: as above.
    unsafe { cuGraphInstantiate_v2(exec, graph, error_node, log, log_size) }
}

pub unsafe fn cuGraphInstantiateWithParams(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    if params.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null, and the API contract makes it valid parameters.
    let (flags, upload_stream) = unsafe { ((*params).flags, (*params).hUploadStream) };
    let result = instantiate(graph, flags).and_then(|handle| {
        // CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD: upload on the given stream right away.
        if flags & 2 != 0 {
            launch(handle, upload_stream, true)?;
        }
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(exec, handle) }
    });
    // CUgraphInstantiateResult: 0 success, 1 error; written as an integer.
    let outcome: u32 = if result.is_ok() { 0 } else { 1 };
    // SAFETY: as above; the enum field is a 32-bit integer.
    unsafe {
        std::ptr::addr_of_mut!((*params).result_out)
            .cast::<u32>()
            .write(outcome)
    };
    status(result.map(|_| ()))
}

fn launch(exec: CUgraphExec, stream_handle: CUstream, upload: bool) -> Result<(), CUresult> {
    let exec = GraphExec::from_handle(exec).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let (ctx, stream) = resolve_stream(stream_handle)?;
    if !std::sync::Arc::ptr_eq(&ctx.conn, &exec.conn) {
        return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    if upload {
        return ctx
            .conn
            .cuda()
            .graph_launch(ctx.remote, exec.remote, stream, true)
            .outcome();
    }
    super::event::graph_launched();
    super::managed::before_device_work(Some(stream_handle));
    let host_work = exec.host_work.lock().unwrap().clone();
    super::graph_host_work::before_launch(&ctx, stream, &host_work)?;
    ctx.conn
        .cuda()
        .graph_launch(ctx.remote, exec.remote, stream, false)
        .outcome()?;
    super::graph_host_work::after_launch(&ctx, stream, &host_work)
}

pub unsafe fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    status(launch(exec, stream, false))
}

pub unsafe fn cuGraphUpload(exec: CUgraphExec, stream: CUstream) -> CUresult {
    status(launch(exec, stream, true))
}

pub unsafe fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    status((|| {
        let object = Graph::from_handle(graph).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        object.conn.cuda().graph_destroy(object.remote).outcome()?;
        Graph::destroy(graph);
        Ok(())
    })())
}

pub unsafe fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    status((|| {
        let object = GraphExec::from_handle(exec).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        object
            .conn
            .cuda()
            .graph_exec_destroy(object.remote)
            .outcome()?;
        GraphExec::destroy(exec);
        Ok(())
    })())
}
