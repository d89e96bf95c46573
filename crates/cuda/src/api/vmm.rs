//! Virtual memory management (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, …), as caching
//! allocators use it (PyTorch's expandable segments). Address reservations, physical
//! allocations and mappings live on the server of the device (or context) they concern; their
//! device ordinals are translated to the server's, and reserved ranges join the map of device
//! memory, so copies and other servers' allocations treat them as device memory.

use std::collections::BTreeMap;
use std::ffi::c_uint;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Mutex;

use rgpu_client::CudaClient;
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{MemAccess, MemProp};

use super::memory::{allocate, context_of, forget_device_range};
use super::{status, write_out, Outcome};
use crate::objects::PrimaryContext;
use crate::objects::{current_context, Context};

/// CU_MEM_LOCATION_TYPE_DEVICE: a location whose id is a device ordinal.
const LOCATION_DEVICE: u32 = 1;

/// The physical allocations the program holds: its handle value -> the context (address) whose
/// server holds it, and the properties the program made it with (as it gave them: its device
/// ordinals). The handle value is also the allocation's id on that server.
static HANDLES: Mutex<BTreeMap<u64, (usize, GivenProp)>> = Mutex::new(BTreeMap::new());

/// An allocation's properties as the program gave them.
#[derive(Clone, Copy)]
struct GivenProp(CUmemAllocationProp);

// SAFETY: plain values; the one pointer (Windows handle metadata) is the program's, handed
// back as it came and never followed here.
unsafe impl Send for GivenProp {}

pub(super) fn next_handle() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A device location of the program as its server's ordinal, with the device's primary context
/// (made if need be) to reach that server through.
fn device_location(location_type: u32, id: i32) -> Result<(i32, Arc<Context>), CUresult> {
    if location_type != LOCATION_DEVICE {
        return Ok((id, current_context()?));
    }
    let device = crate::servers::device(id)?;
    device.primary().ensure_created()?;
    Ok((device.remote_ordinal as i32, device.primary()))
}

/// Reads a `CUmemAllocationProp` as integers (its enum fields may hold values the enums lack)
/// and translates its device.
unsafe fn read_prop(prop: *const CUmemAllocationProp) -> Result<(MemProp, Arc<Context>), CUresult> {
    // SAFETY: null (refused) or, as the API contract makes it, a valid property struct.
    let mut wire = rgpu_cuda_api::wire::mem_prop(
        unsafe { prop.as_ref() }.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?,
    );
    let (location_id, ctx) = device_location(wire.location_type, wire.location_id)?;
    wire.location_id = location_id;
    Ok((wire, ctx))
}

pub unsafe fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    option: c_uint,
) -> CUresult {
    // SAFETY: the caller's allocation properties (null is refused).
    status(unsafe { read_prop(prop) }.and_then(|(prop, ctx)| {
        let server = ctx.conn.cuda();
        let value = server.vmm_granularity(ctx.remote, prop, option).outcome()?;
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(granularity, value as usize) }
    }))
}

pub unsafe fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: u64,
) -> CUresult {
    status(current_context().and_then(|ctx| {
        if ptr.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (server, size64) = (ctx.conn.cuda(), size as u64);
        let reserve_once = || {
            server
                .vmm_reserve(ctx.remote, size64, alignment as u64, addr, flags)
                .outcome()
        };
        let free = |at| server.vmm_address_free(ctx.remote, at, size64).outcome();
        let reserved = allocate(&ctx, size, reserve_once, |_| true, free)?;
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(ptr, reserved) }
    }))
}

pub unsafe fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    status(context_of(ptr).and_then(|ctx| {
        let server = ctx.conn.cuda();
        server
            .vmm_address_free(ctx.remote, ptr, size as u64)
            .outcome()?;
        forget_device_range(ptr);
        Ok(())
    }))
}

pub unsafe fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    // SAFETY: the caller's allocation properties (null is refused).
    status(unsafe { read_prop(prop) }.and_then(|(wire, ctx)| {
        if handle.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let id = next_handle();
        let server = ctx.conn.cuda();
        server
            .vmm_create(ctx.remote, id, size as u64, wire, flags)
            .outcome()?;
        // SAFETY: read_prop read it: non-null and valid.
        remember_handle(id, &ctx, unsafe { prop.read() });
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(handle, id) }
    }))
}

/// A physical allocation the program now holds, on `ctx`'s server, with the properties it
/// reports (as the program gave them, or as the driver described an imported one).
pub(super) fn remember_handle(id: u64, ctx: &Context, prop: CUmemAllocationProp) {
    HANDLES
        .lock()
        .unwrap()
        .insert(id, (ctx.handle() as usize, GivenProp(prop)));
}

/// The context whose server holds a physical allocation.
pub(super) fn handle_context(handle: u64) -> Result<Arc<Context>, CUresult> {
    let ctx = HANDLES.lock().unwrap().get(&handle).map(|&(ctx, _)| ctx);
    ctx.and_then(|ctx| Context::from_handle(ctx as CUcontext))
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

pub unsafe fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    status(handle_context(handle).and_then(|ctx| {
        let (size, offset) = (size as u64, offset as u64);
        let server = ctx.conn.cuda();
        server
            .vmm_map(ctx.remote, ptr, size, offset, handle, flags)
            .outcome()
    }))
}

/// The properties the allocation was made with, as the program gave them.
pub unsafe fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut CUmemAllocationProp,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    let found = HANDLES
        .lock()
        .unwrap()
        .get(&handle)
        .map(|&(_, given)| given);
    match found {
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        Some(GivenProp(given)) => status(unsafe { write_out(prop, given) }),
        None => CUresult::CUDA_ERROR_INVALID_VALUE,
    }
}

pub unsafe fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    status(handle_context(handle).and_then(|ctx| {
        ctx.conn.cuda().vmm_release(ctx.remote, handle).outcome()?;
        HANDLES.lock().unwrap().remove(&handle);
        Ok(())
    }))
}

/// Reads `count` access descriptors as integers (their enum fields may hold values the enums
/// lack), devices translated to the server's ordinals.
///
/// # Safety
/// `desc` holds `count` descriptors.
pub(crate) unsafe fn read_access(
    desc: *const CUmemAccessDesc,
    count: usize,
) -> Result<Vec<MemAccess>, CUresult> {
    (0..count)
        .map(|i| {
            // SAFETY: the caller's guarantee.
            let mut wire = rgpu_cuda_api::wire::mem_access(unsafe { &*desc.add(i) });
            wire.location_id = device_location(wire.location_type, wire.location_id)?.0;
            Ok(wire)
        })
        .collect()
}

pub unsafe fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    status(context_of(ptr).and_then(|ctx| {
        if desc.is_null() && count > 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller passes `count` descriptors.
        let access = unsafe { read_access(desc, count)? };
        let server = ctx.conn.cuda();
        server
            .vmm_set_access(ctx.remote, ptr, size as u64, access)
            .outcome()
    }))
}

pub unsafe fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    status(context_of(ptr).and_then(|ctx| {
        ctx.conn
            .cuda()
            .vmm_unmap(ctx.remote, ptr, size as u64)
            .outcome()
    }))
}
