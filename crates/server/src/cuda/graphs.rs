//! Graphs: captured from a stream's work, or built node by node; instantiated, updated and
//! launched. Nodes and the body graphs of conditional nodes belong to their graph (the driver
//! destroys them with it): the session knows them by the client's ids, with their graph.

use std::ptr::{null, null_mut};

use rgpu_cuda_api::native::{check, Status, INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED};
use rgpu_cuda_api::sys::*;
use rgpu_cuda_api::{cu_call, cu_call_raw, wire};
use rgpu_protocol::cuda::{
    serve, Answer, CaptureState, Edge, Id, LaunchAttribute, ListedEdge, NodeParams, NodeQuery,
    NodeState, SERVER_NODE_IDS,
};

use super::copies::DeviceCopy;
use super::launches::MAX_PARAMS;
use super::owned;
use super::session::{code, CudaSession, Served};
use crate::session::End;

/// More parameters than a kernel can take (their bytes are limited to 32 KiB).
const MAX_KERNEL_PARAMS: usize = 32 * 1024;

/// `CUgraphNodeType`s, as integers.
const KERNEL_NODE: u32 = 0;
const MEMCPY_NODE: u32 = 1;
const MEMSET_NODE: u32 = 2;
const CHILD_GRAPH_NODE: u32 = 4;
const EMPTY_NODE: u32 = 5;
const WAIT_EVENT_NODE: u32 = 6;
const EVENT_RECORD_NODE: u32 = 7;
const MEM_ALLOC_NODE: u32 = 10;
const MEM_FREE_NODE: u32 = 11;

/// A node of one of the session's graphs.
pub(super) struct GraphNode {
    pub(super) raw: CUgraphNode,
    pub(super) graph: Id,
}

/// A graph the session uses but does not own: the body the driver made for a conditional
/// node of graph `owner`, or (`owner` 0) the graph a capture is building, known since
/// `CaptureInfo`, which its `EndCapture` makes the session's own.
pub(super) struct GraphBody {
    pub(super) raw: CUgraph,
    pub(super) owner: Id,
}

impl serve::Graphs for Served<'_> {
    fn begin_capture(
        &mut self,
        ctx: Id,
        stream: Id,
        mode: u32,
        into: Id,
        after: Vec<Id>,
    ) -> Status {
        let cuda = &mut *self.cuda;
        let begun = cuda.enter(ctx).and_then(|()| {
            let stream = cuda.stream(stream)?;
            let mode = capture_mode(mode).ok_or(INVALID_VALUE)?;
            let driver = &cuda.backend.driver;
            if into == 0 {
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                return check(unsafe { cu_call!(driver, cuStreamBeginCapture_v2(stream, mode)) });
            }
            let graph = cuda.graph(into)?;
            let after = cuda.nodes(&after)?;
            // SAFETY: as above; `after` outlives the call.
            check(unsafe {
                cu_call!(
                    driver,
                    cuStreamBeginCaptureToGraph(
                        stream,
                        graph,
                        after.as_ptr(),
                        null(),
                        after.len(),
                        mode
                    )
                )
            })
        });
        if begun.is_ok() {
            cuda.captures += 1;
        }
        code(begun)
    }

    fn end_capture(&mut self, ctx: Id, stream: Id, graph: Id) -> Status {
        let cuda = &mut *self.cuda;
        cuda.captures = cuda.captures.saturating_sub(1);
        // Captured into an existing graph, or one `CaptureInfo` named: the driver hands that
        // graph back.
        if let Ok(existing) = cuda.graph(graph) {
            let ended = cuda.enter(ctx).and_then(|()| {
                let stream = cuda.stream(stream)?;
                let mut raw = null_mut();
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                check(unsafe {
                    cu_call!(cuda.backend.driver, cuStreamEndCapture(stream, &mut raw))
                })?;
                if raw == existing {
                    Ok(())
                } else {
                    Err(INVALID_VALUE)
                }
            });
            cuda.settle_capture_graph(graph, ended.is_ok());
            return code(ended);
        }
        let made = cuda.create_in(ctx, |cuda, raw| {
            let stream = cuda.stream(stream)?;
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe { cu_call!(cuda.backend.driver, cuStreamEndCapture(stream, raw)) })
        });
        code(made.map(|raw| {
            cuda.graphs
                .insert(graph, owned::Graph::new(raw, cuda.current, &cuda.backend));
        }))
    }

    fn capture_info(&mut self, ctx: Id, stream: Id, graph: Id) -> Answer<CaptureState> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx)?;
        let raw_stream = cuda.stream(stream)?;
        let mut status = 0u32;
        let (mut id, mut count) = (0u64, 0usize);
        let mut raw_graph: CUgraph = null_mut();
        let mut deps: *const CUgraphNode = null();
        let status_out = &mut status as *mut u32;
        let (id_out, graph_out) = (&mut id as *mut u64, &mut raw_graph as *mut CUgraph);
        let (deps_out, count_out) = (
            &mut deps as *mut *const CUgraphNode,
            &mut count as *mut usize,
        );
        let no_edges: *mut *const CUgraphEdgeData = null_mut();
        // SAFETY: local out-values (the status written as its integer); no edge data asked.
        check(unsafe {
            cu_call_raw!(
                cuda.backend.driver,
                cuStreamGetCaptureInfo_v3(
                    raw_stream: CUstream,
                    status_out: *mut u32,
                    id_out: *mut u64,
                    graph_out: *mut CUgraph,
                    deps_out: *mut *const CUgraphNode,
                    no_edges: *mut *const CUgraphEdgeData,
                    count_out: *mut usize,
                )
            )
        })?;
        // CU_STREAM_CAPTURE_STATUS_ACTIVE: only then are there a graph and dependencies.
        if status != 1 || raw_graph.is_null() {
            return Ok(CaptureState {
                status,
                dependencies: Vec::new(),
            });
        }
        let raw_deps: Vec<CUgraphNode> = if count == 0 || deps.is_null() {
            Vec::new()
        } else {
            // SAFETY: the driver's array of `count` nodes, valid until the stream's next call.
            unsafe { std::slice::from_raw_parts(deps, count) }.to_vec()
        };
        match cuda.graph(graph) {
            Ok(known) if known != raw_graph => return Err(INVALID_VALUE),
            Ok(_) => {}
            Err(_) => {
                let body = GraphBody {
                    raw: raw_graph,
                    owner: 0,
                };
                cuda.graph_bodies.insert(graph, body);
            }
        }
        let dependencies = raw_deps
            .into_iter()
            .map(|raw| cuda.name_node(raw, graph))
            .collect();
        Ok(CaptureState {
            status,
            dependencies,
        })
    }

    fn update_capture_dependencies(
        &mut self,
        ctx: Id,
        stream: Id,
        nodes: Vec<Id>,
        flags: u32,
    ) -> Status {
        let cuda = &mut *self.cuda;
        code(cuda.enter(ctx).and_then(|()| {
            let stream = cuda.stream(stream)?;
            let mut nodes = cuda.nodes(&nodes)?;
            // SAFETY: a live stream and a local list of live nodes; no edge data.
            check(unsafe {
                cu_call!(
                    cuda.backend.driver,
                    cuStreamUpdateCaptureDependencies_v2(
                        stream,
                        nodes.as_mut_ptr(),
                        null(),
                        nodes.len(),
                        flags
                    )
                )
            })
        }))
    }

    fn graph_instantiate(&mut self, ctx: Id, graph: Id, exec: Id, flags: u64) -> Status {
        let cuda = &mut *self.cuda;
        let made = cuda.create_in(ctx, |cuda, raw| {
            let graph = cuda.graph(graph)?;
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe {
                cu_call!(
                    cuda.backend.driver,
                    cuGraphInstantiateWithFlags(raw, graph, flags)
                )
            })
        });
        code(made.map(|raw| {
            cuda.graph_execs.insert(
                exec,
                owned::GraphExec::new(raw, cuda.current, &cuda.backend),
            );
        }))
    }

    fn graph_launch(&mut self, ctx: Id, exec: Id, stream: Id, upload: bool) -> Answer<()> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx).and_then(|()| {
            let stream = cuda.stream(stream)?;
            let exec = cuda.graph_execs.get(&exec).ok_or(INVALID_HANDLE)?.raw();
            let driver = &cuda.backend.driver;
            check(if upload {
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                unsafe { cu_call!(driver, cuGraphUpload(exec, stream)) }
            } else {
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                unsafe { cu_call!(driver, cuGraphLaunch(exec, stream)) }
            })
        })
    }

    fn graph_destroy(&mut self, graph: Id) -> Answer<()> {
        let taken = self.cuda.graphs.remove(&graph);
        self.cuda.forget_parts_of(graph);
        self.cuda.destroy(taken)
    }

    fn graph_exec_destroy(&mut self, exec: Id) -> Answer<()> {
        let taken = self.cuda.graph_execs.remove(&exec);
        self.cuda.destroy(taken)
    }

    fn graph_create(&mut self, ctx: Id, graph: Id, flags: u32) -> Answer<()> {
        let cuda = &mut *self.cuda;
        let raw = cuda.create_in(ctx, |cuda, raw| {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe { cu_call!(cuda.backend.driver, cuGraphCreate(raw, flags)) })
        })?;
        cuda.graphs
            .insert(graph, owned::Graph::new(raw, cuda.current, &cuda.backend));
        Ok(())
    }

    fn graph_add_node(
        &mut self,
        ctx: Id,
        graph: Id,
        node: Id,
        after: Vec<Id>,
        edges: Vec<Edge>,
        params: NodeParams,
        bulk_len: u64,
    ) -> Result<Answer<()>, End> {
        let cuda = &mut *self.cuda;
        self.session
            .take_bulk_into(&mut cuda.params, bulk_len, MAX_PARAMS)?;
        Ok(cuda.enter(ctx).and_then(|()| {
            if !edges.is_empty() && edges.len() != after.len() {
                return Err(INVALID_VALUE);
            }
            // Edges with data: the node first, then its dependencies with their data.
            let plain = if edges.is_empty() { &after[..] } else { &[] };
            // Which node failed, for the server's debug log (no formatting otherwise).
            let what = log::log_enabled!(log::Level::Debug).then(|| format!("{params:?}"));
            let raw = cuda.add_node(graph, plain, params).inspect_err(|status| {
                if let Some(what) = &what {
                    log::debug!(
                        "graph {graph}: adding {what} ({} bytes of parameters) failed: CUDA \
                         error {status}",
                        cuda.params.len()
                    );
                }
            })?;
            cuda.graph_nodes.insert(node, GraphNode { raw, graph });
            if !edges.is_empty() {
                let to = vec![node; after.len()];
                cuda.dependencies(graph, &after, &to, &edges, false)?;
            }
            Ok(())
        }))
    }

    fn graph_mem_alloc_node_address(&mut self, node: Id) -> Answer<u64> {
        let cuda = &mut *self.cuda;
        let raw = cuda.node(node)?;
        // SAFETY: plain data the driver fills (valid zeroed: every enum in it has a zero value).
        let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
        // SAFETY: a live node of this session and a local out-struct.
        check(unsafe {
            cu_call!(
                cuda.backend.driver,
                cuGraphMemAllocNodeGetParams(raw, &mut p)
            )
        })?;
        Ok(p.dptr)
    }

    fn graph_node_set_params(
        &mut self,
        ctx: Id,
        exec: Id,
        node: Id,
        params: NodeParams,
        bulk_len: u64,
    ) -> Result<Answer<()>, End> {
        let cuda = &mut *self.cuda;
        self.session
            .take_bulk_into(&mut cuda.params, bulk_len, MAX_PARAMS)?;
        Ok(cuda
            .enter(ctx)
            .and_then(|()| check(cuda.set_node_params(exec, node, params))))
    }

    fn graph_node_set_enabled(&mut self, exec: Id, node: Id, enabled: bool) -> Answer<()> {
        let cuda = &mut *self.cuda;
        let exec = cuda.graph_execs.get(&exec).ok_or(INVALID_HANDLE)?.raw();
        let node = cuda.node(node)?;
        // SAFETY: this session's live handles and local buffers; the driver checks addresses.
        check(unsafe {
            cu_call!(
                cuda.backend.driver,
                cuGraphNodeSetEnabled(exec, node, enabled as u32)
            )
        })
    }

    fn graph_dependencies(
        &mut self,
        graph: Id,
        from: Vec<Id>,
        to: Vec<Id>,
        edges: Vec<Edge>,
        remove: bool,
    ) -> Answer<()> {
        self.cuda.dependencies(graph, &from, &to, &edges, remove)
    }

    fn graph_conditional_handle(
        &mut self,
        ctx: Id,
        graph: Id,
        default_value: u32,
        flags: u32,
    ) -> Answer<u64> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx)?;
        let graph = cuda.graph(graph)?;
        let mut handle = 0;
        // SAFETY: this session's live handles and local buffers; the driver checks addresses.
        check(unsafe {
            cu_call!(
                cuda.backend.driver,
                cuGraphConditionalHandleCreate(
                    &mut handle,
                    graph,
                    cuda.current,
                    default_value,
                    flags
                )
            )
        })?;
        Ok(handle)
    }

    fn graph_exec_update(&mut self, ctx: Id, exec: Id, graph: Id) -> Answer<u32> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx)?;
        let graph = cuda.graph(graph)?;
        let exec = cuda.graph_execs.get(&exec).ok_or(INVALID_HANDLE)?.raw();
        let mut info = CUgraphExecUpdateResultInfo_st {
            result: CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS,
            errorNode: null_mut(),
            errorFromNode: null_mut(),
        };
        // SAFETY: this session's live handles and local buffers; the driver checks addresses.
        let status = unsafe {
            cu_call!(
                cuda.backend.driver,
                cuGraphExecUpdate_v2(exec, graph, &mut info)
            )
        };
        check(status).map(|()| info.result as u32)
    }

    fn graph_node_count(&mut self, graph: Id) -> Answer<u64> {
        let cuda = &mut *self.cuda;
        let graph = cuda.graph(graph)?;
        let mut count = 0usize;
        // SAFETY: this session's live handles and local buffers; the driver checks addresses.
        check(unsafe {
            cu_call!(
                cuda.backend.driver,
                cuGraphGetNodes(graph, null_mut(), &mut count)
            )
        })?;
        Ok(count as u64)
    }

    fn graph_nodes(&mut self, graph: Id, query: NodeQuery) -> Answer<Vec<(Id, u32)>> {
        let cuda = &mut *self.cuda;
        let raw_graph = cuda.graph(graph)?;
        let driver = &cuda.backend.driver;
        // Asks twice: how many, then the nodes.
        let list = |out: *mut CUgraphNode, count: &mut usize| -> Status {
            // SAFETY: this session's live handles; `out` is null or has room for `count`.
            unsafe {
                match query {
                    NodeQuery::All => cu_call!(driver, cuGraphGetNodes(raw_graph, out, count)),
                    NodeQuery::Roots => {
                        cu_call!(driver, cuGraphGetRootNodes(raw_graph, out, count))
                    }
                    NodeQuery::DependenciesOf(node) => match cuda.node(node) {
                        Ok(node) => cu_call!(
                            driver,
                            cuGraphNodeGetDependencies_v2(node, out, null_mut(), count)
                        ),
                        Err(status) => status,
                    },
                    NodeQuery::DependentsOf(node) => match cuda.node(node) {
                        Ok(node) => cu_call!(
                            driver,
                            cuGraphNodeGetDependentNodes_v2(node, out, null_mut(), count)
                        ),
                        Err(status) => status,
                    },
                }
            }
        };
        let mut count = 0usize;
        check(list(null_mut(), &mut count))?;
        let mut raws = vec![null_mut(); count];
        check(list(raws.as_mut_ptr(), &mut count))?;
        raws.truncate(count);
        Ok(raws
            .into_iter()
            .map(|raw| cuda.name_node(raw, graph))
            .collect())
    }

    fn graph_edges(&mut self, graph: Id) -> Answer<Vec<ListedEdge>> {
        let cuda = &mut *self.cuda;
        let raw_graph = cuda.graph(graph)?;
        let driver = &cuda.backend.driver;
        let mut count = 0usize;
        let null = null_mut();
        // SAFETY: a graph of the session; null lists ask for the count.
        check(unsafe {
            cu_call!(
                driver,
                cuGraphGetEdges_v2(raw_graph, null, null, null_mut(), &mut count)
            )
        })?;
        if count == 0 {
            return Ok(Vec::new());
        }
        let mut from = vec![null_mut(); count];
        let mut to = vec![null_mut(); count];
        // SAFETY: plain bytes, valid zeroed.
        let mut data: Vec<CUgraphEdgeData> = vec![unsafe { std::mem::zeroed() }; count];
        // SAFETY: three lists with room for `count` entries each.
        check(unsafe {
            cu_call!(
                driver,
                cuGraphGetEdges_v2(
                    raw_graph,
                    from.as_mut_ptr(),
                    to.as_mut_ptr(),
                    data.as_mut_ptr(),
                    &mut count
                )
            )
        })?;
        let edges = (0..count.min(from.len()))
            .map(|i| {
                let (from, from_kind) = cuda.name_node(from[i], graph);
                let (to, to_kind) = cuda.name_node(to[i], graph);
                let data = Edge {
                    from_port: data[i].from_port,
                    to_port: data[i].to_port,
                    kind: data[i].type_,
                };
                ListedEdge {
                    from,
                    from_kind,
                    to,
                    to_kind,
                    data,
                }
            })
            .collect();
        Ok(edges)
    }

    fn graph_clone(&mut self, graph: Id, clone: Id) -> Status {
        let cuda = &mut *self.cuda;
        let made = (|| {
            let original = cuda.graphs.get(&graph).ok_or(INVALID_HANDLE)?;
            let ctx = owned::Owned::context(original);
            if cuda.graphs.contains_key(&clone) || !cuda.usage.has_room_for_object() {
                return Err(INVALID_VALUE);
            }
            let mut raw = null_mut();
            // SAFETY: a graph of the session and a local out-value.
            check(unsafe {
                cu_call!(cuda.backend.driver, cuGraphClone(&mut raw, original.raw()))
            })?;
            cuda.usage.add_objects(1);
            cuda.graphs
                .insert(clone, owned::Graph::new(raw, ctx, &cuda.backend));
            Ok(())
        })();
        code(made)
    }

    fn graph_node_find_in_clone(&mut self, clone: Id, node: Id) -> Answer<(Id, u32)> {
        let cuda = &mut *self.cuda;
        let raw_clone = cuda.graph(clone)?;
        let original = cuda.node(node)?;
        let mut found = null_mut();
        // SAFETY: a node and a graph of the session, and a local out-value; the driver checks
        // that the graph is a clone of the node's.
        check(unsafe {
            cu_call!(
                cuda.backend.driver,
                cuGraphNodeFindInClone(&mut found, original, raw_clone)
            )
        })?;
        Ok(cuda.name_node(found, clone))
    }

    fn graph_destroy_node(&mut self, node: Id) -> Status {
        let cuda = &mut *self.cuda;
        let destroyed = cuda.node(node).and_then(|raw| {
            // SAFETY: a node of the session; the driver removes its edges with it.
            check(unsafe { cu_call!(cuda.backend.driver, cuGraphDestroyNode(raw)) })
        });
        if destroyed.is_ok() {
            cuda.graph_nodes.remove(&node);
        }
        code(destroyed)
    }

    fn graph_node_get_enabled(&mut self, exec: Id, node: Id) -> Answer<bool> {
        let cuda = &mut *self.cuda;
        let exec = cuda.graph_execs.get(&exec).ok_or(INVALID_HANDLE)?.raw();
        let node = cuda.node(node)?;
        let mut enabled = 0u32;
        // SAFETY: this session's live handles and a local out-value.
        check(unsafe {
            cu_call!(
                cuda.backend.driver,
                cuGraphNodeGetEnabled(exec, node, &mut enabled)
            )
        })?;
        Ok(enabled != 0)
    }

    fn graph_node_get_params(&mut self, node: Id) -> Answer<NodeState> {
        let cuda = &mut *self.cuda;
        let raw = cuda.node(node)?;
        let graph = cuda.graph_nodes.get(&node).map_or(0, |n| n.graph);
        let mut state = NodeState {
            params: NodeParams::Empty,
            kernel_params: Vec::new(),
            address: 0,
        };
        let driver = &cuda.backend.driver;
        state.params = match cuda.node_kind(raw) {
            KERNEL_NODE => {
                // SAFETY: plain data, valid zeroed.
                let mut p: CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
                // SAFETY: a live node of the session and a local out-struct.
                check(unsafe { cu_call!(driver, cuGraphKernelNodeGetParams_v2(raw, &mut p)) })?;
                if !p.extra.is_null() {
                    return Err(NOT_SUPPORTED);
                }
                let function = cuda.function_id_of(p.func)?;
                state.kernel_params = cuda.kernel_param_bytes(p.func, p.kernelParams)?;
                NodeParams::Kernel {
                    function,
                    grid: [p.gridDimX, p.gridDimY, p.gridDimZ],
                    block: [p.blockDimX, p.blockDimY, p.blockDimZ],
                    shared_mem: p.sharedMemBytes,
                }
            }
            MEMSET_NODE => {
                // SAFETY: plain data, valid zeroed.
                let mut p: CUDA_MEMSET_NODE_PARAMS = unsafe { std::mem::zeroed() };
                // SAFETY: a live node of the session and a local out-struct.
                check(unsafe { cu_call!(driver, cuGraphMemsetNodeGetParams(raw, &mut p)) })?;
                wire::memset_node(&p)
            }
            MEMCPY_NODE => {
                let mut p = std::mem::MaybeUninit::<CUDA_MEMCPY3D>::uninit();
                // SAFETY: a live node of the session and a local out-struct.
                check(unsafe {
                    cu_call!(driver, cuGraphMemcpyNodeGetParams(raw, p.as_mut_ptr()))
                })?;
                // SAFETY: the driver filled it in (its memory types are the driver's values).
                let p = unsafe { p.assume_init() };
                // Arrays have no wire form (the session names them, not their addresses).
                wire::device_copy_node(&p).ok_or(NOT_SUPPORTED)?
            }
            EMPTY_NODE => NodeParams::Empty,
            kind @ (WAIT_EVENT_NODE | EVENT_RECORD_NODE) => {
                let mut event = null_mut();
                // SAFETY: a live node of the session (of the kind asked) and a local out-value.
                check(unsafe {
                    if kind == EVENT_RECORD_NODE {
                        cu_call!(driver, cuGraphEventRecordNodeGetEvent(raw, &mut event))
                    } else {
                        cu_call!(driver, cuGraphEventWaitNodeGetEvent(raw, &mut event))
                    }
                })?;
                let id = cuda
                    .events
                    .iter()
                    .find(|(_, e)| e.raw() == event)
                    .map(|(&id, _)| id)
                    .ok_or(NOT_SUPPORTED)?;
                if kind == EVENT_RECORD_NODE {
                    NodeParams::EventRecord { event: id }
                } else {
                    NodeParams::EventWait { event: id }
                }
            }
            CHILD_GRAPH_NODE => {
                let mut child = null_mut();
                // SAFETY: a live node of the session and a local out-value.
                check(unsafe { cu_call!(driver, cuGraphChildGraphNodeGetGraph(raw, &mut child)) })?;
                NodeParams::Child {
                    graph: cuda.name_graph(child, graph),
                }
            }
            MEM_ALLOC_NODE => {
                // SAFETY: plain data, valid zeroed.
                let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
                // SAFETY: a live node of the session and a local out-struct.
                check(unsafe { cu_call!(driver, cuGraphMemAllocNodeGetParams(raw, &mut p)) })?;
                let access = if p.accessDescs.is_null() {
                    Vec::new()
                } else {
                    // SAFETY: the driver's array of `accessDescCount` descriptors.
                    unsafe { std::slice::from_raw_parts(p.accessDescs, p.accessDescCount) }
                        .iter()
                        .map(wire::mem_access)
                        .collect()
                };
                state.address = p.dptr;
                NodeParams::MemAlloc {
                    props: wire::wire_pool_props(&p.poolProps),
                    access,
                    size: p.bytesize as u64,
                }
            }
            MEM_FREE_NODE => {
                let mut dptr = 0;
                // SAFETY: a live node of the session and a local out-value.
                check(unsafe { cu_call!(driver, cuGraphMemFreeNodeGetParams(raw, &mut dptr)) })?;
                NodeParams::MemFree { dptr }
            }
            _ => return Err(NOT_SUPPORTED),
        };
        Ok(state)
    }

    fn graph_kernel_node_set_attribute(&mut self, node: Id, attribute: LaunchAttribute) -> Status {
        let cuda = &*self.cuda;
        code(cuda.node(node).and_then(|raw| {
            let value = super::streams::attribute_value(&attribute)?;
            let (id, value) = (attribute.id, &value as *const CUkernelNodeAttrValue);
            // SAFETY: a live node and a local value; the attribute is the client's integer.
            check(unsafe {
                cu_call_raw!(
                    cuda.backend.driver,
                    cuGraphKernelNodeSetAttribute(
                        raw: CUgraphNode,
                        id: u32,
                        value: *const CUkernelNodeAttrValue,
                    )
                )
            })
        }))
    }

    fn graph_kernel_node_get_attribute(&mut self, node: Id, id: u32) -> Answer<Vec<u8>> {
        let cuda = &*self.cuda;
        let raw = cuda.node(node)?;
        // SAFETY: plain data, valid zeroed.
        let mut value: CUkernelNodeAttrValue = unsafe { std::mem::zeroed() };
        let out = &mut value as *mut CUkernelNodeAttrValue;
        // SAFETY: a live node and a local out-value; the attribute is the client's integer.
        check(unsafe {
            cu_call_raw!(
                cuda.backend.driver,
                cuGraphKernelNodeGetAttribute(
                    raw: CUgraphNode,
                    id: u32,
                    out: *mut CUkernelNodeAttrValue,
                )
            )
        })?;
        Ok(super::streams::attribute_bytes(&value))
    }

    fn graph_kernel_node_copy_attributes(&mut self, dst: Id, src: Id) -> Status {
        let cuda = &*self.cuda;
        code(cuda.node(dst).and_then(|dst| {
            let src = cuda.node(src)?;
            // SAFETY: two live nodes of the session; the driver checks their kinds.
            check(unsafe {
                cu_call!(
                    cuda.backend.driver,
                    cuGraphKernelNodeCopyAttributes(dst, src)
                )
            })
        }))
    }

    fn graph_mem_trim(&mut self, device: u32) -> Status {
        let cuda = &mut *self.cuda;
        // SAFETY: a device ordinal; the driver checks it.
        code(check(unsafe {
            cu_call!(
                cuda.backend.driver,
                cuDeviceGraphMemTrim(device as CUdevice)
            )
        }))
    }

    fn graph_mem_attribute(&mut self, device: u32, attribute: u32, reset: bool) -> Answer<u64> {
        let driver = &self.cuda.backend.driver;
        if device as usize >= self.cuda.backend.inventory.devices.len() {
            return Err(super::session::INVALID_DEVICE);
        }
        use CUgraphMem_attribute::*;
        let attribute = match attribute {
            0 => CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT,
            1 => CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
            2 => CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
            3 => CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
            _ => return Err(INVALID_VALUE),
        };
        let mut value = 0u64;
        let out = (&raw mut value).cast();
        // SAFETY: a device ordinal of this server and a local 64-bit value, as both calls
        // take it.
        check(unsafe {
            if reset {
                cu_call!(
                    driver,
                    cuDeviceSetGraphMemAttribute(device as CUdevice, attribute, out)
                )
            } else {
                cu_call!(
                    driver,
                    cuDeviceGetGraphMemAttribute(device as CUdevice, attribute, out)
                )
            }
        })?;
        Ok(value)
    }
}

impl CudaSession {
    /// A graph of the session: made by it, or the body of one of its conditional nodes.
    pub(super) fn graph(&self, id: Id) -> Result<CUgraph, Status> {
        if let Some(graph) = self.graphs.get(&id) {
            return Ok(graph.raw());
        }
        self.graph_bodies
            .get(&id)
            .map(|body| body.raw)
            .ok_or(INVALID_HANDLE)
    }

    /// A capture whose graph `CaptureInfo` named as `graph` ended: the graph is the session's
    /// own now, or gone with the failed capture. (Nothing to do for another graph.)
    fn settle_capture_graph(&mut self, graph: Id, ended: bool) {
        if !self
            .graph_bodies
            .get(&graph)
            .is_some_and(|body| body.owner == 0)
        {
            return;
        }
        let Some(body) = self.graph_bodies.remove(&graph) else {
            return;
        };
        if ended {
            self.usage.add_objects(1);
            let owned = owned::Graph::new(body.raw, self.current, &self.backend);
            self.graphs.insert(graph, owned);
        } else {
            self.forget_parts_of(graph);
        }
    }

    /// A node's `CUgraphNodeType`, as its integer (empty unless the driver says otherwise).
    fn node_kind(&self, raw: CUgraphNode) -> u32 {
        let mut kind = EMPTY_NODE;
        let out = &mut kind as *mut u32;
        // SAFETY: a live node; the type is written as its integer (it may be one the enum
        // lacks).
        let _ = unsafe {
            cu_call_raw!(
                self.backend.driver,
                cuGraphNodeGetType(raw: CUgraphNode, out: *mut u32)
            )
        };
        kind
    }

    /// The session's id of a graph the driver made inside graph `owner` (a child node's
    /// graph): a new one of the server's the first time.
    fn name_graph(&mut self, raw: CUgraph, owner: Id) -> Id {
        let known = self
            .graphs
            .iter()
            .find(|(_, graph)| graph.raw() == raw)
            .map(|(&id, _)| id)
            .or_else(|| {
                self.graph_bodies
                    .iter()
                    .find(|(_, body)| body.raw == raw)
                    .map(|(&id, _)| id)
            });
        if let Some(id) = known {
            return id;
        }
        self.next_node_id += 1;
        let id = SERVER_NODE_IDS + self.next_node_id;
        self.graph_bodies.insert(id, GraphBody { raw, owner });
        id
    }

    /// The session's id of the function a kernel node runs: a function of the session (a
    /// module's, or one the client took from a library kernel, as runtimes do before adding
    /// the node), else a library kernel whose function in the current context it is.
    fn function_id_of(&self, raw: CUfunction) -> Result<Id, Status> {
        let driver = &self.backend.driver;
        let functions = self.functions.iter().filter(|(_, f)| !f.is_kernel);
        let kernels = self.functions.iter().filter(|(_, f)| f.is_kernel);
        functions
            .chain(kernels)
            .find(|(_, function)| {
                if !function.is_kernel {
                    return function.raw == raw;
                }
                let mut in_context = null_mut();
                // SAFETY: a kernel of the session and a local out-value.
                let status = unsafe {
                    cu_call!(
                        driver,
                        cuKernelGetFunction(&mut in_context, function.raw as CUkernel)
                    )
                };
                status == cudaError_enum::CUDA_SUCCESS as u32 && in_context == raw
            })
            .map(|(&id, _)| id)
            .ok_or(NOT_SUPPORTED)
    }

    /// A kernel node's parameters as one buffer laid out as for a launch: each parameter's
    /// bytes (`kernelParams[i]`) at its offset, as the driver describes the function's
    /// parameters.
    fn kernel_param_bytes(
        &self,
        function: CUfunction,
        params: *mut *mut std::ffi::c_void,
    ) -> Result<Vec<u8>, Status> {
        let mut bytes = Vec::new();
        if params.is_null() {
            return Ok(bytes);
        }
        for index in 0..MAX_KERNEL_PARAMS {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: a live function and local out-values; an index past the last parameter
            // is refused.
            let status = unsafe {
                cu_call!(
                    self.backend.driver,
                    cuFuncGetParamInfo(function, index, &mut offset, &mut size)
                )
            };
            if status != cudaError_enum::CUDA_SUCCESS as u32 {
                break;
            }
            // SAFETY: the driver's array holds a pointer per parameter, each to `size` bytes.
            let value = unsafe {
                let at = params.add(index).read();
                std::slice::from_raw_parts(at.cast::<u8>(), size)
            };
            if bytes.len() < offset + size {
                bytes.resize(offset + size, 0);
            }
            bytes[offset..offset + size].copy_from_slice(value);
        }
        Ok(bytes)
    }

    /// The session's id of a node of `graph` (a new one of the server's if the client never
    /// named it), with its type.
    fn name_node(&mut self, raw: CUgraphNode, graph: Id) -> (Id, u32) {
        let kind = self.node_kind(raw);
        if let Some((&id, _)) = self.graph_nodes.iter().find(|(_, node)| node.raw == raw) {
            return (id, kind);
        }
        self.next_node_id += 1;
        let id = SERVER_NODE_IDS + self.next_node_id;
        self.graph_nodes.insert(id, GraphNode { raw, graph });
        (id, kind)
    }

    fn node(&self, id: Id) -> Result<CUgraphNode, Status> {
        self.graph_nodes
            .get(&id)
            .map(|node| node.raw)
            .ok_or(INVALID_HANDLE)
    }

    fn nodes(&self, ids: &[Id]) -> Result<Vec<CUgraphNode>, Status> {
        ids.iter().map(|&id| self.node(id)).collect()
    }

    /// Adds (or removes) the edges `from[i]` -> `to[i]`, with their data when `edges` has any.
    fn dependencies(
        &self,
        graph: Id,
        from: &[Id],
        to: &[Id],
        edges: &[Edge],
        remove: bool,
    ) -> Answer<()> {
        let graph = self.graph(graph)?;
        let (from, to) = (self.nodes(from)?, self.nodes(to)?);
        if from.len() != to.len() || (!edges.is_empty() && edges.len() != from.len()) {
            return Err(INVALID_VALUE);
        }
        let data: Vec<CUgraphEdgeData> = edges
            .iter()
            .map(|edge| {
                // SAFETY: plain bytes, valid zeroed; the type is written as its integer.
                let mut raw: CUgraphEdgeData = unsafe { std::mem::zeroed() };
                raw.from_port = edge.from_port;
                raw.to_port = edge.to_port;
                raw.type_ = edge.kind;
                raw
            })
            .collect();
        let data_ptr = if data.is_empty() {
            null()
        } else {
            data.as_ptr()
        };
        let driver = &self.backend.driver;
        let (f, t, n) = (from.as_ptr(), to.as_ptr(), from.len());
        // SAFETY: this session's live handles and local lists of `n` entries each.
        check(unsafe {
            if remove {
                cu_call!(
                    driver,
                    cuGraphRemoveDependencies_v2(graph, f, t, data_ptr, n)
                )
            } else {
                cu_call!(driver, cuGraphAddDependencies_v2(graph, f, t, data_ptr, n))
            }
        })
    }

    /// Graph `graph` is gone: its nodes and conditional bodies (and theirs) went with it.
    fn forget_parts_of(&mut self, graph: Id) {
        let mut gone = vec![graph];
        while let Some(graph) = gone.pop() {
            self.graph_nodes.retain(|_, node| node.graph != graph);
            let bodies: Vec<Id> = self
                .graph_bodies
                .iter()
                .filter(|(_, body)| body.owner == graph)
                .map(|(&id, _)| id)
                .collect();
            for body in bodies {
                self.graph_bodies.remove(&body);
                gone.push(body);
            }
        }
    }

    /// The kernel node parameters of `function`, its parameter buffer `self.params`. The
    /// parameters go one by one (`kernelParams`, pointing into the buffer) and a library
    /// kernel as its function in the current context: the forms every kind of graph takes
    /// (the body graphs of conditional nodes refuse a parameter buffer).
    fn kernel_node(
        &mut self,
        function: Id,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
    ) -> Result<CUDA_KERNEL_NODE_PARAMS, Status> {
        let found = self.function(function)?;
        let offsets = self.param_offsets.get(&function).ok_or(INVALID_HANDLE)?;
        let base = self.params.as_mut_ptr();
        self.param_pointers.clear();
        for &offset in offsets {
            if offset as usize >= self.params.len() {
                return Err(INVALID_VALUE);
            }
            // SAFETY: within the parameter buffer (checked above).
            self.param_pointers
                .push(unsafe { base.add(offset as usize) }.cast());
        }
        let func = if found.is_kernel {
            let mut func = null_mut();
            // SAFETY: a live library kernel of this session; the current context is entered.
            check(unsafe {
                cu_call!(
                    self.backend.driver,
                    cuKernelGetFunction(&mut func, found.raw.cast())
                )
            })?;
            func
        } else {
            found.raw
        };
        let params = if self.param_pointers.is_empty() {
            null_mut()
        } else {
            self.param_pointers.as_mut_ptr()
        };
        Ok(CUDA_KERNEL_NODE_PARAMS {
            func,
            gridDimX: grid[0],
            gridDimY: grid[1],
            gridDimZ: grid[2],
            blockDimX: block[0],
            blockDimY: block[1],
            blockDimZ: block[2],
            sharedMemBytes: shared_mem,
            kernelParams: params,
            extra: null_mut(),
            kern: null_mut(),
            ctx: null_mut(),
        })
    }

    /// Adds a node to `graph` after `after`; its raw handle.
    fn add_node(
        &mut self,
        graph: Id,
        after: &[Id],
        params: NodeParams,
    ) -> Result<CUgraphNode, Status> {
        let graph_raw = self.graph(graph)?;
        let deps = self.nodes(after)?;
        let (deps, n) = (deps.as_ptr(), deps.len());
        let mut node = null_mut();
        let current = self.current;
        let status = match params {
            NodeParams::Kernel {
                function,
                grid,
                block,
                shared_mem,
            } => {
                let p = self.kernel_node(function, grid, block, shared_mem)?;
                // SAFETY: this session's live handles and local buffers (the parameter buffer
                // and the pointers into it outlive the call, which copies the parameters); the
                // driver checks addresses.
                unsafe {
                    cu_call!(
                        self.backend.driver,
                        cuGraphAddKernelNode_v2(&mut node, graph_raw, deps, n, &p)
                    )
                }
            }
            NodeParams::Memset {
                dst,
                value,
                element_size,
                width,
                height,
                pitch,
            } => {
                let p = wire::memset_params(dst, value, element_size, width, height, pitch);
                // SAFETY: as above.
                unsafe {
                    cu_call!(
                        self.backend.driver,
                        cuGraphAddMemsetNode(&mut node, graph_raw, deps, n, &p, current)
                    )
                }
            }
            NodeParams::Copy {
                dst,
                dst_pitch,
                src,
                src_pitch,
                extent,
            } => {
                let p = DeviceCopy {
                    dst,
                    dst_pitch,
                    src,
                    src_pitch,
                    extent,
                }
                .descriptor();
                // SAFETY: as above.
                unsafe {
                    cu_call!(
                        self.backend.driver,
                        cuGraphAddMemcpyNode(&mut node, graph_raw, deps, n, &p, current)
                    )
                }
            }
            // SAFETY: as above.
            NodeParams::Empty => unsafe {
                cu_call!(
                    self.backend.driver,
                    cuGraphAddEmptyNode(&mut node, graph_raw, deps, n)
                )
            },
            NodeParams::EventRecord { event } => {
                let event = self.event(event)?;
                // SAFETY: as above.
                unsafe {
                    cu_call!(
                        self.backend.driver,
                        cuGraphAddEventRecordNode(&mut node, graph_raw, deps, n, event)
                    )
                }
            }
            NodeParams::EventWait { event } => {
                let event = self.event(event)?;
                // SAFETY: as above.
                unsafe {
                    cu_call!(
                        self.backend.driver,
                        cuGraphAddEventWaitNode(&mut node, graph_raw, deps, n, event)
                    )
                }
            }
            NodeParams::Child { graph: child } => {
                let child = self.graph(child)?;
                // SAFETY: as above.
                unsafe {
                    cu_call!(
                        self.backend.driver,
                        cuGraphAddChildGraphNode(&mut node, graph_raw, deps, n, child)
                    )
                }
            }
            NodeParams::Conditional {
                handle,
                kind,
                bodies,
            } => {
                let kind = match kind {
                    0 => CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF,
                    1 => CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE,
                    2 => CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_SWITCH,
                    _ => return Err(INVALID_VALUE),
                };
                if bodies.is_empty() || bodies.len() > 64 {
                    return Err(INVALID_VALUE);
                }
                // SAFETY: a plain C struct of integers and pointers, valid zeroed.
                let mut p: CUgraphNodeParams = unsafe { std::mem::zeroed() };
                p.type_ = CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL;
                // `phGraph_out` stays null: the driver points it at an array of its own.
                p.__bindgen_anon_1.conditional = CUDA_CONDITIONAL_NODE_PARAMS {
                    handle,
                    type_: kind,
                    size: bodies.len() as u32,
                    phGraph_out: null_mut(),
                    ctx: current,
                };
                // SAFETY: as above.
                let status = unsafe {
                    cu_call!(
                        self.backend.driver,
                        cuGraphAddNode_v2(&mut node, graph_raw, deps, null(), n, &mut p)
                    )
                };
                // SAFETY: the union member just written; the driver's array holds `size` graphs.
                let out = unsafe { p.__bindgen_anon_1.conditional.phGraph_out };
                if status == cudaError_enum::CUDA_SUCCESS as u32 && !out.is_null() {
                    for (i, id) in bodies.into_iter().enumerate() {
                        // SAFETY: within the driver's array of `size` body graphs.
                        let raw = unsafe { out.add(i).read() };
                        self.graph_bodies
                            .insert(id, GraphBody { raw, owner: graph });
                    }
                }
                status
            }
            NodeParams::MemAlloc {
                props,
                access,
                size,
            } => {
                let access: Vec<CUmemAccessDesc> = access.iter().map(wire::access_desc).collect();
                let mut p = CUDA_MEM_ALLOC_NODE_PARAMS {
                    poolProps: wire::pool_props(&props),
                    accessDescs: access.as_ptr(),
                    accessDescCount: access.len(),
                    bytesize: size as usize,
                    dptr: 0,
                };
                // SAFETY: as above; the access list outlives the call.
                unsafe {
                    cu_call!(
                        self.backend.driver,
                        cuGraphAddMemAllocNode(&mut node, graph_raw, deps, n, &mut p)
                    )
                }
            }
            // SAFETY: as above.
            NodeParams::MemFree { dptr } => unsafe {
                cu_call!(
                    self.backend.driver,
                    cuGraphAddMemFreeNode(&mut node, graph_raw, deps, n, dptr)
                )
            },
        };
        check(status).map(|()| node)
    }

    /// New parameters for a node, in its graph (`exec` 0) or in an executable graph.
    fn set_node_params(&mut self, exec: Id, node: Id, params: NodeParams) -> Status {
        let node = match self.node(node) {
            Ok(node) => node,
            Err(status) => return status,
        };
        let exec = match exec {
            0 => null_mut(),
            id => match self.graph_execs.get(&id) {
                Some(exec) => exec.raw(),
                None => return INVALID_HANDLE,
            },
        };
        let current = self.current;
        let backend = self.backend.clone();
        let driver = &backend.driver;
        match params {
            NodeParams::Kernel {
                function,
                grid,
                block,
                shared_mem,
            } => {
                let p = match self.kernel_node(function, grid, block, shared_mem) {
                    Ok(p) => p,
                    Err(status) => return status,
                };
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                unsafe {
                    if exec.is_null() {
                        cu_call!(driver, cuGraphKernelNodeSetParams_v2(node, &p))
                    } else {
                        cu_call!(driver, cuGraphExecKernelNodeSetParams_v2(exec, node, &p))
                    }
                }
            }
            NodeParams::Memset {
                dst,
                value,
                element_size,
                width,
                height,
                pitch,
            } => {
                let p = wire::memset_params(dst, value, element_size, width, height, pitch);
                // SAFETY: as above.
                unsafe {
                    if exec.is_null() {
                        cu_call!(driver, cuGraphMemsetNodeSetParams(node, &p))
                    } else {
                        cu_call!(
                            driver,
                            cuGraphExecMemsetNodeSetParams(exec, node, &p, current)
                        )
                    }
                }
            }
            NodeParams::Copy {
                dst,
                dst_pitch,
                src,
                src_pitch,
                extent,
            } => {
                let p = DeviceCopy {
                    dst,
                    dst_pitch,
                    src,
                    src_pitch,
                    extent,
                }
                .descriptor();
                // SAFETY: as above.
                unsafe {
                    if exec.is_null() {
                        cu_call!(driver, cuGraphMemcpyNodeSetParams(node, &p))
                    } else {
                        cu_call!(
                            driver,
                            cuGraphExecMemcpyNodeSetParams(exec, node, &p, current)
                        )
                    }
                }
            }
            NodeParams::Child { graph } if !exec.is_null() => match self.graph(graph) {
                // SAFETY: as above.
                Ok(child) => unsafe {
                    cu_call!(
                        driver,
                        cuGraphExecChildGraphNodeSetParams(exec, node, child)
                    )
                },
                Err(status) => status,
            },
            NodeParams::EventRecord { event } => match self.event(event) {
                // SAFETY: as above.
                Ok(event) => unsafe {
                    if exec.is_null() {
                        cu_call!(driver, cuGraphEventRecordNodeSetEvent(node, event))
                    } else {
                        cu_call!(
                            driver,
                            cuGraphExecEventRecordNodeSetEvent(exec, node, event)
                        )
                    }
                },
                Err(status) => status,
            },
            NodeParams::EventWait { event } => match self.event(event) {
                // SAFETY: as above.
                Ok(event) => unsafe {
                    if exec.is_null() {
                        cu_call!(driver, cuGraphEventWaitNodeSetEvent(node, event))
                    } else {
                        cu_call!(driver, cuGraphExecEventWaitNodeSetEvent(exec, node, event))
                    }
                },
                Err(status) => status,
            },
            _ => INVALID_VALUE,
        }
    }
}

/// `CUDA_MEMSET_NODE_PARAMS` from the wire.
/// `CUstreamCaptureMode` from the wire.
fn capture_mode(mode: u32) -> Option<CUstreamCaptureMode> {
    use CUstreamCaptureMode_enum::*;
    Some(match mode {
        0 => CU_STREAM_CAPTURE_MODE_GLOBAL,
        1 => CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        2 => CU_STREAM_CAPTURE_MODE_RELAXED,
        _ => return None,
    })
}
