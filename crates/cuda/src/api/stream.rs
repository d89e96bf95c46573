//! Streams. Creation, destruction and event waits are posted; synchronization and queries wait.

use std::ffi::{c_int, c_uint};
use std::sync::Arc;

use rgpu_client::CudaClient;
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{Id, LaunchAttribute};

use super::memory::take_async_read_error;
use super::{status, write_out, Outcome};
use crate::objects::{capture_of, current_context, resolve_stream, Context, Event, Stream};

pub unsafe fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuStreamCreateWithPriority(stream, flags, 0) }
}

pub unsafe fn cuStreamCreateWithPriority(
    out: *mut CUstream,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    status(current_context().and_then(|ctx| {
        if out.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let stream = Stream::new(&ctx, flags, priority);
        let server = ctx.conn.cuda();
        server
            .create_stream(stream.remote, ctx.remote, flags, priority)
            .outcome()?;
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(out, stream.into_handle()) }
    }))
}

pub unsafe fn cuStreamDestroy_v2(stream: CUstream) -> CUresult {
    status((|| {
        // Only a stream of the program's own (not a default stream) can be destroyed.
        Stream::from_handle(stream).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let (ctx, id) = resolve_stream(stream)?;
        ctx.conn.cuda().destroy_stream(id).outcome()?;
        Stream::destroy(stream);
        Ok(())
    })())
}

pub(crate) fn synchronize_stream(ctx: &Context, stream: Id) -> Result<(), CUresult> {
    super::host_mirror::synchronized(ctx, || {
        super::event::learning_completions(&ctx.conn, || {
            ctx.conn
                .cuda()
                .stream_synchronize(ctx.remote, stream)
                .outcome()
        })
    })?;
    take_async_read_error()
}

pub unsafe fn cuStreamSynchronize(stream: CUstream) -> CUresult {
    status(resolve_stream(stream).and_then(|(ctx, id)| synchronize_stream(&ctx, id)))
}

pub unsafe fn cuStreamQuery(stream: CUstream) -> CUresult {
    status(resolve_stream(stream).and_then(|(ctx, id)| {
        super::host_mirror::synchronized(&ctx, || {
            ctx.conn.cuda().stream_query(ctx.remote, id).outcome()
        })
    }))
}

pub unsafe fn cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint) -> CUresult {
    status(resolve_stream(stream).and_then(|(ctx, id)| {
        let event = Event::from_handle(event).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let owner = event.context()?;
        if !Arc::ptr_eq(&owner.conn, &ctx.conn) {
            return wait_across_servers(&owner, event.remote, &ctx, id);
        }
        let server = ctx.conn.cuda();
        server
            .stream_wait_event(ctx.remote, id, event.remote, flags)
            .outcome()?;
        super::graph::note_wait(stream, event.handle);
        Ok(())
    }))
}

/// `stream` (of `ctx`) waits for an event of another server, the wait resolved between the
/// servers: the event's server exports the event's completion (as recorded now) and the
/// stream's server pulls that export of no bytes in the stream's order. Both are posted.
fn wait_across_servers(
    owner: &Context,
    event: Id,
    ctx: &Context,
    stream: Id,
) -> Result<(), CUresult> {
    let ticket = rgpu_client::new_ticket();
    owner
        .conn
        .cuda()
        .export_event(owner.remote, event, ticket)
        .outcome()?;
    let export = rgpu_protocol::PeerExport {
        endpoint: owner.conn.endpoint().to_string(),
        session: owner.conn.session_id(),
        ticket,
    };
    ctx.conn
        .cuda()
        .pull_range(ctx.remote, Some(stream), 0, 0, export, false)
        .outcome()
}

pub unsafe fn cuStreamSetAttribute(
    stream: CUstream,
    attribute: u32,
    value: *const CUstreamAttrValue,
) -> CUresult {
    status(resolve_stream(stream).and_then(|(ctx, id)| {
        if value.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the program's value union, readable as the API requires.
        let bytes = unsafe {
            std::slice::from_raw_parts(value.cast::<u8>(), std::mem::size_of::<CUstreamAttrValue>())
        }
        .to_vec();
        let attribute = LaunchAttribute {
            id: attribute,
            value: bytes,
        };
        ctx.conn
            .cuda()
            .stream_set_attribute(ctx.remote, id, attribute)
            .outcome()
    }))
}

pub unsafe fn cuStreamGetAttribute(
    stream: CUstream,
    attribute: u32,
    value: *mut CUstreamAttrValue,
) -> CUresult {
    status(resolve_stream(stream).and_then(|(ctx, id)| {
        if value.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = ctx
            .conn
            .cuda()
            .stream_get_attribute(ctx.remote, id, attribute)
            .outcome()?;
        let n = bytes.len().min(std::mem::size_of::<CUstreamAttrValue>());
        // SAFETY: the program's value union, writable as the API requires; at most its size.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), value.cast::<u8>(), n) };
        Ok(())
    }))
}

pub unsafe fn cuStreamGetPriority(stream: CUstream, priority: *mut c_int) -> CUresult {
    let value = Stream::from_handle(stream).map_or(0, |s| s.priority);
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
    status(unsafe { write_out(priority, value) })
}

pub unsafe fn cuStreamGetFlags(stream: CUstream, flags: *mut c_uint) -> CUresult {
    let value = Stream::from_handle(stream).map_or(0, |s| s.flags);
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
    status(unsafe { write_out(flags, value) })
}

pub unsafe fn cuStreamGetCtx(stream: CUstream, pctx: *mut CUcontext) -> CUresult {
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
    status(resolve_stream(stream).and_then(|(ctx, _)| unsafe { write_out(pctx, ctx.handle()) }))
}

pub unsafe fn cuStreamGetDevice(stream: CUstream, device: *mut CUdevice) -> CUresult {
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
    status(resolve_stream(stream).and_then(|(ctx, _)| unsafe { write_out(device, ctx.device) }))
}

pub unsafe fn cuStreamGetId(stream: CUstream, id: *mut u64) -> CUresult {
    status(resolve_stream(stream).and_then(|_| {
        let value =
            crate::objects::stream_unique_id(stream).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(id, value) }
    }))
}

/// Capture state is kept on the client (the server records the stream's work): answering
/// these costs nothing, which matters because allocators ask before every allocation.
pub unsafe fn cuStreamIsCapturing(stream: CUstream, capture_status: *mut c_uint) -> CUresult {
    status(
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        resolve_stream(stream).and_then(|_| unsafe {
            write_out(capture_status, (capture_of(stream) != 0) as c_uint)
        }),
    )
}

pub unsafe fn cuStreamGetCaptureInfo_v2(
    stream: CUstream,
    capture_status: *mut c_uint,
    id: *mut u64,
    graph: *mut CUgraph,
    dependencies: *mut *const CUgraphNode,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the caller's out-pointers, each null (refused or skipped) or writable.
    status(resolve_stream(stream).and_then(|_| unsafe {
        let capture = capture_of(stream);
        if capture_status.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if capture != 0 && !(graph.is_null() && dependencies.is_null() && count.is_null()) {
            for_optional(id, capture);
            return super::graph::capture_info(
                stream,
                capture,
                capture_status,
                graph,
                dependencies,
                count,
            );
        }
        write_out(capture_status, (capture != 0) as c_uint)?;
        for_optional(id, capture);
        // Not capturing: no graph, no dependencies.
        for_optional(graph, std::ptr::null_mut());
        for_optional(dependencies, std::ptr::null());
        for_optional(count, 0);
        Ok(())
    }))
}

pub unsafe fn cuStreamGetCaptureInfo_v3(
    stream: CUstream,
    capture_status: *mut c_uint,
    id: *mut u64,
    graph: *mut CUgraph,
    dependencies: *mut *const CUgraphNode,
    edges: *mut *const CUgraphEdgeData,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the caller's optional out-pointer: null or writable.
    unsafe { for_optional(edges, std::ptr::null()) };
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuStreamGetCaptureInfo_v2(stream, capture_status, id, graph, dependencies, count) }
}

/// Writes `value` through an optional out-pointer of the API (skipped when null).
///
/// # Safety
/// `out` is null or writable.
pub(crate) unsafe fn for_optional<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: a non-null out-pointer of the API is writable.
        unsafe { out.write(value) };
    }
}

/// Host functions run on the client, in stream order: the call waits for the stream's earlier
/// work, then runs the function on the calling thread, so work queued after it starts after it.
pub unsafe fn cuLaunchHostFunc(
    stream: CUstream,
    function: CUhostFn,
    user_data: *mut std::ffi::c_void,
) -> CUresult {
    let Some(function) = function else {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    };
    let capture = crate::objects::capture_of(stream);
    if capture != 0 {
        // Captured: the graph's launches call it (graph_host_work.rs).
        let call = super::graph_host_work::HostCall {
            function,
            data: user_data as usize,
        };
        let work = super::graph_host_work::Work::Call(std::sync::Arc::new(call));
        super::graph_host_work::note_captured(capture, work);
        return CUresult::CUDA_SUCCESS;
    }
    status(resolve_stream(stream).and_then(|(ctx, id)| {
        synchronize_stream(&ctx, id)?;
        // SAFETY: the program's callback with the program's data, as the driver would call it.
        unsafe { function(user_data) };
        Ok(())
    }))
}

/// Like [`cuLaunchHostFunc`]; the callback also gets the stream and the status of its work.
pub unsafe fn cuStreamAddCallback(
    stream: CUstream,
    callback: CUstreamCallback,
    user_data: *mut std::ffi::c_void,
    flags: c_uint,
) -> CUresult {
    let Some(callback) = callback else {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    };
    if flags != 0 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    status(resolve_stream(stream).map(|(ctx, id)| {
        let outcome = synchronize_stream(&ctx, id);
        let code = outcome.err().unwrap_or(CUresult::CUDA_SUCCESS);
        // SAFETY: as above.
        unsafe { callback(stream, code, user_data) };
    }))
}
