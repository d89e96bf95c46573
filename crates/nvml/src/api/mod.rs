//! The implemented NVML entry points, by what they answer: `system.rs` (init, versions),
//! `device.rs` (handles and each device's facts and live values), `processes.rs` (the
//! process lists). Each is `pub unsafe fn nvmlName(...) -> nvmlReturn_t` with nvml.h's
//! parameters; tools/gen_nvml_api.py exports it through the panic guard.
//!
//! Checks come in NVML's order: initialized, then a valid handle, then the out-pointers,
//! then whether the value is known (NOT_SUPPORTED when the server's NVML did not say).

mod device;
mod processes;
mod system;

pub use device::*;
pub use processes::*;
pub use system::*;

use std::ffi::{c_char, c_uint};

use rgpu_protocol::nvml::DeviceStatus;

use crate::devices::{self, Device};
use crate::types::*;

/// An entry point's outcome as its return value.
fn status(result: Result<(), nvmlReturn_t>) -> nvmlReturn_t {
    match result {
        Ok(()) => NVML_SUCCESS,
        Err(error) => error,
    }
}

/// Fails with INVALID_ARGUMENT on a null out-pointer.
fn non_null<T>(out: *mut T) -> Result<(), nvmlReturn_t> {
    if out.is_null() {
        Err(NVML_ERROR_INVALID_ARGUMENT)
    } else {
        Ok(())
    }
}

/// A value the server's NVML may not have answered.
fn known<T>(value: Option<T>) -> Result<T, nvmlReturn_t> {
    value.ok_or(NVML_ERROR_NOT_SUPPORTED)
}

/// Writes `value` through `out` (checked non-null by the caller).
///
/// # Safety
/// `out` must be null or valid for writing a `T`, as NVML's contract has it.
unsafe fn write<T>(out: *mut T, value: T) -> Result<(), nvmlReturn_t> {
    non_null(out)?;
    // SAFETY: non-null, and writable for a T by the caller's contract.
    unsafe { out.write(value) };
    Ok(())
}

/// Writes `text` as a C string into `out`, `length` bytes: INSUFFICIENT_SIZE if it does not
/// fit with its terminator.
///
/// # Safety
/// `out` must be null or valid for writing `length` bytes.
unsafe fn write_str(out: *mut c_char, length: c_uint, text: &str) -> Result<(), nvmlReturn_t> {
    non_null(out)?;
    let bytes = text.as_bytes();
    if bytes.len() >= length as usize {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: `out` holds `length` bytes (the caller's contract), more than the text and its
    // terminator; the text is ours, so the two do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), bytes.len());
        out.add(bytes.len()).write(0);
    }
    Ok(())
}

/// A fixed fact of `device`, written through `out`.
///
/// # Safety
/// `out` must be null or valid for writing a `T`.
unsafe fn fact<T>(
    device: nvmlDevice_t,
    out: *mut T,
    value: impl FnOnce(&Device) -> Option<T>,
) -> nvmlReturn_t {
    status((|| {
        let device = devices::device(device)?;
        non_null(out)?;
        // SAFETY: the caller's contract.
        unsafe { write(out, known(value(device))?) }
    })())
}

/// A live value of `device` (one round trip to its server), written through `out`.
///
/// # Safety
/// `out` must be null or valid for writing a `T`.
unsafe fn live<T>(
    device: nvmlDevice_t,
    out: *mut T,
    value: impl FnOnce(&DeviceStatus) -> Option<T>,
) -> nvmlReturn_t {
    status((|| {
        let device = devices::device(device)?;
        non_null(out)?;
        let status = device.status()?;
        // SAFETY: the caller's contract.
        unsafe { write(out, known(value(&status))?) }
    })())
}

/// A pair of live values (current and pending modes).
///
/// # Safety
/// `first` and `second` must be null or valid for writing a `c_uint`.
unsafe fn live_pair(
    device: nvmlDevice_t,
    first: *mut c_uint,
    second: *mut c_uint,
    value: impl FnOnce(&DeviceStatus) -> Option<(u32, u32)>,
) -> nvmlReturn_t {
    status((|| {
        let device = devices::device(device)?;
        non_null(first)?;
        non_null(second)?;
        let (a, b) = known(value(&device.status()?))?;
        // SAFETY: the caller's contract.
        unsafe { write(first, a)? };
        // SAFETY: the caller's contract.
        unsafe { write(second, b) }
    })())
}
