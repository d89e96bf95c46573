//! `CUresult`s: from the server's statuses, from a failed connection, for the entry points'
//! out-pointers. Every module of the library uses these; they use none of it.

use rgpu_client::ClientError;
use rgpu_cuda_api::sys::CUresult;
use rgpu_protocol::cuda::{Answer, Status};

/// A request's outcome as a `CUresult`: a failed connection gives the error for that, a
/// failure the server reports gives its status.
pub trait Outcome<T> {
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
pub fn status(result: Result<(), CUresult>) -> CUresult {
    match result {
        Ok(()) => CUresult::CUDA_SUCCESS,
        Err(error) => error,
    }
}

/// A `CUresult` from a server's integer status (unknown codes become CUDA_ERROR_UNKNOWN).
pub fn from_remote(status: u32) -> Result<(), CUresult> {
    match rgpu_cuda_api::generated::result(status) {
        Some(CUresult::CUDA_SUCCESS) => Ok(()),
        Some(error) => Err(error),
        None => Err(CUresult::CUDA_ERROR_UNKNOWN),
    }
}

/// Writes through an out-pointer, or fails with CUDA_ERROR_INVALID_VALUE when it is null.
pub unsafe fn write_out<T>(out: *mut T, value: T) -> Result<(), CUresult> {
    if out.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passes a pointer the API contract makes writable for a T.
    unsafe { out.write(value) };
    Ok(())
}

/// The CUDA error for a failed exchange with a server.
pub fn client_error(error: ClientError) -> CUresult {
    log::error!("rgpu: {error}");
    match error {
        ClientError::Timeout(_) => CUresult::CUDA_ERROR_LAUNCH_TIMEOUT,
        _ => CUresult::CUDA_ERROR_DEVICE_UNAVAILABLE,
    }
}
