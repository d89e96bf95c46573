//! The process-wide state: connections to the servers and the device list, taken once at
//! `cuInit`. Every GPU of every server in `RGPU_SERVERS` is a device of the program, numbered
//! in server order; all device queries are answered from the inventory fetched here.

use std::sync::{Arc, OnceLock};

use rgpu_client::{
    ClientConfig, ClientError, Connection, CudaClient, DeviceKind, DeviceSelection, ServerLink,
};
use rgpu_cuda_api::sys::CUresult;
use rgpu_protocol::cuda::CuDevice;

/// The driver API version this library implements (`cuDriverGetVersion` never says more).
pub const API_VERSION: i32 = 13000;

pub struct Servers {
    pub devices: Vec<Device>,
    /// Servers with at least one device.
    pub servers: usize,
    /// The lowest driver version among the servers, capped at [`API_VERSION`].
    pub driver_version: i32,
}

pub struct Device {
    /// The device's server, and the program's session on it (renewed after a loss).
    pub link: Arc<ServerLink>,
    /// The device's ordinal in the program (over all servers).
    pub ordinal: i32,
    /// The device's ordinal on its server.
    pub remote_ordinal: u32,
    pub info: CuDevice,
    /// Attribute values indexed by `CUdevice_attribute`; `None` where the server's driver did
    /// not answer.
    attributes: Vec<Option<i32>>,
}

impl Device {
    pub fn attribute(&self, attribute: u32) -> Option<i32> {
        self.attributes.get(attribute as usize).copied().flatten()
    }
}

static SERVERS: OnceLock<Result<Servers, CUresult>> = OnceLock::new();

/// Connects to the servers (first call only) and returns the outcome of that first call.
pub fn init() -> Result<&'static Servers, CUresult> {
    SERVERS.get_or_init(connect).as_ref().map_err(|e| *e)
}

/// The servers and devices, or CUDA_ERROR_NOT_INITIALIZED before a successful `cuInit`.
pub fn servers() -> Result<&'static Servers, CUresult> {
    match SERVERS.get() {
        Some(result) => result.as_ref().map_err(|e| *e),
        None => Err(CUresult::CUDA_ERROR_NOT_INITIALIZED),
    }
}

/// The version `cuDriverGetVersion` reports (also before `cuInit`).
pub fn driver_version() -> i32 {
    match SERVERS.get() {
        Some(Ok(servers)) => servers.driver_version,
        _ => API_VERSION,
    }
}

/// The device with this ordinal.
pub fn device(ordinal: i32) -> Result<&'static Device, CUresult> {
    let servers = servers()?;
    usize::try_from(ordinal)
        .ok()
        .and_then(|i| servers.devices.get(i))
        .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
}

/// Logging to stderr, at the level `RGPU_LOG` names (default warn); once, at the first call.
pub fn init_logging() {
    let _ = env_logger::Builder::from_env(env_logger::Env::new().filter_or("RGPU_LOG", "warn"))
        .format_target(false)
        .try_init();
}

fn connect() -> Result<Servers, CUresult> {
    init_logging();
    let config = ClientConfig::from_env().map_err(|e| {
        log::error!("rgpu: {e}");
        CUresult::CUDA_ERROR_NO_DEVICE
    })?;
    if config.servers.is_empty() {
        log::error!("rgpu: RGPU_SERVERS is not set: no CUDA devices");
        return Err(CUresult::CUDA_ERROR_NO_DEVICE);
    }
    let selection = DeviceSelection::from_env().map_err(|e| {
        log::error!("rgpu: {e}");
        CUresult::CUDA_ERROR_NO_DEVICE
    })?;
    // (server, its ordinal for the device, what it is), every server's devices in order.
    let mut found = Vec::new();
    let mut servers = 0;
    let mut driver_version = API_VERSION;
    for (endpoint, result) in config.servers.iter().zip(config.connect_all()) {
        let inventory = result.and_then(|conn| Ok((conn.clone(), inventory_of(&conn)?)));
        match inventory {
            Ok((conn, inventory)) => {
                if inventory.devices.is_empty() {
                    log::info!("rgpu: server {endpoint} has no CUDA devices");
                    continue;
                }
                servers += 1;
                driver_version = driver_version.min(inventory.driver_version);
                // Launches and async copies are posted; they must reach the GPU while the
                // program goes on posting, not only at its next synchronizing call.
                conn.flush_in_background();
                let known: Vec<String> = inventory.devices.iter().map(|d| d.name.clone()).collect();
                let link = ServerLink::new(endpoint, &config, conn, move |fresh| {
                    let names: Vec<String> = inventory_of(fresh)
                        .map_err(|e| e.to_string())?
                        .devices
                        .into_iter()
                        .map(|d| d.name)
                        .collect();
                    if names != known {
                        return Err("it serves other GPUs than before".into());
                    }
                    fresh.flush_in_background();
                    Ok(())
                });
                for (ordinal, info) in inventory.devices.into_iter().enumerate() {
                    found.push((link.clone(), ordinal as u32, info));
                }
            }
            Err(e) => log::error!("rgpu: server {endpoint} is not available: {e}"),
        }
    }
    let chosen = selection
        .choose(found, |(_, _, info)| (info.name.clone(), DeviceKind::Gpu))
        .map_err(|e| {
            log::error!("rgpu: {e}");
            CUresult::CUDA_ERROR_NO_DEVICE
        })?;
    if selection.is_active() {
        log::info!(
            "rgpu: {} CUDA devices selected ({selection:?})",
            chosen.len()
        );
    }
    let devices: Vec<Device> = chosen
        .into_iter()
        .enumerate()
        .map(|(global, (link, ordinal, info))| make_device(&link, ordinal, info, global as i32))
        .collect();
    if devices.is_empty() {
        return Err(CUresult::CUDA_ERROR_NO_DEVICE);
    }
    Ok(Servers {
        devices,
        servers,
        driver_version,
    })
}

fn inventory_of(conn: &Connection) -> Result<rgpu_protocol::cuda::CuInventory, ClientError> {
    conn.cuda().get_inventory()
}

fn make_device(link: &Arc<ServerLink>, ordinal: u32, info: CuDevice, global: i32) -> Device {
    let size = info.attributes.iter().map(|&(a, _)| a as usize + 1).max();
    let mut attributes = vec![None; size.unwrap_or(0)];
    for &(attribute, value) in &info.attributes {
        attributes[attribute as usize] = Some(value);
    }
    Device {
        link: link.clone(),
        ordinal: global,
        remote_ordinal: ordinal,
        info,
        attributes,
    }
}
