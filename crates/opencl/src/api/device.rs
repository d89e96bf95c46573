//! Devices: answered entirely from the inventory fetched at connect.

use std::ffi::c_void;

use opencl_sys::*;

use crate::api::platform::platform_from;
use crate::handle::{self, Ref};
use crate::objects::Device;
use crate::util::{bytes_of, guard, write_info};

pub fn device_from(device: cl_device_id) -> Result<Ref<Device>, cl_int> {
    handle::lookup::<Device>(device)
}

/// Maps a list of device handles; any invalid one makes the whole list invalid.
///
/// # Safety
/// `devices` points to `count` handles (or is null with count 0).
pub unsafe fn devices_from(
    devices: *const cl_device_id,
    count: cl_uint,
) -> Result<Vec<Ref<Device>>, cl_int> {
    if devices.is_null() != (count == 0) {
        return Err(CL_INVALID_VALUE);
    }
    // SAFETY: see the function contract.
    unsafe { crate::util::slice(devices, count as usize) }
        .iter()
        .map(|&d| device_from(d))
        .collect()
}

pub unsafe extern "C" fn clGetDeviceIDs(
    platform: cl_platform_id,
    device_type: cl_device_type,
    num_entries: cl_uint,
    devices: *mut cl_device_id,
    num_devices: *mut cl_uint,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let platform = match platform_from(platform) {
            Ok(p) => p,
            Err(code) => return code,
        };
        if (num_entries == 0 && !devices.is_null()) || (devices.is_null() && num_devices.is_null())
        {
            return CL_INVALID_VALUE;
        }
        let all = &platform.devices;
        let matching: Vec<&Ref<Device>> = match device_type {
            CL_DEVICE_TYPE_ALL => all.iter().collect(),
            // The first device is the default one.
            CL_DEVICE_TYPE_DEFAULT => all.iter().take(1).collect(),
            t if t & !(CL_DEVICE_TYPE_CPU
                | CL_DEVICE_TYPE_GPU
                | CL_DEVICE_TYPE_ACCELERATOR
                | CL_DEVICE_TYPE_CUSTOM
                | CL_DEVICE_TYPE_DEFAULT)
                != 0 =>
            {
                return CL_INVALID_DEVICE_TYPE
            }
            t => all.iter().filter(|d| d.device_type & t != 0).collect(),
        };
        if matching.is_empty() {
            if !num_devices.is_null() {
                // SAFETY: checked non-null.
                unsafe { *num_devices = 0 };
            }
            return CL_DEVICE_NOT_FOUND;
        }
        if !num_devices.is_null() {
            // SAFETY: checked non-null.
            unsafe { *num_devices = matching.len() as cl_uint };
        }
        if !devices.is_null() {
            for (i, device) in matching.iter().take(num_entries as usize).enumerate() {
                // SAFETY: the caller provides num_entries slots.
                unsafe { *devices.add(i) = handle::raw(device) };
            }
        }
        CL_SUCCESS
    })
}

pub unsafe extern "C" fn clGetDeviceInfo(
    device: cl_device_id,
    param_name: cl_device_info,
    param_value_size: usize,
    param_value: *mut c_void,
    param_value_size_ret: *mut usize,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let device = match device_from(device) {
            Ok(d) => d,
            Err(code) => return code,
        };
        let value = match param_name {
            CL_DEVICE_PLATFORM => match platform_from(std::ptr::null_mut()) {
                Ok(platform) => bytes_of(&handle::raw(&platform)),
                Err(code) => return code,
            },
            CL_DEVICE_PARENT_DEVICE => bytes_of(&std::ptr::null_mut::<c_void>()),
            CL_DEVICE_REFERENCE_COUNT => bytes_of(&(1 as cl_uint)),
            other => match device.info.get(&other) {
                Some(value) => value.clone(),
                None => return CL_INVALID_VALUE,
            },
        };
        // SAFETY: the application's out-pointers for this query.
        unsafe { write_info(&value, param_value_size, param_value, param_value_size_ret) }
    })
}

pub unsafe extern "C" fn clCreateSubDevices(
    in_device: cl_device_id,
    _properties: *const cl_device_partition_property,
    _num_devices: cl_uint,
    _out_devices: *mut cl_device_id,
    _num_devices_ret: *mut cl_uint,
) -> cl_int {
    match device_from(in_device) {
        // rgpu devices report no partition types (CL_DEVICE_PARTITION_PROPERTIES is empty).
        Ok(_) => CL_INVALID_VALUE,
        Err(code) => code,
    }
}

/// Root devices are not reference counted.
pub unsafe extern "C" fn clRetainDevice(device: cl_device_id) -> cl_int {
    device_from(device).map_or_else(|code| code, |_| CL_SUCCESS)
}

pub unsafe extern "C" fn clReleaseDevice(device: cl_device_id) -> cl_int {
    device_from(device).map_or_else(|code| code, |_| CL_SUCCESS)
}

/// rgpu's platform reports CL_PLATFORM_HOST_TIMER_RESOLUTION 0 (a remote device's timer and
/// this host's cannot be synchronized), and for such a platform the specification makes the
/// host timer unsupported: CL_INVALID_OPERATION for a valid device.
pub unsafe extern "C" fn clGetHostTimer(
    device: cl_device_id,
    _host_timestamp: *mut cl_ulong,
) -> cl_int {
    match device_from(device) {
        Ok(_) => CL_INVALID_OPERATION,
        Err(code) => code,
    }
}
