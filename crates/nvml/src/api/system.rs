//! Initialization, versions and what is not about one device.

use std::ffi::{c_char, c_int, c_uint};

use super::{known, status, write, write_str};
use crate::devices;
use crate::types::*;

pub unsafe fn nvmlInit_v2() -> nvmlReturn_t {
    status(devices::init())
}

/// The first NVML API's name for it (PyTorch calls this one).
pub unsafe fn nvmlInit() -> nvmlReturn_t {
    status(devices::init())
}

/// The flags (no GPUs, no attach) change nothing here: no GPU is attached locally.
pub unsafe fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    status(devices::init())
}

pub unsafe fn nvmlShutdown() -> nvmlReturn_t {
    status(devices::shutdown())
}

pub unsafe fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t {
    status((|| {
        let text = known(devices::devices()?.system.driver_version.as_deref())?;
        // SAFETY: the caller's contract: `length` writable bytes.
        unsafe { write_str(version, length, text) }
    })())
}

pub unsafe fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t {
    status((|| {
        let text = known(devices::devices()?.system.nvml_version.as_deref())?;
        // SAFETY: the caller's contract: `length` writable bytes.
        unsafe { write_str(version, length, text) }
    })())
}

pub unsafe fn nvmlSystemGetCudaDriverVersion_v2(cudaDriverVersion: *mut c_int) -> nvmlReturn_t {
    status((|| {
        let version = known(devices::devices()?.system.cuda_driver_version)?;
        // SAFETY: the caller's contract.
        unsafe { write(cudaDriverVersion, version) }
    })())
}

pub unsafe fn nvmlSystemGetCudaDriverVersion(cudaDriverVersion: *mut c_int) -> nvmlReturn_t {
    // SAFETY: the same contract.
    unsafe { nvmlSystemGetCudaDriverVersion_v2(cudaDriverVersion) }
}

/// The processes NVML lists are this machine's (see processes.rs): named from /proc.
pub unsafe fn nvmlSystemGetProcessName(
    pid: c_uint,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    status((|| {
        devices::devices()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map_err(|_| NVML_ERROR_NOT_FOUND)?;
        // SAFETY: the caller's contract: `length` writable bytes.
        unsafe { write_str(name, length, comm.trim_end()) }
    })())
}

/// No S-class units here.
pub unsafe fn nvmlUnitGetCount(unitCount: *mut c_uint) -> nvmlReturn_t {
    status((|| {
        devices::devices()?;
        // SAFETY: the caller's contract.
        unsafe { write(unitCount, 0) }
    })())
}

/// No GPUs are excluded.
pub unsafe fn nvmlGetExcludedDeviceCount(deviceCount: *mut c_uint) -> nvmlReturn_t {
    status((|| {
        devices::devices()?;
        // SAFETY: the caller's contract.
        unsafe { write(deviceCount, 0) }
    })())
}

/// NVML's message for each return code (static strings, as NVML's are).
#[no_mangle]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let text: &'static std::ffi::CStr = match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt request issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"The operating system has blocked the request",
        18 => c"RM has detected an NVML/RM version mismatch",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        22 => c"The requested vgpu operation is not available on target device, because ECC is enabled",
        23 => c"Insufficient resources",
        24 => c"Frequency not supported",
        25 => c"Argument version mismatch",
        26 => c"Deprecated",
        27 => c"Not ready",
        28 => c"GPU not found",
        29 => c"Invalid state",
        30 => c"Reset type not supported",
        _ => c"Unknown Error",
    };
    text.as_ptr()
}

/// Event sets exist (nvidia-smi makes one before it prints its table) but no event ever
/// comes: the servers' devices register none ([`nvmlDeviceRegisterEvents`]).
pub unsafe fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    status((|| {
        devices::devices()?;
        // SAFETY: the caller's contract.
        unsafe { write(set, EVENT_SET) }
    })())
}

pub unsafe fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    status((|| {
        devices::devices()?;
        if set != EVENT_SET {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        Ok(())
    })())
}

/// No device sends events over the network (XID errors and clock changes stay on the server).
pub unsafe fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    _eventTypes: u64,
    _set: nvmlEventSet_t,
) -> nvmlReturn_t {
    status(devices::device(device).and(Err(NVML_ERROR_NOT_SUPPORTED)))
}

/// Waits out the timeout: nothing is ever registered.
pub unsafe fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    _data: *mut c_char,
    timeoutms: c_uint,
) -> nvmlReturn_t {
    status((|| {
        devices::devices()?;
        if set != EVENT_SET {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        std::thread::sleep(std::time::Duration::from_millis(timeoutms.into()));
        Err(NVML_ERROR_TIMEOUT)
    })())
}

pub unsafe fn nvmlEventSetWait(
    set: nvmlEventSet_t,
    data: *mut c_char,
    timeoutms: c_uint,
) -> nvmlReturn_t {
    // SAFETY: the same contract.
    unsafe { nvmlEventSetWait_v2(set, data, timeoutms) }
}

/// The one event set handed out (its value is never followed).
const EVENT_SET: nvmlEventSet_t = 1 as nvmlEventSet_t;
