//! Allocations (plain and stream-ordered, each charged to the session's memory quota) and
//! memsets.

use std::ffi::c_void;

use rgpu_cuda_api::native::{check, Status, INVALID_VALUE};
use rgpu_cuda_api::sys::*;
use rgpu_cuda_api::{cu_call, cu_call_raw};
use rgpu_protocol::cuda::{
    serve, Answer, DevicePtr, Id, MemAccess, MemInfo, Pool, PoolProps, HOST_MIRROR_MAX,
};

use super::ipc::SharedObject;
use super::session::{code, Charged, CudaSession, Served};
use crate::session::End;

impl serve::Memory for Served<'_> {
    fn mem_get_info(&mut self, ctx: Id) -> Answer<MemInfo> {
        let cuda = &mut *self.cuda;
        let (mut free, mut total) = (0usize, 0usize);
        let status = cuda.enter(ctx).and_then(|()| {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe { cu_call!(cuda.backend.driver, cuMemGetInfo_v2(&mut free, &mut total)) })
        });
        status.map(|()| MemInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    fn mem_alloc(&mut self, ctx: Id, size: u64) -> Answer<DevicePtr> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx).and_then(|()| {
            cuda.charged_allocation(size, |cuda| {
                let mut ptr = 0u64;
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                check(unsafe {
                    cu_call!(cuda.backend.driver, cuMemAlloc_v2(&mut ptr, size as usize))
                })
                .map(|()| Charged::Pointer(ptr))
            })
        })
    }

    fn staging_alloc(&mut self, ctx: Id, size: u64) -> Answer<DevicePtr> {
        // CU_STREAM_CAPTURE_MODE_RELAXED: an allocation is no capture hazard for this caller.
        let mut mode = 2u32;
        let exchange = &mut mode as *mut u32;
        let backend = self.cuda.backend.clone();
        // SAFETY: exchanges this thread's capture mode through a local.
        let relaxed = unsafe {
            cu_call_raw!(
                backend.driver,
                cuThreadExchangeStreamCaptureMode(exchange: *mut u32)
            )
        };
        let allocated = self.mem_alloc(ctx, size);
        if relaxed == rgpu_cuda_api::native::SUCCESS {
            // SAFETY: puts the previous mode back, through the same local.
            unsafe {
                cu_call_raw!(
                    backend.driver,
                    cuThreadExchangeStreamCaptureMode(exchange: *mut u32)
                )
            };
        }
        allocated
    }

    fn mem_free(&mut self, ctx: Id, ptr: DevicePtr) -> Status {
        let cuda = &mut *self.cuda;
        let status = cuda
            .enter(ctx)
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            .and_then(|()| check(unsafe { cu_call!(cuda.backend.driver, cuMemFree_v2(ptr)) }));
        if status.is_ok() {
            // A stream-ordered allocation freed synchronously is not freed again at the end.
            cuda.async_allocations.remove(&ptr);
            cuda.uncharge(Charged::Pointer(ptr));
            let object = SharedObject::Memory(cuda.current as usize, ptr);
            self.unshare(object);
        }
        code(status)
    }

    fn mem_alloc_async(&mut self, ctx: Id, stream: Id, size: u64) -> Answer<DevicePtr> {
        let cuda = &mut *self.cuda;
        let allocated = cuda.enter(ctx).and_then(|()| {
            let stream = cuda.stream(stream)?;
            cuda.charged_allocation(size, |cuda| {
                let mut ptr = 0u64;
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                check(unsafe {
                    cu_call!(
                        cuda.backend.driver,
                        cuMemAllocAsync(&mut ptr, size as usize, stream)
                    )
                })
                .map(|()| Charged::Pointer(ptr))
            })
        });
        if let Ok(ptr) = allocated {
            cuda.async_allocations.insert(ptr, cuda.current);
        }
        allocated
    }

    fn mem_free_async(&mut self, ctx: Id, stream: Id, ptr: DevicePtr) -> Answer<()> {
        let cuda = &mut *self.cuda;
        let status = cuda.enter(ctx).and_then(|()| {
            let stream = cuda.stream(stream)?;
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe { cu_call!(cuda.backend.driver, cuMemFreeAsync(ptr, stream)) })
        });
        if status.is_ok() {
            cuda.async_allocations.remove(&ptr);
            cuda.uncharge(Charged::Pointer(ptr));
        }
        status
    }

    fn mem_pool_create(&mut self, ctx: Id, id: Id, props: PoolProps) -> Status {
        code(self.cuda.create_pool(ctx, id, &props))
    }

    fn mem_pool_destroy(&mut self, id: Id) -> Answer<()> {
        let taken = self.cuda.mem_pools.remove(&id);
        self.cuda.destroy(taken)
    }

    fn mem_alloc_from_pool(
        &mut self,
        ctx: Id,
        stream: Id,
        pool: Pool,
        size: u64,
    ) -> Answer<DevicePtr> {
        self.cuda.alloc_from_pool(ctx, stream, pool, size)
    }

    fn mem_pool_set_attribute(&mut self, pool: Pool, attribute: u32, value: u64) -> Status {
        code(self.cuda.set_pool_attribute(pool, attribute, value))
    }

    fn mem_pool_get_attribute(&mut self, pool: Pool, attribute: u32) -> Answer<u64> {
        self.cuda.pool_attribute(pool, attribute)
    }

    fn host_mirror(&mut self, ctx: Id, size: u64) -> Answer<DevicePtr> {
        if size == 0 || size > HOST_MIRROR_MAX {
            return Err(INVALID_VALUE);
        }
        let cuda = &mut *self.cuda;
        cuda.enter(ctx)?;
        cuda.charged_allocation(size, |cuda| {
            let driver = &cuda.backend.driver;
            let mut host = std::ptr::null_mut();
            let flags = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP;
            // SAFETY: a local out-pointer; the driver checks the size.
            check(unsafe { cu_call!(driver, cuMemHostAlloc(&mut host, size as usize, flags)) })?;
            // SAFETY: `size` bytes just allocated, ours alone.
            unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, size as usize) };
            let mut device = 0u64;
            // SAFETY: the mapped allocation just made and a local out-pointer.
            let mapped =
                unsafe { cu_call!(driver, cuMemHostGetDevicePointer_v2(&mut device, host, 0)) };
            if let Err(status) = check(mapped) {
                // SAFETY: the allocation just made, not handed out.
                unsafe { cu_call!(driver, cuMemFreeHost(host)) };
                return Err(status);
            }
            cuda.host_mirrors
                .insert(device, (host as usize, size, cuda.current));
            Ok(Charged::Pointer(device))
        })
    }

    fn host_mirror_write(
        &mut self,
        mirror: DevicePtr,
        offset: u64,
        bulk_len: u64,
    ) -> Result<Answer<()>, End> {
        let found = self.cuda.host_mirrors.get(&mirror).copied();
        let fits = |size: u64| offset.checked_add(bulk_len).is_some_and(|end| end <= size);
        match found {
            Some((host, size, _)) if fits(size) => {
                // SAFETY: the mirror's memory (mapped pinned memory this session allocated),
                // `offset + bulk_len <= size` checked; the device may read it meanwhile, as a
                // program's own zero-copy memory is read.
                let into = unsafe {
                    std::slice::from_raw_parts_mut(
                        (host + offset as usize) as *mut u8,
                        bulk_len as usize,
                    )
                };
                self.session.take_bulk(into)?;
                Ok(Ok(()))
            }
            _ => {
                self.session.drop_bulk()?;
                Ok(Err(INVALID_VALUE))
            }
        }
    }

    fn host_mirror_read(&mut self, mirror: DevicePtr) -> Answer<Vec<u8>> {
        let &(host, size, _) = self.cuda.host_mirrors.get(&mirror).ok_or(INVALID_VALUE)?;
        // SAFETY: the mirror's memory, `size` bytes.
        Ok(unsafe { std::slice::from_raw_parts(host as *const u8, size as usize) }.to_vec())
    }

    fn host_mirror_free(&mut self, mirror: DevicePtr) -> Answer<()> {
        let cuda = &mut *self.cuda;
        let (host, _, _) = cuda.host_mirrors.remove(&mirror).ok_or(INVALID_VALUE)?;
        cuda.uncharge(Charged::Pointer(mirror));
        // SAFETY: the mirror's allocation, forgotten above so freed once.
        check(unsafe { cu_call!(cuda.backend.driver, cuMemFreeHost(host as *mut c_void)) })
    }

    fn mem_pool_trim(&mut self, pool: Pool, keep: u64) -> Answer<()> {
        let cuda = &mut *self.cuda;
        let pool = cuda.pool(pool)?;
        // SAFETY: a live pool.
        check(unsafe { cu_call!(cuda.backend.driver, cuMemPoolTrimTo(pool, keep as usize)) })
    }

    fn mem_pool_set_access(&mut self, pool: Pool, access: Vec<MemAccess>) -> Status {
        code(self.cuda.set_pool_access(pool, &access))
    }

    fn mem_pool_get_access(&mut self, pool: Pool, device: u32) -> Answer<u32> {
        self.cuda.pool_access(pool, device)
    }

    fn device_set_mem_pool(&mut self, device: u32, pool: Pool) -> Status {
        code(self.cuda.set_device_pool(device, pool))
    }

    #[allow(clippy::too_many_arguments)]
    fn memset(
        &mut self,
        ctx: Id,
        stream: Id,
        dst: DevicePtr,
        value: u32,
        element_size: u8,
        width: u64,
        height: u64,
        pitch: u64,
    ) -> Answer<()> {
        let cuda = &mut *self.cuda;
        let stream = cuda.enter(ctx).and_then(|()| cuda.stream(stream))?;
        check(cuda.memset(
            stream,
            dst,
            value,
            element_size,
            width as usize,
            height as usize,
            pitch as usize,
        ))
    }

    fn mem_alloc_managed(&mut self, ctx: Id, size: u64, flags: u32) -> Answer<DevicePtr> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx).and_then(|()| {
            cuda.charged_allocation(size, |cuda| {
                let mut ptr = 0u64;
                // SAFETY: this session's live context and a local out-pointer; the driver
                // checks the size and flags.
                check(unsafe {
                    cu_call!(
                        cuda.backend.driver,
                        cuMemAllocManaged(&mut ptr, size as usize, flags)
                    )
                })
                .map(|()| Charged::Pointer(ptr))
            })
        })
    }

    fn mem_prefetch(
        &mut self,
        ctx: Id,
        stream: Id,
        ptr: DevicePtr,
        size: u64,
        location_type: u32,
        location_id: i32,
    ) -> Answer<()> {
        let cuda = &mut *self.cuda;
        let stream = cuda.enter(ctx).and_then(|()| cuda.stream(stream))?;
        let (location, size, flags) = (
            MemLocation::new(location_type, location_id),
            size as usize,
            0u32,
        );
        // SAFETY: this session's live stream; the location is passed by value as the driver
        // declares it, and the driver checks the range.
        check(unsafe {
            cu_call_raw!(
                cuda.backend.driver,
                cuMemPrefetchAsync_v2(
                    ptr: u64,
                    size: usize,
                    location: MemLocation,
                    flags: u32,
                    stream: CUstream,
                )
            )
        })
    }

    fn mem_advise(
        &mut self,
        ctx: Id,
        ptr: DevicePtr,
        size: u64,
        advice: u32,
        location_type: u32,
        location_id: i32,
    ) -> Status {
        let cuda = &mut *self.cuda;
        let status = cuda.enter(ctx).and_then(|()| {
            let (location, size) = (MemLocation::new(location_type, location_id), size as usize);
            // SAFETY: the advice and location travel as the integers the driver declares;
            // the driver checks the range and values.
            check(unsafe {
                cu_call_raw!(
                    cuda.backend.driver,
                    cuMemAdvise_v2(ptr: u64, size: usize, advice: u32, location: MemLocation)
                )
            })
        });
        code(status)
    }

    fn stream_attach_mem(
        &mut self,
        ctx: Id,
        stream: Id,
        ptr: DevicePtr,
        size: u64,
        flags: u32,
    ) -> Answer<()> {
        let cuda = &mut *self.cuda;
        let stream = cuda.enter(ctx).and_then(|()| cuda.stream(stream))?;
        // SAFETY: this session's live stream; the driver checks the range and flags.
        check(unsafe {
            cu_call!(
                cuda.backend.driver,
                cuStreamAttachMemAsync(stream, ptr, size as usize, flags)
            )
        })
    }

    fn mem_range_get_attribute(
        &mut self,
        ctx: Id,
        ptr: DevicePtr,
        size: u64,
        attribute: u32,
        data_size: u32,
    ) -> Answer<Vec<u8>> {
        // Every range attribute is one or more 32-bit values.
        if data_size == 0 || data_size > MAX_RANGE_ATTRIBUTE_BYTES || !data_size.is_multiple_of(4) {
            return Err(INVALID_VALUE);
        }
        let cuda = &mut *self.cuda;
        cuda.enter(ctx)?;
        let mut data = vec![0u8; data_size as usize];
        let (out, len, size) = (
            data.as_mut_ptr().cast::<c_void>(),
            data.len(),
            size as usize,
        );
        // SAFETY: a local buffer of `len` bytes; the attribute travels as its integer.
        check(unsafe {
            cu_call_raw!(
                cuda.backend.driver,
                cuMemRangeGetAttribute(
                    out: *mut c_void,
                    len: usize,
                    attribute: u32,
                    ptr: u64,
                    size: usize,
                )
            )
        })?;
        Ok(data)
    }
}

/// The most bytes a range attribute may ask for (one 32-bit value per device of a large
/// server, for `CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY`).
const MAX_RANGE_ATTRIBUTE_BYTES: u32 = 4 * 1024;

/// `CUmemLocation` with its type as the integer the client sent (the enum has values the
/// Rust type may lack), passed to the driver by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct MemLocation {
    location_type: u32,
    id: i32,
}

impl MemLocation {
    fn new(location_type: u32, id: i32) -> MemLocation {
        MemLocation { location_type, id }
    }
}

impl CudaSession {
    #[allow(clippy::too_many_arguments)]
    fn memset(
        &mut self,
        stream: CUstream,
        dst: u64,
        value: u32,
        element_size: u8,
        width: usize,
        height: usize,
        pitch: usize,
    ) -> Status {
        let driver = &self.backend.driver;
        match (element_size, height > 1) {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            (1, false) => unsafe {
                cu_call!(driver, cuMemsetD8Async(dst, value as u8, width, stream))
            },
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            (2, false) => unsafe {
                cu_call!(driver, cuMemsetD16Async(dst, value as u16, width, stream))
            },
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            (4, false) => unsafe { cu_call!(driver, cuMemsetD32Async(dst, value, width, stream)) },
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            (1, true) => unsafe {
                cu_call!(
                    driver,
                    cuMemsetD2D8Async(dst, pitch, value as u8, width, height, stream)
                )
            },
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            (2, true) => unsafe {
                cu_call!(
                    driver,
                    cuMemsetD2D16Async(dst, pitch, value as u16, width, height, stream)
                )
            },
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            (4, true) => unsafe {
                cu_call!(
                    driver,
                    cuMemsetD2D32Async(dst, pitch, value, width, height, stream)
                )
            },
            _ => INVALID_VALUE,
        }
    }
}
