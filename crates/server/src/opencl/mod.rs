//! The OpenCL requests, grouped as the API is: each file adds the handlers of one group to
//! [`Session`]. Handlers return `ClResult`; the session turns that into a reply or, for a
//! request without one, a deferred error.

mod context;
mod enqueue;
mod event;
mod includes;
mod info;
mod kernel;

pub(crate) use kernel::KernelFacts;
mod memory;
mod program;

use rgpu_cl_api::sys;
use rgpu_protocol::opencl::Id;

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
