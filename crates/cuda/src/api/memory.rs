//! Memory: device allocations (on the server), host allocations (here: "pinned" memory of a
//! remote GPU is ordinary client memory, since the network, not PCIe, moves it; on the
//! server's own host it is memory shared with the server, which registers it with the driver,
//! so copies from and into it run in place at PCIe speed), memsets,
//! pointer queries, and the maps of device and page-locked memory that copies ([`super::copy`])
//! consult.
//!
//! Memsets are posted: they leave with the next flush, in stream order, and report failures at
//! the next synchronizing call.

use std::alloc::Layout;
use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rgpu_client::CudaClient;
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::Id;

use super::{from_remote, status, write_out, Outcome};
use crate::objects::{current_context, resolve_stream, Context};
use crate::ranges::RangeMap;

const PAGE: usize = 4096;

/// Device memory of the program, with the owning context's handle.
static DEVICE_RANGES: RwLock<RangeMap<usize>> = RwLock::new(RangeMap::new());

/// The device memory of plain allocations (`cuMemAlloc`): memory whose server can share it
/// with another server of its machine through a CUDA IPC handle (pool and VMM memory have
/// none).
static PLAIN_RANGES: RwLock<RangeMap<()>> = RwLock::new(RangeMap::new());

/// Device allocations (by range start) whose synchronous copies and sets finish before they
/// return: `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`, which programs set on memory another process
/// reads through IPC.
static SYNC_MEMOPS: Mutex<std::collections::BTreeSet<u64>> =
    Mutex::new(std::collections::BTreeSet::new());

/// After a synchronous copy or set that touched `ptrs`: waits for the work of an allocation
/// with `SYNC_MEMOPS` on, as the driver does (other synchronous work may finish later, and
/// everything the program can observe through rgpu is ordered after it anyway).
pub(crate) fn finish_sync_memops(ptrs: &[u64]) -> Result<(), CUresult> {
    for &ptr in ptrs {
        let Some((start, _, ctx)) = device_range(ptr) else {
            continue;
        };
        if !SYNC_MEMOPS.lock().unwrap().contains(&start) {
            continue;
        }
        if let Some(ctx) = Context::from_handle(ctx as CUcontext) {
            super::stream::synchronize_stream(&ctx, 0)?;
        }
    }
    Ok(())
}

pub unsafe fn cuPointerSetAttribute(
    value: *const c_void,
    attribute: c_uint,
    ptr: CUdeviceptr,
) -> CUresult {
    const SYNC_MEMOPS_ATTRIBUTE: c_uint = 6;
    status(crate::servers::servers().and_then(|_| {
        // The driver lets a program set this attribute only.
        if value.is_null() || attribute != SYNC_MEMOPS_ATTRIBUTE {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let Some((start, _, _)) = device_range(ptr) else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        // SAFETY: the caller's value of this attribute, an unsigned int, as the API requires.
        let on = unsafe { value.cast::<c_uint>().read_unaligned() } != 0;
        let mut flagged = SYNC_MEMOPS.lock().unwrap();
        match on {
            true => flagged.insert(start),
            false => flagged.remove(&start),
        };
        Ok(())
    }))
}

/// Whether `[ptr, ptr + size)` lies in one plain allocation (see `PLAIN_RANGES`).
pub(crate) fn is_plain_allocation(ptr: u64, size: u64) -> bool {
    PLAIN_RANGES
        .read()
        .unwrap()
        .find(ptr)
        .is_some_and(|(start, len, ())| ptr.saturating_add(size) <= start.saturating_add(len))
}

/// Page-locked host memory, with its flags and whether rgpu allocated it.
static HOST_RANGES: Mutex<RangeMap<(u32, bool)>> = Mutex::new(RangeMap::new());

/// Page-locked allocations shared with a server on this host, by address: the connection
/// that shares them.
static SHARED_HOST: Mutex<std::collections::BTreeMap<usize, Arc<rgpu_client::Connection>>> =
    Mutex::new(std::collections::BTreeMap::new());

/// The first failure of a read nobody waited for, reported at the next synchronization.
static ASYNC_READ_ERROR: AtomicU32 = AtomicU32::new(0);

pub(crate) fn record_device_range(ptr: u64, size: u64, ctx: &Context) {
    let mut ranges = DEVICE_RANGES.write().unwrap();
    ranges.insert(ptr, size, ctx.handle() as usize);
}

/// The device range holding `ptr`: (start, size, context handle).
fn device_range(ptr: u64) -> Option<(u64, u64, usize)> {
    DEVICE_RANGES.read().unwrap().find(ptr)
}

/// Whether `ptr` lies in device memory of the program.
pub(crate) fn is_device_memory(ptr: u64) -> bool {
    device_range(ptr).is_some()
}

/// The 8-byte words of `params` (a launch's parameters) that point into page-locked host
/// memory: (word index, the allocation's start and size). One lookup of the ranges a launch.
pub(crate) fn host_pointers_in(params: &[u8]) -> Vec<(usize, u64, u64)> {
    let ranges = HOST_RANGES.lock().unwrap();
    let words = params
        .as_chunks::<8>()
        .0
        .iter()
        .map(|w| u64::from_ne_bytes(*w));
    words
        .enumerate()
        .filter(|&(_, value)| value >= 0x10000)
        .filter_map(|(i, value)| ranges.find(value).map(|(start, size, _)| (i, start, size)))
        .collect()
}

fn host_range(ptr: usize) -> Option<(usize, usize, u32)> {
    let (start, size, (flags, _)) = HOST_RANGES.lock().unwrap().find(ptr as u64)?;
    Some((start as usize, size as usize, flags))
}

/// The context a device pointer belongs to, else the current one.
pub(crate) fn context_of(ptr: u64) -> Result<Arc<Context>, CUresult> {
    allocation_context(ptr)?.map_or_else(current_context, Ok)
}

/// The context of the device allocation holding `ptr`, if one does.
pub(crate) fn allocation_context(ptr: u64) -> Result<Option<Arc<Context>>, CUresult> {
    match device_range(ptr).and_then(|(_, _, ctx)| Context::from_handle(ctx as CUcontext)) {
        Some(ctx) => {
            ctx.ensure_created()?;
            Ok(Some(ctx))
        }
        None => Ok(None),
    }
}

/// Whether `ptr..ptr+size` is page-locked host memory (so an async read may land later).
pub(crate) fn is_page_locked(ptr: *mut c_void, size: usize) -> bool {
    host_range(ptr as usize).is_some_and(|(start, len, _)| ptr as usize + size <= start + len)
}

/// Keeps the first failure (`code` not 0) of a read nobody waits for.
pub(crate) fn note_async_read_error(code: u32) {
    if code != 0 {
        let _ = ASYNC_READ_ERROR.compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// The failure of an unwaited read, if one happened since the last call.
pub(crate) fn take_async_read_error() -> Result<(), CUresult> {
    match ASYNC_READ_ERROR.swap(0, Ordering::AcqRel) {
        0 => Ok(()),
        code => from_remote(code),
    }
}

/// Whether `[ptr, ptr+size)` overlaps device memory the program already has (only possible
/// for memory of another server: each server's driver has its own address space).
pub(crate) fn overlaps_known_range(ptr: u64, size: u64) -> bool {
    DEVICE_RANGES.read().unwrap().overlaps(ptr, size)
}

/// Allocations that collided with another server's, tried again this many times.
const DISTINCT_ADDRESS_TRIES: usize = 16;

/// Allocates `size` bytes at an address no other server's memory of the program overlaps.
///
/// Device pointers are the servers' own addresses (kernels get them inside their parameters,
/// which rgpu cannot rewrite). Two servers may hand out the same address: then the colliding
/// block is held while the server is asked again, so every pointer the program holds names one
/// server's memory, and copies find their server by address. `allocate_once` asks the server
/// once (`MemAlloc` or `MemAllocAsync`); `claim` may refuse an address for other reasons
/// (managed memory needs the same address free in this process).
pub(crate) fn allocate(
    ctx: &Context,
    size: usize,
    allocate_once: impl Fn() -> Result<u64, CUresult>,
    claim: impl Fn(u64) -> bool,
    free: impl Fn(u64) -> Result<(), CUresult>,
) -> Result<u64, CUresult> {
    let mut colliding = Vec::new();
    let mut result = Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    for _ in 0..DISTINCT_ADDRESS_TRIES {
        let ptr = match allocate_once() {
            Ok(ptr) => ptr,
            Err(e) => {
                result = Err(e);
                break;
            }
        };
        if overlaps_known_range(ptr, size as u64) || !claim(ptr) {
            colliding.push(ptr);
            continue;
        }
        record_device_range(ptr, size as u64, ctx);
        result = Ok(ptr);
        break;
    }
    for &ptr in &colliding {
        let _ = free(ptr);
    }
    if result.is_err() && !colliding.is_empty() {
        log::error!("rgpu: no device memory at an address distinct from other servers'");
    }
    result
}

pub unsafe fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    status(current_context().and_then(|ctx| {
        if dptr.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let server = ctx.conn.cuda();
        let allocate_once = || server.mem_alloc(ctx.remote, size as u64).outcome();
        let free = |ptr| server.mem_free(ctx.remote, ptr).outcome();
        let ptr = allocate(&ctx, size, allocate_once, |_| true, free)?;
        PLAIN_RANGES.write().unwrap().insert(ptr, size as u64, ());
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(dptr, ptr) }
    }))
}

/// Stream-ordered allocation from the device's default pool.
pub unsafe fn cuMemAllocAsync(dptr: *mut CUdeviceptr, size: usize, stream: CUstream) -> CUresult {
    status(resolve_stream(stream).and_then(|(ctx, stream)| {
        if dptr.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let server = ctx.conn.cuda();
        let allocate_once = || {
            server
                .mem_alloc_async(ctx.remote, stream, size as u64)
                .outcome()
        };
        let free = |ptr| free_async(&ctx, stream, ptr);
        let ptr = allocate(&ctx, size, allocate_once, |_| true, free)?;
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(dptr, ptr) }
    }))
}

fn free_async(ctx: &Context, stream: Id, ptr: u64) -> Result<(), CUresult> {
    ctx.conn
        .cuda()
        .mem_free_async(ctx.remote, stream, ptr)
        .outcome()
}

pub unsafe fn cuMemFreeAsync(ptr: CUdeviceptr, stream: CUstream) -> CUresult {
    status(resolve_stream(stream).and_then(|(ctx, stream)| {
        free_async(&ctx, stream, ptr)?;
        DEVICE_RANGES.write().unwrap().remove(ptr);
        Ok(())
    }))
}

pub unsafe fn cuMemFree_v2(ptr: CUdeviceptr) -> CUresult {
    if ptr == 0 {
        return CUresult::CUDA_SUCCESS;
    }
    status(context_of(ptr).and_then(|ctx| {
        ctx.conn.cuda().mem_free(ctx.remote, ptr).outcome()?;
        DEVICE_RANGES.write().unwrap().remove(ptr);
        PLAIN_RANGES.write().unwrap().remove(ptr);
        super::managed::forget(ptr);
        Ok(())
    }))
}

pub unsafe fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    status(current_context().and_then(|ctx| {
        let info = ctx.conn.cuda().mem_get_info(ctx.remote).outcome()?;
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe {
            write_out(free, info.free as usize)?;
            write_out(total, info.total as usize)
        }
    }))
}

pub unsafe fn cuMemGetAddressRange_v2(
    base: *mut CUdeviceptr,
    size: *mut usize,
    ptr: CUdeviceptr,
) -> CUresult {
    status(crate::servers::servers().and_then(|_| {
        let (start, len, _) = device_range(ptr).ok_or(CUresult::CUDA_ERROR_NOT_FOUND)?;
        // SAFETY: the caller's out-pointers, each written only when non-null.
        unsafe {
            if !base.is_null() {
                base.write(start);
            }
            if !size.is_null() {
                size.write(len as usize);
            }
        }
        Ok(())
    }))
}

// ---- host memory -------------------------------------------------------------------------

pub unsafe fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, flags: c_uint) -> CUresult {
    status(current_context().and_then(|ctx| {
        if pp.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let memory = match ctx.conn.share_host_memory(size) {
            Some(shared) => {
                SHARED_HOST
                    .lock()
                    .unwrap()
                    .insert(shared as usize, ctx.conn.clone());
                shared
            }
            None => {
                let layout = Layout::from_size_align(size.max(1), PAGE)
                    .map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
                // SAFETY: a non-zero-sized layout.
                unsafe { std::alloc::alloc(layout) }
            }
        };
        if memory.is_null() {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        HOST_RANGES
            .lock()
            .unwrap()
            .insert(memory as u64, size.max(1) as u64, (flags, true));
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(pp, memory.cast()) }
    }))
}

pub unsafe fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuMemHostAlloc(pp, size, 0) }
}

pub unsafe fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    let mut ranges = HOST_RANGES.lock().unwrap();
    match ranges.get(p as u64) {
        Some((size, (_, true))) => {
            ranges.remove(p as u64);
            drop(ranges);
            super::host_mirror::forget(p as u64);
            let shared = SHARED_HOST.lock().unwrap().remove(&(p as usize));
            if let Some(conn) = shared {
                conn.unshare_host_memory(p.cast());
                return CUresult::CUDA_SUCCESS;
            }
            // SAFETY: allocated by cuMemHostAlloc with this layout.
            let layout = unsafe { Layout::from_size_align_unchecked(size as usize, PAGE) };
            // SAFETY: as above; the range is forgotten, so it is freed once.
            unsafe { std::alloc::dealloc(p.cast(), layout) };
            CUresult::CUDA_SUCCESS
        }
        _ => CUresult::CUDA_ERROR_INVALID_VALUE,
    }
}

pub unsafe fn cuMemHostRegister_v2(p: *mut c_void, size: usize, flags: c_uint) -> CUresult {
    status(current_context().and_then(|_| {
        if p.is_null() || size == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut ranges = HOST_RANGES.lock().unwrap();
        if ranges.overlaps(p as u64, size as u64) {
            return Err(CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        ranges.insert(p as u64, size as u64, (flags, false));
        Ok(())
    }))
}

pub unsafe fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    let mut ranges = HOST_RANGES.lock().unwrap();
    match ranges.get(p as u64) {
        Some((_, (_, false))) => {
            ranges.remove(p as u64);
            drop(ranges);
            super::host_mirror::forget(p as u64);
            CUresult::CUDA_SUCCESS
        }
        _ => CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
    }
}

/// Unified addressing: page-locked host memory is at the same address on the device (a
/// kernel given it reaches it through a mirror, host_mirror.rs).
pub unsafe fn cuMemHostGetDevicePointer_v2(
    pdptr: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    status((|| {
        if flags != 0 || host_range(p as usize).is_none() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(pdptr, p as CUdeviceptr) }
    })())
}

pub unsafe fn cuMemHostGetFlags(flags: *mut c_uint, p: *mut c_void) -> CUresult {
    match host_range(p as usize) {
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        Some((_, _, f)) => status(unsafe { write_out(flags, f) }),
        None => CUresult::CUDA_ERROR_INVALID_VALUE,
    }
}

// ---- memset -------------------------------------------------------------------------------

fn memset(
    stream: Option<CUstream>,
    dst: u64,
    value: u32,
    element_size: u8,
    width: usize,
    height: usize,
    pitch: usize,
) -> Result<(), CUresult> {
    super::managed::before_device_work(stream);
    let owner = allocation_context(dst)?;
    if owner.is_none() {
        let row = width * element_size as usize;
        let span = pitch.max(row) * height.saturating_sub(1) + row;
        if is_page_locked(dst as *mut c_void, span) {
            let pattern = &value.to_le_bytes()[..element_size as usize];
            return set_host_memory(stream, dst, pattern, row, height.max(1), pitch);
        }
        log::debug!("memset at {dst:#x}: in no allocation known here; the server decides");
    }
    let synchronous = stream.is_none();
    let (ctx, stream) = match stream {
        Some(stream) => resolve_stream(stream)?,
        None => (owner.map_or_else(current_context, Ok)?, 0),
    };
    let (width, height, pitch) = (width as u64, height as u64, pitch as u64);
    let server = ctx.conn.cuda();
    server
        .memset(
            ctx.remote,
            stream,
            dst,
            value,
            element_size,
            width,
            height,
            pitch,
        )
        .outcome()?;
    match synchronous {
        true => finish_sync_memops(&[dst]),
        false => Ok(()),
    }
}

/// A memset of page-locked host memory, which unified addressing lets the program set as
/// device memory (XLA's host memory space is such memory): `pattern` repeated over `row`
/// bytes of each of `rows` rows `pitch` apart, done here after the stream's earlier work, as
/// the driver does it in stream order.
fn set_host_memory(
    stream: Option<CUstream>,
    dst: u64,
    pattern: &[u8],
    row: usize,
    rows: usize,
    pitch: usize,
) -> Result<(), CUresult> {
    if let Some(stream) = stream {
        let (ctx, id) = resolve_stream(stream)?;
        super::stream::synchronize_stream(&ctx, id)?;
    }
    for r in 0..rows {
        let start = dst as usize + r * pitch;
        // SAFETY: the rows lie in the caller's page-locked allocation (checked by the
        // caller), which the API lets it set.
        let bytes = unsafe { std::slice::from_raw_parts_mut(start as *mut u8, row) };
        for element in bytes.chunks_exact_mut(pattern.len()) {
            element.copy_from_slice(pattern);
        }
    }
    Ok(())
}

pub unsafe fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, count: usize) -> CUresult {
    status(memset(None, dst, value as u32, 1, count, 1, 0))
}

pub unsafe fn cuMemsetD16_v2(dst: CUdeviceptr, value: u16, count: usize) -> CUresult {
    status(memset(None, dst, value as u32, 2, count, 1, 0))
}

pub unsafe fn cuMemsetD32_v2(dst: CUdeviceptr, value: u32, count: usize) -> CUresult {
    status(memset(None, dst, value, 4, count, 1, 0))
}

pub unsafe fn cuMemsetD8Async(
    dst: CUdeviceptr,
    value: u8,
    count: usize,
    stream: CUstream,
) -> CUresult {
    status(memset(Some(stream), dst, value as u32, 1, count, 1, 0))
}

pub unsafe fn cuMemsetD16Async(
    dst: CUdeviceptr,
    value: u16,
    count: usize,
    stream: CUstream,
) -> CUresult {
    status(memset(Some(stream), dst, value as u32, 2, count, 1, 0))
}

pub unsafe fn cuMemsetD32Async(
    dst: CUdeviceptr,
    value: u32,
    count: usize,
    stream: CUstream,
) -> CUresult {
    status(memset(Some(stream), dst, value, 4, count, 1, 0))
}

pub unsafe fn cuMemsetD2D8_v2(
    dst: CUdeviceptr,
    pitch: usize,
    value: u8,
    width: usize,
    height: usize,
) -> CUresult {
    status(memset(None, dst, value as u32, 1, width, height, pitch))
}

pub unsafe fn cuMemsetD2D16_v2(
    dst: CUdeviceptr,
    pitch: usize,
    value: u16,
    width: usize,
    height: usize,
) -> CUresult {
    status(memset(None, dst, value as u32, 2, width, height, pitch))
}

pub unsafe fn cuMemsetD2D32_v2(
    dst: CUdeviceptr,
    pitch: usize,
    value: u32,
    width: usize,
    height: usize,
) -> CUresult {
    status(memset(None, dst, value, 4, width, height, pitch))
}

pub unsafe fn cuMemsetD2D8Async(
    dst: CUdeviceptr,
    pitch: usize,
    value: u8,
    width: usize,
    height: usize,
    stream: CUstream,
) -> CUresult {
    status(memset(
        Some(stream),
        dst,
        value as u32,
        1,
        width,
        height,
        pitch,
    ))
}

pub unsafe fn cuMemsetD2D16Async(
    dst: CUdeviceptr,
    pitch: usize,
    value: u16,
    width: usize,
    height: usize,
    stream: CUstream,
) -> CUresult {
    status(memset(
        Some(stream),
        dst,
        value as u32,
        2,
        width,
        height,
        pitch,
    ))
}

pub unsafe fn cuMemsetD2D32Async(
    dst: CUdeviceptr,
    pitch: usize,
    value: u32,
    width: usize,
    height: usize,
    stream: CUstream,
) -> CUresult {
    status(memset(Some(stream), dst, value, 4, width, height, pitch))
}

// ---- pointer attributes -------------------------------------------------------------------

const MEMORYTYPE_HOST: u32 = 1;
const MEMORYTYPE_DEVICE: u32 = 2;

/// Writes one pointer attribute; `Err` for pointers or attributes rgpu cannot describe.
unsafe fn pointer_attribute(
    data: *mut c_void,
    attribute: c_uint,
    ptr: u64,
) -> Result<(), CUresult> {
    let device = device_range(ptr);
    let host = if device.is_none() {
        host_range(ptr as usize)
    } else {
        None
    };
    if device.is_none() && host.is_none() {
        log::debug!("pointer attribute {attribute} of {ptr:#x}: no allocation known here");
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = device.and_then(|(_, _, ctx)| Context::from_handle(ctx as CUcontext));
    let managed = device.is_some() && super::managed::is_managed(ptr);
    // SAFETY: `data` is the caller's out-pointer for this attribute's type (null is refused above).
    unsafe {
        match attribute {
            1 => write_out(
                data.cast::<CUcontext>(),
                ctx.map_or(std::ptr::null_mut(), |ctx| ctx.handle()),
            ),
            2 => write_out(
                data.cast::<u32>(),
                if device.is_some() {
                    MEMORYTYPE_DEVICE
                } else {
                    MEMORYTYPE_HOST
                },
            ),
            // DEVICE_POINTER: page-locked host memory is its own (unified addressing; a
            // kernel given it reaches it through a mirror, host_mirror.rs).
            3 => write_out(data.cast::<u64>(), ptr),
            // HOST_POINTER: page-locked memory, and managed memory (its host view).
            4 => match host.is_some() || managed {
                true => write_out(data.cast::<u64>(), ptr),
                false => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
            },
            6 => write_out(
                data.cast::<u32>(),
                device.is_some_and(|(start, _, _)| SYNC_MEMOPS.lock().unwrap().contains(&start))
                    as u32,
            ),
            // IS_MANAGED
            8 => write_out(data.cast::<u32>(), managed as u32),
            // BUFFER_ID: the range start is unique while the range lives.
            7 => write_out(
                data.cast::<u64>(),
                device.map_or(ptr, |(start, _, _)| start),
            ),
            9 => write_out(data.cast::<i32>(), ctx.map_or(0, |c| c.device)),
            11 => write_out(
                data.cast::<u64>(),
                device
                    .map(|d| d.0)
                    .or(host.map(|h| h.0 as u64))
                    .unwrap_or(0),
            ),
            12 => write_out(
                data.cast::<usize>(),
                device
                    .map(|d| d.1 as usize)
                    .or(host.map(|h| h.1))
                    .unwrap_or(0),
            ),
            // MAPPED
            13 => write_out(data.cast::<u32>(), 1),
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }
}

pub unsafe fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: c_uint,
    ptr: CUdeviceptr,
) -> CUresult {
    status(
        // SAFETY: the caller's out-pointer for the attribute's value, as the API requires.
        crate::servers::servers().and_then(|_| unsafe { pointer_attribute(data, attribute, ptr) }),
    )
}

pub unsafe fn cuPointerGetAttributes(
    count: c_uint,
    attributes: *mut c_uint,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    status(crate::servers::servers().and_then(|_| {
        if attributes.is_null() || data.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        for i in 0..count as usize {
            // SAFETY: the caller passes `count` attributes and as many destinations.
            let (attribute, out) = unsafe { (*attributes.add(i), *data.add(i)) };
            if out.is_null() {
                continue;
            }
            // Unknown memory is not an error here: the driver reports type 0 (unregistered).
            // SAFETY: the caller's out-pointer for the attribute's value, as the API requires.
            if unsafe { pointer_attribute(out, attribute, ptr) }.is_err() && attribute == 2 {
                // SAFETY: the caller's out-pointer for the attribute's value (a 32-bit memory type).
                unsafe { out.cast::<u32>().write(0) };
            }
        }
        Ok(())
    }))
}

// ---- pitched memory -------------------------------------------------------------------------

/// Row pitch of cuMemAllocPitch: rows start at multiples of this many bytes, as the driver
/// does on every current GPU.
const PITCH_ALIGNMENT: usize = 512;

pub unsafe fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    if pitch.is_null() || width == 0 || height == 0 || ![4, 8, 16].contains(&element_size) {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    let row = width.div_ceil(PITCH_ALIGNMENT) * PITCH_ALIGNMENT;
    let Some(size) = row.checked_mul(height) else {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    };
    // SAFETY: the caller's arguments, passed on as they came.
    let status = unsafe { cuMemAlloc_v2(dptr, size) };
    if status == CUresult::CUDA_SUCCESS {
        // SAFETY: `pitch` is the caller's out-pointer (checked non-null above).
        unsafe { pitch.write(row) };
    }
    status
}

/// Forgets a device range (freed or unreserved).
pub(crate) fn forget_device_range(ptr: u64) {
    DEVICE_RANGES.write().unwrap().remove(ptr);
    PLAIN_RANGES.write().unwrap().remove(ptr);
    SYNC_MEMOPS.lock().unwrap().remove(&ptr);
}
