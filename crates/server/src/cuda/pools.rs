//! Memory pools: the devices' default pools and pools a session makes (destroyed with the
//! session), their attributes and access, and allocations from them (charged to the session's
//! memory quota like every allocation).

use std::ptr::null_mut;

use rgpu_cuda_api::native::{check, Status, INVALID_HANDLE, INVALID_VALUE};
use rgpu_cuda_api::sys::*;
use rgpu_cuda_api::{cu_call, cu_call_raw};
use rgpu_protocol::cuda::{Answer, DevicePtr, Id, MemAccess, Pool, PoolProps};

use super::owned;
use super::session::{Charged, CudaSession};

/// `CUmemPool_attribute`s whose value is a `cuuint64_t` (the others are `int`).
const WIDE_ATTRIBUTES: std::ops::RangeInclusive<u32> = 4..=8;

impl CudaSession {
    /// The driver's handle of `pool`.
    pub(super) fn pool(&self, pool: Pool) -> Result<CUmemoryPool, Status> {
        match pool {
            Pool::Created(id) => self
                .mem_pools
                .get(&id)
                .map(owned::MemPool::raw)
                .ok_or(INVALID_HANDLE),
            Pool::Default(device) => {
                let mut raw = null_mut();
                // SAFETY: an out-pointer and a device ordinal, which the driver checks.
                check(unsafe {
                    cu_call!(
                        self.backend.driver,
                        cuDeviceGetDefaultMemPool(&mut raw, device as CUdevice)
                    )
                })?;
                Ok(raw)
            }
        }
    }

    pub(super) fn create_pool(&mut self, ctx: Id, id: Id, props: &PoolProps) -> Answer<()> {
        self.create_pool_with(ctx, id, |cuda, raw| {
            let props = rgpu_cuda_api::wire::pool_props(props);
            // SAFETY: a valid property struct and out-pointer.
            check(unsafe { cu_call!(cuda.backend.driver, cuMemPoolCreate(raw, &props)) })
        })
    }

    /// Pool `id`, as `make` makes it (created, or imported from another session).
    pub(super) fn create_pool_with(
        &mut self,
        ctx: Id,
        id: Id,
        make: impl FnOnce(&CudaSession, &mut CUmemoryPool) -> Result<(), Status>,
    ) -> Answer<()> {
        let raw = self.create_in(ctx, make)?;
        self.mem_pools
            .insert(id, owned::MemPool::new(raw, null_mut(), &self.backend));
        Ok(())
    }

    pub(super) fn alloc_from_pool(
        &mut self,
        ctx: Id,
        stream: Id,
        pool: Pool,
        size: u64,
    ) -> Answer<DevicePtr> {
        self.enter(ctx)?;
        let stream = self.stream(stream)?;
        let pool = self.pool(pool)?;
        let allocated = self.charged_allocation(size, |cuda| {
            let mut ptr = 0u64;
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe {
                cu_call!(
                    cuda.backend.driver,
                    cuMemAllocFromPoolAsync(&mut ptr, size as usize, pool, stream)
                )
            })
            .map(|()| Charged::Pointer(ptr))
        });
        if let Ok(ptr) = allocated {
            self.async_allocations.insert(ptr, self.current);
        }
        allocated
    }

    pub(super) fn set_pool_attribute(&self, pool: Pool, attribute: u32, value: u64) -> Answer<()> {
        let pool = self.pool(pool)?;
        // Little-endian: an `int` attribute reads the low half.
        let mut value = value;
        let value = &mut value as *mut u64 as *mut std::ffi::c_void;
        // SAFETY: a live pool and an 8-byte value; the attribute is the client's integer.
        check(unsafe {
            cu_call_raw!(
                self.backend.driver,
                cuMemPoolSetAttribute(
                    pool: CUmemoryPool,
                    attribute: u32,
                    value: *mut std::ffi::c_void,
                )
            )
        })
    }

    pub(super) fn pool_attribute(&self, pool: Pool, attribute: u32) -> Answer<u64> {
        let pool = self.pool(pool)?;
        let mut value = 0u64;
        let out = &mut value as *mut u64 as *mut std::ffi::c_void;
        // SAFETY: a live pool and room for the widest value.
        check(unsafe {
            cu_call_raw!(
                self.backend.driver,
                cuMemPoolGetAttribute(
                    pool: CUmemoryPool,
                    attribute: u32,
                    out: *mut std::ffi::c_void,
                )
            )
        })?;
        Ok(if WIDE_ATTRIBUTES.contains(&attribute) {
            value
        } else {
            value as u32 as u64
        })
    }

    pub(super) fn set_pool_access(&self, pool: Pool, access: &[MemAccess]) -> Answer<()> {
        let pool = self.pool(pool)?;
        let descs: Vec<CUmemAccessDesc> = access
            .iter()
            .map(rgpu_cuda_api::wire::access_desc)
            .collect();
        // SAFETY: a live pool and a local descriptor list.
        check(unsafe {
            cu_call!(
                self.backend.driver,
                cuMemPoolSetAccess(pool, descs.as_ptr(), descs.len())
            )
        })
    }

    pub(super) fn pool_access(&self, pool: Pool, device: u32) -> Answer<u32> {
        let pool = self.pool(pool)?;
        let mut flags = 0u32;
        // SAFETY: plain data, valid zeroed; the location type is written as its integer.
        let mut location: CUmemLocation = unsafe { std::mem::zeroed() };
        // CU_MEM_LOCATION_TYPE_DEVICE.
        // SAFETY: a 32-bit enum field written as its integer.
        unsafe {
            std::ptr::addr_of_mut!(location.type_)
                .cast::<u32>()
                .write(1)
        };
        location.id = i32::try_from(device).map_err(|_| INVALID_VALUE)?;
        let out = &mut flags as *mut u32;
        let at = &mut location as *mut CUmemLocation;
        // SAFETY: a live pool and local out-pointers; the flags are written as an integer.
        check(unsafe {
            cu_call_raw!(
                self.backend.driver,
                cuMemPoolGetAccess(out: *mut u32, pool: CUmemoryPool, at: *mut CUmemLocation)
            )
        })?;
        Ok(flags)
    }

    pub(super) fn set_device_pool(&self, device: u32, pool: Pool) -> Answer<()> {
        let pool = self.pool(pool)?;
        // SAFETY: a device ordinal (checked by the driver) and a live pool.
        check(unsafe {
            cu_call!(
                self.backend.driver,
                cuDeviceSetMemPool(device as CUdevice, pool)
            )
        })
    }
}
