//! Kernel launches (the parameter buffer is the request's bulk, read into a buffer the session
//! reuses) and the occupancy calculator.

use std::ffi::c_void;
use std::ptr::null_mut;

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::launch_param;
use rgpu_cuda_api::native::{check, Driver, Status, INVALID_VALUE};
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{serve, Answer, Id, LaunchAttribute, OccupancyQuery};

use super::session::{CudaSession, Served, INVALID_CONTEXT};

/// The largest kernel parameter buffer a launch may carry (the driver's limit is 32 KiB).
pub(super) const MAX_PARAMS: u64 = 1 << 20;
use crate::session::End;

impl serve::Launches for Served<'_> {
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &mut self,
        ctx: Id,
        function: Id,
        stream: Id,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        attributes: Vec<LaunchAttribute>,
        bulk_len: u64,
    ) -> Result<Answer<()>, End> {
        let cuda = &mut *self.cuda;
        self.session
            .take_bulk_into(&mut cuda.params, bulk_len, MAX_PARAMS)?;
        // A launch with more requests behind it goes to the launch thread, so that the driver
        // issues it while they are read; a lone one (a launch the program then waits for) is
        // issued here at once, where the launch thread has nothing left to issue before it.
        let more_behind = self.session.reader.has_buffered();
        let hand_over = cuda
            .launcher()
            .is_some_and(|launcher| more_behind || !launcher.is_idle());
        let resolve = |cuda: &mut CudaSession| {
            cuda.resolve_launch(function, stream, grid, block, shared_mem, &attributes)
        };
        if hand_over {
            // The launch thread makes the context current itself.
            let Some(context) = cuda.contexts.get(&ctx).map(|c| c.raw) else {
                return Ok(Err(INVALID_CONTEXT));
            };
            return Ok(resolve(cuda).map(|shape| cuda.hand_over_launch(context, shape)));
        }
        Ok(cuda.enter(ctx).and_then(|()| {
            let mut shape = resolve(cuda)?;
            check(issue_launch(
                &cuda.backend.driver,
                &mut shape,
                &mut cuda.params,
            ))
        }))
    }

    fn occupancy(&mut self, ctx: Id, query: OccupancyQuery) -> Answer<i64> {
        self.cuda.occupancy(ctx, &query)
    }
}

/// A launch with its handles resolved, ready for the driver (on the session thread or the
/// launch thread).
pub(super) struct LaunchShape {
    pub function: CUfunction,
    pub stream: CUstream,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    pub attributes: Vec<CUlaunchAttribute>,
}

impl CudaSession {
    /// Resolves a launch's handles and attributes: a bad one fails the launch, inline or
    /// handed over alike.
    fn resolve_launch(
        &self,
        function: Id,
        stream: Id,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        attributes: &[LaunchAttribute],
    ) -> Result<LaunchShape, Status> {
        Ok(LaunchShape {
            function: self.function(function)?.raw,
            stream: self.stream(stream)?,
            grid,
            block,
            shared_mem,
            attributes: launch_attributes(attributes).ok_or(INVALID_VALUE)?,
        })
    }

    /// Hands a resolved launch (its parameters in `self.params`) to the launch thread, which
    /// issues it in `context`.
    fn hand_over_launch(&mut self, context: CUcontext, shape: LaunchShape) {
        let params = std::mem::take(&mut self.params);
        if let Some(launcher) = self.launcher() {
            launcher.post(context, shape, &params);
        }
        self.params = params;
    }

    fn occupancy(&mut self, ctx: Id, query: &OccupancyQuery) -> Result<i64, Status> {
        self.enter(ctx)?;
        let driver = &self.backend.driver;
        match *query {
            OccupancyQuery::MaxActiveBlocks {
                function,
                block_size,
                shared_mem,
                flags,
            } => {
                let function = self.function(function)?;
                let mut blocks = 0;
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                check(unsafe {
                    cu_call!(
                        driver,
                        cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
                            &mut blocks,
                            function.raw,
                            block_size,
                            shared_mem as usize,
                            flags
                        )
                    )
                })?;
                Ok(blocks as i64)
            }
            OccupancyQuery::AvailableDynamicSharedMem {
                function,
                num_blocks,
                block_size,
            } => {
                let function = self.function(function)?;
                let mut bytes = 0usize;
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                check(unsafe {
                    cu_call!(
                        driver,
                        cuOccupancyAvailableDynamicSMemPerBlock(
                            &mut bytes,
                            function.raw,
                            num_blocks,
                            block_size
                        )
                    )
                })?;
                Ok(bytes as i64)
            }
            OccupancyQuery::MaxPotentialBlockSize {
                function,
                shared_mem,
                block_size_limit,
                flags,
            } => {
                let function = self.function(function)?;
                let (mut min_grid, mut block) = (0, 0);
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                check(unsafe {
                    cu_call!(
                        driver,
                        cuOccupancyMaxPotentialBlockSizeWithFlags(
                            &mut min_grid,
                            &mut block,
                            function.raw,
                            None,
                            shared_mem as usize,
                            block_size_limit,
                            flags
                        )
                    )
                })?;
                // Both answers in one value: min grid size high, block size low.
                Ok(((min_grid as i64) << 32) | block as u32 as i64)
            }
            OccupancyQuery::MaxActiveClusters {
                function,
                grid,
                block,
                shared_mem,
                ref attributes,
            } => {
                let function = self.function(function)?;
                let mut attrs = launch_attributes(attributes).ok_or(INVALID_VALUE)?;
                let config = launch_config(grid, block, shared_mem, null_mut(), &mut attrs);
                let mut clusters = 0;
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                check(unsafe {
                    cu_call!(
                        driver,
                        cuOccupancyMaxActiveClusters(&mut clusters, function.raw, &config)
                    )
                })?;
                Ok(clusters as i64)
            }
        }
    }
}

/// Issues a resolved launch with its parameter buffer `params` (as the wire carries it):
/// without attributes `cuLaunchKernel`, with them `cuLaunchKernelEx`.
pub(super) fn issue_launch(driver: &Driver, shape: &mut LaunchShape, params: &mut [u8]) -> Status {
    let mut size = params.len();
    let mut extra = [
        launch_param::BUFFER_POINTER as *mut c_void,
        params.as_mut_ptr().cast(),
        launch_param::BUFFER_SIZE as *mut c_void,
        (&mut size as *mut usize).cast(),
        launch_param::END as *mut c_void,
    ];
    let LaunchShape {
        function,
        stream,
        grid,
        block,
        shared_mem,
        ref mut attributes,
    } = *shape;
    if attributes.is_empty() {
        // SAFETY: the session's live handles and local buffers; the driver checks addresses.
        return unsafe {
            cu_call!(
                driver,
                cuLaunchKernel(
                    function,
                    grid[0],
                    grid[1],
                    grid[2],
                    block[0],
                    block[1],
                    block[2],
                    shared_mem,
                    stream,
                    null_mut(),
                    extra.as_mut_ptr()
                )
            )
        };
    }
    let config = launch_config(grid, block, shared_mem, stream, attributes);
    // SAFETY: as above.
    unsafe {
        cu_call!(
            driver,
            cuLaunchKernelEx(&config, function, null_mut(), extra.as_mut_ptr())
        )
    }
}

pub(super) fn launch_config(
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    stream: CUstream,
    attrs: &mut [CUlaunchAttribute],
) -> CUlaunchConfig {
    CUlaunchConfig {
        gridDimX: grid[0],
        gridDimY: grid[1],
        gridDimZ: grid[2],
        blockDimX: block[0],
        blockDimY: block[1],
        blockDimZ: block[2],
        sharedMemBytes: shared_mem,
        hStream: stream,
        attrs: attrs.as_mut_ptr(),
        numAttrs: attrs.len() as u32,
    }
}

/// Rebuilds launch attributes from their wire form; `None` if one is malformed.
fn launch_attributes(attributes: &[LaunchAttribute]) -> Option<Vec<CUlaunchAttribute>> {
    let value_offset = std::mem::offset_of!(CUlaunchAttribute, value);
    let value_size = std::mem::size_of::<CUlaunchAttributeValue>();
    attributes
        .iter()
        .map(|attribute| {
            if attribute.value.len() > value_size {
                return None;
            }
            // SAFETY: CUlaunchAttribute is plain data for which all-zero bytes are valid (id 0
            // is CU_LAUNCH_ATTRIBUTE_IGNORE); the id and value bytes are written inside it.
            unsafe {
                let mut raw: CUlaunchAttribute = std::mem::zeroed();
                let base = (&mut raw as *mut CUlaunchAttribute).cast::<u8>();
                base.cast::<u32>().write_unaligned(attribute.id);
                std::ptr::copy_nonoverlapping(
                    attribute.value.as_ptr(),
                    base.add(value_offset),
                    attribute.value.len(),
                );
                Some(raw)
            }
        })
        .collect()
}
