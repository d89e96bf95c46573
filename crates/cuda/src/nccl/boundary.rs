//! The C boundary of rgpu's NCCL: every entry of the table runs through [`guard`], so a panic
//! becomes `ncclInternalError` (or an error text) and a log line, never an unwind into C.

use std::collections::HashSet;
use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use rgpu_cuda_api::nccl::{ncclResult_t, NCCL_INVALID_USAGE, NCCL_SUCCESS};

/// Runs an entry's implementation; a panic inside returns `on_panic`.
pub(super) fn guard<R: PartialEq + Copy + 'static>(
    name: &'static str,
    on_panic: R,
    call: impl FnOnce() -> R,
) -> R {
    if rgpu_client::fork::forked() {
        crate::servers::init_logging();
        log::warn!("rgpu: {name} in a child forked after CUDA was set up: refused");
        return on_panic;
    }
    let _span = rgpu_client::trace::enter("nccl", name);
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(result) => {
            if let Some(&code) = (&result as &dyn std::any::Any).downcast_ref::<ncclResult_t>() {
                if code != NCCL_SUCCESS && log::log_enabled!(log::Level::Debug) {
                    log::debug!("rgpu: {name} -> {code}");
                }
            }
            result
        }
        Err(panic) => {
            let why = rgpu_client::panic_message(&*panic);
            crate::servers::init_logging();
            log::error!("rgpu: {name} panicked ({why})");
            on_panic
        }
    }
}

/// An NCCL function rgpu does not implement: logs its name once, answers ncclInvalidUsage
/// (NCCL has no "not supported").
pub(super) unsafe extern "C" fn unsupported(name: *const c_char) -> ncclResult_t {
    static LOGGED: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let name = if name.is_null() {
        "an NCCL function".to_string()
    } else {
        // SAFETY: rgpu's libnccl passes its functions' names as C string literals.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    };
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let mut logged = LOGGED.lock().unwrap_or_else(|e| e.into_inner());
        if logged.get_or_insert_with(HashSet::new).insert(name.clone()) {
            crate::servers::init_logging();
            log::warn!("rgpu: {name} is not supported (ncclInvalidUsage)");
        }
    }));
    NCCL_INVALID_USAGE
}
