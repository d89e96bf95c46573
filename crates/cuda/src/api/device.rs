//! Device queries, answered from the inventory taken at `cuInit`, and primary contexts.

use std::ffi::{c_char, c_int, c_uint};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::CuPeer;

use super::{status, write_out};
use crate::objects::PrimaryContext;
use crate::servers::{self, device};

pub unsafe fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
    status(servers::servers().and_then(|rt| unsafe { write_out(count, rt.devices.len() as c_int) }))
}

pub unsafe fn cuDeviceGet(out: *mut CUdevice, ordinal: c_int) -> CUresult {
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
    status(device(ordinal).and_then(|_| unsafe { write_out(out, ordinal) }))
}

pub unsafe fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    status(device(dev).and_then(|device| {
        if name.is_null() || len <= 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's buffer of `len` bytes (null is refused), as the API requires.
        unsafe { copy_c_string(&device.info.name, name, len as usize) };
        Ok(())
    }))
}

/// Copies `text` into a C buffer of `capacity` bytes, truncated and NUL-terminated.
unsafe fn copy_c_string(text: &str, out: *mut c_char, capacity: usize) {
    let n = text.len().min(capacity - 1);
    // SAFETY: the caller's buffer holds `capacity` bytes; n + 1 <= capacity are written.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast(), out, n);
        *out.add(n) = 0;
    }
}

pub unsafe fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuDeviceGetUuid_v2(uuid, dev) }
}

pub unsafe fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    status(device(dev).and_then(|device| {
        let bytes = device.info.uuid.map(|b| b as c_char);
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(uuid, CUuuid { bytes }) }
    }))
}

pub unsafe fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    status(
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        device(dev).and_then(|device| unsafe { write_out(bytes, device.info.total_mem as usize) }),
    )
}

pub unsafe fn cuDeviceGetAttribute(
    value: *mut c_int,
    attribute: c_uint,
    dev: CUdevice,
) -> CUresult {
    status(device(dev).and_then(|device| {
        let answer = device
            .attribute(attribute)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(value, answer) }
    }))
}

pub unsafe fn cuDeviceComputeCapability(
    major: *mut c_int,
    minor: *mut c_int,
    dev: CUdevice,
) -> CUresult {
    status(device(dev).and_then(|device| {
        let major_value = device.attribute(75).unwrap_or(0);
        let minor_value = device.attribute(76).unwrap_or(0);
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe {
            write_out(major, major_value)?;
            write_out(minor, minor_value)
        }
    }))
}

pub unsafe fn cuDeviceGetPCIBusId(bus_id: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    status(device(dev).and_then(|device| {
        if bus_id.is_null() || len <= 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's buffer of `len` bytes (null is refused), as the API requires.
        unsafe { copy_c_string(&device.info.pci_bus_id, bus_id, len as usize) };
        Ok(())
    }))
}

/// A PCI address `[domain:]bus:device.function` as numbers (hexadecimal, any case); `None`
/// where it is not one.
fn pci_address(text: &str) -> Option<(u32, u32, u32, u32)> {
    let (rest, function) = text.trim().rsplit_once('.')?;
    let parts: Vec<&str> = rest.split(':').collect();
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    let (domain, bus, dev) = match parts[..] {
        [domain, bus, dev] => (hex(domain)?, hex(bus)?, hex(dev)?),
        [bus, dev] => (0, hex(bus)?, hex(dev)?),
        _ => return None,
    };
    Some((domain, bus, dev, hex(function)?))
}

/// The first device (in the program's order) at that PCI address: GPUs of different servers
/// may share one, each on its own machine.
pub unsafe fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, bus_id: *const c_char) -> CUresult {
    status(servers::servers().and_then(|servers| {
        if dev.is_null() || bus_id.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated string from the caller (null refused above).
        let text = unsafe { std::ffi::CStr::from_ptr(bus_id) }.to_string_lossy();
        let wanted = pci_address(&text).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let found = servers
            .devices
            .iter()
            .find(|d| pci_address(&d.info.pci_bus_id) == Some(wanted))
            .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)?;
        // SAFETY: checked non-null above; writable as the API requires.
        unsafe { write_out(dev, found.ordinal) }
    }))
}

/// What the server of `dev` says of reaching `peer`: `None` when they are the same device or
/// on different servers (whose GPUs never share memory).
fn peer_link(dev: CUdevice, peer: CUdevice) -> Result<Option<&'static CuPeer>, CUresult> {
    let (device, other) = (device(dev)?, device(peer)?);
    if !Arc::ptr_eq(&device.link, &other.link) {
        return Ok(None);
    }
    let link = device
        .info
        .peers
        .iter()
        .find(|p| p.device == other.remote_ordinal);
    Ok(link)
}

pub unsafe fn cuDeviceCanAccessPeer(
    can_access: *mut c_int,
    dev: CUdevice,
    peer: CUdevice,
) -> CUresult {
    status(peer_link(dev, peer).and_then(|link| {
        let can = link.is_some_and(|link| link.can_access);
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(can_access, can as c_int) }
    }))
}

pub unsafe fn cuDeviceGetP2PAttribute(
    value: *mut c_int,
    attribute: c_uint,
    src: CUdevice,
    dst: CUdevice,
) -> CUresult {
    if src == dst {
        return CUresult::CUDA_ERROR_INVALID_DEVICE;
    }
    status(peer_link(src, dst).and_then(|link| {
        let answer = match link {
            Some(link) => link
                .attributes
                .iter()
                .find(|(id, _)| *id == attribute)
                .map(|&(_, value)| value)
                .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?,
            // Devices that cannot reach each other: every capability 0.
            None if (1..=4).contains(&attribute) => 0,
            None => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(value, answer) }
    }))
}

pub unsafe fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    status(device(dev).and_then(|device| {
        device.primary().ensure_created()?;
        device.primary().retained.fetch_add(1, Ordering::AcqRel);
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(pctx, device.primary().handle()) }
    }))
}

pub unsafe fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    status(device(dev).and_then(|device| {
        let released =
            device
                .primary()
                .retained
                .try_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        // The server keeps the session's stand-in until the session ends: a later retain is
        // cheap, and memory the program still points at stays valid.
        released
            .map(|_| ())
            .map_err(|_| CUresult::CUDA_ERROR_INVALID_CONTEXT)
    }))
}

pub unsafe fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuDevicePrimaryCtxRelease_v2(dev) }
}

pub unsafe fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    status(device(dev).and_then(|device| {
        let primary = device.primary();
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe {
            write_out(flags, primary.flags.load(Ordering::Relaxed))?;
            write_out(
                active,
                (primary.retained.load(Ordering::Acquire) > 0) as c_int,
            )
        }
    }))
}

pub unsafe fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    status(device(dev).map(|device| device.primary().flags.store(flags, Ordering::Relaxed)))
}

pub unsafe fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuDevicePrimaryCtxSetFlags_v2(dev, flags) }
}

pub unsafe fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    status(device(dev).map(|device| {
        crate::export_tables::context_destroyed(device.primary().handle());
        // A primary context whose session was lost comes back in a new one.
        device.reset_primary();
    }))
}

pub unsafe fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuDevicePrimaryCtxReset_v2(dev) }
}

#[cfg(test)]
mod tests {
    use super::pci_address;

    #[test]
    fn pci_addresses_parse_with_or_without_a_domain() {
        assert_eq!(pci_address("0000:18:00.0"), Some((0, 0x18, 0, 0)));
        assert_eq!(pci_address("00000000:9A:00.1"), Some((0, 0x9a, 0, 1)));
        assert_eq!(pci_address("9a:00.1"), Some((0, 0x9a, 0, 1)));
        assert_eq!(pci_address("gpu0"), None);
        assert_eq!(pci_address("1:2:3:4.0"), None);
    }
}
