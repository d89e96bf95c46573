//! The C boundary: every exported driver entry point (generated_exports.rs) runs its
//! implementation through [`guard`], so a panic becomes `CUDA_ERROR_UNKNOWN` and a log line
//! instead of unwinding into C (undefined behavior) or aborting the program; the callbacks of
//! cudart's private tables (export_tables.rs) run through [`callback`].

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use rgpu_cuda_api::sys::CUresult;

/// Runs an entry point's implementation; a panic inside returns `CUDA_ERROR_UNKNOWN`.
#[inline]
pub fn guard(name: &'static str, call: impl FnOnce() -> CUresult) -> CUresult {
    // A child forked after CUDA was set up: as NVIDIA's driver, refuse (the sessions are the
    // parent's); the error strings still answer.
    if rgpu_client::fork::forked() && !name.starts_with("cuGetError") {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    }
    let _span = rgpu_client::trace::enter("cuda", name);
    match catch_unwind(AssertUnwindSafe(|| {
        inject_panic(name);
        call()
    })) {
        Ok(result) => {
            // What failed and how, for RGPU_LOG=debug.
            if result != CUresult::CUDA_SUCCESS && log::log_enabled!(log::Level::Debug) {
                log::debug!("rgpu: {name} -> {result:?}");
            }
            result
        }
        Err(panic) => {
            let why = rgpu_client::panic_message(&*panic);
            crate::servers::init_logging();
            log::error!("rgpu: {name} panicked ({why}); returning CUDA_ERROR_UNKNOWN");
            CUresult::CUDA_ERROR_UNKNOWN
        }
    }
}

/// Runs a callback of cudart's private tables (export_tables.rs), which cudart calls from
/// inside its own calls: a panic inside returns `on_panic` and is logged, never unwinds into C.
pub fn callback<R>(name: &'static str, on_panic: R, call: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(|| {
        inject_panic(name);
        call()
    }))
    .unwrap_or_else(|panic| {
        let why = rgpu_client::panic_message(&*panic);
        crate::servers::init_logging();
        log::error!("rgpu: {name} (a private-table callback) panicked ({why})");
        on_panic
    })
}

/// Fault injection for the boundary's own test: `RGPU_TEST_PANIC_IN=<entry point>` makes that
/// entry point panic (read once; costs one atomic load per call otherwise).
fn inject_panic(name: &'static str) {
    static PANIC_IN: OnceLock<Option<String>> = OnceLock::new();
    let target = PANIC_IN.get_or_init(|| std::env::var("RGPU_TEST_PANIC_IN").ok());
    if target.as_deref() == Some(name) {
        panic!("RGPU_TEST_PANIC_IN={name}");
    }
}
