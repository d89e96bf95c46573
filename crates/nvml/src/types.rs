//! NVML's C types, as nvml.h (NVML 13) declares them: only those the implemented entry points
//! take. Layouts are checked against the header's sizes and offsets in the tests below.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_uint, c_ulonglong};

pub type nvmlReturn_t = c_uint;

pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: nvmlReturn_t = 9;
pub const NVML_ERROR_TIMEOUT: nvmlReturn_t = 10;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: nvmlReturn_t = 13;
pub const NVML_ERROR_GPU_IS_LOST: nvmlReturn_t = 15;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// An opaque device handle (a pointer to a `nvmlDevice_st` the library owns).
pub type nvmlDevice_t = *const Device;

/// An opaque event set handle.
pub type nvmlEventSet_t = *const EventSet;

/// What an event set handle points at; nothing does.
#[repr(C)]
pub struct EventSet {
    _opaque: [u8; 0],
}

/// What a device handle points at; callers never look inside.
#[repr(C)]
pub struct Device {
    _opaque: [u8; 0],
}

/// `NVML_VALUE_NOT_AVAILABLE` in an `unsigned long long` field.
pub const NVML_VALUE_NOT_AVAILABLE: u64 = u64::MAX;

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_t {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`: `version` must be [`NVML_MEMORY_V2`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `NVML_STRUCT_VERSION(Memory, 2)`: the struct's size, version 2 in the top byte.
pub const NVML_MEMORY_V2: c_uint = std::mem::size_of::<nvmlMemory_v2_t>() as c_uint | (2 << 24);

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlPciInfo_t` (v2 and v3; v1's `busId` was the first 16 bytes, and it ended after
/// `pciSubSystemId`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub busId: [c_char; 32],
}

/// The bytes of `nvmlPciInfo_t` that version 1 of `nvmlDeviceGetPciInfo` writes.
pub const PCI_INFO_V1_SIZE: usize = std::mem::offset_of!(nvmlPciInfo_t, busId);

/// `nvmlProcessInfo_v1_t` (`nvmlDeviceGet*RunningProcesses`, unversioned).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
}

/// `nvmlProcessInfo_t` (`_v3`), the same as `nvmlProcessInfo_v2_t` (`_v2`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

/// Buffer sizes nvml.h recommends; an answer never needs more.
pub const NVML_DEVICE_NAME_V2_BUFFER_SIZE: usize = 96;
pub const NVML_DEVICE_UUID_V2_BUFFER_SIZE: usize = 96;

/// `nvmlClockType_t` / `nvmlTemperatureSensors_t` values used here.
pub const NVML_TEMPERATURE_GPU: c_uint = 0;
/// No MIG instance (`gpuInstanceId`, `computeInstanceId` of a process outside MIG).
pub const NO_INSTANCE: c_uint = u32::MAX;

#[cfg(test)]
mod tests {
    use std::mem::{align_of, offset_of, size_of};

    use super::*;

    /// Sizes and offsets as gcc computes them from nvml.h (CUDA 13, nvidia-nvml-dev 13.5).
    #[test]
    fn layouts_match_nvml_h() {
        assert_eq!(
            (size_of::<nvmlMemory_t>(), align_of::<nvmlMemory_t>()),
            (24, 8)
        );
        assert_eq!(offset_of!(nvmlMemory_t, free), 8);
        assert_eq!(offset_of!(nvmlMemory_t, used), 16);
        assert_eq!(size_of::<nvmlMemory_v2_t>(), 40);
        assert_eq!(offset_of!(nvmlMemory_v2_t, total), 8);
        assert_eq!(offset_of!(nvmlMemory_v2_t, reserved), 16);
        assert_eq!(offset_of!(nvmlMemory_v2_t, free), 24);
        assert_eq!(offset_of!(nvmlMemory_v2_t, used), 32);
        assert_eq!(NVML_MEMORY_V2, 0x0200_0028);
        assert_eq!(
            (
                size_of::<nvmlUtilization_t>(),
                align_of::<nvmlUtilization_t>()
            ),
            (8, 4)
        );
        assert_eq!(
            (size_of::<nvmlPciInfo_t>(), align_of::<nvmlPciInfo_t>()),
            (68, 4)
        );
        assert_eq!(offset_of!(nvmlPciInfo_t, domain), 16);
        assert_eq!(offset_of!(nvmlPciInfo_t, pciDeviceId), 28);
        assert_eq!(offset_of!(nvmlPciInfo_t, pciSubSystemId), 32);
        assert_eq!(offset_of!(nvmlPciInfo_t, busId), 36);
        assert_eq!(PCI_INFO_V1_SIZE, 36);
        assert_eq!(size_of::<nvmlProcessInfo_v1_t>(), 16);
        assert_eq!(size_of::<nvmlProcessInfo_t>(), 24);
        assert_eq!(offset_of!(nvmlProcessInfo_t, gpuInstanceId), 16);
        assert_eq!(offset_of!(nvmlProcessInfo_t, computeInstanceId), 20);
    }
}
