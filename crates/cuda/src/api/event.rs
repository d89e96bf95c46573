//! Events. Creation, records and destruction are posted; synchronization, queries and timing
//! wait for the server.

use std::ffi::c_uint;
use std::sync::Arc;

use rgpu_client::CudaClient;
use rgpu_cuda_api::sys::*;

use super::memory::take_async_read_error;
use super::{status, write_out, Outcome};
use crate::objects::{current_context, resolve_stream, Context, Event};
use rgpu_protocol::cuda::Id;

pub unsafe fn cuEventCreate(out: *mut CUevent, flags: c_uint) -> CUresult {
    status(current_context().and_then(|ctx| {
        if out.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let event = Event::new(&ctx);
        let server = ctx.conn.cuda();
        server
            .create_event(event.remote, ctx.remote, flags)
            .outcome()?;
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(out, event.into_handle()) }
    }))
}

pub unsafe fn cuEventDestroy_v2(event: CUevent) -> CUresult {
    status((|| {
        let object = Event::from_handle(event).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let ctx = object.context()?;
        ctx.conn.cuda().destroy_event(object.remote).outcome()?;
        Event::destroy(event);
        Ok(())
    })())
}

pub unsafe fn cuEventRecord(event: CUevent, stream: CUstream) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuEventRecordWithFlags(event, stream, 0) }
}

pub unsafe fn cuEventRecordWithFlags(event: CUevent, stream: CUstream, flags: c_uint) -> CUresult {
    status(resolve_stream(stream).and_then(|(ctx, stream_id)| {
        let object = Event::from_handle(event).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let server = ctx.conn.cuda();
        server
            .record_event(ctx.remote, object.remote, stream_id, flags)
            .outcome()?;
        super::graph::note_record(object.handle, crate::objects::capture_of(stream));
        Ok(())
    }))
}

/// The context and event of a context-wide event call, on one server.
fn context_and_event(ctx: CUcontext, event: CUevent) -> Result<(Arc<Context>, Id), CUresult> {
    let ctx = Context::from_handle(ctx).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    let event = Event::from_handle(event).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    if !Arc::ptr_eq(&event.context()?.conn, &ctx.conn) {
        return Err(crate::unsupported::not_supported(
            "context-wide event calls with an event of another server",
        ));
    }
    Ok((ctx, event.remote))
}

pub unsafe fn cuCtxRecordEvent(hCtx: CUcontext, hEvent: CUevent) -> CUresult {
    status(context_and_event(hCtx, hEvent).and_then(|(ctx, event)| {
        ctx.conn
            .cuda()
            .ctx_record_event(ctx.remote, event)
            .outcome()
    }))
}

pub unsafe fn cuCtxWaitEvent(hCtx: CUcontext, hEvent: CUevent) -> CUresult {
    status(
        context_and_event(hCtx, hEvent)
            .and_then(|(ctx, event)| ctx.conn.cuda().ctx_wait_event(ctx.remote, event).outcome()),
    )
}

pub unsafe fn cuEventSynchronize(event: CUevent) -> CUresult {
    status((|| {
        let event = Event::from_handle(event).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let ctx = event.context()?;
        super::host_mirror::synchronized(&ctx, || {
            ctx.conn.cuda().event_synchronize(event.remote).outcome()
        })?;
        take_async_read_error()
    })())
}

pub unsafe fn cuEventQuery(event: CUevent) -> CUresult {
    status((|| {
        let event = Event::from_handle(event).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let ctx = event.context()?;
        super::host_mirror::synchronized(&ctx, || {
            ctx.conn.cuda().event_query(event.remote).outcome()
        })
    })())
}

pub unsafe fn cuEventElapsedTime_v2(
    milliseconds: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    status((|| {
        let start = Event::from_handle(start).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let end = Event::from_handle(end).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let ctx = start.context()?;
        let server = ctx.conn.cuda();
        let ms = server
            .event_elapsed_time(start.remote, end.remote)
            .outcome()?;
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(milliseconds, ms) }
    })())
}

pub unsafe fn cuEventElapsedTime(milliseconds: *mut f32, start: CUevent, end: CUevent) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuEventElapsedTime_v2(milliseconds, start, end) }
}
