//! OpenCL definitions shared by the rgpu server, the ICD (`librgpu_opencl.so`) and the CLI.
//!
//! - [`sys`]: the OpenCL C types, constants and function-pointer types (opencl-sys, with no
//!   link-time dependency on libOpenCL).
//! - [`for_each_dispatch_slot!`] and [`DISPATCH_SLOT_NAMES`]: the one list of the OpenCL API,
//!   generated from opencl-sys by `tools/gen_opencl_api.py`, in ICD dispatch table order.
//!   Consumers build tables, loaders and stubs from it instead of copying signatures.
//! - [`native`]: the system's OpenCL (the ICD loader) loaded at run time, with helpers for the
//!   two-call clGet*Info pattern.
//! - [`params`]: every platform and device info parameter with its name and value kind.
//! - [`errors`]: OpenCL status code names.
//! - [`objects`]: owning wrappers of the few OpenCL objects the CLI's tools use (`rgpu devices`,
//!   `rgpu bench`).
//!
//! `src/generated.rs` (and the ICD's `crates/opencl/src/generated_dispatch.rs`) come from
//! `python3 tools/gen_opencl_api.py`; CI runs it with `--check`.

pub use opencl_sys as sys;

pub mod errors;
mod generated;
pub mod native;
pub mod objects;
pub mod params;
pub mod validate;

pub use errors::{error_name, ClError};
pub use generated::DISPATCH_SLOT_NAMES;
pub use native::NativeOpenCl;

/// Every type that appears in an OpenCL entry point's signature, under one path, so generated
/// code can name them as `rgpu_cl_api::types::X` (or `$crate::types::X` inside macros).
pub mod types {
    pub use crate::sys::cl_icd::*;
    pub use crate::sys::*;
    pub use core::ffi::{c_char, c_int, c_void};

    /// C `size_t` (what opencl-sys signatures use for sizes).
    #[allow(non_camel_case_types)]
    pub type size_t = usize;
    /// C `intptr_t`.
    #[allow(non_camel_case_types)]
    pub type intptr_t = isize;
}

/// rgpu's device info extension: the server holding a device, as the NUL-terminated string
/// `host:port` (or `unix:/path`). Answered by rgpu devices only; other platforms return
/// CL_INVALID_VALUE.
pub const CL_DEVICE_RGPU_SERVER: u32 = 0x5247_0001;

/// Listed in CL_DEVICE_EXTENSIONS of every rgpu device; announces [`CL_DEVICE_RGPU_SERVER`].
pub const RGPU_DEVICE_EXTENSION: &str = "cl_rgpu_remote_device";

/// CL_PLATFORM_NAME of the platform that holds the remote devices.
pub const RGPU_PLATFORM_NAME: &str = "rgpu";

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! collect_slots {
        ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
            vec![$((stringify!($name), <[&str]>::len(&[$(stringify!($arg)),*]))),*]
        };
    }

    #[test]
    fn generated_list_matches_the_dispatch_table() {
        let slots = for_each_dispatch_slot!(collect_slots);
        let names: Vec<&str> = slots.iter().map(|(name, _)| *name).collect();
        assert_eq!(names, DISPATCH_SLOT_NAMES);
        // One pointer-sized field per slot: the list covers the whole struct, in order.
        assert_eq!(
            DISPATCH_SLOT_NAMES.len() * std::mem::size_of::<usize>(),
            std::mem::size_of::<sys::cl_icd::_cl_icd_dispatch>()
        );
        assert_eq!(names[0], "clGetPlatformIDs");
        assert_eq!(*names.last().unwrap(), "clGetKernelSuggestedLocalWorkSize");
        for expected in [
            "clEnqueueNDRangeKernel",
            "clCreateCommandQueueWithProperties",
            "clSetKernelArgSVMPointer",
            "clCreateProgramWithIL",
            "clCreateBufferWithProperties",
            "clSetContextDestructorCallback",
        ] {
            assert!(names.contains(&expected), "{expected} missing");
        }
        let position = |name| names.iter().position(|n| *n == name).unwrap();
        assert!(position("clEnqueueNDRangeKernel") < position("clCreateSubBuffer"));
        let nd_range_args = slots.iter().find(|(n, _)| *n == "clEnqueueNDRangeKernel");
        assert_eq!(nd_range_args.unwrap().1, 9);
    }

    macro_rules! extra_tokens_reach_the_callback {
        ([$value:expr] $($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
            $value + [$(stringify!($name)),*].len()
        };
    }

    #[test]
    fn extra_tokens_are_passed_through() {
        let base = 1000;
        let total = for_each_dispatch_slot!(extra_tokens_reach_the_callback, base);
        assert_eq!(total, 1000 + DISPATCH_SLOT_NAMES.len());
    }

    #[test]
    fn rgpu_server_param_is_answered_by_the_icd_not_queried_natively() {
        assert!(params::DEVICE_INFO_PARAMS
            .iter()
            .all(|(param, _, _)| *param != CL_DEVICE_RGPU_SERVER));
    }
}
