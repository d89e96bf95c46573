//! The devices NVML shows: found once, at the first `nvmlInit`, through
//! `rgpu_client::find_cuda_devices` (the CUDA library's numbering, so both agree), with each
//! server's NVML facts. Names, UUIDs, PCI ids and the other fixed facts are answered from
//! here; live values cost one round trip to the device's server per query.
//!
//! `nvmlInit`/`nvmlShutdown` keep a count, as NVML does: entry points fail with
//! NVML_ERROR_UNINITIALIZED while it is zero. The connections stay for the process (a later
//! `nvmlInit` finds them again).
//!
//! Tests (and CI, which has no GPU) can stand a recorded inventory in for the servers:
//! `RGPU_TEST_NVML_RECORDED=<file.json>` (see [`Recorded`]).

use std::sync::{Arc, Mutex, OnceLock};

use rgpu_client::{ClientError, CudaClient, ServerLink};
use rgpu_protocol::cuda::{CuDevice, CuInventory};
use rgpu_protocol::nvml::{DeviceFacts, DeviceStatus, NvmlAnswer, NvmlInventory, NvmlQuery};
use serde::{Deserialize, Serialize};

use crate::types::*;

/// The devices and the servers' NVML versions.
pub struct Devices {
    pub list: Vec<Device>,
    pub system: System,
}

/// What `nvmlSystemGet*` answer: the first server's (with devices) that knows.
#[derive(Default)]
pub struct System {
    pub driver_version: Option<String>,
    pub nvml_version: Option<String>,
    pub cuda_driver_version: Option<i32>,
}

/// One device, at index `index` (CUDA's ordinal for it).
pub struct Device {
    pub index: u32,
    pub info: CuDevice,
    pub facts: DeviceFacts,
    source: Source,
}

/// Where a device's live values come from.
enum Source {
    Server {
        link: Arc<ServerLink>,
        remote_ordinal: u32,
        /// The server's machine (`NvmlInventory::host`).
        host: Option<String>,
    },
    Recorded(Box<Option<DeviceStatus>>),
}

impl Device {
    /// The device's live values, from its server (one round trip).
    pub fn status(&self) -> Result<DeviceStatus, nvmlReturn_t> {
        match &self.source {
            Source::Server {
                link,
                remote_ordinal,
                ..
            } => match link.connection().cuda().get_device_status(*remote_ordinal) {
                Ok(Ok(status)) => Ok(status),
                Ok(Err(_)) => Err(NVML_ERROR_INVALID_ARGUMENT),
                Err(e) => Err(client_error(e)),
            },
            Source::Recorded(status) => (**status).clone().ok_or(NVML_ERROR_GPU_IS_LOST),
        }
    }

    /// Asks the device's server's own NVML (`query.device` and `query.peer` are filled in
    /// here; `peer` must be a device of the same server): one round trip.
    pub fn forward(
        &self,
        mut query: NvmlQuery,
        peer: Option<&Device>,
    ) -> Result<NvmlAnswer, nvmlReturn_t> {
        let Source::Server {
            link,
            remote_ordinal,
            ..
        } = &self.source
        else {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        };
        query.device = *remote_ordinal;
        if let Some(peer) = peer {
            match &peer.source {
                Source::Server {
                    link: peer_link,
                    remote_ordinal,
                    ..
                } if Arc::ptr_eq(link, peer_link) => query.peer = *remote_ordinal,
                // Another server of this machine: its GPU, by UUID, to this server's NVML.
                _ if self.same_host(peer) => {
                    query.peer_uuid = Some(rgpu_protocol::nvml::uuid_string(&peer.info.uuid))
                }
                _ => return Err(NVML_ERROR_NOT_SUPPORTED),
            }
        }
        link.connection()
            .cuda()
            .forward_nvml(query)
            .map_err(client_error)
    }

    /// Whether `other` is served from the same machine as this device (by this server or
    /// another).
    pub fn same_host(&self, other: &Device) -> bool {
        match (&self.source, &other.source) {
            (Source::Server { host: Some(a), .. }, Source::Server { host: Some(b), .. }) => a == b,
            _ => false,
        }
    }

    /// Whether `other` is served by the same server as this device.
    pub fn same_server(&self, other: &Device) -> bool {
        match (&self.source, &other.source) {
            (Source::Server { link: a, .. }, Source::Server { link: b, .. }) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// The handle NVML callers hold: the device's address, never dereferenced by them.
    pub fn handle(&self) -> nvmlDevice_t {
        (self as *const Device).cast()
    }

    /// The attribute `attribute` (a `CUdevice_attribute`) from the CUDA inventory.
    pub fn cuda_attribute(&self, attribute: u32) -> Option<i32> {
        self.info
            .attributes
            .iter()
            .find(|&&(a, _)| a == attribute)
            .map(|&(_, v)| v)
    }
}

fn client_error(error: ClientError) -> nvmlReturn_t {
    log::error!("rgpu: {error}");
    match error {
        ClientError::Timeout(_) => NVML_ERROR_TIMEOUT,
        ClientError::Protocol(_) => NVML_ERROR_UNKNOWN,
        _ => NVML_ERROR_GPU_IS_LOST,
    }
}

impl Devices {
    /// The device a handle names; INVALID_ARGUMENT for anything else (a handle is compared
    /// with the devices' addresses, never followed).
    pub fn by_handle(&self, handle: nvmlDevice_t) -> Result<&Device, nvmlReturn_t> {
        self.list
            .iter()
            .find(|d| d.handle() == handle)
            .ok_or(NVML_ERROR_INVALID_ARGUMENT)
    }

    /// The devices, in the program's order (CUDA's).
    fn new(chosen: Vec<(CuDevice, DeviceFacts, Source)>, system: System) -> Devices {
        let list = chosen
            .into_iter()
            .enumerate()
            .map(|(index, (info, facts, source))| Device {
                index: index as u32,
                info,
                facts,
                source,
            })
            .collect();
        Devices { list, system }
    }
}

impl System {
    /// Takes what `nvml` knows and this does not yet.
    fn learn(&mut self, nvml: &NvmlInventory) {
        self.driver_version = self.driver_version.take().or(nvml.driver_version.clone());
        self.nvml_version = self.nvml_version.take().or(nvml.nvml_version.clone());
        self.cuda_driver_version = self.cuda_driver_version.or(nvml.cuda_driver_version);
    }
}

/// A recorded inventory (`RGPU_TEST_NVML_RECORDED`, JSON): what each server answered, in
/// `RGPU_SERVERS` order.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Recorded {
    pub servers: Vec<RecordedServer>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct RecordedServer {
    pub inventory: CuInventory,
    pub nvml: NvmlInventory,
    /// Each device's live values (`None`: its server is lost).
    pub status: Vec<Option<DeviceStatus>>,
}

impl Recorded {
    /// The devices as the library numbers them, with live values from the recording.
    pub fn devices(self) -> Result<Devices, String> {
        let mut system = System::default();
        let mut found = Vec::new();
        for server in self.servers {
            if !server.inventory.devices.is_empty() {
                system.learn(&server.nvml);
            }
            let mut facts = server.nvml.devices.into_iter();
            let mut status = server.status.into_iter();
            for info in server.inventory.devices {
                let source = Source::Recorded(Box::new(status.next().flatten()));
                found.push((info, facts.next().unwrap_or_default(), source));
            }
        }
        let chosen = rgpu_client::choose_devices(found, |(info, _, _)| info.name.clone())?;
        Ok(Devices::new(chosen, system))
    }
}

/// The servers' devices: the recording if `RGPU_TEST_NVML_RECORDED` names one, else the
/// servers of `RGPU_SERVERS`.
fn discover() -> Result<Devices, nvmlReturn_t> {
    init_logging();
    if let Some(path) = std::env::var_os("RGPU_TEST_NVML_RECORDED") {
        let text = std::fs::read_to_string(&path).map_err(|e| {
            log::error!("rgpu: {}: {e}", path.to_string_lossy());
            NVML_ERROR_DRIVER_NOT_LOADED
        })?;
        let recorded: Recorded = serde_json::from_str(&text).map_err(|e| {
            log::error!("rgpu: {}: {e}", path.to_string_lossy());
            NVML_ERROR_DRIVER_NOT_LOADED
        })?;
        return recorded.devices().map_err(not_loaded);
    }
    let found = rgpu_client::find_cuda_devices(|_| {}).map_err(not_loaded)?;
    if found.reached == 0 {
        // Like a machine whose driver does not answer: nvidia-smi says it cannot reach it.
        return Err(NVML_ERROR_DRIVER_NOT_LOADED);
    }
    // Each server's NVML facts, asked once per server (the devices of a server are adjacent).
    let mut system = System::default();
    let mut asked: Option<(Arc<ServerLink>, NvmlInventory)> = None;
    let mut chosen = Vec::new();
    for device in found.devices {
        if !asked
            .as_ref()
            .is_some_and(|(link, _)| Arc::ptr_eq(link, &device.link))
        {
            let nvml = device.link.current().cuda().get_nvml_inventory();
            let nvml = nvml.unwrap_or_else(|e| {
                log::error!("rgpu: {}: {e}", device.link.endpoint());
                NvmlInventory::default()
            });
            system.learn(&nvml);
            asked = Some((device.link.clone(), nvml));
        }
        let facts = asked
            .as_ref()
            .and_then(|(_, nvml)| nvml.devices.get(device.remote_ordinal as usize).cloned())
            .unwrap_or_default();
        let host = asked.as_ref().and_then(|(_, nvml)| nvml.host.clone());
        let source = Source::Server {
            link: device.link,
            remote_ordinal: device.remote_ordinal,
            host,
        };
        chosen.push((device.info, facts, source));
    }
    Ok(Devices::new(chosen, system))
}

fn not_loaded(why: String) -> nvmlReturn_t {
    log::error!("rgpu: {why}");
    NVML_ERROR_DRIVER_NOT_LOADED
}

/// The outcome of discovery (first `nvmlInit` only), and the init count.
static DEVICES: OnceLock<Result<Devices, nvmlReturn_t>> = OnceLock::new();
static INIT_COUNT: Mutex<u32> = Mutex::new(0);

/// `nvmlInit`: discovers the devices (first call) and counts the call.
pub fn init() -> Result<(), nvmlReturn_t> {
    DEVICES.get_or_init(discover).as_ref().map_err(|e| *e)?;
    *lock_count() += 1;
    Ok(())
}

/// `nvmlShutdown`: UNINITIALIZED if every init was already matched.
pub fn shutdown() -> Result<(), nvmlReturn_t> {
    let mut count = lock_count();
    if *count == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    *count -= 1;
    Ok(())
}

/// The devices, or UNINITIALIZED outside `nvmlInit` ... `nvmlShutdown`.
pub fn devices() -> Result<&'static Devices, nvmlReturn_t> {
    if *lock_count() == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    match DEVICES.get() {
        Some(Ok(devices)) => Ok(devices),
        _ => Err(NVML_ERROR_UNINITIALIZED),
    }
}

/// The device a handle names (the library initialized).
pub fn device(handle: nvmlDevice_t) -> Result<&'static Device, nvmlReturn_t> {
    devices()?.by_handle(handle)
}

fn lock_count() -> std::sync::MutexGuard<'static, u32> {
    INIT_COUNT.lock().unwrap_or_else(|e| e.into_inner())
}

/// Logging to stderr, at the level `RGPU_LOG` names (default warn); once.
pub fn init_logging() {
    rgpu_client::init_logging();
}
