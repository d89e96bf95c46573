//! NVML's view of the served devices, for the clients' drop-in `libnvidia-ml.so.1`: the
//! server's own NVML (NVIDIA's `libnvidia-ml.so.1`, loaded at the first such request through
//! `nvml-wrapper`), its devices found by the UUID of each CUDA device (so the CUDA order, which
//! `CUDA_VISIBLE_DEVICES` may change, is the order clients see). A server without NVML answers
//! every value as unknown; the client says NVML_ERROR_NOT_SUPPORTED for those.

use std::sync::OnceLock;

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::{Device, Nvml};
use rgpu_protocol::cuda::{serve, Answer};
use rgpu_protocol::nvml::{
    forwarded, uuid_string, DeviceFacts, DeviceStatus, MemoryStatus, NvmlAnswer, NvmlInventory,
    NvmlQuery, Param, ProcessStatus, Utilization,
};

use super::nvml_forward::{self, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED};
use super::session::{Served, INVALID_DEVICE};
use super::Backend;

/// The library NVIDIA's driver installs (the name nvidia-smi and pynvml load).
const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// The clocks answered, as `nvmlClockType_t` values.
const CLOCKS: [(Clock, u32); 4] = [
    (Clock::Graphics, 0),
    (Clock::SM, 1),
    (Clock::Memory, 2),
    (Clock::Video, 3),
];

impl serve::Monitoring for Served<'_> {
    fn get_nvml_inventory(&mut self) -> NvmlInventory {
        let backend = &self.cuda.backend;
        let count = backend.inventory.devices.len();
        let Some(nvml) = backend.nvml() else {
            return NvmlInventory {
                devices: vec![DeviceFacts::default(); count],
                host: host_identity(),
                ..NvmlInventory::default()
            };
        };
        NvmlInventory {
            driver_version: nvml.sys_driver_version().ok(),
            nvml_version: nvml.sys_nvml_version().ok(),
            cuda_driver_version: nvml.sys_cuda_driver_version().ok(),
            devices: (0..count)
                .map(|ordinal| {
                    backend
                        .nvml_device(nvml, ordinal)
                        .map_or_else(DeviceFacts::default, |device| facts(&device))
                })
                .collect(),
            host: host_identity(),
        }
    }

    fn get_device_status(&mut self, device: u32) -> Answer<DeviceStatus> {
        let backend = &self.cuda.backend;
        if device as usize >= backend.inventory.devices.len() {
            return Err(INVALID_DEVICE);
        }
        let found = backend
            .nvml()
            .and_then(|nvml| backend.nvml_device(nvml, device as usize));
        Ok(found.map_or_else(DeviceStatus::default, |device| status(&device)))
    }

    fn forward_nvml(&mut self, query: NvmlQuery) -> NvmlAnswer {
        let backend = &self.cuda.backend;
        let refuse = |ret| NvmlAnswer {
            ret,
            bytes: Vec::new(),
        };
        let (Some(nvml), Some(library)) = (backend.nvml(), backend.nvml_library()) else {
            return refuse(NOT_SUPPORTED);
        };
        let Some(params) = forwarded(&query.function) else {
            return refuse(NOT_SUPPORTED);
        };
        // The NVML handle of a CUDA ordinal of this server, where the function takes it.
        let handle = |wanted: Param, ordinal: u32| -> Result<Option<u64>, u32> {
            if !params.contains(&wanted) {
                return Ok(None);
            }
            let device = backend.nvml_device(nvml, ordinal as usize);
            // SAFETY: the raw handle of a device of this NVML, valid while it is loaded
            // (for the server's life).
            let raw = device.map(|d| unsafe { d.handle() } as u64);
            raw.map(Some).ok_or(INVALID_ARGUMENT)
        };
        // A peer of another server of this machine, by UUID: this NVML sees every GPU of
        // the machine, whatever the servers' CUDA_VISIBLE_DEVICES.
        let peer = |wanted: Param| -> Result<Option<u64>, u32> {
            let Some(uuid) = &query.peer_uuid else {
                return handle(wanted, query.peer);
            };
            if !params.contains(&wanted) {
                return Ok(None);
            }
            let device = nvml.device_by_uuid(uuid.as_str()).map_err(|_| NOT_FOUND)?;
            // SAFETY: as above.
            Ok(Some(unsafe { device.handle() } as u64))
        };
        let devices =
            handle(Param::Device, query.device).and_then(|device| Ok((device, peer(Param::Peer)?)));
        match devices.and_then(|(device, peer)| nvml_forward::prepare(&query, device, peer)) {
            Ok(prepared) => nvml_forward::call(library, &query.function, prepared),
            Err(ret) => refuse(ret),
        }
    }
}

impl Backend {
    /// The server's NVML, loaded at the first call; `None` where there is none (or only
    /// rgpu's own drop-in, which would ask the servers it names rather than this GPU).
    fn nvml(&self) -> Option<&Nvml> {
        static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
        NVML.get_or_init(load_nvml).as_ref()
    }

    /// NVIDIA's NVML library itself, for the forwarded calls (loaded once more: the loader
    /// hands back the instance `nvml` loaded).
    fn nvml_library(&self) -> Option<&libloading::Library> {
        static LIBRARY: OnceLock<Option<libloading::Library>> = OnceLock::new();
        LIBRARY
            .get_or_init(|| {
                self.nvml()?;
                // SAFETY: the library `load_nvml` checked is NVIDIA's and initialized.
                unsafe { libloading::Library::new(NVML_LIBRARY) }.ok()
            })
            .as_ref()
    }

    /// The NVML device of the CUDA device `ordinal`, found by its UUID.
    fn nvml_device<'n>(&self, nvml: &'n Nvml, ordinal: usize) -> Option<Device<'n>> {
        let uuid = uuid_string(&self.inventory.devices.get(ordinal)?.uuid);
        nvml.device_by_uuid(uuid.as_str())
            .inspect_err(|e| log::debug!("NVML has no device {uuid}: {e}"))
            .ok()
    }
}

/// This machine, as `NvmlInventory::host` names it: a hash of the kernel's boot id, which
/// every server (and container) of one machine reads alike, and no other machine does.
fn host_identity() -> Option<String> {
    use sha2::Digest as _;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let digest = sha2::Sha256::digest(format!("rgpu host {}", boot.trim()).as_bytes());
    Some(hex::encode(&digest[..16]))
}

fn load_nvml() -> Option<Nvml> {
    // SAFETY: loading NVIDIA's NVML runs its initializers, which have no preconditions.
    let library = match unsafe { libloading::Library::new(NVML_LIBRARY) } {
        Ok(library) => library,
        Err(e) => {
            log::info!("no NVML ({NVML_LIBRARY}: {e}): NVML queries are answered as unsupported");
            return None;
        }
    };
    // SAFETY: a symbol lookup; the value is not used.
    if unsafe { library.get::<*const u8>(b"rgpu_nvml_client\0") }.is_ok() {
        log::warn!(
            "{NVML_LIBRARY} is rgpu's own drop-in, not NVIDIA's: NVML queries are answered as \
             unsupported (start the server without rgpu's lib folder on LD_LIBRARY_PATH)"
        );
        return None;
    }
    match Nvml::builder().lib_path(NVML_LIBRARY.as_ref()).init() {
        Ok(nvml) => Some(nvml),
        Err(e) => {
            log::warn!("NVML did not initialize ({e}): NVML queries are answered as unsupported");
            None
        }
    }
}

fn facts(device: &Device) -> DeviceFacts {
    DeviceFacts {
        serial: device.serial().ok(),
        board_id: device.board_id().ok(),
        brand: device.brand().ok().map(|b| b.as_c()),
        architecture: device.architecture().ok().map(|a| a.as_c()),
        minor_number: device.minor_number().ok(),
        pci_ids: device
            .pci_info()
            .ok()
            .map(|pci| (pci.pci_device_id, pci.pci_sub_system_id.unwrap_or(0))),
        vbios_version: device.vbios_version().ok(),
        num_cores: device.num_cores().ok(),
        memory_bus_width: device.memory_bus_width().ok(),
        max_pcie_link_generation: device.max_pcie_link_gen().ok(),
        max_pcie_link_width: device.max_pcie_link_width().ok(),
        max_clocks: CLOCKS
            .iter()
            .filter_map(|(clock, raw)| Some((*raw, device.max_clock_info(*clock).ok()?)))
            .collect(),
        default_power_limit: device.power_management_limit_default().ok(),
    }
}

fn status(device: &Device) -> DeviceStatus {
    let worker = std::process::id();
    let enable = |on: bool| u32::from(on);
    DeviceStatus {
        memory: device.memory_info().ok().map(|m| MemoryStatus {
            total: m.total,
            reserved: m.reserved,
            free: m.free,
            used: m.used,
        }),
        utilization: device.utilization_rates().ok().map(|u| Utilization {
            gpu: u.gpu,
            memory: u.memory,
        }),
        temperature: device.temperature(TemperatureSensor::Gpu).ok(),
        power_usage: device.power_usage().ok(),
        power_limit: device.power_management_limit().ok(),
        enforced_power_limit: device.enforced_power_limit().ok(),
        clocks: CLOCKS
            .iter()
            .filter_map(|(clock, raw)| Some((*raw, device.clock_info(*clock).ok()?)))
            .collect(),
        fan_speed: device.fan_speed(0).ok(),
        performance_state: device.performance_state().ok().map(|p| p.as_c()),
        persistence_mode: device.is_in_persistent_mode().ok().map(enable),
        compute_mode: device.compute_mode().ok().map(|m| m.as_c()),
        mig_mode: device.mig_mode().ok().map(|m| (m.current, m.pending)),
        ecc_mode: device
            .is_ecc_enabled()
            .ok()
            .map(|e| (enable(e.currently_enabled), enable(e.pending_enabled))),
        display_mode: device.is_display_connected().ok().map(enable),
        display_active: device.is_display_active().ok().map(enable),
        pcie_link_generation: device.current_pcie_link_gen().ok(),
        pcie_link_width: device.current_pcie_link_width().ok(),
        // The session's own process: its worker (or, with thread isolation, the server).
        processes: device.running_compute_processes().ok().map(|all| {
            all.into_iter()
                .filter(|p| p.pid == worker)
                .map(|p| ProcessStatus {
                    pid: p.pid,
                    used_memory: match p.used_gpu_memory {
                        UsedGpuMemory::Used(bytes) => Some(bytes),
                        UsedGpuMemory::Unavailable => None,
                    },
                })
                .collect()
        }),
    }
}
