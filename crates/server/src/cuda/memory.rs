//! Allocations (plain and stream-ordered, each charged to the session's memory quota) and
//! memsets.

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::{check, Status, INVALID_VALUE};
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{serve, Answer, DevicePtr, Id, MemAccess, MemInfo, Pool, PoolProps};

use super::session::{code, Charged, CudaSession, Served};

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

    fn mem_free(&mut self, ctx: Id, ptr: DevicePtr) -> Status {
        let cuda = &mut *self.cuda;
        let status = cuda
            .enter(ctx)
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            .and_then(|()| check(unsafe { cu_call!(cuda.backend.driver, cuMemFree_v2(ptr)) }));
        if status.is_ok() {
            cuda.uncharge(Charged::Pointer(ptr));
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
