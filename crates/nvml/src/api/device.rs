//! Device handles, each device's fixed facts (from the inventory taken at init) and its live
//! values (from its server, per call).

use std::ffi::{c_char, c_int, c_uint, CStr};

use rgpu_protocol::nvml::uuid_string;

use super::{fact, known, live, live_pair, non_null, status, write, write_str};
use crate::devices::{self, Device};
use crate::types::*;

/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR` / `_MINOR`.
const COMPUTE_CAPABILITY_MAJOR: u32 = 75;
const COMPUTE_CAPABILITY_MINOR: u32 = 76;
/// `nvmlClockType_t` values run 0 (graphics) to 3 (video).
const CLOCK_TYPES: c_uint = 4;

pub unsafe fn nvmlDeviceGetCount_v2(deviceCount: *mut c_uint) -> nvmlReturn_t {
    status((|| {
        let count = devices::devices()?.list.len() as c_uint;
        // SAFETY: the caller's contract.
        unsafe { write(deviceCount, count) }
    })())
}

pub unsafe fn nvmlDeviceGetCount(deviceCount: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the same contract.
    unsafe { nvmlDeviceGetCount_v2(deviceCount) }
}

pub unsafe fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    status((|| {
        let found = devices::devices()?.list.get(index as usize);
        let found = found.ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        // SAFETY: the caller's contract.
        unsafe { write(device, found.handle()) }
    })())
}

pub unsafe fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut nvmlDevice_t) -> nvmlReturn_t {
    // SAFETY: the same contract.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

/// The first device whose text (`key`) is `wanted` (a C string).
///
/// # Safety
/// `wanted` must be null or a C string; `device` null or writable.
unsafe fn handle_by(
    wanted: *const c_char,
    device: *mut nvmlDevice_t,
    matches: impl Fn(&Device, &str) -> bool,
) -> nvmlReturn_t {
    status((|| {
        let devices = devices::devices()?;
        if wanted.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: a C string, by the caller's contract.
        let wanted = unsafe { CStr::from_ptr(wanted) }.to_string_lossy();
        let found = devices.list.iter().find(|d| matches(d, wanted.trim()));
        let found = found.ok_or(NVML_ERROR_NOT_FOUND)?;
        // SAFETY: the caller's contract.
        unsafe { write(device, found.handle()) }
    })())
}

pub unsafe fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe {
        handle_by(uuid, device, |d, wanted| {
            uuid_string(&d.info.uuid).eq_ignore_ascii_case(wanted)
        })
    }
}

pub unsafe fn nvmlDeviceGetHandleByPciBusId_v2(
    pciBusId: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe {
        handle_by(pciBusId, device, |d, wanted| {
            let ours = parse_bus_id(&d.info.pci_bus_id);
            ours.is_some() && ours == parse_bus_id(wanted)
        })
    }
}

pub unsafe fn nvmlDeviceGetHandleByPciBusId(
    pciBusId: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: the same contract.
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device) }
}

pub unsafe fn nvmlDeviceGetHandleBySerial(
    serial: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe {
        handle_by(serial, device, |d, wanted| {
            d.facts.serial.as_deref() == Some(wanted)
        })
    }
}

/// A string fact of a device.
///
/// # Safety
/// `out` must be null or valid for writing `length` bytes.
unsafe fn string_fact(
    device: nvmlDevice_t,
    out: *mut c_char,
    length: c_uint,
    value: impl FnOnce(&Device) -> Option<String>,
) -> nvmlReturn_t {
    status((|| {
        let device = devices::device(device)?;
        non_null(out)?;
        let text = known(value(device))?;
        // SAFETY: the caller's contract.
        unsafe { write_str(out, length, &text) }
    })())
}

pub unsafe fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { string_fact(device, name, length, |d| Some(d.info.name.clone())) }
}

pub unsafe fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { string_fact(device, uuid, length, |d| Some(uuid_string(&d.info.uuid))) }
}

pub unsafe fn nvmlDeviceGetSerial(
    device: nvmlDevice_t,
    serial: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { string_fact(device, serial, length, |d| d.facts.serial.clone()) }
}

pub unsafe fn nvmlDeviceGetVbiosVersion(
    device: nvmlDevice_t,
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { string_fact(device, version, length, |d| d.facts.vbios_version.clone()) }
}

pub unsafe fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { fact(device, index, |d| Some(d.index)) }
}

pub unsafe fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minorNumber: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { fact(device, minorNumber, |d| d.facts.minor_number) }
}

pub unsafe fn nvmlDeviceGetBoardId(device: nvmlDevice_t, boardId: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { fact(device, boardId, |d| d.facts.board_id) }
}

pub unsafe fn nvmlDeviceGetBrand(device: nvmlDevice_t, brand: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { fact(device, brand, |d| d.facts.brand) }
}

pub unsafe fn nvmlDeviceGetArchitecture(device: nvmlDevice_t, arch: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { fact(device, arch, |d| d.facts.architecture) }
}

pub unsafe fn nvmlDeviceGetNumGpuCores(
    device: nvmlDevice_t,
    numCores: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { fact(device, numCores, |d| d.facts.num_cores) }
}

pub unsafe fn nvmlDeviceGetMemoryBusWidth(
    device: nvmlDevice_t,
    busWidth: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { fact(device, busWidth, |d| d.facts.memory_bus_width) }
}

pub unsafe fn nvmlDeviceGetMaxPcieLinkGeneration(
    device: nvmlDevice_t,
    maxLinkGen: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { fact(device, maxLinkGen, |d| d.facts.max_pcie_link_generation) }
}

pub unsafe fn nvmlDeviceGetGpuMaxPcieLinkGeneration(
    device: nvmlDevice_t,
    maxLinkGenDevice: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe {
        fact(device, maxLinkGenDevice, |d| {
            d.facts.max_pcie_link_generation
        })
    }
}

pub unsafe fn nvmlDeviceGetMaxPcieLinkWidth(
    device: nvmlDevice_t,
    maxLinkWidth: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { fact(device, maxLinkWidth, |d| d.facts.max_pcie_link_width) }
}

pub unsafe fn nvmlDeviceGetPowerManagementDefaultLimit(
    device: nvmlDevice_t,
    defaultLimit: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { fact(device, defaultLimit, |d| d.facts.default_power_limit) }
}

pub unsafe fn nvmlDeviceGetMaxClockInfo(
    device: nvmlDevice_t,
    clockType: c_uint,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    if clockType >= CLOCK_TYPES {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: the caller's contract.
    unsafe { fact(device, clock, |d| clock_of(&d.facts.max_clocks, clockType)) }
}

pub unsafe fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    status((|| {
        let device = devices::device(device)?;
        non_null(major)?;
        non_null(minor)?;
        let major_value = known(device.cuda_attribute(COMPUTE_CAPABILITY_MAJOR))?;
        let minor_value = known(device.cuda_attribute(COMPUTE_CAPABILITY_MINOR))?;
        // SAFETY: the caller's contract.
        unsafe { write(major, major_value)? };
        // SAFETY: the caller's contract.
        unsafe { write(minor, minor_value) }
    })())
}

/// `nvmlPciInfo_t` of a device: bus ids from CUDA's `cuDeviceGetPCIBusId`, PCI ids from NVML.
fn pci_info(device: &Device) -> Result<nvmlPciInfo_t, nvmlReturn_t> {
    let (domain, bus, dev, _) = known(parse_bus_id(&device.info.pci_bus_id))?;
    let (device_id, subsystem_id) = device.facts.pci_ids.unwrap_or((0, 0));
    let mut info = nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain,
        bus,
        device: dev,
        pciDeviceId: device_id,
        pciSubSystemId: subsystem_id,
        busId: [0; 32],
    };
    let legacy = format!("{domain:04X}:{bus:02X}:{dev:02X}.0");
    let full = format!("{domain:08X}:{bus:02X}:{dev:02X}.0");
    for (slot, byte) in info.busIdLegacy.iter_mut().zip(legacy.bytes()) {
        *slot = byte as c_char;
    }
    for (slot, byte) in info.busId.iter_mut().zip(full.bytes()) {
        *slot = byte as c_char;
    }
    Ok(info)
}

pub unsafe fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    status((|| {
        let device = devices::device(device)?;
        non_null(pci)?;
        let info = pci_info(device)?;
        // SAFETY: the caller's contract.
        unsafe { write(pci, info) }
    })())
}

pub unsafe fn nvmlDeviceGetPciInfo_v2(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    // SAFETY: the same contract (v2 has v3's layout).
    unsafe { nvmlDeviceGetPciInfo_v3(device, pci) }
}

/// Version 1: the struct ended before `busId`, and its first 16 bytes were the bus id.
pub unsafe fn nvmlDeviceGetPciInfo(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> nvmlReturn_t {
    status((|| {
        let device = devices::device(device)?;
        non_null(pci)?;
        let info = pci_info(device)?;
        // SAFETY: the caller's struct holds the v1 fields, the first PCI_INFO_V1_SIZE bytes
        // of ours (the same layout), which are copied.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&info as *const nvmlPciInfo_t).cast::<u8>(),
                pci.cast::<u8>(),
                PCI_INFO_V1_SIZE,
            )
        };
        Ok(())
    })())
}

pub unsafe fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe {
        live(device, memory, |s| {
            s.memory.map(|m| nvmlMemory_t {
                total: m.total,
                free: m.free,
                // Version 1 counts the reserved memory as used.
                used: m.used + m.reserved,
            })
        })
    }
}

/// The caller says which version it passes in `version`; only version 2 exists.
pub unsafe fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    status((|| {
        let device = devices::device(device)?;
        non_null(memory)?;
        // SAFETY: a readable nvmlMemory_v2_t by the caller's contract.
        if unsafe { (*memory).version } != NVML_MEMORY_V2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let m = known(device.status()?.memory)?;
        let value = nvmlMemory_v2_t {
            version: NVML_MEMORY_V2,
            total: m.total,
            reserved: m.reserved,
            free: m.free,
            used: m.used,
        };
        // SAFETY: the caller's contract.
        unsafe { write(memory, value) }
    })())
}

pub unsafe fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe {
        live(device, utilization, |s| {
            s.utilization.map(|u| nvmlUtilization_t {
                gpu: u.gpu,
                memory: u.memory,
            })
        })
    }
}

pub unsafe fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensorType: c_uint,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    if sensorType != NVML_TEMPERATURE_GPU {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: the caller's contract.
    unsafe { live(device, temp, |s| s.temperature) }
}

pub unsafe fn nvmlDeviceGetPowerUsage(device: nvmlDevice_t, power: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { live(device, power, |s| s.power_usage) }
}

pub unsafe fn nvmlDeviceGetPowerManagementLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { live(device, limit, |s| s.power_limit) }
}

pub unsafe fn nvmlDeviceGetEnforcedPowerLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { live(device, limit, |s| s.enforced_power_limit) }
}

pub unsafe fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    clockType: c_uint,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    if clockType >= CLOCK_TYPES {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: the caller's contract.
    unsafe { live(device, clock, |s| clock_of(&s.clocks, clockType)) }
}

pub unsafe fn nvmlDeviceGetFanSpeed(device: nvmlDevice_t, speed: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { live(device, speed, |s| s.fan_speed) }
}

pub unsafe fn nvmlDeviceGetPerformanceState(
    device: nvmlDevice_t,
    pState: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { live(device, pState, |s| s.performance_state) }
}

pub unsafe fn nvmlDeviceGetPowerState(device: nvmlDevice_t, pState: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { live(device, pState, |s| s.performance_state) }
}

pub unsafe fn nvmlDeviceGetPersistenceMode(
    device: nvmlDevice_t,
    mode: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { live(device, mode, |s| s.persistence_mode) }
}

pub unsafe fn nvmlDeviceGetComputeMode(device: nvmlDevice_t, mode: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { live(device, mode, |s| s.compute_mode) }
}

pub unsafe fn nvmlDeviceGetDisplayMode(device: nvmlDevice_t, display: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { live(device, display, |s| s.display_mode) }
}

pub unsafe fn nvmlDeviceGetDisplayActive(
    device: nvmlDevice_t,
    isActive: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { live(device, isActive, |s| s.display_active) }
}

pub unsafe fn nvmlDeviceGetCurrPcieLinkGeneration(
    device: nvmlDevice_t,
    currLinkGen: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { live(device, currLinkGen, |s| s.pcie_link_generation) }
}

pub unsafe fn nvmlDeviceGetCurrPcieLinkWidth(
    device: nvmlDevice_t,
    currLinkWidth: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { live(device, currLinkWidth, |s| s.pcie_link_width) }
}

pub unsafe fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    currentMode: *mut c_uint,
    pendingMode: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { live_pair(device, currentMode, pendingMode, |s| s.mig_mode) }
}

pub unsafe fn nvmlDeviceGetEccMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    unsafe { live_pair(device, current, pending, |s| s.ecc_mode) }
}

fn clock_of(clocks: &[(u32, u32)], clock_type: c_uint) -> Option<u32> {
    clocks
        .iter()
        .find(|&&(t, _)| t == clock_type)
        .map(|&(_, mhz)| mhz)
}

/// `(domain, bus, device, function)` of a PCI bus id in any of NVML's and CUDA's spellings
/// (`0000:1b:00.0`, `00000000:1B:00.0`, `1b:00.0`).
pub fn parse_bus_id(text: &str) -> Option<(u32, u32, u32, u32)> {
    let (rest, function) = text.trim().rsplit_once('.')?;
    let parts: Vec<&str> = rest.split(':').collect();
    let (domain, bus, device) = match parts.as_slice() {
        [domain, bus, device] => (*domain, *bus, *device),
        [bus, device] => ("0", *bus, *device),
        _ => return None,
    };
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    Some((hex(domain)?, hex(bus)?, hex(device)?, hex(function)?))
}
