//! The OpenCL requests, grouped as the API is: each file implements one group of the OpenCL
//! table's server traits (`rgpu_protocol::opencl::serve`) on [`Session`]; `serve::dispatch`
//! routes each request to its method and sends its reply, or defers the failure of a request
//! that has none.

pub(crate) mod completion;
mod confine;
mod context;
mod enqueue;
mod event;
pub(crate) mod handles;
mod includes;
mod info;
pub(crate) mod inventory;
mod kernel;

mod memory;
mod migration;
pub(crate) mod native;
mod peers;
mod program;
pub(crate) mod session;
pub(crate) mod staging;

use rgpu_cl_api::sys;
use rgpu_protocol::opencl::{Answer, Id};

use crate::opencl::native::{ClResult, Device};
use crate::session::Session;

impl Session {
    /// The native devices behind device ids.
    pub(crate) fn native_devices(&self, ids: &[Id]) -> ClResult<Vec<Device>> {
        ids.iter()
            .map(|&id| {
                self.cl
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
