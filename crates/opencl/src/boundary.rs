//! The C boundary: every exported OpenCL entry point (generated_dispatch.rs, which also fills
//! the ICD dispatch table) runs its implementation through [`guard`], so a panic becomes an
//! OpenCL error and a log line instead of unwinding into C (undefined behavior) or aborting
//! the program.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

/// Runs entry point `name`'s implementation; a panic inside returns `on_panic()` (the error
/// the entry point reports: a status, or NULL with the status through `errcode_ret`).
#[inline]
pub fn guard<R>(name: &'static str, on_panic: impl FnOnce() -> R, call: impl FnOnce() -> R) -> R {
    let _span = rgpu_client::trace::enter("opencl", name);
    match catch_unwind(AssertUnwindSafe(|| {
        inject_panic(name);
        call()
    })) {
        Ok(result) => result,
        Err(panic) => {
            let why = rgpu_client::panic_message(&*panic);
            log::error!("rgpu: {name} panicked ({why}); returning CL_OUT_OF_HOST_MEMORY");
            on_panic()
        }
    }
}

/// Fault injection for the boundary's own test: `RGPU_TEST_PANIC_IN=<entry point>` makes that
/// entry point panic (read once; costs one atomic load per call otherwise).
fn inject_panic(name: &str) {
    static PANIC_IN: OnceLock<Option<String>> = OnceLock::new();
    let target = PANIC_IN.get_or_init(|| std::env::var("RGPU_TEST_PANIC_IN").ok());
    if target.as_deref() == Some(name) {
        panic!("RGPU_TEST_PANIC_IN={name}");
    }
}
