//! The platforms and devices this server serves, taken once at start: native handles for the
//! server, and every info value for the clients (`GetInventory`).

use rgpu_cl_api::params::{self, ValueKind};
use rgpu_cl_api::{sys, RGPU_PLATFORM_NAME};
use rgpu_protocol::opencl::{self as wire, Id};

use crate::opencl::native::{Cl, Device, Platform};

pub struct ServedPlatform {
    pub id: Id,
    pub native: Platform,
    pub name: String,
    /// OpenCL major version, from CL_PLATFORM_VERSION ("OpenCL 3.0 ...").
    pub major_version: u32,
}

pub struct ServedDevice {
    pub id: Id,
    pub platform: Id,
    pub native: Device,
    pub name: String,
}

pub struct Inventory {
    /// The native library; `None` when none could be loaded (the server then serves nothing).
    pub cl: Option<Cl>,
    pub platforms: Vec<ServedPlatform>,
    pub devices: Vec<ServedDevice>,
    /// What `GetInventory` answers.
    pub wire: wire::Inventory,
}

/// Which platforms and devices to serve.
#[derive(Default)]
pub struct Filters<'a> {
    /// Case-insensitive substring of CL_PLATFORM_NAME.
    pub platform: Option<&'a str>,
    /// Case-insensitive substring of CL_DEVICE_NAME, or a comma list of device indices
    /// (0-based, counted over the devices of the platforms that pass the platform filter).
    pub device: Option<&'a str>,
}

impl Inventory {
    pub fn empty() -> Inventory {
        Inventory {
            cl: None,
            platforms: Vec::new(),
            devices: Vec::new(),
            wire: wire::Inventory::default(),
        }
    }

    /// Enumerates and describes what `cl` offers, minus what the filters leave out and the
    /// rgpu platform itself (a server never serves itself).
    pub fn take(cl: Cl, filters: &Filters<'_>) -> Inventory {
        // PoCL initializes its devices lazily and not thread-safely: servers binding at once in
        // one process (tests) must take turns.
        static ENUMERATION: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _turn = ENUMERATION.lock().unwrap_or_else(|e| e.into_inner());
        let mut inventory = Inventory::empty();
        let platforms = cl.platforms().unwrap_or_else(|e| {
            log::warn!("clGetPlatformIDs failed: {}", rgpu_cl_api::error_name(e));
            Vec::new()
        });
        let device_indices = filters.device.and_then(parse_indices);
        let mut device_index = 0usize;
        for platform in platforms {
            let name = cl
                .platform_info(platform, sys::CL_PLATFORM_NAME)
                .map(|b| params::decode_string(&b))
                .unwrap_or_default();
            if name == RGPU_PLATFORM_NAME {
                log::debug!("skipping the rgpu platform itself");
                continue;
            }
            if let Some(wanted) = filters.platform {
                if !contains_ignore_case(&name, wanted) {
                    log::info!("platform {name:?} left out by the platform filter");
                    continue;
                }
            }
            let platform_id = inventory.platforms.len() as Id + 1;
            let mut served = Vec::new();
            for device in cl.devices(platform).unwrap_or_default() {
                let index = device_index;
                device_index += 1;
                let device_name = cl
                    .device_info(device, sys::CL_DEVICE_NAME)
                    .map(|b| params::decode_string(&b))
                    .unwrap_or_default();
                let keep = match (&device_indices, filters.device) {
                    (Some(indices), _) => indices.contains(&index),
                    (None, Some(wanted)) => contains_ignore_case(&device_name, wanted),
                    (None, None) => true,
                };
                if keep {
                    served.push((device, device_name));
                } else {
                    log::info!("device {index} {device_name:?} left out by the device filter");
                }
            }
            if served.is_empty() {
                continue;
            }
            let info = describe(
                |param| cl.platform_info(platform, param),
                params::PLATFORM_INFO_PARAMS,
            );
            let version = cl
                .platform_info(platform, sys::CL_PLATFORM_VERSION)
                .map(|b| params::decode_string(&b))
                .unwrap_or_default();
            inventory.wire.platforms.push(wire::PlatformDesc {
                id: platform_id,
                info,
            });
            inventory.platforms.push(ServedPlatform {
                id: platform_id,
                native: platform,
                name,
                major_version: parse_major_version(&version),
            });
            for (device, device_name) in served {
                let device_id = inventory.devices.len() as Id + 1;
                let info = describe(
                    |param| cl.device_info(device, param),
                    params::DEVICE_INFO_PARAMS,
                );
                inventory.wire.devices.push(wire::DeviceDesc {
                    id: device_id,
                    platform: platform_id,
                    info,
                });
                inventory.devices.push(ServedDevice {
                    id: device_id,
                    platform: platform_id,
                    native: device,
                    name: device_name,
                });
            }
        }
        inventory.cl = Some(cl);
        inventory
    }

    pub fn platform(&self, id: Id) -> Option<&ServedPlatform> {
        self.platforms.iter().find(|p| p.id == id)
    }

    pub fn device(&self, id: Id) -> Option<&ServedDevice> {
        self.devices.iter().find(|d| d.id == id)
    }

    /// The id of the served device with this native handle address (0 if none).
    pub fn device_id_of(&self, addr: usize) -> Id {
        self.devices
            .iter()
            .find(|d| d.native.raw() as usize == addr)
            .map_or(0, |d| d.id)
    }

    /// The id of the served platform with this native handle address (0 if none).
    pub fn platform_id_of(&self, addr: usize) -> Id {
        self.platforms
            .iter()
            .find(|p| p.native.raw() as usize == addr)
            .map_or(0, |p| p.id)
    }
}

/// Every parameter of `table` that answers, except handles (meaningless to a client).
fn describe(
    query: impl Fn(u32) -> Result<Vec<u8>, i32>,
    table: &[params::ParamInfo],
) -> Vec<(u32, Vec<u8>)> {
    table
        .iter()
        .filter(|(_, _, kind)| !matches!(kind, ValueKind::Handle | ValueKind::HandleArray))
        .filter_map(|&(param, _, _)| query(param).ok().map(|value| (param, value)))
        .collect()
}

fn contains_ignore_case(haystack: &str, needle: &str) -> bool {
    haystack.to_lowercase().contains(&needle.to_lowercase())
}

/// "0,2" -> [0, 2]; `None` when the text is not a list of indices (then it is a name).
fn parse_indices(text: &str) -> Option<Vec<usize>> {
    text.split(',')
        .map(|part| part.trim().parse::<usize>().ok())
        .collect()
}

fn parse_major_version(version: &str) -> u32 {
    version
        .strip_prefix("OpenCL ")
        .and_then(|rest| rest.split('.').next())
        .and_then(|major| major.trim().parse().ok())
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse() {
        assert_eq!(parse_indices("0, 2"), Some(vec![0, 2]));
        assert_eq!(parse_indices("pthread"), None);
        assert_eq!(parse_indices("1,gpu"), None);
        assert!(contains_ignore_case(
            "Portable Computing Language",
            "portable"
        ));
        assert_eq!(parse_major_version("OpenCL 3.0 PoCL 3.1"), 3);
        assert_eq!(parse_major_version("OpenCL 1.2 CUDA"), 1);
        assert_eq!(parse_major_version("garbage"), 1);
    }
}
