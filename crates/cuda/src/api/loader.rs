//! Finding entry points and tables: cuGetProcAddress, cuGetExportTable, and the error names
//! and strings.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

use rgpu_cuda_api::generated::RESULT_NAMES;
use rgpu_cuda_api::sys::{cuuint64_t, CUdriverProcAddressQueryResult, CUresult, CUuuid};

use crate::export_tables;
use crate::proc_address;

pub unsafe fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cudaVersion: c_int,
    flags: cuuint64_t,
) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, std::ptr::null_mut()) }
}

pub unsafe fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cudaVersion: c_int,
    flags: cuuint64_t,
    symbolStatus: *mut u32,
) -> CUresult {
    if symbol.is_null() || pfn.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller passes a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str();
    let found = name.map_or(
        Err(CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
        |name| proc_address::lookup(name, cudaVersion, flags),
    );
    let (address, query, result) = match found {
        Ok(address) => (
            address as *mut c_void,
            CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS,
            CUresult::CUDA_SUCCESS,
        ),
        Err(query) => (std::ptr::null_mut(), query, CUresult::CUDA_ERROR_NOT_FOUND),
    };
    // SAFETY: `pfn` is non-null and writable; `symbolStatus` is optional.
    unsafe {
        pfn.write(address);
        if !symbolStatus.is_null() {
            symbolStatus.write(query as u32);
        }
    }
    result
}

pub unsafe fn cuGetExportTable(
    ppExportTable: *mut *const c_void,
    pExportTableId: *const CUuuid,
) -> CUresult {
    if ppExportTable.is_null() || pExportTableId.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller passes a readable UUID.
    let id = unsafe { (*pExportTableId).bytes }.map(|b| b as u8);
    match export_tables::get(&id) {
        Some(table) => {
            // SAFETY: non-null and writable per the API.
            unsafe { ppExportTable.write(table) };
            CUresult::CUDA_SUCCESS
        }
        None => CUresult::CUDA_ERROR_INVALID_VALUE,
    }
}

/// Each `CUresult` value with its name and description, NUL-terminated and never freed (the
/// API hands out `const char*` that stay valid).
fn error_texts() -> &'static [(u32, CString, CString)] {
    static TEXTS: OnceLock<Vec<(u32, CString, CString)>> = OnceLock::new();
    TEXTS.get_or_init(|| {
        RESULT_NAMES
            .iter()
            .map(|&(result, name)| {
                let text = CString::new(name).expect("result names have no NUL");
                let description = CString::new(describe(name)).expect("no NUL");
                (result as u32, text, description)
            })
            .collect()
    })
}

/// A short description from an error's name: "CUDA_ERROR_OUT_OF_MEMORY" -> "out of memory".
fn describe(name: &str) -> String {
    match name.strip_prefix("CUDA_ERROR_") {
        Some(rest) => rest.to_ascii_lowercase().replace('_', " "),
        None if name == "CUDA_SUCCESS" => "no error".to_string(),
        None => name.to_ascii_lowercase().replace('_', " "),
    }
}

/// Looks up an error text. `error` is a plain integer: callers may pass values that are not
/// `CUresult` variants, which an enum parameter could not hold.
unsafe fn error_text(
    error: u32,
    text: *mut *const c_char,
    pick: fn(&(u32, CString, CString)) -> &CString,
) -> CUresult {
    if text.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    let texts = error_texts();
    let found = texts
        .binary_search_by_key(&error, |entry| entry.0)
        .ok()
        .map(|i| pick(&texts[i]).as_ptr());
    // SAFETY: `text` is non-null and writable per the API.
    unsafe { text.write(found.unwrap_or(std::ptr::null())) };
    match found {
        Some(_) => CUresult::CUDA_SUCCESS,
        None => CUresult::CUDA_ERROR_INVALID_VALUE,
    }
}

pub unsafe fn cuGetErrorName(error: u32, pStr: *mut *const c_char) -> CUresult {
    // SAFETY: the caller's out-pointer for the text (null is refused).
    unsafe { error_text(error, pStr, |entry| &entry.1) }
}

pub unsafe fn cuGetErrorString(error: u32, pStr: *mut *const c_char) -> CUresult {
    // SAFETY: the caller's out-pointer for the text (null is refused).
    unsafe { error_text(error, pStr, |entry| &entry.2) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(f: unsafe fn(u32, *mut *const c_char) -> CUresult, error: u32) -> Option<String> {
        let mut out = std::ptr::dangling::<c_char>();
        // SAFETY: test: a writable local out-pointer.
        let result = unsafe { f(error, &mut out) };
        assert_eq!(result == CUresult::CUDA_SUCCESS, !out.is_null());
        // SAFETY: a non-null result points at a static NUL-terminated text.
        (!out.is_null()).then(|| unsafe { CStr::from_ptr(out) }.to_str().unwrap().to_string())
    }

    #[test]
    fn error_names_and_strings() {
        assert_eq!(
            text(cuGetErrorName, 2).as_deref(),
            Some("CUDA_ERROR_OUT_OF_MEMORY")
        );
        assert_eq!(text(cuGetErrorString, 2).as_deref(), Some("out of memory"));
        assert_eq!(text(cuGetErrorName, 0).as_deref(), Some("CUDA_SUCCESS"));
        assert_eq!(text(cuGetErrorString, 0).as_deref(), Some("no error"));
        assert_eq!(
            text(cuGetErrorName, 999).as_deref(),
            Some("CUDA_ERROR_UNKNOWN")
        );
        assert_eq!(text(cuGetErrorName, 12345), None);
        assert_eq!(text(cuGetErrorString, u32::MAX), None);
        // SAFETY: the caller's arguments, passed on as they came.
        let result = unsafe { cuGetErrorName(2, std::ptr::null_mut()) };
        assert_eq!(result, CUresult::CUDA_ERROR_INVALID_VALUE);
    }

    #[test]
    fn result_names_are_sorted_by_value() {
        for pair in error_texts().windows(2) {
            assert!(pair[0].0 < pair[1].0);
        }
    }

    #[test]
    fn proc_address_reports_status() {
        let mut pfn = std::ptr::dangling_mut::<c_void>();
        let mut query = u32::MAX;
        let name = c"cuMemAlloc";
        // SAFETY: the caller's arguments, passed on as they came.
        let result = unsafe { cuGetProcAddress_v2(name.as_ptr(), &mut pfn, 12000, 0, &mut query) };
        assert_eq!(result, CUresult::CUDA_SUCCESS);
        assert_eq!(
            pfn as *const (),
            proc_address::export("cuMemAlloc_v2").unwrap()
        );
        assert_eq!(
            query,
            CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS as u32
        );

        let name = c"cuNoSuchThing";
        // SAFETY: the caller's arguments, passed on as they came.
        let result = unsafe { cuGetProcAddress_v2(name.as_ptr(), &mut pfn, 12000, 0, &mut query) };
        assert_eq!(result, CUresult::CUDA_ERROR_NOT_FOUND);
        assert!(pfn.is_null());
        assert_eq!(
            query,
            CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND as u32
        );

        let name = c"cuCtxCreate";
        // SAFETY: the caller's arguments, passed on as they came.
        let result = unsafe { cuGetProcAddress(name.as_ptr(), &mut pfn, 1000, 0) };
        assert_eq!(result, CUresult::CUDA_ERROR_NOT_FOUND);
        // SAFETY: the caller's arguments, passed on as they came.
        let result = unsafe { cuGetProcAddress(std::ptr::null(), &mut pfn, 12000, 0) };
        assert_eq!(result, CUresult::CUDA_ERROR_INVALID_VALUE);
    }
}
