//! Tensor maps (TMA descriptors, which Hopper kernels of XLA, Triton and CUTLASS take as
//! parameters): a 128-byte encoding of a tensor's shape and device address in the driver's
//! own undocumented format, so the server's driver makes it. The same request is answered
//! from a cache afterwards (programs encode the same few maps at every step), so only the
//! first costs a round trip.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use rgpu_client::CudaClient;
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::TensorMapRequest;

use super::{status, Outcome};
use crate::objects::current_context;

/// Encoded maps by request; cleared when it grows past this many.
const CACHE_ENTRIES: usize = 4096;
static CACHE: Mutex<Option<HashMap<TensorMapRequest, Vec<u8>>>> = Mutex::new(None);
/// `CU_TENSOR_MAP_NUM_QWORDS` * 8.
const MAP_BYTES: usize = 128;

/// Encodes `request` on the current context's server (or takes it from the cache) into `map`.
fn encode(map: *mut CUtensorMap, request: TensorMapRequest) -> CUresult {
    status((|| {
        if map.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let cached = CACHE
            .lock()
            .unwrap()
            .as_ref()
            .and_then(|cache| cache.get(&request).cloned());
        let bytes = match cached {
            Some(bytes) => bytes,
            None => {
                let ctx = current_context()?;
                let bytes = ctx.conn.cuda().tensor_map(request.clone()).outcome()?;
                if bytes.len() != MAP_BYTES {
                    return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                }
                let mut cache = CACHE.lock().unwrap();
                let cache = cache.get_or_insert_with(HashMap::new);
                if cache.len() >= CACHE_ENTRIES {
                    cache.clear();
                }
                cache.insert(request, bytes.clone());
                bytes
            }
        };
        // SAFETY: the program's 128-byte map, writable as the API requires.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), map.cast::<u8>(), MAP_BYTES) };
        Ok(())
    })())
}

/// `n` values at `values` (empty for a null pointer; the driver refuses what it needs).
///
/// # Safety
/// `values` is null or holds `n` values.
unsafe fn list<T: Copy>(values: *const T, n: usize) -> Vec<T> {
    if values.is_null() {
        return Vec::new();
    }
    // SAFETY: the caller's guarantee.
    unsafe { std::slice::from_raw_parts(values, n) }.to_vec()
}

/// The rank a tensor map may have (the driver refuses others; the lists are read up to it).
fn rank_ok(rank: u32) -> Result<usize, CUresult> {
    if (1..=5).contains(&rank) {
        Ok(rank as usize)
    } else {
        Err(CUresult::CUDA_ERROR_INVALID_VALUE)
    }
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn cuTensorMapEncodeTiled(
    map: *mut CUtensorMap,
    data_type: u32,
    rank: u32,
    address: *mut c_void,
    dims: *const u64,
    strides: *const u64,
    box_dims: *const u32,
    element_strides: *const u32,
    interleave: u32,
    swizzle: u32,
    l2: u32,
    oob: u32,
) -> CUresult {
    let n = match rank_ok(rank) {
        Ok(n) => n,
        Err(e) => return e,
    };
    // SAFETY: the program's lists of `rank` (strides: `rank - 1`) values, as the API requires.
    let request = unsafe {
        TensorMapRequest::Tiled {
            data_type,
            address: address as u64,
            dims: list(dims, n),
            strides: list(strides, n - 1),
            box_dims: list(box_dims, n),
            element_strides: list(element_strides, n),
            modes: [interleave, swizzle, l2, oob],
        }
    };
    encode(map, request)
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn cuTensorMapEncodeIm2col(
    map: *mut CUtensorMap,
    data_type: u32,
    rank: u32,
    address: *mut c_void,
    dims: *const u64,
    strides: *const u64,
    lower_corner: *const c_int,
    upper_corner: *const c_int,
    channels: u32,
    pixels: u32,
    element_strides: *const u32,
    interleave: u32,
    swizzle: u32,
    l2: u32,
    oob: u32,
) -> CUresult {
    let n = match rank_ok(rank) {
        Ok(n) if n >= 3 => n,
        _ => return CUresult::CUDA_ERROR_INVALID_VALUE,
    };
    // SAFETY: the program's lists (corners: `rank - 2` values), as the API requires.
    let request = unsafe {
        TensorMapRequest::Im2col {
            data_type,
            address: address as u64,
            dims: list(dims, n),
            strides: list(strides, n - 1),
            lower_corner: list(lower_corner, n - 2),
            upper_corner: list(upper_corner, n - 2),
            channels,
            pixels,
            element_strides: list(element_strides, n),
            modes: [interleave, swizzle, l2, oob],
        }
    };
    encode(map, request)
}

pub unsafe fn cuTensorMapReplaceAddress(map: *mut CUtensorMap, address: *mut c_void) -> CUresult {
    if map.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the program's 128-byte map.
    let old = unsafe { std::slice::from_raw_parts(map.cast::<u8>(), MAP_BYTES) }.to_vec();
    encode(
        map,
        TensorMapRequest::ReplaceAddress {
            map: old,
            address: address as u64,
        },
    )
}
