//! The C boundary: every exported entry point runs through [`guard`], so a panic becomes
//! NVML_ERROR_UNKNOWN and a log line instead of unwinding into C or aborting the program; and
//! what an entry point rgpu does not implement answers ([`not_supported`]).

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::types::{nvmlReturn_t, NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_UNKNOWN, NVML_SUCCESS};

/// Runs an entry point's implementation; a panic inside returns NVML_ERROR_UNKNOWN.
#[inline]
pub fn guard(name: &'static str, call: impl FnOnce() -> nvmlReturn_t) -> nvmlReturn_t {
    let _span = rgpu_client::trace::enter("nvml", name);
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(result) => {
            if result != NVML_SUCCESS {
                log::debug!("rgpu: {name} -> {result}");
            } else {
                log::trace!("rgpu: {name}");
            }
            result
        }
        Err(panic) => {
            let why = rgpu_client::panic_message(&*panic);
            crate::devices::init_logging();
            log::error!("rgpu: {name} panicked ({why}); returning NVML_ERROR_UNKNOWN");
            NVML_ERROR_UNKNOWN
        }
    }
}

/// An NVML entry point rgpu does not implement: NOT_SUPPORTED, said once per name.
pub fn not_supported(name: &'static str) -> nvmlReturn_t {
    if rgpu_client::first_time(name) {
        crate::devices::init_logging();
        log::info!("rgpu: {name} is not supported; returning NVML_ERROR_NOT_SUPPORTED");
    }
    NVML_ERROR_NOT_SUPPORTED
}
