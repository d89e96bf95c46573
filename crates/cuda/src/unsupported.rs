//! What an entry point rgpu does not implement does: return CUDA_ERROR_NOT_SUPPORTED and say so
//! once per name.

use rgpu_cuda_api::sys::CUresult;

pub fn not_supported(name: &'static str) -> CUresult {
    if rgpu_client::first_time(name) {
        log::warn!("rgpu: {name} is not supported; returning CUDA_ERROR_NOT_SUPPORTED");
    }
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
