//! Managed memory: allocated on the server's device, seen by the program at the same address
//! through a host view paged on demand ([`crate::host_view`], docs/managed-memory.md).
//! [`before_device_work`] hands it to the device ahead of every launch, copy and memset;
//! prefetch, advice and stream attachment go to the server's driver.

use std::ffi::{c_uint, c_void};
use std::sync::Arc;

use rgpu_client::CudaClient;
use rgpu_cuda_api::sys::*;

use super::copy::{read_linear, write_linear};
use super::memory::{allocate, context_of, note_async_read_error};
use super::stream::synchronize_stream;
use super::{status, write_out, Outcome};
use crate::host_view::{self, Backing};
use crate::objects::{capture_of, current_context, resolve_stream, Context};

const CU_MEM_ATTACH_GLOBAL: u32 = 1;
const CU_MEM_ATTACH_HOST: u32 = 2;
const CU_MEM_ATTACH_SINGLE: u32 = 4;

/// `CUmemLocationType` values, as integers.
const LOCATION_DEVICE: u32 = 1;
const LOCATION_HOST: u32 = 2;
/// `CU_DEVICE_CPU`: the host, where a device ordinal is asked for.
const DEVICE_CPU: i32 = -1;

/// Gives managed memory to the device before work on `stream` (None: the legacy default
/// stream) that may touch it: the host's changes are written back and its view dropped until
/// it touches the memory again. Work captured into a graph runs later: its launch hands over.
pub(crate) fn before_device_work(stream: Option<CUstream>) {
    if stream.is_none_or(|s| capture_of(s) == 0) {
        host_view::hand_over();
    }
}

/// The device copy of a managed allocation, read and written through its context's server.
struct OnServer {
    ctx: Arc<Context>,
}

impl Backing for OnServer {
    fn fetch(&self, address: u64, into: *mut u8, len: usize) -> Result<(), CUresult> {
        let fetched = read_linear(&self.ctx, address, into, len);
        if let Err(e) = fetched {
            // A fault cannot return an error: the program hears of it at its next sync.
            note_async_read_error(e as u32);
        }
        fetched
    }

    fn write_back(&self, runs: &[(u64, &[u8])]) -> Result<(), CUresult> {
        let written = runs
            .iter()
            .try_for_each(|&(address, bytes)| write_linear(&self.ctx, address, bytes))
            // Work on any stream, blocking or not, must see the bytes: wait until they are
            // there.
            .and_then(|()| synchronize_stream(&self.ctx, 0));
        if let Err(e) = written {
            // Handing over happens before work that may not touch this memory: the failure
            // reaches the program at its next synchronization.
            note_async_read_error(e as u32);
        }
        written
    }
}

pub unsafe fn cuMemAllocManaged(dptr: *mut CUdeviceptr, size: usize, flags: c_uint) -> CUresult {
    status(current_context().and_then(|ctx| {
        if dptr.is_null()
            || size == 0
            || !matches!(flags, CU_MEM_ATTACH_GLOBAL | CU_MEM_ATTACH_HOST)
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // Whole pages, so that the driver packs allocations on page boundaries and each
        // host view has its pages to itself.
        let asked = size.div_ceil(host_view::PAGE) * host_view::PAGE;
        let server = ctx.conn.cuda();
        let allocate_once = || {
            server
                .mem_alloc_managed(ctx.remote, asked as u64, flags)
                .outcome()
        };
        let free = |ptr| server.mem_free(ctx.remote, ptr).outcome();
        // The host view must sit at the device address: an address this process already uses
        // is given back and another asked for.
        let claim = |ptr: u64| match host_view::register(
            ptr,
            size,
            Box::new(OnServer { ctx: ctx.clone() }),
        ) {
            Ok(()) => true,
            Err(e) => {
                log::debug!("rgpu: managed memory at {ptr:#x} has no host view here: {e}");
                false
            }
        };
        let ptr = allocate(&ctx, size, allocate_once, claim, free)?;
        // SAFETY: an out-pointer from the caller: null (refused above) or writable.
        unsafe { write_out(dptr, ptr) }
    }))
}

/// The context of the managed allocation holding `ptr..ptr + size`.
fn managed_context(ptr: CUdeviceptr, size: usize) -> Result<Arc<Context>, CUresult> {
    match host_view::find(ptr) {
        Some((start, len)) if size > 0 && ptr + size as u64 <= start + len as u64 => {
            context_of(ptr)
        }
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// A `CUmemLocation` as its server names it: a device ordinal becomes the server's.
fn server_location(ctx: &Context, location_type: u32, id: i32) -> Result<(u32, i32), CUresult> {
    if location_type != LOCATION_DEVICE {
        return Ok((location_type, id));
    }
    let device = crate::servers::device(id).map_err(|_| CUresult::CUDA_ERROR_INVALID_DEVICE)?;
    let own = crate::servers::device(ctx.device)?;
    if !Arc::ptr_eq(&device.link, &own.link) {
        // A device of another server cannot hold this memory.
        return Err(CUresult::CUDA_ERROR_INVALID_DEVICE);
    }
    Ok((LOCATION_DEVICE, device.remote_ordinal as i32))
}

/// The program's ordinal of device `remote` of `ctx`'s server (other values as they are).
fn program_ordinal(ctx: &Context, remote: i32) -> i32 {
    let (Ok(own), Ok(servers)) = (
        crate::servers::device(ctx.device),
        crate::servers::servers(),
    ) else {
        return remote;
    };
    servers
        .devices
        .iter()
        .find(|d| Arc::ptr_eq(&d.link, &own.link) && d.remote_ordinal as i32 == remote)
        .map_or(remote, |d| d.ordinal)
}

/// Reads a `CUmemLocation`'s type as its integer (the caller may pass any value).
fn location_parts(location: &CUmemLocation) -> (u32, i32) {
    // SAFETY: the type field is a 32-bit enum, read as its integer.
    let location_type = unsafe { std::ptr::addr_of!(location.type_).cast::<u32>().read() };
    (location_type, location.id)
}

fn prefetch(
    ptr: CUdeviceptr,
    size: usize,
    (location_type, id): (u32, i32),
    stream_handle: CUstream,
) -> Result<(), CUresult> {
    let (ctx, stream) = resolve_stream(stream_handle)?;
    let owner = managed_context(ptr, size)?;
    if !Arc::ptr_eq(&owner.conn, &ctx.conn) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let (location_type, id) = server_location(&owner, location_type, id)?;
    before_device_work(Some(stream_handle));
    ctx.conn
        .cuda()
        .mem_prefetch(ctx.remote, stream, ptr, size as u64, location_type, id)
        .outcome()
}

pub unsafe fn cuMemPrefetchAsync_v2(
    ptr: CUdeviceptr,
    size: usize,
    location: CUmemLocation,
    flags: c_uint,
    stream: CUstream,
) -> CUresult {
    if flags != 0 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    status(prefetch(ptr, size, location_parts(&location), stream))
}

/// The pre-12.2 form: a device ordinal, or `CU_DEVICE_CPU` for the host.
pub unsafe fn cuMemPrefetchAsync(
    ptr: CUdeviceptr,
    size: usize,
    device: CUdevice,
    stream: CUstream,
) -> CUresult {
    status(prefetch(ptr, size, legacy_location(device), stream))
}

fn legacy_location(device: CUdevice) -> (u32, i32) {
    if device == DEVICE_CPU {
        (LOCATION_HOST, 0)
    } else {
        (LOCATION_DEVICE, device)
    }
}

fn advise(
    ptr: CUdeviceptr,
    size: usize,
    advice: u32,
    (location_type, id): (u32, i32),
) -> Result<(), CUresult> {
    let ctx = managed_context(ptr, size)?;
    let (location_type, id) = server_location(&ctx, location_type, id)?;
    ctx.conn
        .cuda()
        .mem_advise(ctx.remote, ptr, size as u64, advice, location_type, id)
        .outcome()
}

pub unsafe fn cuMemAdvise_v2(
    ptr: CUdeviceptr,
    size: usize,
    advice: u32,
    location: CUmemLocation,
) -> CUresult {
    status(advise(ptr, size, advice, location_parts(&location)))
}

/// The pre-12.2 form: a device ordinal, or `CU_DEVICE_CPU` for the host.
pub unsafe fn cuMemAdvise(
    ptr: CUdeviceptr,
    size: usize,
    advice: u32,
    device: CUdevice,
) -> CUresult {
    status(advise(ptr, size, advice, legacy_location(device)))
}

pub unsafe fn cuStreamAttachMemAsync(
    stream: CUstream,
    ptr: CUdeviceptr,
    length: usize,
    flags: c_uint,
) -> CUresult {
    status(resolve_stream(stream).and_then(|(ctx, stream_id)| {
        if !matches!(
            flags,
            CU_MEM_ATTACH_GLOBAL | CU_MEM_ATTACH_HOST | CU_MEM_ATTACH_SINGLE
        ) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // Length 0: the whole allocation, which must start at `ptr`.
        let (start, size) = host_view::find(ptr).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let length = if length == 0 {
            if start != ptr {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            size
        } else {
            length
        };
        let owner = managed_context(ptr, length)?;
        if !Arc::ptr_eq(&owner.conn, &ctx.conn) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        ctx.conn
            .cuda()
            .stream_attach_mem(ctx.remote, stream_id, ptr, length as u64, flags)
            .outcome()
    }))
}

/// `CUmem_range_attribute` values whose answer holds device ordinals, and (for the `_ID`
/// forms) the attribute that says whether it is a device.
const RANGE_PREFERRED_LOCATION: u32 = 2;
const RANGE_ACCESSED_BY: u32 = 3;
const RANGE_LAST_PREFETCH_LOCATION: u32 = 4;
const RANGE_PREFERRED_LOCATION_TYPE: u32 = 5;
const RANGE_PREFERRED_LOCATION_ID: u32 = 6;
const RANGE_LAST_PREFETCH_LOCATION_TYPE: u32 = 7;
const RANGE_LAST_PREFETCH_LOCATION_ID: u32 = 8;

fn range_attribute(
    data: *mut c_void,
    data_size: usize,
    attribute: u32,
    ptr: CUdeviceptr,
    size: usize,
) -> Result<(), CUresult> {
    if data.is_null() || data_size == 0 || !data_size.is_multiple_of(4) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = managed_context(ptr, size)?;
    let ask = |attribute: u32, data_size: usize| -> Result<Vec<i32>, CUresult> {
        let data_size = u32::try_from(data_size).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let bytes = ctx
            .conn
            .cuda()
            .mem_range_get_attribute(ctx.remote, ptr, size as u64, attribute, data_size)
            .outcome()?;
        Ok(bytes
            .as_chunks::<4>()
            .0
            .iter()
            .map(|&c| i32::from_ne_bytes(c))
            .collect())
    };
    let mut values = ask(attribute, data_size)?;
    let holds_devices = match attribute {
        RANGE_PREFERRED_LOCATION | RANGE_ACCESSED_BY | RANGE_LAST_PREFETCH_LOCATION => true,
        RANGE_PREFERRED_LOCATION_ID => {
            ask(RANGE_PREFERRED_LOCATION_TYPE, 4)?.first() == Some(&(LOCATION_DEVICE as i32))
        }
        RANGE_LAST_PREFETCH_LOCATION_ID => {
            ask(RANGE_LAST_PREFETCH_LOCATION_TYPE, 4)?.first() == Some(&(LOCATION_DEVICE as i32))
        }
        _ => false,
    };
    if holds_devices {
        for value in values.iter_mut().filter(|v| **v >= 0) {
            *value = program_ordinal(&ctx, *value);
        }
    }
    let out = data.cast::<i32>();
    for (i, value) in values.into_iter().enumerate() {
        // SAFETY: the caller's buffer of `data_size` bytes, as the API requires.
        unsafe { out.add(i).write_unaligned(value) };
    }
    Ok(())
}

pub unsafe fn cuMemRangeGetAttribute(
    data: *mut c_void,
    data_size: usize,
    attribute: u32,
    ptr: CUdeviceptr,
    size: usize,
) -> CUresult {
    status(range_attribute(data, data_size, attribute, ptr, size))
}

pub unsafe fn cuMemRangeGetAttributes(
    data: *mut *mut c_void,
    data_sizes: *mut usize,
    attributes: *mut u32,
    count: usize,
    ptr: CUdeviceptr,
    size: usize,
) -> CUresult {
    status((|| {
        if data.is_null() || data_sizes.is_null() || attributes.is_null() || count == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        for i in 0..count {
            // SAFETY: the caller passes `count` of each, as the API requires.
            let (out, out_size, attribute) =
                unsafe { (*data.add(i), *data_sizes.add(i), *attributes.add(i)) };
            range_attribute(out, out_size, attribute, ptr, size)?;
        }
        Ok(())
    })())
}

/// Whether `ptr` lies in managed memory (a host-side address that is really the device's).
pub(crate) fn is_managed(ptr: u64) -> bool {
    host_view::find(ptr).is_some()
}

/// Drops the host view of a freed managed allocation.
pub(crate) fn forget(ptr: u64) {
    host_view::unregister(ptr);
}
