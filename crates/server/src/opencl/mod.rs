//! The OpenCL requests, grouped as the API is: each file implements one group of the OpenCL
//! table's server traits (`rgpu_protocol::opencl::serve`) on [`Session`]; `serve::dispatch`
//! routes each request to its method and sends its reply, or defers the failure of a request
//! that has none.

mod context;
mod enqueue;
mod event;
mod includes;
mod info;
mod kernel;

mod memory;
mod program;

use rgpu_cl_api::sys;
use rgpu_protocol::opencl::{Answer, Id};

use crate::native::{ClResult, Device};
use crate::session::Session;

impl Session {
    /// The native devices behind device ids.
    pub(crate) fn native_devices(&self, ids: &[Id]) -> ClResult<Vec<Device>> {
        ids.iter()
            .map(|&id| {
                self.inventory
                    .device(id)
                    .map(|d| d.native)
                    .ok_or(sys::CL_INVALID_DEVICE)
            })
            .collect()
    }
}

/// A status as an answer: `Ok` for CL_SUCCESS.
pub(crate) fn answer(status: i32) -> Answer<()> {
    match status {
        sys::CL_SUCCESS => Ok(()),
        error => Err(error),
    }
}
