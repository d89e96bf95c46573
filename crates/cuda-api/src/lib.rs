//! CUDA driver API definitions shared by the rgpu server, the drop-in `libcuda.so.1` and the CLI.
//!
//! - [`sys`]: the driver's C types (from cudarc's bindings; rgpu never calls through cudarc).
//! - [`generated`]: the one list of driver functions ([`for_each_driver_function!`]), the
//!   `cuGetProcAddress` version table and the names of every `CUresult`.
//! - [`native`]: a driver library loaded at run time, called through [`cu_call!`].
//! - [`wire`]: driver structs to and from their wire forms, for both ends.

pub use cudarc::driver::sys;

pub mod generated;
pub mod image;
pub mod native;
pub mod wire;

/// The markers of a launch's `extra` array (`CU_LAUNCH_PARAM_*`, pointer-valued macros in C).
pub mod launch_param {
    pub const END: usize = 0;
    pub const BUFFER_POINTER: usize = 1;
    pub const BUFFER_SIZE: usize = 2;
}
