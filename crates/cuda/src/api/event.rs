//! Events. Creation, records and destruction are posted; synchronization, queries and timing
//! wait for the server.

use std::ffi::c_uint;

use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{CuReply, CuRequest};

use super::context::{call, call_status, post, unexpected};
use super::memory::take_async_read_error;
use super::{from_remote, status, write_out};
use crate::objects::{current_context, resolve_stream, Event};

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(out: *mut CUevent, flags: c_uint) -> CUresult {
    status(current_context().and_then(|ctx| {
        if out.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let event = Event::new(ctx, flags);
        let request = CuRequest::CreateEvent {
            id: event.remote,
            ctx: ctx.remote,
            flags,
        };
        post(ctx, request, &[])?;
        unsafe { write_out(out, event.into_handle()) }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(event: CUevent) -> CUresult {
    status((|| {
        let object = Event::from_handle(event).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let ctx = object.context()?;
        post(ctx, CuRequest::DestroyEvent { id: object.remote }, &[])?;
        // SAFETY: the program gives the handle up by destroying it.
        drop(unsafe { Event::destroy(event) });
        Ok(())
    })())
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(event: CUevent, stream: CUstream) -> CUresult {
    unsafe { cuEventRecordWithFlags(event, stream, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecordWithFlags(
    event: CUevent,
    stream: CUstream,
    flags: c_uint,
) -> CUresult {
    status(resolve_stream(stream).and_then(|(ctx, stream)| {
        let event = Event::from_handle(event).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let request = CuRequest::RecordEvent {
            ctx: ctx.remote,
            event: event.remote,
            stream,
            flags,
        };
        post(ctx, request, &[])
    }))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(event: CUevent) -> CUresult {
    status((|| {
        let event = Event::from_handle(event).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        call_status(
            event.context()?,
            CuRequest::EventSynchronize {
                event: event.remote,
            },
        )?;
        take_async_read_error()
    })())
}

#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(event: CUevent) -> CUresult {
    status((|| {
        let event = Event::from_handle(event).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        call_status(
            event.context()?,
            CuRequest::EventQuery {
                event: event.remote,
            },
        )
    })())
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    milliseconds: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    status((|| {
        let start = Event::from_handle(start).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let end = Event::from_handle(end).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let request = CuRequest::EventElapsedTime {
            start: start.remote,
            end: end.remote,
        };
        match call(start.context()?, request)? {
            CuReply::Elapsed {
                status,
                milliseconds: ms,
            } => {
                from_remote(status)?;
                unsafe { write_out(milliseconds, ms) }
            }
            other => Err(unexpected(other)),
        }
    })())
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    milliseconds: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    unsafe { cuEventElapsedTime_v2(milliseconds, start, end) }
}
