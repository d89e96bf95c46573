//! Graph entry points of CUDA 10 to 12.2, which programs built against those toolkits still
//! ask `cuGetProcAddress` for by their version (a CUDA 12.1 runtime asks for
//! `cuGraphAddDependencies` without edge data, a CUDA 11 one for `cuGraphAddKernelNode` with
//! the shorter parameter struct): each is the current entry point with what it lacks filled
//! in.

use std::ffi::c_void;

use rgpu_cuda_api::sys::*;

use super::graph_nodes as current;

/// The CUDA 11 kernel node parameters (no `kern`, no `ctx`), as the current struct.
///
/// # Safety
/// `params` is null or valid for reading.
unsafe fn kernel_params_v2(
    params: *const CUDA_KERNEL_NODE_PARAMS_v1,
) -> Option<CUDA_KERNEL_NODE_PARAMS> {
    // SAFETY: the caller's guarantee.
    let p = unsafe { params.as_ref() }?;
    Some(CUDA_KERNEL_NODE_PARAMS {
        func: p.func,
        gridDimX: p.gridDimX,
        gridDimY: p.gridDimY,
        gridDimZ: p.gridDimZ,
        blockDimX: p.blockDimX,
        blockDimY: p.blockDimY,
        blockDimZ: p.blockDimZ,
        sharedMemBytes: p.sharedMemBytes,
        kernelParams: p.kernelParams,
        extra: p.extra,
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    })
}

/// A pointer to `params`, or null where there were none (the current entry point refuses it).
fn or_null(params: &Option<CUDA_KERNEL_NODE_PARAMS>) -> *const CUDA_KERNEL_NODE_PARAMS {
    params.as_ref().map_or(std::ptr::null(), |p| p as *const _)
}

pub unsafe fn cuGraphAddKernelNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *const CUDA_KERNEL_NODE_PARAMS_v1,
) -> CUresult {
    // SAFETY: the program's descriptor, valid as the API requires.
    let params = unsafe { kernel_params_v2(params) };
    // SAFETY: the caller's arguments, the descriptor converted.
    unsafe { current::cuGraphAddKernelNode_v2(node, graph, deps, count, or_null(&params)) }
}

pub unsafe fn cuGraphKernelNodeSetParams(
    node: CUgraphNode,
    params: *const CUDA_KERNEL_NODE_PARAMS_v1,
) -> CUresult {
    // SAFETY: as above.
    let params = unsafe { kernel_params_v2(params) };
    // SAFETY: as above.
    unsafe { current::cuGraphKernelNodeSetParams_v2(node, or_null(&params)) }
}

pub unsafe fn cuGraphExecKernelNodeSetParams(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const CUDA_KERNEL_NODE_PARAMS_v1,
) -> CUresult {
    // SAFETY: as above.
    let params = unsafe { kernel_params_v2(params) };
    // SAFETY: as above.
    unsafe { current::cuGraphExecKernelNodeSetParams_v2(exec, node, or_null(&params)) }
}

pub unsafe fn cuGraphAddDependencies(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    count: usize,
) -> CUresult {
    // SAFETY: the caller's lists; plain edges.
    unsafe { current::cuGraphAddDependencies_v2(graph, from, to, std::ptr::null(), count) }
}

pub unsafe fn cuGraphRemoveDependencies(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    count: usize,
) -> CUresult {
    // SAFETY: as above.
    unsafe { current::cuGraphRemoveDependencies_v2(graph, from, to, std::ptr::null(), count) }
}

pub unsafe fn cuGraphNodeGetDependencies(
    node: CUgraphNode,
    deps: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the caller's list and count; no edge data asked.
    unsafe { current::cuGraphNodeGetDependencies_v2(node, deps, std::ptr::null_mut(), count) }
}

pub unsafe fn cuGraphNodeGetDependentNodes(
    node: CUgraphNode,
    dependents: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    // SAFETY: as above.
    unsafe {
        current::cuGraphNodeGetDependentNodes_v2(node, dependents, std::ptr::null_mut(), count)
    }
}

pub unsafe fn cuGraphAddNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *mut CUgraphNodeParams,
) -> CUresult {
    // SAFETY: the caller's arguments; plain edges.
    unsafe { current::cuGraphAddNode_v2(node, graph, deps, std::ptr::null(), count, params) }
}

/// CUDA 10.2 to 11: the verdict and the failing node as two out-values.
pub unsafe fn cuGraphExecUpdate(
    exec: CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    verdict: *mut u32,
) -> CUresult {
    // SAFETY: plain values, valid zeroed.
    let mut info: CUgraphExecUpdateResultInfo = unsafe { std::mem::zeroed() };
    // SAFETY: the caller's handles and a local record.
    let status = unsafe { current::cuGraphExecUpdate_v2(exec, graph, &mut info) };
    // SAFETY: the caller's out-pointers, each null or writable.
    unsafe {
        if !error_node.is_null() {
            error_node.write(info.errorNode);
        }
        if !verdict.is_null() {
            verdict.write(*std::ptr::addr_of!(info.result).cast::<u32>());
        }
    }
    status
}

/// The CUDA 10 capture query: status and id only.
pub unsafe fn cuStreamGetCaptureInfo(
    stream: CUstream,
    capture_status: *mut u32,
    id: *mut u64,
) -> CUresult {
    let none: *mut c_void = std::ptr::null_mut();
    // SAFETY: the caller's out-pointers; the rest not asked.
    unsafe {
        super::stream::cuStreamGetCaptureInfo_v2(
            stream,
            capture_status,
            id,
            none.cast(),
            none.cast(),
            none.cast(),
        )
    }
}

pub unsafe fn cuEventDestroy(event: CUevent) -> CUresult {
    // SAFETY: the caller's handle.
    unsafe { super::event::cuEventDestroy_v2(event) }
}

pub unsafe fn cuStreamDestroy(stream: CUstream) -> CUresult {
    // SAFETY: the caller's handle.
    unsafe { super::stream::cuStreamDestroy_v2(stream) }
}
