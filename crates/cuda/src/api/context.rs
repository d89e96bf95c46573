//! Contexts. The current context is per thread and kept on the client; requests carry the
//! context they run in, so switching contexts never costs a round trip.

use std::ffi::{c_int, c_uint};
use std::sync::atomic::Ordering;

use rgpu_client::CudaClient;
use rgpu_cuda_api::sys::*;

use super::{status, write_out, Outcome};
use crate::objects::{self, context_or_current, current_context, Context, ContextKind};
use crate::servers::{self, device};

pub unsafe fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    _params: *mut CUctxCreateParams,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    status(device(dev).and_then(|device| {
        if pctx.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // A new context lives in a new session if the device's server was lost and is back.
        let ctx = Context::new(&device.link.connection(), dev, ContextKind::Explicit, flags);
        ctx.ensure_created()?;
        let handle = ctx.into_handle();
        objects::push_current(handle);
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(pctx, handle) }
    }))
}

pub unsafe fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    _affinity: *mut CUexecAffinityParam,
    _count: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuCtxCreate_v4(pctx, std::ptr::null_mut(), flags, dev) }
}

pub unsafe fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuCtxCreate_v4(pctx, std::ptr::null_mut(), flags, dev) }
}

pub unsafe fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    status((|| {
        servers::servers()?;
        let context = Context::from_handle(ctx).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        if context.kind == ContextKind::Primary {
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        crate::export_tables::context_destroyed(ctx);
        super::host_mirror::forget_context(&context);
        super::ipc::forget_mappings_of(&context);
        context
            .conn
            .cuda()
            .destroy_context(context.remote)
            .outcome()?;
        if objects::current_handle() == ctx {
            objects::pop_current();
        }
        Context::destroy(ctx);
        Ok(())
    })())
}

pub unsafe fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
    status(servers::servers().and_then(|_| unsafe { write_out(pctx, objects::current_handle()) }))
}

pub unsafe fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    status(servers::servers().and_then(|_| {
        if !ctx.is_null() {
            Context::from_handle(ctx).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        }
        objects::set_current(ctx);
        Ok(())
    }))
}

pub unsafe fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    status(servers::servers().and_then(|_| {
        Context::from_handle(ctx).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        objects::push_current(ctx);
        Ok(())
    }))
}

pub unsafe fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    status(servers::servers().and_then(|_| {
        let popped = objects::pop_current().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        if !pctx.is_null() {
            // SAFETY: `pctx` is the caller's out-pointer, checked non-null.
            unsafe { pctx.write(popped) };
        }
        Ok(())
    }))
}

pub unsafe fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
    status(current_context().and_then(|ctx| unsafe { write_out(dev, ctx.device) }))
}

pub unsafe fn cuCtxGetDevice_v2(dev: *mut CUdevice, ctx: CUcontext) -> CUresult {
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
    status(context_or_current(ctx).and_then(|ctx| unsafe { write_out(dev, ctx.device) }))
}

pub unsafe fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    status(
        current_context()
            // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
            .and_then(|ctx| unsafe { write_out(flags, ctx.flags.load(Ordering::Relaxed)) }),
    )
}

pub unsafe fn cuCtxGetId(ctx: CUcontext, id: *mut u64) -> CUresult {
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
    status(context_or_current(ctx).and_then(|ctx| unsafe { write_out(id, ctx.unique_id) }))
}

pub unsafe fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint) -> CUresult {
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
    status(context_or_current(ctx).and_then(|_| unsafe { write_out(version, 13000) }))
}

pub unsafe fn cuCtxSynchronize() -> CUresult {
    status(current_context().and_then(|ctx| synchronize(&ctx)))
}

pub unsafe fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult {
    status(context_or_current(ctx).and_then(|ctx| synchronize(&ctx)))
}

pub unsafe fn cuCtxResetPersistingL2Cache() -> CUresult {
    status(current_context().and_then(|ctx| {
        ctx.conn
            .cuda()
            .reset_persisting_l2_cache(ctx.remote)
            .outcome()
    }))
}

pub(crate) fn synchronize(ctx: &Context) -> Result<(), CUresult> {
    super::host_mirror::synchronized(ctx, || {
        super::event::learning_completions(&ctx.conn, || {
            ctx.conn.cuda().synchronize(ctx.remote).outcome()
        })
    })
}

pub unsafe fn cuCtxGetLimit(value: *mut usize, limit: c_uint) -> CUresult {
    status(current_context().and_then(|ctx| {
        let v = ctx.conn.cuda().get_limit(ctx.remote, limit).outcome()?;
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(value, v as usize) }
    }))
}

pub unsafe fn cuCtxSetLimit(limit: c_uint, value: usize) -> CUresult {
    status(current_context().and_then(|ctx| {
        let server = ctx.conn.cuda();
        server.set_limit(ctx.remote, limit, value as u64).outcome()
    }))
}

pub unsafe fn cuProfilerStart() -> CUresult {
    status(current_context().and_then(|ctx| ctx.conn.cuda().profiler(ctx.remote, true).outcome()))
}

pub unsafe fn cuProfilerStop() -> CUresult {
    status(current_context().and_then(|ctx| ctx.conn.cuda().profiler(ctx.remote, false).outcome()))
}

pub unsafe fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) -> CUresult {
    // SAFETY: the caller's out-pointers, each written only when non-null.
    status(current_context().map(|_| unsafe {
        // The driver's range on every GPU it supports: 0 (lowest) to -5 (highest).
        if !least.is_null() {
            least.write(0);
        }
        if !greatest.is_null() {
            greatest.write(-5);
        }
    }))
}

pub unsafe fn cuCtxGetCacheConfig(config: *mut c_uint) -> CUresult {
    status(
        current_context()
            // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
            .and_then(|ctx| unsafe { write_out(config, ctx.cache_config.load(Ordering::Relaxed)) }),
    )
}

pub unsafe fn cuCtxSetCacheConfig(config: c_uint) -> CUresult {
    // A preference only; the server's GPUs decide their cache split per kernel.
    status(current_context().map(|ctx| ctx.cache_config.store(config, Ordering::Relaxed)))
}

/// `cuCtxEnablePeerAccess` (`flags` given) or `cuCtxDisablePeerAccess` from the current
/// context to `peer`: the server of both decides; contexts of different servers never share
/// memory.
fn peer_access(peer: CUcontext, flags: Option<c_uint>) -> Result<(), CUresult> {
    let ctx = current_context()?;
    let peer = Context::from_handle(peer).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    if !std::sync::Arc::ptr_eq(&ctx.conn, &peer.conn) {
        return Err(match flags {
            Some(_) => CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
            None => CUresult::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
        });
    }
    peer.ensure_created()?;
    let server = ctx.conn.cuda();
    match flags {
        Some(flags) => server.enable_peer_access(ctx.remote, peer.remote, flags),
        None => server.disable_peer_access(ctx.remote, peer.remote),
    }
    .outcome()
}

pub unsafe fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) -> CUresult {
    status(peer_access(peer, Some(flags)))
}

pub unsafe fn cuCtxDisablePeerAccess(peer: CUcontext) -> CUresult {
    status(peer_access(peer, None))
}
