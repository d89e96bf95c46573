//! Reading graph nodes' parameters back (`cuGraph*NodeGetParams`, `cuGraphEvent*NodeGetEvent`,
//! `cuGraphChildGraphNodeGetGraph`). The server reads them from its driver
//! (`GraphNodeGetParams`), also for nodes the program never named (captured, cloned); they
//! come back in the program's terms: its function, event and graph handles, its device
//! ordinals, and a kernel's arguments as pointers into a copy that lives until the node's next
//! query, as the driver's own copy does. Host nodes are the client's: their function and data
//! are kept here, as are the descriptors of copy nodes the program made (a host side is the
//! client's work too).

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use rgpu_client::CudaClient;
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{MemAccess, NodeParams, NodeState, PoolProps};

use super::{status, write_out, Outcome};
use crate::objects::{Event, Function, Graph, GraphNode};

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_DEVICE: u32 = 1;

/// What a node's last query handed out by pointer: a kernel's arguments and pointers to each,
/// a graph allocation's access list.
#[derive(Default)]
struct Kept {
    arguments: Box<[u8]>,
    pointers: Box<[*mut c_void]>,
    access: Box<[CUmemAccessDesc]>,
}

// SAFETY: the pointers point into `arguments`, owned alongside; nothing here is followed by
// another thread.
unsafe impl Send for Kept {}

/// By node handle.
static KEPT: Mutex<BTreeMap<usize, Kept>> = Mutex::new(BTreeMap::new());

/// Host nodes' function and data, by node handle.
static HOST_NODES: Mutex<BTreeMap<usize, (CUhostFn, usize)>> = Mutex::new(BTreeMap::new());

/// Copy nodes' descriptors as the program gave them, by node handle: the server knows a copy
/// with a host side only as a copy to or from a staging buffer.
static COPY_NODES: Mutex<BTreeMap<usize, ProgramCopy>> = Mutex::new(BTreeMap::new());

struct ProgramCopy(CUDA_MEMCPY3D);

// SAFETY: the program's addresses, kept to be handed back, never followed here.
unsafe impl Send for ProgramCopy {}

/// Keeps a copy node's descriptor for `cuGraphMemcpyNodeGetParams`.
pub(crate) fn remember_copy_node(node: usize, params: &CUDA_MEMCPY3D) {
    COPY_NODES
        .lock()
        .unwrap()
        .insert(node, ProgramCopy(*params));
}

/// Keeps a host node's function and data for `cuGraphHostNodeGetParams`.
pub(crate) fn remember_host_node(node: usize, function: CUhostFn, data: usize) {
    HOST_NODES.lock().unwrap().insert(node, (function, data));
}

/// The node and its parameters as its server's driver has them.
fn node_state(node: CUgraphNode) -> Result<(Arc<GraphNode>, NodeState), CUresult> {
    let object = GraphNode::from_handle(node).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let state = object
        .conn
        .cuda()
        .graph_node_get_params(object.remote)
        .outcome()?;
    Ok((object, state))
}

/// A location's device as the program numbers it.
fn program_location(node: &GraphNode, location_type: u32, id: i32) -> i32 {
    if location_type != LOCATION_DEVICE {
        return id;
    }
    u32::try_from(id)
        .ok()
        .and_then(|remote| crate::servers::program_ordinal(&node.conn, remote))
        .unwrap_or(id)
}

pub unsafe fn cuGraphKernelNodeGetParams_v2(
    hNode: CUgraphNode,
    nodeParams: *mut CUDA_KERNEL_NODE_PARAMS,
) -> CUresult {
    status((|| {
        if nodeParams.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (node, state) = node_state(hNode)?;
        let NodeParams::Kernel {
            function,
            grid,
            block,
            shared_mem,
        } = state.params
        else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        let function = Function::find(|f| f.remote == function && Arc::ptr_eq(&f.conn, &node.conn))
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let mut kept = Kept {
            arguments: state.kernel_params.into_boxed_slice(),
            ..Kept::default()
        };
        let base = kept.arguments.as_mut_ptr();
        kept.pointers = function
            .params
            .iter()
            .map(|&(offset, _)| base.wrapping_add(offset as usize).cast::<c_void>())
            .collect();
        let pointers = if kept.pointers.is_empty() {
            std::ptr::null_mut()
        } else {
            kept.pointers.as_mut_ptr()
        };
        KEPT.lock().unwrap().insert(node.handle, kept);
        // As the driver answers: the function, and the library kernel it is of (runtimes find
        // their kernels by it), in the current context.
        let kernel = if function.is_kernel {
            function.handle
        } else {
            function.kernel
        };
        let ctx = crate::objects::current_context().map_or(0, |ctx| ctx.handle);
        let params = CUDA_KERNEL_NODE_PARAMS {
            func: function.handle as CUfunction,
            gridDimX: grid[0],
            gridDimY: grid[1],
            gridDimZ: grid[2],
            blockDimX: block[0],
            blockDimY: block[1],
            blockDimZ: block[2],
            sharedMemBytes: shared_mem,
            kernelParams: pointers,
            extra: std::ptr::null_mut(),
            kern: kernel as CUkernel,
            ctx: ctx as CUcontext,
        };
        // SAFETY: the caller's out-pointer, checked non-null.
        unsafe { write_out(nodeParams, params) }
    })())
}

/// The CUDA 11 form (no `kern`, no `ctx`).
pub unsafe fn cuGraphKernelNodeGetParams(
    hNode: CUgraphNode,
    nodeParams: *mut CUDA_KERNEL_NODE_PARAMS_v1,
) -> CUresult {
    if nodeParams.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: plain data, valid zeroed.
    let mut current: CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    // SAFETY: a local out-struct.
    let got = unsafe { cuGraphKernelNodeGetParams_v2(hNode, &mut current) };
    if got != CUresult::CUDA_SUCCESS {
        return got;
    }
    let older = CUDA_KERNEL_NODE_PARAMS_v1 {
        func: current.func,
        gridDimX: current.gridDimX,
        gridDimY: current.gridDimY,
        gridDimZ: current.gridDimZ,
        blockDimX: current.blockDimX,
        blockDimY: current.blockDimY,
        blockDimZ: current.blockDimZ,
        sharedMemBytes: current.sharedMemBytes,
        kernelParams: current.kernelParams,
        extra: current.extra,
    };
    // SAFETY: the caller's out-pointer, checked non-null.
    status(unsafe { write_out(nodeParams, older) })
}

pub unsafe fn cuGraphMemsetNodeGetParams(
    hNode: CUgraphNode,
    nodeParams: *mut CUDA_MEMSET_NODE_PARAMS,
) -> CUresult {
    status((|| {
        let (_, state) = node_state(hNode)?;
        let NodeParams::Memset {
            dst,
            value,
            element_size,
            width,
            height,
            pitch,
        } = state.params
        else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        let params =
            rgpu_cuda_api::wire::memset_params(dst, value, element_size, width, height, pitch);
        // SAFETY: the caller's out-pointer: null (refused by write_out) or writable.
        unsafe { write_out(nodeParams, params) }
    })())
}

pub unsafe fn cuGraphMemcpyNodeGetParams(
    hNode: CUgraphNode,
    nodeParams: *mut CUDA_MEMCPY3D,
) -> CUresult {
    let kept = COPY_NODES
        .lock()
        .unwrap()
        .get(&(hNode as usize))
        .map(|c| c.0);
    status((|| {
        let params = match kept {
            Some(params) => params,
            // A node the program never described (captured, cloned): its server's copy
            // between device addresses; one from a staging buffer had a host side.
            None => match node_state(hNode)?.1.params {
                NodeParams::Copy {
                    dst,
                    dst_pitch,
                    src,
                    src_pitch,
                    extent,
                } if super::memory::is_device_memory(dst)
                    && super::memory::is_device_memory(src) =>
                {
                    rgpu_cuda_api::wire::device_copy_params(dst, dst_pitch, src, src_pitch, extent)
                }
                NodeParams::Copy { .. } => {
                    return Err(crate::unsupported::not_supported(
                        "reading back a captured copy node with a host side",
                    ))
                }
                _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
            },
        };
        // SAFETY: the caller's out-pointer: null (refused by write_out) or writable.
        unsafe { write_out(nodeParams, params) }
    })())
}

/// The event an event record (`record`) or wait node uses, as the program's handle.
fn node_event(node: CUgraphNode, record: bool) -> Result<CUevent, CUresult> {
    let (object, state) = node_state(node)?;
    let id = match state.params {
        NodeParams::EventRecord { event } if record => event,
        NodeParams::EventWait { event } if !record => event,
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    };
    let event = Event::find(|e| {
        e.remote == id
            && e.context()
                .is_ok_and(|ctx| Arc::ptr_eq(&ctx.conn, &object.conn))
    })
    .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    Ok(event.handle as CUevent)
}

pub unsafe fn cuGraphEventRecordNodeGetEvent(
    hNode: CUgraphNode,
    event_out: *mut CUevent,
) -> CUresult {
    // SAFETY: the caller's out-pointer: null (refused by write_out) or writable.
    status(node_event(hNode, true).and_then(|event| unsafe { write_out(event_out, event) }))
}

pub unsafe fn cuGraphEventWaitNodeGetEvent(
    hNode: CUgraphNode,
    event_out: *mut CUevent,
) -> CUresult {
    // SAFETY: as above.
    status(node_event(hNode, false).and_then(|event| unsafe { write_out(event_out, event) }))
}

/// The graph a child node runs (its own copy of the graph it was given): a handle of the
/// program's, made the first time.
pub unsafe fn cuGraphChildGraphNodeGetGraph(hNode: CUgraphNode, phGraph: *mut CUgraph) -> CUresult {
    status((|| {
        let (node, state) = node_state(hNode)?;
        let NodeParams::Child { graph } = state.params else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        let handle = match Graph::find(|g| g.remote == graph && Arc::ptr_eq(&g.conn, &node.conn)) {
            Some(known) => known.handle as CUgraph,
            None => Graph::known_as(&node.conn, graph).into_handle(),
        };
        // SAFETY: the caller's out-pointer: null (refused by write_out) or writable.
        unsafe { write_out(phGraph, handle) }
    })())
}

/// `CUmemPoolProps` from the wire, its device the program's.
fn pool_props(node: &GraphNode, props: &PoolProps) -> CUmemPoolProps {
    let program = PoolProps {
        location_id: program_location(node, props.location_type, props.location_id),
        ..*props
    };
    rgpu_cuda_api::wire::pool_props(&program)
}

/// `CUmemAccessDesc` from the wire, its device the program's.
fn access_desc(node: &GraphNode, access: &MemAccess) -> CUmemAccessDesc {
    let program = MemAccess {
        location_id: program_location(node, access.location_type, access.location_id),
        ..access.clone()
    };
    rgpu_cuda_api::wire::access_desc(&program)
}

pub unsafe fn cuGraphMemAllocNodeGetParams(
    hNode: CUgraphNode,
    params_out: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    status((|| {
        if params_out.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (node, state) = node_state(hNode)?;
        let NodeParams::MemAlloc {
            props,
            access,
            size,
        } = &state.params
        else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        let kept = Kept {
            access: access.iter().map(|a| access_desc(&node, a)).collect(),
            ..Kept::default()
        };
        let (list, count) = (kept.access.as_ptr(), kept.access.len());
        KEPT.lock().unwrap().insert(node.handle, kept);
        let params = CUDA_MEM_ALLOC_NODE_PARAMS {
            poolProps: pool_props(&node, props),
            accessDescs: if count == 0 { std::ptr::null() } else { list },
            accessDescCount: count,
            bytesize: *size as usize,
            dptr: state.address,
        };
        // SAFETY: the caller's out-pointer, checked non-null.
        unsafe { write_out(params_out, params) }
    })())
}

pub unsafe fn cuGraphMemFreeNodeGetParams(
    hNode: CUgraphNode,
    dptr_out: *mut CUdeviceptr,
) -> CUresult {
    status((|| {
        let (_, state) = node_state(hNode)?;
        let NodeParams::MemFree { dptr } = state.params else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        // SAFETY: the caller's out-pointer: null (refused by write_out) or writable.
        unsafe { write_out(dptr_out, dptr) }
    })())
}

pub unsafe fn cuGraphHostNodeGetParams(
    hNode: CUgraphNode,
    nodeParams: *mut CUDA_HOST_NODE_PARAMS,
) -> CUresult {
    let kept = HOST_NODES.lock().unwrap().get(&(hNode as usize)).copied();
    let Some((function, data)) = kept else {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    };
    let params = CUDA_HOST_NODE_PARAMS {
        fn_: function,
        userData: data as *mut c_void,
    };
    // SAFETY: the caller's out-pointer: null (refused by write_out) or writable.
    status(unsafe { write_out(nodeParams, params) })
}

/// A kernel node of the program's, and its server.
fn kernel_node(node: CUgraphNode) -> Result<Arc<GraphNode>, CUresult> {
    GraphNode::from_handle(node).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

pub unsafe fn cuGraphKernelNodeSetAttribute(
    hNode: CUgraphNode,
    attr: u32,
    value: *const CUkernelNodeAttrValue,
) -> CUresult {
    status(kernel_node(hNode).and_then(|node| {
        if value.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the program's value union, readable as the API requires.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                value.cast::<u8>(),
                std::mem::size_of::<CUkernelNodeAttrValue>(),
            )
        }
        .to_vec();
        let attribute = rgpu_protocol::cuda::LaunchAttribute {
            id: attr,
            value: bytes,
        };
        node.conn
            .cuda()
            .graph_kernel_node_set_attribute(node.remote, attribute)
            .outcome()
    }))
}

pub unsafe fn cuGraphKernelNodeGetAttribute(
    hNode: CUgraphNode,
    attr: u32,
    value_out: *mut CUkernelNodeAttrValue,
) -> CUresult {
    status(kernel_node(hNode).and_then(|node| {
        if value_out.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = node
            .conn
            .cuda()
            .graph_kernel_node_get_attribute(node.remote, attr)
            .outcome()?;
        let n = bytes
            .len()
            .min(std::mem::size_of::<CUkernelNodeAttrValue>());
        // SAFETY: the program's value union, writable as the API requires; at most its size.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), value_out.cast::<u8>(), n) };
        Ok(())
    }))
}

pub unsafe fn cuGraphKernelNodeCopyAttributes(dst: CUgraphNode, src: CUgraphNode) -> CUresult {
    status(kernel_node(dst).and_then(|to| {
        let from = kernel_node(src)?;
        if !Arc::ptr_eq(&to.conn, &from.conn) {
            // Nodes of graphs of two servers: no driver holds both.
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        to.conn
            .cuda()
            .graph_kernel_node_copy_attributes(to.remote, from.remote)
            .outcome()
    }))
}
