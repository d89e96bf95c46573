//! Virtual memory management, in the request's context: address reservations, physical
//! allocations (charged to the session's memory quota), mappings and access. They belong to the
//! device, not to a context, so the session records them and undoes them at its end.

use rgpu_cuda_api::native::{check, Status, INVALID_HANDLE};
use rgpu_cuda_api::sys::*;
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

// `allocation_prop` writes the allocation flags as 8 bytes.
const _: () = assert!(std::mem::size_of::<CUmemAllocationProp_st__bindgen_ty_1>() == 8);

/// `CUmemAllocationProp` from its wire form. Its enum fields are written as the integers the
/// client sent (the driver checks them), never as Rust enum values.
fn allocation_prop(prop: &MemProp) -> CUmemAllocationProp {
    // SAFETY: plain data for which all-zero bytes are valid; fields are written through raw
    // pointers at their offsets, each an integer of the written width.
    unsafe {
        let mut raw: CUmemAllocationProp = std::mem::zeroed();
        let base = std::ptr::addr_of_mut!(raw);
        std::ptr::addr_of_mut!((*base).type_)
            .cast::<u32>()
            .write(prop.kind);
        std::ptr::addr_of_mut!((*base).requestedHandleTypes)
            .cast::<u32>()
            .write(prop.handle_types);
        std::ptr::addr_of_mut!((*base).location.type_)
            .cast::<u32>()
            .write(prop.location_type);
        (*base).location.id = prop.location_id;
        std::ptr::addr_of_mut!((*base).allocFlags)
            .cast::<[u8; 8]>()
            .write_unaligned(prop.alloc_flags);
        raw
    }
}

/// The wire form of `CUmemAllocationProp` (as the driver describes an imported allocation).
pub(super) fn wire_prop(prop: &CUmemAllocationProp) -> MemProp {
    let base = std::ptr::addr_of!(*prop);
    // SAFETY: fields of a valid struct, each read as an integer of its width (a newer driver
    // may write enum values this build lacks).
    unsafe {
        MemProp {
            kind: std::ptr::addr_of!((*base).type_).cast::<u32>().read(),
            handle_types: std::ptr::addr_of!((*base).requestedHandleTypes)
                .cast::<u32>()
                .read(),
            location_type: std::ptr::addr_of!((*base).location.type_)
                .cast::<u32>()
                .read(),
            location_id: (*base).location.id,
            alloc_flags: std::ptr::addr_of!((*base).allocFlags)
                .cast::<[u8; 8]>()
                .read_unaligned(),
        }
    }
}

/// The wire form of a `CUmemAccessDesc` (as the driver describes one).
pub(super) fn wire_access(desc: &CUmemAccessDesc) -> MemAccess {
    let base = std::ptr::addr_of!(*desc);
    // SAFETY: fields of a valid struct, each read as an integer of its width.
    unsafe {
        MemAccess {
            location_type: std::ptr::addr_of!((*base).location.type_)
                .cast::<u32>()
                .read(),
            location_id: (*base).location.id,
            flags: std::ptr::addr_of!((*base).flags).cast::<u32>().read(),
        }
    }
}

pub(super) fn access_desc(access: &MemAccess) -> CUmemAccessDesc {
    // SAFETY: as in `allocation_prop`.
    unsafe {
        let mut raw: CUmemAccessDesc = std::mem::zeroed();
        let base = std::ptr::addr_of_mut!(raw);
        std::ptr::addr_of_mut!((*base).location.type_)
            .cast::<u32>()
            .write(access.location_type);
        (*base).location.id = access.location_id;
        std::ptr::addr_of_mut!((*base).flags)
            .cast::<u32>()
            .write(access.flags);
        raw
    }
}
