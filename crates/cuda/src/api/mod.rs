//! The driver API entry points rgpu implements, by API group. Every `pub unsafe fn cu*` here is
//! the implementation of the driver function of that name: tools/gen_cuda_api.py finds them and
//! generates its exported symbol (generated_exports.rs) with the parameters the driver declares,
//! so a signature that differs does not compile, running it through the C boundary
//! (boundary.rs); every other driver symbol gets a NOT_SUPPORTED stub.

pub mod context;
pub mod copy;
pub mod device;
pub mod event;
pub mod graph;
pub mod init;
pub mod launch;
pub mod loader;
pub mod memory;
pub mod module;
pub mod stream;
pub mod vmm;

pub use context::*;
pub use copy::*;
pub use device::*;
pub use event::*;
pub use graph::*;
pub use init::*;
pub use launch::*;
pub use loader::*;
pub use memory::*;
pub use module::*;
pub use stream::*;
pub use vmm::*;

use rgpu_client::ClientError;
use rgpu_cuda_api::sys::CUresult;
use rgpu_protocol::cuda::{Answer, Status};

use crate::servers::client_error;

/// A request's outcome as a `CUresult`: a failed connection gives the error for that, a
/// failure the server reports gives its status.
pub(crate) trait Outcome<T> {
    fn outcome(self) -> Result<T, CUresult>;
}

/// Calls answered with a value or a status.
impl<T> Outcome<T> for Result<Answer<T>, ClientError> {
    fn outcome(self) -> Result<T, CUresult> {
        match self.map_err(client_error)? {
            Ok(value) => Ok(value),
            Err(status) => Err(from_remote(status)
                .err()
                .unwrap_or(CUresult::CUDA_ERROR_UNKNOWN)),
        }
    }
}

/// Calls answered with a status.
impl Outcome<()> for Result<Status, ClientError> {
    fn outcome(self) -> Result<(), CUresult> {
        from_remote(self.map_err(client_error)?)
    }
}

/// Posted requests (their failures come from a later synchronizing call).
impl Outcome<()> for Result<(), ClientError> {
    fn outcome(self) -> Result<(), CUresult> {
        self.map_err(client_error)
    }
}

/// Lets entry points use `?` on `Result<_, CUresult>` and return a plain `CUresult`.
pub(crate) fn status(result: Result<(), CUresult>) -> CUresult {
    match result {
        Ok(()) => CUresult::CUDA_SUCCESS,
        Err(error) => error,
    }
}

/// A `CUresult` from a server's integer status (unknown codes become CUDA_ERROR_UNKNOWN).
pub(crate) fn from_remote(status: u32) -> Result<(), CUresult> {
    match rgpu_cuda_api::generated::result(status) {
        Some(CUresult::CUDA_SUCCESS) => Ok(()),
        Some(error) => Err(error),
        None => Err(CUresult::CUDA_ERROR_UNKNOWN),
    }
}

/// Writes through an out-pointer, or fails with CUDA_ERROR_INVALID_VALUE when it is null.
pub(crate) unsafe fn write_out<T>(out: *mut T, value: T) -> Result<(), CUresult> {
    if out.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passes a pointer the API contract makes writable for a T.
    unsafe { out.write(value) };
    Ok(())
}
