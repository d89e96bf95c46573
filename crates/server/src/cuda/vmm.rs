//! Virtual memory management, in the request's context: address reservations, physical
//! allocations (charged to the session's memory quota), mappings and access. They belong to the
//! device, not to a context, so the session records them and undoes them at its end.

use rgpu_cuda_api::native::{check, Status, INVALID_HANDLE};
use rgpu_cuda_api::sys::*;
use rgpu_cuda_api::wire::{access_desc, allocation_prop};
use rgpu_cuda_api::{cu_call, cu_call_raw};
use rgpu_protocol::cuda::{serve, Answer, DevicePtr, Id, MemAccess, MemProp};

use super::session::{code, Charged, Served};

impl serve::VirtualMemory for Served<'_> {
    fn vmm_granularity(&mut self, ctx: Id, prop: MemProp, option: u32) -> Answer<u64> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx).and_then(|()| {
            let prop = allocation_prop(&prop);
            let mut granularity = 0usize;
            let out = &mut granularity as *mut usize;
            let prop = &prop as *const CUmemAllocationProp;
            // SAFETY: valid out-pointer and property struct; the option is passed as the
            // integer the client sent, which the driver checks.
            check(unsafe {
                cu_call_raw!(
                    cuda.backend.driver,
                    cuMemGetAllocationGranularity(
                        out: *mut usize,
                        prop: *const CUmemAllocationProp,
                        option: u32,
                    )
                )
            })?;
            Ok(granularity as u64)
        })
    }

    fn vmm_reserve(
        &mut self,
        ctx: Id,
        size: u64,
        alignment: u64,
        addr: DevicePtr,
        flags: u64,
    ) -> Answer<DevicePtr> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx).and_then(|()| {
            let mut ptr = 0u64;
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe {
                cu_call!(
                    cuda.backend.driver,
                    cuMemAddressReserve(&mut ptr, size as usize, alignment as usize, addr, flags)
                )
            })?;
            cuda.vmm_reservations.insert(ptr, size);
            Ok(ptr)
        })
    }

    fn vmm_create(&mut self, ctx: Id, handle: Id, size: u64, prop: MemProp, flags: u64) -> Status {
        let cuda = &mut *self.cuda;
        let created = cuda.enter(ctx).and_then(|()| {
            let prop = allocation_prop(&prop);
            cuda.charged_allocation(size, |cuda| {
                let mut raw = 0;
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                check(unsafe {
                    cu_call!(
                        cuda.backend.driver,
                        cuMemCreate(&mut raw, size as usize, &prop, flags)
                    )
                })?;
                cuda.vmm_handles.insert(handle, raw);
                Ok(Charged::Handle(handle))
            })
        });
        code(created.map(drop))
    }

    fn vmm_map(
        &mut self,
        ctx: Id,
        ptr: DevicePtr,
        size: u64,
        offset: u64,
        handle: Id,
        flags: u64,
    ) -> Status {
        let cuda = &mut *self.cuda;
        code(cuda.enter(ctx).and_then(|()| {
            let raw = *cuda.vmm_handles.get(&handle).ok_or(INVALID_HANDLE)?;
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe {
                cu_call!(
                    cuda.backend.driver,
                    cuMemMap(ptr, size as usize, offset as usize, raw, flags)
                )
            })?;
            cuda.vmm_mappings.insert(ptr, size);
            Ok(())
        }))
    }

    fn vmm_set_access(
        &mut self,
        ctx: Id,
        ptr: DevicePtr,
        size: u64,
        access: Vec<MemAccess>,
    ) -> Status {
        let cuda = &mut *self.cuda;
        code(cuda.enter(ctx).and_then(|()| {
            let descs: Vec<CUmemAccessDesc> = access.iter().map(access_desc).collect();
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe {
                cu_call!(
                    cuda.backend.driver,
                    cuMemSetAccess(ptr, size as usize, descs.as_ptr(), descs.len())
                )
            })
        }))
    }

    fn vmm_unmap(&mut self, ctx: Id, ptr: DevicePtr, size: u64) -> Status {
        let cuda = &mut *self.cuda;
        code(cuda.enter(ctx).and_then(|()| {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe { cu_call!(cuda.backend.driver, cuMemUnmap(ptr, size as usize)) })?;
            cuda.vmm_mappings.remove(&ptr);
            Ok(())
        }))
    }

    fn vmm_release(&mut self, ctx: Id, handle: Id) -> Status {
        let cuda = &mut *self.cuda;
        code(cuda.enter(ctx).and_then(|()| {
            let raw = cuda.vmm_handles.remove(&handle).ok_or(INVALID_HANDLE)?;
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            let status = unsafe { cu_call!(cuda.backend.driver, cuMemRelease(raw)) };
            cuda.uncharge(Charged::Handle(handle));
            check(status)
        }))
    }

    fn vmm_address_free(&mut self, ctx: Id, ptr: DevicePtr, size: u64) -> Status {
        let cuda = &mut *self.cuda;
        code(cuda.enter(ctx).and_then(|()| {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe { cu_call!(cuda.backend.driver, cuMemAddressFree(ptr, size as usize)) })?;
            cuda.vmm_reservations.remove(&ptr);
            Ok(())
        }))
    }
}
