//! `nvmlInternalGetExportTable`: nvidia-smi fetches a private table of NVML's before anything
//! else and gives up ("Failed to initialize NVML") without one. rgpu implements none of its
//! entries; what it hands out says so (see [`nvmlInternalGetExportTable`]).

use std::ffi::c_void;

use crate::types::*;

/// The one table nvidia-smi asks for, by its id (a GUID, 6c3efec4-8fc9-4e6c-a327-ee696e12f7c4).
const SMI_TABLE_ID: [u8; 16] = [
    0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e, 0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4,
];

/// A table without entries: its first word (the table's size in bytes) is 0, and every slot
/// is null, so a caller that checks the size before a slot (as nvidia-smi does) uses the
/// public entry points instead.
static EMPTY_TABLE: [usize; 512] = [0; 512];

#[no_mangle]
pub unsafe extern "C" fn nvmlInternalGetExportTable(
    table: *mut *const c_void,
    id: *const [u8; 16],
) -> nvmlReturn_t {
    crate::boundary::guard("nvmlInternalGetExportTable", || {
        if table.is_null() || id.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: the caller passes a 16-byte id.
        let id = unsafe { *id };
        if id != SMI_TABLE_ID {
            log::info!("rgpu: nvmlInternalGetExportTable({id:02x?}): no such table");
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: the caller passes a writable pointer slot.
        unsafe { table.write(EMPTY_TABLE.as_ptr().cast()) };
        NVML_SUCCESS
    })
}
