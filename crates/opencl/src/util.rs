//! Small helpers shared by the entry points: returning info values, error codes, slices from
//! C pointers.

use std::ffi::{c_void, CStr};

use opencl_sys::*;
use rgpu_client::ClientError;

/// The standard clGet*Info contract: report the size, copy the value if there is room.
///
/// # Safety
/// `value`/`value_size_ret` are the application's pointers for this call (null or writable).
pub unsafe fn write_info(
    bytes: &[u8],
    value_size: usize,
    value: *mut c_void,
    value_size_ret: *mut usize,
) -> cl_int {
    if !value.is_null() {
        if value_size < bytes.len() {
            return CL_INVALID_VALUE;
        }
        // SAFETY: the application promised `value_size` writable bytes at `value`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), value as *mut u8, bytes.len()) };
    }
    if !value_size_ret.is_null() {
        // SAFETY: as above for `value_size_ret`.
        unsafe { *value_size_ret = bytes.len() };
    }
    CL_SUCCESS
}

/// The bytes of a plain value, as an info query returns it.
pub fn bytes_of<T: Copy>(value: &T) -> Vec<u8> {
    // SAFETY: T is Copy plain data; reading its bytes is sound.
    unsafe { std::slice::from_raw_parts(value as *const T as *const u8, std::mem::size_of::<T>()) }
        .to_vec()
}

/// The bytes of a slice of plain values.
pub fn bytes_of_slice<T: Copy>(values: &[T]) -> Vec<u8> {
    // SAFETY: as for `bytes_of`.
    unsafe {
        std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values))
    }
    .to_vec()
}

/// A NUL-terminated string value.
pub fn string_bytes(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 1);
    out.extend_from_slice(text.as_bytes());
    out.push(0);
    out
}

/// Stores an error code where the application asked for it.
///
/// # Safety
/// `errcode_ret` is null or writable.
pub unsafe fn set_error(errcode_ret: *mut cl_int, code: cl_int) {
    if !errcode_ret.is_null() {
        // SAFETY: see the function contract.
        unsafe { *errcode_ret = code };
    }
}

/// Turns a `Result` of a creation into the C convention (handle or null + errcode).
///
/// # Safety
/// `errcode_ret` is null or writable.
pub unsafe fn creation(
    result: Result<*mut c_void, cl_int>,
    errcode_ret: *mut cl_int,
) -> *mut c_void {
    match result {
        Ok(handle) => {
            // SAFETY: the application's errcode pointer: null or writable.
            unsafe { set_error(errcode_ret, CL_SUCCESS) };
            handle
        }
        Err(code) => {
            // SAFETY: the application's errcode pointer: null or writable.
            unsafe { set_error(errcode_ret, code) };
            std::ptr::null_mut()
        }
    }
}

/// Flattens `Result<(), cl_int>` into a status code.
pub fn status(result: Result<(), cl_int>) -> cl_int {
    match result {
        Ok(()) => CL_SUCCESS,
        Err(code) => code,
    }
}

/// The OpenCL error for a failure of the connection to the server. Logged once per kind of
/// failure so the user learns why, without flooding.
pub fn client_error(e: ClientError) -> cl_int {
    use std::sync::atomic::{AtomicBool, Ordering};
    static LOGGED: AtomicBool = AtomicBool::new(false);
    if !LOGGED.swap(true, Ordering::Relaxed) {
        log::error!("rgpu: {e}");
    } else {
        log::debug!("rgpu: {e}");
    }
    CL_OUT_OF_RESOURCES
}

/// A slice from a C pointer and count; empty for a null pointer or zero count.
///
/// # Safety
/// If non-null, `ptr` points to `count` valid values.
pub unsafe fn slice<'a, T>(ptr: *const T, count: usize) -> &'a [T] {
    if ptr.is_null() || count == 0 {
        &[]
    } else {
        // SAFETY: see the function contract.
        unsafe { std::slice::from_raw_parts(ptr, count) }
    }
}

/// A zero-terminated property list, including the terminating zero.
///
/// # Safety
/// If non-null, `props` points to a zero-terminated list (key, value pairs, then 0).
pub unsafe fn property_list<T: Copy + Default + PartialEq>(props: *const T) -> Vec<T> {
    let mut out = Vec::new();
    if props.is_null() {
        return out;
    }
    let mut i = 0;
    loop {
        // SAFETY: the list is zero-terminated; we stop at the terminator.
        let key = unsafe { *props.add(i) };
        out.push(key);
        if key == T::default() {
            break;
        }
        // SAFETY: the list is zero-terminated and each key has its value after it (the API contract).
        out.push(unsafe { *props.add(i + 1) });
        i += 2;
    }
    out
}

/// A C string argument as UTF-8 (lossy), or None for null.
///
/// # Safety
/// `ptr` is null or a NUL-terminated string.
pub unsafe fn c_string(ptr: *const std::ffi::c_char) -> Option<String> {
    if ptr.is_null() {
        None
    } else {
        // SAFETY: see the function contract.
        Some(
            unsafe { CStr::from_ptr(ptr) }
                .to_string_lossy()
                .into_owned(),
        )
    }
}

/// Runs a body, turning a panic into `on_panic` instead of unwinding into C: the boundary's
/// guard, for entry points outside the dispatch table and for callbacks.
pub fn guard<R>(on_panic: R, body: impl FnOnce() -> R) -> R {
    // Named in traces only when it is the outermost call: an extension function (reached
    // through clGetExtensionFunctionAddress) or a callback.
    crate::boundary::guard("an extension function or callback", || on_panic, body)
}

pub fn version_number(major: u32, minor: u32, patch: u32) -> cl_version {
    (major << 22) | (minor << 12) | patch
}

pub fn name_version(name: &str, version: cl_version) -> Vec<u8> {
    let mut entry = bytes_of(&version);
    let mut field = [0u8; CL_NAME_VERSION_MAX_NAME_SIZE];
    field[..name.len()].copy_from_slice(name.as_bytes());
    entry.extend_from_slice(&field);
    entry
}

/// A request's outcome as an OpenCL status: a failed connection gives the error for that
/// ([`client_error`]), a failure the server reports gives its status.
pub trait Outcome<T> {
    fn outcome(self) -> Result<T, cl_int>;
}

/// Calls answered with a value or a status.
impl<T> Outcome<T> for Result<rgpu_protocol::opencl::Answer<T>, ClientError> {
    fn outcome(self) -> Result<T, cl_int> {
        self.map_err(client_error)?
    }
}

/// Posted requests (their failures come from a later synchronizing call).
impl Outcome<()> for Result<(), ClientError> {
    fn outcome(self) -> Result<(), cl_int> {
        self.map_err(client_error)
    }
}
