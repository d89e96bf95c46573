//! Events. Creation, records and destruction are posted; timing waits for the server, and so
//! do synchronizations and queries unless the client knows the event's latest record has
//! completed: a successful synchronization's reply comes after the server's list of recorded
//! events that completed (`CuEventsDone`, with each one's record count), which the client keeps
//! until the event is recorded again or a graph is launched (a graph may record any event).

use std::collections::HashMap;
use std::ffi::c_uint;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rgpu_client::CudaClient;
use rgpu_cuda_api::sys::*;

use super::memory::take_async_read_error;
use super::{status, write_out, Outcome};
use crate::objects::{current_context, resolve_stream, Context, Event};
use rgpu_protocol::cuda::Id;

/// Graph launches so far: knowledge learned before the latest one is stale.
static GRAPH_LAUNCHES: AtomicU64 = AtomicU64::new(0);

/// Per (connection, event): the record count whose completion the server reported, and the
/// graph launches counted when the synchronization that reported it was sent.
type Completions = HashMap<(usize, Id), (u64, u64)>;

fn completions() -> std::sync::MutexGuard<'static, Completions> {
    static KNOWN: std::sync::LazyLock<Mutex<Completions>> =
        std::sync::LazyLock::new(Default::default);
    KNOWN.lock().unwrap_or_else(|e| e.into_inner())
}

fn connection_key(conn: &Arc<rgpu_client::Connection>) -> usize {
    Arc::as_ptr(conn) as usize
}

/// A graph is about to be launched: it may record events, so what the client knew of their
/// completion no longer holds.
pub(crate) fn graph_launched() {
    GRAPH_LAUNCHES.fetch_add(1, Ordering::SeqCst);
}

/// Runs `sync`, a synchronization request to `conn`'s server, and keeps what its reply said
/// of recorded events that completed.
pub(crate) fn learning_completions<T>(
    conn: &Arc<rgpu_client::Connection>,
    sync: impl FnOnce() -> Result<T, CUresult>,
) -> Result<T, CUresult> {
    let launches = GRAPH_LAUNCHES.load(Ordering::SeqCst);
    let result = sync();
    let done = rgpu_client::take_done_records();
    if result.is_ok() && !done.is_empty() {
        let key = connection_key(conn);
        let mut known = completions();
        for (event, records) in done {
            known.insert((key, event), (records, launches));
        }
    }
    result
}

/// Whether `event`'s latest record is known to have completed (then its query and
/// synchronization need not ask the server).
fn known_complete(event: &Event, ctx: &Context) -> bool {
    let records = event.records.load(Ordering::SeqCst);
    event.local_answers
        && records > 0
        && !super::host_mirror::active(ctx)
        && completions().get(&(connection_key(&ctx.conn), event.remote))
            == Some(&(records, GRAPH_LAUNCHES.load(Ordering::SeqCst)))
}

pub unsafe fn cuEventCreate(out: *mut CUevent, flags: c_uint) -> CUresult {
    status(current_context().and_then(|ctx| {
        if out.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut event = Event::new(&ctx);
        // Another process may record an interprocess event.
        event.local_answers = flags & CUevent_flags_enum::CU_EVENT_INTERPROCESS as c_uint == 0;
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
        completions().remove(&(connection_key(&ctx.conn), object.remote));
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
        // Counted before the record leaves: a completion reported meanwhile is an older one's.
        object.records.fetch_add(1, Ordering::SeqCst);
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
    if let Some(object) = Event::from_handle(hEvent) {
        object.records.fetch_add(1, Ordering::SeqCst);
    }
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
        if !known_complete(&event, &ctx) {
            super::host_mirror::synchronized(&ctx, || {
                learning_completions(&ctx.conn, || {
                    ctx.conn.cuda().event_synchronize(event.remote).outcome()
                })
            })?;
        }
        take_async_read_error()
    })())
}

pub unsafe fn cuEventQuery(event: CUevent) -> CUresult {
    status((|| {
        let event = Event::from_handle(event).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let ctx = event.context()?;
        if known_complete(&event, &ctx) {
            return Ok(());
        }
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
