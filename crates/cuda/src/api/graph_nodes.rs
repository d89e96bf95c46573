//! Graphs built node by node (XLA's command buffers, CUTLASS, hand-built graphs): each node is
//! made on the server under an id the client picks, so building a graph posts requests and
//! never waits for the network; failures show at the next synchronizing call. The client keeps
//! what the program may ask back (a node's type, a conditional node's body graphs).
//!
//! Nodes run on the server's device: kernel, copy, memset, empty, event, child-graph,
//! conditional, and memory (allocation and free) nodes. The host's part — copies with a host
//! side (through a staging buffer on the server) and host nodes (an empty node there) — is
//! done by the graph's launches here (graph_host_work.rs).

use std::cell::RefCell;
use std::ffi::{c_uint, c_void};
use std::sync::Arc;

use rgpu_client::CudaClient;
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{Edge, Id, NodeParams, NodeQuery};

use super::{status, write_out, Outcome};
use crate::objects::{current_context, Context, Event, Graph, GraphExec, GraphNode};
use crate::unsupported::not_supported;

thread_local! {
    /// A kernel node's parameter buffer, reused.
    static PARAMS: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

const NODE_KERNEL: u32 = 0;
const NODE_MEMCPY: u32 = 1;
const NODE_MEMSET: u32 = 2;
const NODE_HOST: u32 = 3;
const NODE_GRAPH: u32 = 4;
const NODE_EMPTY: u32 = 5;
const NODE_WAIT_EVENT: u32 = 6;
const NODE_EVENT_RECORD: u32 = 7;
const NODE_MEM_ALLOC: u32 = 10;
const NODE_MEM_FREE: u32 = 11;
const NODE_CONDITIONAL: u32 = 13;

/// A graph and the current context, which must be on the graph's server.
fn graph_and_context(graph: CUgraph) -> Result<(Arc<Graph>, Arc<Context>), CUresult> {
    let graph = Graph::from_handle(graph).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let ctx = current_context()?;
    if !Arc::ptr_eq(&ctx.conn, &graph.conn) {
        return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    Ok((graph, ctx))
}

/// A node of `graph`'s server.
fn node_of(
    node: CUgraphNode,
    conn: &Arc<rgpu_client::Connection>,
) -> Result<Arc<GraphNode>, CUresult> {
    let node = GraphNode::from_handle(node).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if !Arc::ptr_eq(&node.conn, conn) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(node)
}

/// The ids of `count` nodes at `nodes`.
///
/// # Safety
/// `nodes` is null (with `count` 0) or points to `count` node handles.
pub(crate) unsafe fn node_ids(
    nodes: *const CUgraphNode,
    count: usize,
    conn: &Arc<rgpu_client::Connection>,
) -> Result<Vec<Id>, CUresult> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if nodes.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's guarantee.
    let nodes = unsafe { std::slice::from_raw_parts(nodes, count) };
    nodes
        .iter()
        .map(|&node| node_of(node, conn).map(|n| n.remote))
        .collect()
}

/// The data of `count` edges at `edges`: empty when there is none (a null list, or every
/// edge with default ports and the default type; the reserved bytes are not looked at).
///
/// # Safety
/// `edges` is null or holds `count` edge records.
pub(crate) unsafe fn read_edges(edges: *const CUgraphEdgeData, count: usize) -> Vec<Edge> {
    if edges.is_null() || count == 0 {
        return Vec::new();
    }
    // SAFETY: the caller's guarantee.
    let records = unsafe { std::slice::from_raw_parts(edges, count) };
    let read: Vec<Edge> = records
        .iter()
        .map(|e| Edge {
            from_port: e.from_port,
            to_port: e.to_port,
            kind: e.type_,
        })
        .collect();
    if read.iter().all(|e| *e == Edge::default()) {
        Vec::new()
    } else {
        read
    }
}

/// The event's id (events live on the server of their context).
fn event_id(event: CUevent) -> Result<Id, CUresult> {
    Event::from_handle(event)
        .map(|e| e.remote)
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

/// The wire form of a kernel node: the function's id on `ctx`'s server and its parameters
/// packed into `buffer`.
///
/// # Safety
/// The pointers are the program's, valid as the API requires.
#[allow(clippy::too_many_arguments)]
unsafe fn kernel_params(
    ctx: &Context,
    func: *mut c_void,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    buffer: &mut Vec<u8>,
) -> Result<NodeParams, CUresult> {
    let function =
        crate::objects::Function::from_handle(func).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let remote = super::module::function_on(&function, ctx)?;
    // SAFETY: the caller's guarantee.
    unsafe { super::launch::pack_params(&function, params, extra, buffer)? };
    Ok(NodeParams::Kernel {
        function: remote,
        grid,
        block,
        shared_mem,
    })
}

/// The wire form of `CUDA_KERNEL_NODE_PARAMS` (v2: `kern` when `func` is null).
///
/// # Safety
/// `p` is null or a valid descriptor.
unsafe fn kernel_node(
    ctx: &Context,
    p: *const CUDA_KERNEL_NODE_PARAMS,
    buffer: &mut Vec<u8>,
) -> Result<NodeParams, CUresult> {
    // SAFETY: the caller's guarantee.
    let p = unsafe { p.as_ref() }.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let func = if p.func.is_null() {
        p.kern.cast()
    } else {
        p.func.cast()
    };
    // SAFETY: the descriptor's pointers, valid as the API requires.
    unsafe {
        kernel_params(
            ctx,
            func,
            [p.gridDimX, p.gridDimY, p.gridDimZ],
            [p.blockDimX, p.blockDimY, p.blockDimZ],
            p.sharedMemBytes,
            p.kernelParams,
            p.extra,
            buffer,
        )
    }
}

/// The wire form of `CUDA_MEMSET_NODE_PARAMS`.
///
/// # Safety
/// `p` is null or a valid descriptor.
unsafe fn memset_node(p: *const CUDA_MEMSET_NODE_PARAMS) -> Result<NodeParams, CUresult> {
    // SAFETY: the caller's guarantee.
    let p = unsafe { p.as_ref() }.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if ![1, 2, 4].contains(&p.elementSize) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(rgpu_cuda_api::wire::memset_node(p))
}

/// Runs `make` with the thread's parameter buffer, then posts the node.
fn post_node(
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    edges: Vec<Edge>,
    kind: u32,
    bodies: usize,
    make: impl FnOnce(&Context, &mut Vec<u8>) -> Result<NodeParams, CUresult>,
) -> Result<Arc<GraphNode>, CUresult> {
    let (graph, ctx) = graph_and_context(graph)?;
    // SAFETY: the program's dependency list, valid as the API requires.
    let after = unsafe { node_ids(deps, count, &graph.conn)? };
    PARAMS.with(|buffer| {
        let mut buffer = buffer.borrow_mut();
        buffer.clear();
        let mut params = make(&ctx, &mut buffer)?;
        // A conditional node's bodies: graphs the driver makes, known here by new ids.
        let body_graphs: Vec<Graph> = (0..bodies)
            .map(|_| Graph {
                conditional_body: true,
                ..Graph::new(&ctx.conn)
            })
            .collect();
        if let NodeParams::Conditional { bodies, .. } = &mut params {
            *bodies = body_graphs.iter().map(|g| g.remote).collect();
        }
        let node = GraphNode {
            handle: crate::handles::new_handle(),
            conn: ctx.conn.clone(),
            remote: ctx.conn.new_id(),
            graph: graph.handle,
            kind,
            bodies: body_graphs
                .into_iter()
                .map(|g| g.into_handle() as usize)
                .collect(),
        };
        ctx.conn
            .cuda()
            .graph_add_node(
                ctx.remote,
                graph.remote,
                node.remote,
                after,
                edges,
                params,
                &buffer,
            )
            .outcome()?;
        let node = node.register();
        graph.nodes.lock().unwrap().insert(node.remote, node.handle);
        Ok(node)
    })
}

/// Writes a new node's handle out.
fn made(node: *mut CUgraphNode, made: Result<Arc<GraphNode>, CUresult>) -> CUresult {
    status(made.and_then(|object| {
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(node, object.handle as CUgraphNode) }
    }))
}

pub unsafe fn cuGraphCreate(graph: *mut CUgraph, flags: c_uint) -> CUresult {
    status(current_context().and_then(|ctx| {
        if graph.is_null() || flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let object = Graph::new(&ctx.conn);
        ctx.conn
            .cuda()
            .graph_create(ctx.remote, object.remote, flags)
            .outcome()?;
        // SAFETY: checked non-null above; writable as the API requires.
        unsafe { write_out(graph, object.into_handle()) }
    }))
}

pub unsafe fn cuGraphAddKernelNode_v2(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *const CUDA_KERNEL_NODE_PARAMS,
) -> CUresult {
    made(
        node,
        post_node(
            graph,
            deps,
            count,
            Vec::new(),
            NODE_KERNEL,
            0,
            |ctx, buffer| {
                // SAFETY: the program's descriptor, valid as the API requires.
                unsafe { kernel_node(ctx, params, buffer) }
            },
        ),
    )
}

pub unsafe fn cuGraphAddMemsetNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *const CUDA_MEMSET_NODE_PARAMS,
    _ctx: CUcontext,
) -> CUresult {
    made(
        node,
        post_node(graph, deps, count, Vec::new(), NODE_MEMSET, 0, |_, _| {
            // SAFETY: the program's descriptor, valid as the API requires.
            unsafe { memset_node(params) }
        }),
    )
}

pub unsafe fn cuGraphAddMemcpyNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *const CUDA_MEMCPY3D,
    _ctx: CUcontext,
) -> CUresult {
    // SAFETY: the program's descriptor, valid as the API requires.
    made(node, unsafe {
        memcpy_node(graph, deps, count, Vec::new(), params)
    })
}

/// A copy node; one with a host side copies through a staging buffer, and the graph keeps the
/// host copy for its launches (graph_host_work.rs).
///
/// # Safety
/// `params` is null or a valid descriptor; `deps` holds `count` node handles.
unsafe fn memcpy_node(
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    edges: Vec<Edge>,
    params: *const CUDA_MEMCPY3D,
) -> Result<Arc<GraphNode>, CUresult> {
    let mut host_copy = None;
    let node = post_node(graph, deps, count, edges, NODE_MEMCPY, 0, |_, _| {
        // SAFETY: the caller's guarantee.
        let (params, copy) = unsafe { super::copy::graph_copy_staged(params)? };
        host_copy = copy;
        Ok(params)
    })?;
    // SAFETY: valid (graph_copy_staged read it above).
    super::graph_params::remember_copy_node(node.handle, unsafe { &*params });
    if let Some(copy) = host_copy {
        let graph = Graph::from_handle(graph).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if graph.conditional_body {
            return Err(crate::unsupported::not_supported(
                "copies with a host side inside conditional nodes",
            ));
        }
        graph
            .host_work
            .lock()
            .unwrap()
            .push(super::graph_host_work::Work::Copy(copy));
    }
    Ok(node)
}

pub unsafe fn cuGraphAddEmptyNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
) -> CUresult {
    made(
        node,
        post_node(graph, deps, count, Vec::new(), NODE_EMPTY, 0, |_, _| {
            Ok(NodeParams::Empty)
        }),
    )
}

pub unsafe fn cuGraphAddChildGraphNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    child: CUgraph,
) -> CUresult {
    made(node, child_node(graph, deps, count, Vec::new(), child))
}

/// A host node: an empty node on the server (so that dependencies on it hold), and a host
/// function the graph's launches call (graph_host_work.rs).
fn host_node(
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    edges: Vec<Edge>,
    function: CUhostFn,
    data: *mut c_void,
) -> Result<Arc<GraphNode>, CUresult> {
    let function = function.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let object = Graph::from_handle(graph).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if object.conditional_body {
        return Err(crate::unsupported::not_supported(
            "host nodes inside conditional nodes",
        ));
    }
    let node = post_node(graph, deps, count, edges, NODE_HOST, 0, |_, _| {
        Ok(NodeParams::Empty)
    })?;
    super::graph_params::remember_host_node(node.handle, Some(function), data as usize);
    let call = super::graph_host_work::HostCall {
        function,
        data: data as usize,
    };
    object
        .host_work
        .lock()
        .unwrap()
        .push(super::graph_host_work::Work::Call(Arc::new(call)));
    Ok(node)
}

pub unsafe fn cuGraphAddHostNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *const CUDA_HOST_NODE_PARAMS,
) -> CUresult {
    // SAFETY: the program's descriptor, valid as the API requires.
    let Some(p) = (unsafe { params.as_ref() }) else {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    };
    made(
        node,
        host_node(graph, deps, count, Vec::new(), p.fn_, p.userData),
    )
}

/// A child-graph node: the parent runs a copy of the child, host copies included.
fn child_node(
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    edges: Vec<Edge>,
    child: CUgraph,
) -> Result<Arc<GraphNode>, CUresult> {
    let child = Graph::from_handle(child).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let copies = child.host_work.lock().unwrap().clone();
    let node = post_node(graph, deps, count, edges, NODE_GRAPH, 0, |_, _| {
        Ok(NodeParams::Child {
            graph: child.remote,
        })
    })?;
    if !copies.is_empty() {
        let parent = Graph::from_handle(graph).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if parent.conditional_body {
            return Err(crate::unsupported::not_supported(
                "copies with a host side inside conditional nodes",
            ));
        }
        parent.host_work.lock().unwrap().extend(copies);
    }
    Ok(node)
}

/// An event record or wait node.
fn add_event_node(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    event: CUevent,
    kind: u32,
) -> CUresult {
    let made_node = post_node(graph, deps, count, Vec::new(), kind, 0, |_, _| {
        let event = event_id(event)?;
        Ok(if kind == NODE_EVENT_RECORD {
            NodeParams::EventRecord { event }
        } else {
            NodeParams::EventWait { event }
        })
    });
    made(node, made_node)
}

pub unsafe fn cuGraphAddEventRecordNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    event: CUevent,
) -> CUresult {
    add_event_node(node, graph, deps, count, event, NODE_EVENT_RECORD)
}

pub unsafe fn cuGraphAddEventWaitNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    event: CUevent,
) -> CUresult {
    add_event_node(node, graph, deps, count, event, NODE_WAIT_EVENT)
}

/// A graph allocation node: posted like any node, then its address (fixed by the driver when
/// the node is made) is asked for and written into the program's parameters.
///
/// # Safety
/// `params` is the program's `CUDA_MEM_ALLOC_NODE_PARAMS`, valid as the API requires.
unsafe fn mem_alloc_node(
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    edges: Vec<Edge>,
    params: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> Result<Arc<GraphNode>, CUresult> {
    // SAFETY: the caller's guarantee.
    let Some(p) = (unsafe { params.as_mut() }) else {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    };
    // SAFETY: the program's pool description and access list, as the API requires.
    let (props, access) = unsafe {
        let (props, _) = super::pools::read_pool_props(&p.poolProps)?;
        let access = if p.accessDescs.is_null() {
            Vec::new()
        } else {
            super::vmm::read_access(p.accessDescs, p.accessDescCount)?
        };
        (props, access)
    };
    let size = p.bytesize as u64;
    let node = post_node(graph, deps, count, edges, NODE_MEM_ALLOC, 0, |_, _| {
        Ok(NodeParams::MemAlloc {
            props,
            access,
            size,
        })
    })?;
    let (_, ctx) = graph_and_context(graph)?;
    let dptr = ctx
        .conn
        .cuda()
        .graph_mem_alloc_node_address(node.remote)
        .outcome()?;
    super::memory::record_device_range(dptr, size, &ctx);
    p.dptr = dptr;
    Ok(node)
}

pub unsafe fn cuGraphAddMemAllocNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    // SAFETY: the program's arguments, as the API requires.
    made(node, unsafe {
        mem_alloc_node(graph, deps, count, Vec::new(), params)
    })
}

pub unsafe fn cuGraphAddMemFreeNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    dptr: CUdeviceptr,
) -> CUresult {
    made(
        node,
        post_node(graph, deps, count, Vec::new(), NODE_MEM_FREE, 0, |_, _| {
            Ok(NodeParams::MemFree { dptr })
        }),
    )
}

pub unsafe fn cuGraphAddNode_v2(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    edges: *const CUgraphEdgeData,
    count: usize,
    params: *mut CUgraphNodeParams,
) -> CUresult {
    // SAFETY: the program's edge list, as long as its dependency list.
    let edge_data = unsafe { read_edges(edges, count) };
    // SAFETY: the program's descriptor, valid as the API requires.
    let Some(p) = (unsafe { params.as_mut() }) else {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    };
    // SAFETY: reading the type tag as an integer (it may hold values the enum lacks).
    let kind = unsafe { std::ptr::addr_of!(p.type_).cast::<u32>().read() };
    // SAFETY: each arm reads the union member the type tag names.
    let made_node = unsafe {
        match kind {
            NODE_KERNEL => {
                let k = p.__bindgen_anon_1.kernel;
                post_node(
                    graph,
                    deps,
                    count,
                    edge_data.clone(),
                    kind,
                    0,
                    |ctx, buffer| {
                        let func = if k.func.is_null() {
                            k.kern.cast()
                        } else {
                            k.func.cast()
                        };
                        kernel_params(
                            ctx,
                            func,
                            [k.gridDimX, k.gridDimY, k.gridDimZ],
                            [k.blockDimX, k.blockDimY, k.blockDimZ],
                            k.sharedMemBytes,
                            k.kernelParams,
                            k.extra,
                            buffer,
                        )
                    },
                )
            }
            NODE_MEMSET => {
                let m = p.__bindgen_anon_1.memset;
                let v1 = CUDA_MEMSET_NODE_PARAMS {
                    dst: m.dst,
                    pitch: m.pitch,
                    value: m.value,
                    elementSize: m.elementSize,
                    width: m.width,
                    height: m.height,
                };
                post_node(graph, deps, count, edge_data.clone(), kind, 0, |_, _| {
                    memset_node(&v1)
                })
            }
            NODE_MEMCPY => {
                let copy = std::ptr::addr_of!(p.__bindgen_anon_1.memcpy.copyParams);
                memcpy_node(graph, deps, count, edge_data.clone(), copy)
            }
            NODE_EMPTY => post_node(graph, deps, count, edge_data.clone(), kind, 0, |_, _| {
                Ok(NodeParams::Empty)
            }),
            NODE_GRAPH => {
                let child = p.__bindgen_anon_1.graph.graph;
                child_node(graph, deps, count, edge_data.clone(), child)
            }
            NODE_EVENT_RECORD => {
                let event = p.__bindgen_anon_1.eventRecord.event;
                post_node(graph, deps, count, edge_data.clone(), kind, 0, |_, _| {
                    Ok(NodeParams::EventRecord {
                        event: event_id(event)?,
                    })
                })
            }
            NODE_WAIT_EVENT => {
                let event = p.__bindgen_anon_1.eventWait.event;
                post_node(graph, deps, count, edge_data.clone(), kind, 0, |_, _| {
                    Ok(NodeParams::EventWait {
                        event: event_id(event)?,
                    })
                })
            }
            NODE_CONDITIONAL => {
                let c = p.__bindgen_anon_1.conditional;
                let cond_kind = std::ptr::addr_of!(c.type_).cast::<u32>().read();
                let made_node = post_node(
                    graph,
                    deps,
                    count,
                    edge_data.clone(),
                    kind,
                    c.size as usize,
                    |_, _| {
                        if c.size == 0 || c.size > 64 {
                            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                        }
                        Ok(NodeParams::Conditional {
                            handle: c.handle,
                            kind: cond_kind,
                            bodies: Vec::new(),
                        })
                    },
                );
                if let Ok(object) = &made_node {
                    // The body graphs, in an array that lives as long as the node.
                    p.__bindgen_anon_1.conditional.phGraph_out =
                        object.bodies.as_ptr() as *mut CUgraph;
                }
                made_node
            }
            NODE_MEM_ALLOC => {
                // The v2 parameters have the v1 layout (the v2 type only renames it).
                let alloc = std::ptr::addr_of_mut!(p.__bindgen_anon_1.alloc).cast();
                mem_alloc_node(graph, deps, count, edge_data.clone(), alloc)
            }
            NODE_HOST => {
                let host = p.__bindgen_anon_1.host;
                host_node(
                    graph,
                    deps,
                    count,
                    edge_data.clone(),
                    host.fn_,
                    host.userData,
                )
            }
            NODE_MEM_FREE => {
                let dptr = p.__bindgen_anon_1.free.dptr;
                post_node(graph, deps, count, edge_data.clone(), kind, 0, |_, _| {
                    Ok(NodeParams::MemFree { dptr })
                })
            }
            _ => {
                return not_supported(
                    "this kind of graph node (semaphore or batch memory-op nodes)",
                )
            }
        }
    };
    made(node, made_node)
}

pub unsafe fn cuGraphConditionalHandleCreate(
    handle: *mut CUgraphConditionalHandle,
    graph: CUgraph,
    _ctx: CUcontext,
    default_value: c_uint,
    flags: c_uint,
) -> CUresult {
    status(graph_and_context(graph).and_then(|(graph, ctx)| {
        if handle.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let value = ctx
            .conn
            .cuda()
            .graph_conditional_handle(ctx.remote, graph.remote, default_value, flags)
            .outcome()?;
        // SAFETY: checked non-null above; writable as the API requires.
        unsafe { write_out(handle, value) }
    }))
}

/// New parameters for `node`, in its graph (`exec` null) or in an executable graph.
fn set_params(
    exec: CUgraphExec,
    node: CUgraphNode,
    kind: u32,
    make: impl FnOnce(&Context, &mut Vec<u8>) -> Result<NodeParams, CUresult>,
) -> CUresult {
    status((|| {
        let ctx = current_context()?;
        let node = node_of(node, &ctx.conn)?;
        if node.kind != kind {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let exec = match GraphExec::from_handle(exec) {
            Some(exec) => exec.remote,
            None if exec.is_null() => 0,
            None => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        PARAMS.with(|buffer| {
            let mut buffer = buffer.borrow_mut();
            buffer.clear();
            let params = make(&ctx, &mut buffer)?;
            ctx.conn
                .cuda()
                .graph_node_set_params(ctx.remote, exec, node.remote, params, &buffer)
                .outcome()
        })
    })())
}

pub unsafe fn cuGraphKernelNodeSetParams_v2(
    node: CUgraphNode,
    params: *const CUDA_KERNEL_NODE_PARAMS,
) -> CUresult {
    set_params(std::ptr::null_mut(), node, NODE_KERNEL, |ctx, buffer| {
        // SAFETY: the program's descriptor, valid as the API requires.
        unsafe { kernel_node(ctx, params, buffer) }
    })
}

pub unsafe fn cuGraphExecKernelNodeSetParams_v2(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const CUDA_KERNEL_NODE_PARAMS,
) -> CUresult {
    set_params(exec, node, NODE_KERNEL, |ctx, buffer| {
        // SAFETY: the program's descriptor, valid as the API requires.
        unsafe { kernel_node(ctx, params, buffer) }
    })
}

pub unsafe fn cuGraphMemsetNodeSetParams(
    node: CUgraphNode,
    params: *const CUDA_MEMSET_NODE_PARAMS,
) -> CUresult {
    // SAFETY: the program's descriptor, valid as the API requires.
    set_params(std::ptr::null_mut(), node, NODE_MEMSET, |_, _| unsafe {
        memset_node(params)
    })
}

pub unsafe fn cuGraphExecMemsetNodeSetParams(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const CUDA_MEMSET_NODE_PARAMS,
    _ctx: CUcontext,
) -> CUresult {
    // SAFETY: the program's descriptor, valid as the API requires.
    set_params(exec, node, NODE_MEMSET, |_, _| unsafe {
        memset_node(params)
    })
}

pub unsafe fn cuGraphMemcpyNodeSetParams(
    node: CUgraphNode,
    params: *const CUDA_MEMCPY3D,
) -> CUresult {
    // SAFETY: the program's descriptor, valid as the API requires.
    let set = set_params(std::ptr::null_mut(), node, NODE_MEMCPY, |_, _| unsafe {
        super::copy::graph_copy(params)
    });
    if set == CUresult::CUDA_SUCCESS {
        // SAFETY: as above (graph_copy read it).
        super::graph_params::remember_copy_node(node as usize, unsafe { &*params });
    }
    set
}

pub unsafe fn cuGraphExecMemcpyNodeSetParams(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const CUDA_MEMCPY3D,
    _ctx: CUcontext,
) -> CUresult {
    // SAFETY: the program's descriptor, valid as the API requires.
    set_params(exec, node, NODE_MEMCPY, |_, _| unsafe {
        super::copy::graph_copy(params)
    })
}

pub unsafe fn cuGraphExecChildGraphNodeSetParams(
    exec: CUgraphExec,
    node: CUgraphNode,
    child: CUgraph,
) -> CUresult {
    set_params(exec, node, NODE_GRAPH, |_, _| {
        let child = Graph::from_handle(child).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        Ok(NodeParams::Child {
            graph: child.remote,
        })
    })
}

pub unsafe fn cuGraphEventRecordNodeSetEvent(node: CUgraphNode, event: CUevent) -> CUresult {
    set_params(std::ptr::null_mut(), node, NODE_EVENT_RECORD, |_, _| {
        Ok(NodeParams::EventRecord {
            event: event_id(event)?,
        })
    })
}

pub unsafe fn cuGraphExecEventRecordNodeSetEvent(
    exec: CUgraphExec,
    node: CUgraphNode,
    event: CUevent,
) -> CUresult {
    set_params(exec, node, NODE_EVENT_RECORD, |_, _| {
        Ok(NodeParams::EventRecord {
            event: event_id(event)?,
        })
    })
}

pub unsafe fn cuGraphEventWaitNodeSetEvent(node: CUgraphNode, event: CUevent) -> CUresult {
    set_params(std::ptr::null_mut(), node, NODE_WAIT_EVENT, |_, _| {
        Ok(NodeParams::EventWait {
            event: event_id(event)?,
        })
    })
}

pub unsafe fn cuGraphExecEventWaitNodeSetEvent(
    exec: CUgraphExec,
    node: CUgraphNode,
    event: CUevent,
) -> CUresult {
    set_params(exec, node, NODE_WAIT_EVENT, |_, _| {
        Ok(NodeParams::EventWait {
            event: event_id(event)?,
        })
    })
}

pub unsafe fn cuGraphNodeSetEnabled(
    exec: CUgraphExec,
    node: CUgraphNode,
    enabled: c_uint,
) -> CUresult {
    status((|| {
        let exec = GraphExec::from_handle(exec).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let node = node_of(node, &exec.conn)?;
        exec.conn
            .cuda()
            .graph_node_set_enabled(exec.remote, node.remote, enabled != 0)
            .outcome()
    })())
}

/// `cuGraphAddDependencies` / `cuGraphRemoveDependencies`.
///
/// # Safety
/// The node lists hold `count` handles each (or are null with `count` 0).
unsafe fn dependencies(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    edges: *const CUgraphEdgeData,
    count: usize,
    remove: bool,
) -> CUresult {
    // SAFETY: the caller's guarantee covers the edge list too.
    let edge_data = unsafe { read_edges(edges, count) };
    status((|| {
        let graph = Graph::from_handle(graph).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's guarantee.
        let (from, to) = unsafe {
            (
                node_ids(from, count, &graph.conn)?,
                node_ids(to, count, &graph.conn)?,
            )
        };
        graph
            .conn
            .cuda()
            .graph_dependencies(graph.remote, from, to, edge_data, remove)
            .outcome()
    })())
}

pub unsafe fn cuGraphAddDependencies_v2(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    edges: *const CUgraphEdgeData,
    count: usize,
) -> CUresult {
    // SAFETY: the program's lists, valid as the API requires.
    unsafe { dependencies(graph, from, to, edges, count, false) }
}

pub unsafe fn cuGraphRemoveDependencies_v2(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    edges: *const CUgraphEdgeData,
    count: usize,
) -> CUresult {
    // SAFETY: the program's lists, valid as the API requires.
    unsafe { dependencies(graph, from, to, edges, count, true) }
}

/// The program's handle of node `id` of `graph` (of type `kind`), made the first time the
/// program sees the node.
pub(crate) fn node_handle(graph: &Graph, id: Id, kind: u32) -> usize {
    *graph.nodes.lock().unwrap().entry(id).or_insert_with(|| {
        GraphNode {
            handle: crate::handles::new_handle(),
            conn: graph.conn.clone(),
            remote: id,
            graph: graph.handle,
            kind,
            bodies: Box::new([]),
        }
        .register()
        .handle
    })
}

/// Lists nodes of `graph` as the `cuGraphGet*Nodes` calls do: with `out` null, how many in
/// `count`; else up to `count` handles (the rest of `out` nulled) and how many were written.
///
/// # Safety
/// `out` is null or has room for `*count` handles; `count` is null or valid.
unsafe fn list_nodes(
    graph: &Graph,
    query: NodeQuery,
    out: *mut CUgraphNode,
    count: *mut usize,
) -> Result<(), CUresult> {
    if count.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let listed = graph
        .conn
        .cuda()
        .graph_nodes(graph.remote, query)
        .outcome()?;
    if out.is_null() {
        // SAFETY: checked non-null; the caller's guarantee.
        unsafe { count.write(listed.len()) };
        return Ok(());
    }
    // SAFETY: the caller's guarantee.
    let room = unsafe { count.read() };
    for i in 0..room {
        let handle = match listed.get(i) {
            Some(&(id, kind)) => node_handle(graph, id, kind),
            None => 0,
        };
        // SAFETY: the caller's guarantee: room for `room` handles.
        unsafe { out.add(i).write(handle as CUgraphNode) };
    }
    // SAFETY: as above.
    unsafe { count.write(room.min(listed.len())) };
    Ok(())
}

pub unsafe fn cuGraphGetNodes(
    graph: CUgraph,
    nodes: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    status(
        Graph::from_handle(graph)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
            .and_then(
                // SAFETY: the program's list and count, as the API requires.
                |graph| unsafe { list_nodes(&graph, NodeQuery::All, nodes, count) },
            ),
    )
}

pub unsafe fn cuGraphGetRootNodes(
    graph: CUgraph,
    nodes: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    status(
        Graph::from_handle(graph)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
            .and_then(
                // SAFETY: as above.
                |graph| unsafe { list_nodes(&graph, NodeQuery::Roots, nodes, count) },
            ),
    )
}

/// The nodes before or after `node`, with plain edges (edge data is not reported).
///
/// # Safety
/// As `list_nodes`; `edges` is null or has room for `*count` records.
unsafe fn neighbours(
    node: CUgraphNode,
    before: bool,
    out: *mut CUgraphNode,
    edges: *mut CUgraphEdgeData,
    count: *mut usize,
) -> CUresult {
    status((|| {
        let node = GraphNode::from_handle(node).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let graph =
            Graph::from_handle(node.graph as CUgraph).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let query = if before {
            NodeQuery::DependenciesOf(node.remote)
        } else {
            NodeQuery::DependentsOf(node.remote)
        };
        // SAFETY: the caller's guarantee.
        unsafe { list_nodes(&graph, query, out, count)? };
        if !edges.is_null() && !out.is_null() {
            // SAFETY: as above: room for as many records as handles were written.
            unsafe { std::ptr::write_bytes(edges, 0, count.read()) };
        }
        Ok(())
    })())
}

pub unsafe fn cuGraphNodeGetDependencies_v2(
    node: CUgraphNode,
    deps: *mut CUgraphNode,
    edges: *mut CUgraphEdgeData,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the program's lists and count, as the API requires.
    unsafe { neighbours(node, true, deps, edges, count) }
}

pub unsafe fn cuGraphNodeGetDependentNodes_v2(
    node: CUgraphNode,
    dependents: *mut CUgraphNode,
    edges: *mut CUgraphEdgeData,
    count: *mut usize,
) -> CUresult {
    // SAFETY: as above.
    unsafe { neighbours(node, false, dependents, edges, count) }
}

pub unsafe fn cuGraphNodeGetType(node: CUgraphNode, kind: *mut u32) -> CUresult {
    status((|| {
        let node = GraphNode::from_handle(node).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if kind.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: checked non-null, writable as the API requires.
        unsafe { kind.write(node.kind) };
        Ok(())
    })())
}

pub unsafe fn cuGraphExecUpdate_v2(
    exec: CUgraphExec,
    graph: CUgraph,
    info: *mut CUgraphExecUpdateResultInfo,
) -> CUresult {
    let result = (|| {
        let exec = GraphExec::from_handle(exec).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let (graph, ctx) = graph_and_context(graph)?;
        let verdict = ctx
            .conn
            .cuda()
            .graph_exec_update(ctx.remote, exec.remote, graph.remote)
            .outcome()?;
        // Updated in place: its host copies are the new graph's.
        *exec.host_work.lock().unwrap() = graph.host_work.lock().unwrap().clone();
        Ok(verdict)
    })();
    // CU_GRAPH_EXEC_UPDATE_ERROR (1) when the update failed without a verdict.
    let verdict = result.unwrap_or(1);
    // SAFETY: the program's result record, null or writable as the API requires.
    if let Some(info) = unsafe { info.as_mut() } {
        // SAFETY: the enum field is a 32-bit integer.
        unsafe {
            std::ptr::addr_of_mut!(info.result)
                .cast::<u32>()
                .write(verdict)
        };
        info.errorNode = std::ptr::null_mut();
        info.errorFromNode = std::ptr::null_mut();
    }
    status(result.map(|_| ()))
}

/// A graph memory attribute of `device`, read (`reset` false) or reset to 0.
fn graph_mem_attribute(device: CUdevice, attribute: u32, reset: bool) -> Result<u64, CUresult> {
    let device = crate::servers::device(device)?;
    device
        .link
        .connection()
        .cuda()
        .graph_mem_attribute(device.remote_ordinal, attribute, reset)
        .outcome()
}

pub unsafe fn cuDeviceGetGraphMemAttribute(
    device: CUdevice,
    attr: c_uint,
    value: *mut c_void,
) -> CUresult {
    status(graph_mem_attribute(device, attr, false).and_then(|v| {
        // SAFETY: an out-pointer from the caller for a 64-bit value, as the API requires.
        unsafe { write_out(value.cast::<u64>(), v) }
    }))
}

pub unsafe fn cuDeviceSetGraphMemAttribute(
    device: CUdevice,
    attr: c_uint,
    value: *mut c_void,
) -> CUresult {
    // The driver takes only 0 (a high watermark's reset).
    // SAFETY: the caller's 64-bit value, as the API requires (null is refused).
    if value.is_null() || unsafe { value.cast::<u64>().read_unaligned() } != 0 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    status(graph_mem_attribute(device, attr, true).map(|_| ()))
}

pub unsafe fn cuDeviceGraphMemTrim(device: CUdevice) -> CUresult {
    status((|| {
        let device = crate::servers::device(device)?;
        device
            .link
            .connection()
            .cuda()
            .graph_mem_trim(device.remote_ordinal)
            .outcome()
    })())
}

/// `cuGraphGetEdges` (`data` null: the edges must be plain ones, else CUDA_ERROR_LOSSY_QUERY,
/// unless `lossy` as the CUDA 10 entry point, which has no edge data).
///
/// # Safety
/// `from` and `to` are null or have room for `*count` handles, `data` for `*count` records.
unsafe fn list_edges(
    graph: CUgraph,
    from: *mut CUgraphNode,
    to: *mut CUgraphNode,
    data: *mut CUgraphEdgeData,
    count: *mut usize,
    lossy: bool,
) -> Result<(), CUresult> {
    let graph = Graph::from_handle(graph).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if count.is_null() || from.is_null() != to.is_null() || (from.is_null() && !data.is_null()) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let edges = graph.conn.cuda().graph_edges(graph.remote).outcome()?;
    if from.is_null() {
        // SAFETY: checked non-null; the caller's guarantee.
        unsafe { count.write(edges.len()) };
        return Ok(());
    }
    let plain = rgpu_protocol::cuda::Edge::default();
    if data.is_null() && !lossy && edges.iter().any(|e| e.data != plain) {
        return Err(CUresult::CUDA_ERROR_LOSSY_QUERY);
    }
    // SAFETY: the caller's guarantee.
    let room = unsafe { count.read() };
    for i in 0..room {
        let (a, b, edge) = match edges.get(i) {
            Some(e) => (
                node_handle(&graph, e.from, e.from_kind),
                node_handle(&graph, e.to, e.to_kind),
                e.data,
            ),
            None => (0, 0, plain),
        };
        // SAFETY: room for `room` entries in each list, as the caller guarantees.
        unsafe {
            from.add(i).write(a as CUgraphNode);
            to.add(i).write(b as CUgraphNode);
            if !data.is_null() {
                let record = data.add(i);
                record.write(std::mem::zeroed());
                (*record).from_port = edge.from_port;
                (*record).to_port = edge.to_port;
                (*record).type_ = edge.kind;
            }
        }
    }
    // SAFETY: as above.
    unsafe { count.write(room.min(edges.len())) };
    Ok(())
}

pub unsafe fn cuGraphGetEdges_v2(
    graph: CUgraph,
    from: *mut CUgraphNode,
    to: *mut CUgraphNode,
    data: *mut CUgraphEdgeData,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the program's lists and count, as the API requires.
    status(unsafe { list_edges(graph, from, to, data, count, false) })
}

/// The CUDA 10 entry point: no edge data.
pub unsafe fn cuGraphGetEdges(
    graph: CUgraph,
    from: *mut CUgraphNode,
    to: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    // SAFETY: as above.
    status(unsafe { list_edges(graph, from, to, std::ptr::null_mut(), count, true) })
}

pub unsafe fn cuGraphClone(clone: *mut CUgraph, original: CUgraph) -> CUresult {
    status((|| {
        let original = Graph::from_handle(original).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if clone.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut object = Graph::new(&original.conn);
        object.conditional_body = original.conditional_body;
        // The clone's host copies are the original's (the same staging buffers: its copy
        // nodes are copies of the original's).
        *object.host_work.get_mut().unwrap() = original.host_work.lock().unwrap().clone();
        original
            .conn
            .cuda()
            .graph_clone(original.remote, object.remote)
            .outcome()?;
        // SAFETY: checked non-null above; writable as the API requires.
        unsafe { write_out(clone, object.into_handle()) }
    })())
}

pub unsafe fn cuGraphNodeFindInClone(
    found: *mut CUgraphNode,
    original: CUgraphNode,
    clone: CUgraph,
) -> CUresult {
    status((|| {
        let clone = Graph::from_handle(clone).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let original = node_of(original, &clone.conn)?;
        if found.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (id, kind) = clone
            .conn
            .cuda()
            .graph_node_find_in_clone(clone.remote, original.remote)
            .outcome()?;
        let handle = node_handle(&clone, id, kind);
        // SAFETY: checked non-null above; writable as the API requires.
        unsafe { write_out(found, handle as CUgraphNode) }
    })())
}

pub unsafe fn cuGraphDestroyNode(node: CUgraphNode) -> CUresult {
    status((|| {
        let object = GraphNode::from_handle(node).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        object
            .conn
            .cuda()
            .graph_destroy_node(object.remote)
            .outcome()?;
        if let Some(graph) = Graph::from_handle(object.graph as CUgraph) {
            graph.nodes.lock().unwrap().remove(&object.remote);
        }
        GraphNode::destroy(node);
        Ok(())
    })())
}

pub unsafe fn cuGraphNodeGetEnabled(
    exec: CUgraphExec,
    node: CUgraphNode,
    enabled: *mut c_uint,
) -> CUresult {
    status((|| {
        let exec = GraphExec::from_handle(exec).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let node = node_of(node, &exec.conn)?;
        if enabled.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let on = exec
            .conn
            .cuda()
            .graph_node_get_enabled(exec.remote, node.remote)
            .outcome()?;
        // SAFETY: checked non-null above; writable as the API requires.
        unsafe { write_out(enabled, on as c_uint) }
    })())
}
