//! What an entry point rgpu does not implement does: return CUDA_ERROR_NOT_SUPPORTED and say so
//! once per name.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use rgpu_cuda_api::sys::CUresult;

pub fn not_supported(name: &'static str) -> CUresult {
    static SEEN: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let first = SEEN
        .get_or_init(|| Mutex::new(HashSet::new()))
        .lock()
        .map(|mut seen| seen.insert(name))
        .unwrap_or(false);
    if first {
        log::warn!("rgpu: {name} is not supported; returning CUDA_ERROR_NOT_SUPPORTED");
    }
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
