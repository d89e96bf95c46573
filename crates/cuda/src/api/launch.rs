//! Kernel launches and the occupancy calculator.
//!
//! A launch is posted: its parameters are packed, by the layout the server gave when the
//! function was looked up, into one buffer that travels as the request's bulk. Nothing waits
//! for the network and nothing is allocated per launch.

use std::cell::RefCell;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

use rgpu_client::CudaClient;
use rgpu_cuda_api::launch_param;
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{LaunchAttribute, OccupancyQuery};

use super::{status, write_out, Outcome};
use crate::objects::{current_context, resolve_stream, Context, Function};

thread_local! {
    static PARAMS: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Packs the launch's parameters into `buffer`.
pub(crate) unsafe fn pack_params(
    function: &Function,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    buffer: &mut Vec<u8>,
) -> Result<(), CUresult> {
    buffer.clear();
    if !params.is_null() {
        buffer.resize(function.params_size, 0);
        for (i, &(offset, size)) in function.params.iter().enumerate() {
            // SAFETY: the API contract: one pointer per parameter, each to `size` bytes.
            unsafe {
                let src = *params.add(i);
                if src.is_null() {
                    return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                }
                let dst = buffer.as_mut_ptr().add(offset as usize);
                std::ptr::copy_nonoverlapping(src.cast::<u8>(), dst, size as usize);
            }
        }
        return Ok(());
    }
    if extra.is_null() {
        return if function.params.is_empty() {
            Ok(())
        } else {
            Err(CUresult::CUDA_ERROR_INVALID_VALUE)
        };
    }
    let (mut pointer, mut size) = (std::ptr::null::<u8>(), None);
    let mut i = 0;
    // SAFETY: the API contract: `extra` is a list of (marker, value) pairs ending with END.
    unsafe {
        loop {
            match *extra.add(i) as usize {
                launch_param::END => break,
                launch_param::BUFFER_POINTER => pointer = (*extra.add(i + 1)).cast(),
                launch_param::BUFFER_SIZE => size = Some(*(*extra.add(i + 1)).cast::<usize>()),
                _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
            }
            i += 2;
        }
        match size {
            Some(size) if !pointer.is_null() => {
                buffer.extend_from_slice(std::slice::from_raw_parts(pointer, size))
            }
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }
    Ok(())
}

/// The function, and its id on the context's server.
fn launchable(f: *mut c_void, ctx: &Context) -> Result<(Arc<Function>, u64), CUresult> {
    let function = Function::from_handle(f).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    let remote = super::module::function_on(&function, ctx)?;
    Ok((function, remote))
}

unsafe fn launch(
    f: *mut c_void,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    attributes: Vec<LaunchAttribute>,
) -> Result<(), CUresult> {
    let stream_handle = stream;
    let (ctx, stream) = resolve_stream(stream)?;
    let (function, remote) = launchable(f, &ctx)?;
    PARAMS.with(|buffer| {
        let mut buffer = buffer.borrow_mut();
        // SAFETY: the caller's kernel parameters (`kernelParams` or `extra`), as the API requires.
        unsafe { pack_params(&function, params, extra, &mut buffer)? };
        // Parameters pointing into page-locked host memory point to its mirror instead.
        super::host_mirror::translate_params(&ctx, &mut buffer)?;
        // After reading the parameters: they may lie in managed memory, whose host view the
        // hand-over drops.
        super::managed::before_device_work(Some(stream_handle));
        let server = ctx.conn.cuda();
        server
            .launch(
                ctx.remote, remote, stream, grid, block, shared_mem, attributes, &buffer,
            )
            .outcome()
    })
}

pub unsafe fn cuLaunchKernel(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_mem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller's kernel and parameters, as the API requires them.
    status(unsafe {
        launch(
            f.cast(),
            [grid_x, grid_y, grid_z],
            [block_x, block_y, block_z],
            shared_mem,
            stream,
            params,
            extra,
            Vec::new(),
        )
    })
}

/// The attributes of a launch configuration, in wire form.
unsafe fn wire_attributes(attrs: *const CUlaunchAttribute, count: u32) -> Vec<LaunchAttribute> {
    if attrs.is_null() || count == 0 {
        return Vec::new();
    }
    let value_offset = std::mem::offset_of!(CUlaunchAttribute, value);
    let value_size = std::mem::size_of::<CUlaunchAttributeValue>();
    (0..count as usize)
        .map(|i| {
            // SAFETY: the configuration lists `count` attributes; each is read as bytes.
            unsafe {
                let base = attrs.add(i).cast::<u8>();
                LaunchAttribute {
                    id: base.cast::<u32>().read_unaligned(),
                    value: std::slice::from_raw_parts(base.add(value_offset), value_size).to_vec(),
                }
            }
        })
        .collect()
}

pub unsafe fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    if config.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null, and the API contract makes it a valid configuration.
    let config = unsafe { &*config };
    // SAFETY: the caller's kernel and parameters, as the API requires them.
    status(unsafe {
        launch(
            f.cast(),
            [config.gridDimX, config.gridDimY, config.gridDimZ],
            [config.blockDimX, config.blockDimY, config.blockDimZ],
            config.sharedMemBytes,
            config.hStream,
            params,
            extra,
            wire_attributes(config.attrs, config.numAttrs),
        )
    })
}

pub unsafe fn cuLaunchCooperativeKernel(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_mem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    // CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2, value: int 1.
    let mut value = vec![0u8; std::mem::size_of::<CUlaunchAttributeValue>()];
    value[..4].copy_from_slice(&1i32.to_le_bytes());
    let cooperative = vec![LaunchAttribute { id: 2, value }];
    // SAFETY: the caller's kernel and parameters, as the API requires them.
    status(unsafe {
        launch(
            f.cast(),
            [grid_x, grid_y, grid_z],
            [block_x, block_y, block_z],
            shared_mem,
            stream,
            params,
            std::ptr::null_mut(),
            cooperative,
        )
    })
}

// ---- occupancy ---------------------------------------------------------------------------

/// Asks the server an occupancy question once per function and arguments; `query` builds the
/// question from the function's id on the current context's server.
fn occupancy(
    f: *mut c_void,
    key: (u8, i64, i64, u32),
    query: impl FnOnce(u64) -> OccupancyQuery,
) -> Result<i64, CUresult> {
    let ctx = current_context()?;
    let (function, remote) = launchable(f, &ctx)?;
    if let Some(&answer) = function.occupancy.lock().unwrap().get(&key) {
        return Ok(answer);
    }
    let server = ctx.conn.cuda();
    let answer = server.occupancy(ctx.remote, query(remote)).outcome()?;
    function.occupancy.lock().unwrap().insert(key, answer);
    Ok(answer)
}

pub unsafe fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    blocks: *mut c_int,
    f: CUfunction,
    block_size: c_int,
    shared_mem: usize,
    flags: c_uint,
) -> CUresult {
    let key = (0, block_size as i64, shared_mem as i64, flags);
    let query = |function| OccupancyQuery::MaxActiveBlocks {
        function,
        block_size,
        shared_mem: shared_mem as u64,
        flags,
    };
    status(
        occupancy(f.cast(), key, query)
            // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
            .and_then(|answer| unsafe { write_out(blocks, answer as c_int) }),
    )
}

pub unsafe fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    blocks: *mut c_int,
    f: CUfunction,
    block_size: c_int,
    shared_mem: usize,
) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe {
        cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, f, block_size, shared_mem, 0)
    }
}

pub unsafe fn cuOccupancyAvailableDynamicSMemPerBlock(
    bytes: *mut usize,
    f: CUfunction,
    num_blocks: c_int,
    block_size: c_int,
) -> CUresult {
    let key = (1, num_blocks as i64, block_size as i64, 0);
    let query = |function| OccupancyQuery::AvailableDynamicSharedMem {
        function,
        num_blocks,
        block_size,
    };
    status(
        occupancy(f.cast(), key, query)
            // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
            .and_then(|answer| unsafe { write_out(bytes, answer as usize) }),
    )
}

pub unsafe fn cuOccupancyMaxPotentialBlockSizeWithFlags(
    min_grid: *mut c_int,
    block: *mut c_int,
    f: CUfunction,
    size_callback: CUoccupancyB2DSize,
    shared_mem: usize,
    block_size_limit: c_int,
    flags: c_uint,
) -> CUresult {
    if size_callback.is_some() {
        // The callback is code in this process; the calculator runs on the server.
        return crate::unsupported::not_supported(
            "cuOccupancyMaxPotentialBlockSize with a shared-memory callback",
        );
    }
    let key = (2, shared_mem as i64, block_size_limit as i64, flags);
    let query = |function| OccupancyQuery::MaxPotentialBlockSize {
        function,
        shared_mem: shared_mem as u64,
        block_size_limit,
        flags,
    };
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
    status(occupancy(f.cast(), key, query).and_then(|answer| unsafe {
        write_out(min_grid, (answer >> 32) as c_int)?;
        write_out(block, answer as u32 as c_int)
    }))
}

pub unsafe fn cuOccupancyMaxPotentialBlockSize(
    min_grid: *mut c_int,
    block: *mut c_int,
    f: CUfunction,
    size_callback: CUoccupancyB2DSize,
    shared_mem: usize,
    block_size_limit: c_int,
) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe {
        cuOccupancyMaxPotentialBlockSizeWithFlags(
            min_grid,
            block,
            f,
            size_callback,
            shared_mem,
            block_size_limit,
            0,
        )
    }
}

pub unsafe fn cuOccupancyMaxActiveClusters(
    clusters: *mut c_int,
    f: CUfunction,
    config: *const CUlaunchConfig,
) -> CUresult {
    if config.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null, and the API contract makes it a valid configuration.
    let config = unsafe { &*config };
    // SAFETY: `numAttrs` attributes at `attrs`, as the API requires of a launch configuration.
    let attributes = unsafe { wire_attributes(config.attrs, config.numAttrs) };
    let grid = [config.gridDimX, config.gridDimY, config.gridDimZ];
    let block = [config.blockDimX, config.blockDimY, config.blockDimZ];
    let key_grid = ((grid[0] as i64) << 32) | (block[0] as i64);
    let key_rest = ((config.sharedMemBytes as i64) << 32) | attributes.len() as i64;
    let key = (3, key_grid, key_rest, grid[1] ^ (block[1] << 16));
    let query = |function| OccupancyQuery::MaxActiveClusters {
        function,
        grid,
        block,
        shared_mem: config.sharedMemBytes,
        attributes,
    };
    status(
        occupancy(f.cast(), key, query)
            // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
            .and_then(|answer| unsafe { write_out(clusters, answer as c_int) }),
    )
}
