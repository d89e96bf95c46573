//! Memory pools: each device's default pool, pools the program makes (on the server of their
//! device), their attributes and access, stream-ordered allocations from them, and the pool
//! `cuMemAllocAsync` takes from. A pool handle names its server and the pool there.

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Arc, Mutex};

use rgpu_client::CudaClient;
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{Pool, PoolProps};

use super::memory::allocate;
use super::{status, write_out, Outcome};
use crate::objects::{resolve_stream, Context, MemPool, PrimaryContext};

/// `CUmemPool_attribute`s whose value is a `cuuint64_t` (the others are `int`): the
/// release threshold and the reserved and used memory counters.
const WIDE_ATTRIBUTES: std::ops::RangeInclusive<u32> = 4..=8;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_DEVICE: u32 = 1;

/// Each device's default pool handle, and the pool its `cuMemAllocAsync` takes from (set
/// with `cuDeviceSetMemPool`), by program device ordinal.
static DEFAULT_POOLS: Mutex<Option<HashMap<i32, usize>>> = Mutex::new(None);
static CURRENT_POOLS: Mutex<Option<HashMap<i32, usize>>> = Mutex::new(None);

/// The default pool of program device `ordinal`, made once.
fn default_pool(ordinal: i32) -> Result<usize, CUresult> {
    let device = crate::servers::device(ordinal)?;
    let mut pools = DEFAULT_POOLS.lock().unwrap();
    let pools = pools.get_or_insert_with(HashMap::new);
    if let Some(&handle) = pools.get(&ordinal) {
        return Ok(handle);
    }
    let pool = MemPool {
        handle: crate::handles::new_handle(),
        conn: device.link.connection(),
        pool: Pool::Default(device.remote_ordinal),
        device: ordinal,
    };
    let handle = pool.into_handle() as usize;
    pools.insert(ordinal, handle);
    Ok(handle)
}

/// The program's pool behind a handle.
pub(super) fn pool_of(pool: CUmemoryPool) -> Result<Arc<MemPool>, CUresult> {
    MemPool::from_handle(pool).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

pub unsafe fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, device: CUdevice) -> CUresult {
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
    status(
        default_pool(device).and_then(|handle| unsafe { write_out(pool, handle as CUmemoryPool) }),
    )
}

pub unsafe fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, device: CUdevice) -> CUresult {
    let current = CURRENT_POOLS
        .lock()
        .unwrap()
        .as_ref()
        .and_then(|pools| pools.get(&device).copied());
    let handle = match current {
        Some(handle) => Ok(handle),
        None => default_pool(device),
    };
    // SAFETY: as above.
    status(handle.and_then(|handle| unsafe { write_out(pool, handle as CUmemoryPool) }))
}

pub unsafe fn cuDeviceSetMemPool(device: CUdevice, pool: CUmemoryPool) -> CUresult {
    status((|| {
        let object = pool_of(pool)?;
        let target = crate::servers::device(device)?;
        if object.device != device {
            return Err(CUresult::CUDA_ERROR_INVALID_DEVICE);
        }
        object
            .conn
            .cuda()
            .device_set_mem_pool(target.remote_ordinal, object.pool)
            .outcome()?;
        CURRENT_POOLS
            .lock()
            .unwrap()
            .get_or_insert_with(HashMap::new)
            .insert(device, pool as usize);
        Ok(())
    })())
}

/// A pool description as its server takes it (the device ordinal the server's), and the
/// device it names.
///
/// # Safety
/// `props` is a valid property struct; its enum fields are read as integers (they may hold
/// values the enums lack).
pub(crate) unsafe fn read_pool_props(
    props: *const CUmemPoolProps,
) -> Result<(PoolProps, &'static crate::servers::Device), CUresult> {
    // SAFETY: the caller's guarantee.
    let mut wire = rgpu_cuda_api::wire::wire_pool_props(unsafe { &*props });
    // Pools of host memory would live on the server, away from the program.
    if wire.location_type != LOCATION_DEVICE {
        return Err(crate::unsupported::not_supported(
            "memory pools of host memory",
        ));
    }
    let device = crate::servers::device(wire.location_id)?;
    wire.location_id = device.remote_ordinal as i32;
    Ok((wire, device))
}

pub unsafe fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> CUresult {
    status((|| {
        if pool.is_null() || props.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null, a valid property struct as the API requires.
        let (props, device) = unsafe { read_pool_props(props)? };
        let ctx = device.primary();
        ctx.ensure_created()?;
        let object = MemPool {
            handle: crate::handles::new_handle(),
            conn: ctx.conn.clone(),
            pool: Pool::Created(ctx.conn.new_id()),
            device: device.ordinal,
        };
        let Pool::Created(id) = object.pool else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        ctx.conn
            .cuda()
            .mem_pool_create(ctx.remote, id, props)
            .outcome()?;
        // SAFETY: checked non-null above.
        unsafe { write_out(pool, object.into_handle()) }
    })())
}

pub unsafe fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    status((|| {
        let object = pool_of(pool)?;
        let Pool::Created(id) = object.pool else {
            // A default pool is the device's: it cannot be destroyed.
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        object.conn.cuda().mem_pool_destroy(id).outcome()?;
        MemPool::destroy(pool);
        if let Some(pools) = CURRENT_POOLS.lock().unwrap().as_mut() {
            pools.retain(|_, &mut handle| handle != pool as usize);
        }
        Ok(())
    })())
}

pub unsafe fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    status(resolve_stream(stream).and_then(|(ctx, stream)| {
        let object = pool_of(pool)?;
        if dptr.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if !Arc::ptr_eq(&object.conn, &ctx.conn) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let server = ctx.conn.cuda();
        let allocate_once = || {
            server
                .mem_alloc_from_pool(ctx.remote, stream, object.pool, size as u64)
                .outcome()
        };
        let free = |ptr| free_async(&ctx, stream, ptr);
        let ptr = allocate(&ctx, size, allocate_once, |_| true, free)?;
        // SAFETY: checked non-null above.
        unsafe { write_out(dptr, ptr) }
    }))
}

fn free_async(ctx: &Context, stream: u64, ptr: u64) -> Result<(), CUresult> {
    ctx.conn
        .cuda()
        .mem_free_async(ctx.remote, stream, ptr)
        .outcome()
}

pub unsafe fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attribute: u32,
    value: *mut c_void,
) -> CUresult {
    status((|| {
        let object = pool_of(pool)?;
        if value.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the API contract: an `int` or a `cuuint64_t`, by attribute.
        let number = unsafe {
            if WIDE_ATTRIBUTES.contains(&attribute) {
                value.cast::<u64>().read_unaligned()
            } else {
                value.cast::<c_int>().read_unaligned() as u32 as u64
            }
        };
        object
            .conn
            .cuda()
            .mem_pool_set_attribute(object.pool, attribute, number)
            .outcome()
    })())
}

pub unsafe fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    attribute: u32,
    value: *mut c_void,
) -> CUresult {
    status((|| {
        let object = pool_of(pool)?;
        if value.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let number = object
            .conn
            .cuda()
            .mem_pool_get_attribute(object.pool, attribute)
            .outcome()?;
        // SAFETY: as in cuMemPoolSetAttribute.
        unsafe {
            if WIDE_ATTRIBUTES.contains(&attribute) {
                value.cast::<u64>().write_unaligned(number)
            } else {
                value.cast::<c_int>().write_unaligned(number as c_int)
            }
        }
        Ok(())
    })())
}

pub unsafe fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult {
    status(pool_of(pool).and_then(|object| {
        object
            .conn
            .cuda()
            .mem_pool_trim(object.pool, keep as u64)
            .outcome()
    }))
}

pub unsafe fn cuMemPoolSetAccess(
    pool: CUmemoryPool,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    status((|| {
        let object = pool_of(pool)?;
        if desc.is_null() && count > 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the program's `count` descriptors, as the API requires.
        let access = unsafe { super::vmm::read_access(desc, count)? };
        object
            .conn
            .cuda()
            .mem_pool_set_access(object.pool, access)
            .outcome()
    })())
}

pub unsafe fn cuMemPoolGetAccess(
    flags: *mut u32,
    pool: CUmemoryPool,
    location: *mut CUmemLocation,
) -> CUresult {
    status((|| {
        let object = pool_of(pool)?;
        if flags.is_null() || location.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null, a valid location as the API requires; its type read as an integer.
        let (kind, id) = unsafe {
            (
                std::ptr::addr_of!((*location).type_).cast::<u32>().read(),
                (*location).id,
            )
        };
        if kind != LOCATION_DEVICE {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let device = crate::servers::device(id)?;
        // Another server's device cannot reach this pool.
        let answer = if Arc::ptr_eq(&device.link.connection(), &object.conn) {
            object
                .conn
                .cuda()
                .mem_pool_get_access(object.pool, device.remote_ordinal)
                .outcome()?
        } else {
            0
        };
        // SAFETY: checked non-null above.
        unsafe { write_out(flags, answer) }
    })())
}

/// `CU_MEM_ALLOCATION_TYPE_PINNED`: the kind of memory every device pool holds.
const ALLOCATION_PINNED: c_uint = 1;

/// The device a `CUmemLocation` names, for the CUDA 13 pool calls by location: device pools
/// of pinned memory only (pools of host or managed memory would live on the server, away
/// from the program).
///
/// # Safety
/// `location` is null or a valid location; its type is read as an integer.
unsafe fn pool_device(location: *const CUmemLocation, kind: c_uint) -> Result<CUdevice, CUresult> {
    if location.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's guarantee.
    let (location_type, id) = unsafe {
        (
            std::ptr::addr_of!((*location).type_).cast::<u32>().read(),
            (*location).id,
        )
    };
    if location_type != LOCATION_DEVICE || kind != ALLOCATION_PINNED {
        return Err(crate::unsupported::not_supported(
            "memory pools of host or managed memory (cuMemGetMemPool and the like)",
        ));
    }
    Ok(id)
}

pub unsafe fn cuMemGetDefaultMemPool(
    pool_out: *mut CUmemoryPool,
    location: *mut CUmemLocation,
    type_: c_uint,
) -> CUresult {
    // SAFETY: the caller's location (null refused) and out-pointer, passed on.
    match unsafe { pool_device(location, type_) } {
        // SAFETY: the caller's out-pointer (or pool), passed on.
        Ok(device) => unsafe { cuDeviceGetDefaultMemPool(pool_out, device) },
        Err(error) => error,
    }
}

pub unsafe fn cuMemGetMemPool(
    pool: *mut CUmemoryPool,
    location: *mut CUmemLocation,
    type_: c_uint,
) -> CUresult {
    // SAFETY: as above.
    match unsafe { pool_device(location, type_) } {
        // SAFETY: the caller's out-pointer (or pool), passed on.
        Ok(device) => unsafe { cuDeviceGetMemPool(pool, device) },
        Err(error) => error,
    }
}

pub unsafe fn cuMemSetMemPool(
    location: *mut CUmemLocation,
    type_: c_uint,
    pool: CUmemoryPool,
) -> CUresult {
    // SAFETY: as above.
    match unsafe { pool_device(location, type_) } {
        // SAFETY: the caller's out-pointer (or pool), passed on.
        Ok(device) => unsafe { cuDeviceSetMemPool(device, pool) },
        Err(error) => error,
    }
}
