//! The OpenCL entry points, one module per API group. Every `pub unsafe extern "C" fn cl*`
//! here is an implemented entry point: tools/gen_opencl_api.py scans these files to build the
//! ICD dispatch table (`generated_dispatch.rs`), giving every other slot a stub that returns
//! the API's error and logs its name once.

pub mod context;
pub mod device;
pub mod enqueue;
pub mod event;
pub mod image;
pub mod kernel;
pub mod memory;
pub mod peers;
pub mod platform;
pub mod program;
pub mod queue;
pub mod sampler;
