//! The CUDA devices a program sees: every GPU of every server in `RGPU_SERVERS`, in server
//! order, then narrowed by the environment's selection ([`DeviceSelection`]). The drop-in
//! `libcuda.so.1` and `libnvidia-ml.so.1` both number devices with this, so that NVML's
//! device `i` is CUDA's device `i` (PyTorch and vLLM count and pick devices through NVML).

use std::sync::Arc;

use rgpu_protocol::cuda::{CuDevice, CuInventory};

use crate::{
    ClientConfig, ClientError, Connection, CudaClient, DeviceKind, DeviceSelection, ServerLink,
};

/// One CUDA device of a server.
pub struct RemoteDevice {
    /// The device's server, and the program's session on it (renewed after a loss).
    pub link: Arc<ServerLink>,
    /// The device's ordinal on its server.
    pub remote_ordinal: u32,
    pub info: CuDevice,
}

/// What [`find_cuda_devices`] found.
pub struct RemoteDevices {
    /// The program's devices, in its order.
    pub devices: Vec<RemoteDevice>,
    /// Servers with at least one CUDA device.
    pub servers: usize,
    /// Servers that answered (with devices or without).
    pub reached: usize,
    /// The lowest driver version among those servers.
    pub lowest_driver_version: Option<i32>,
}

/// Connects to every server of `RGPU_SERVERS` (at once), takes each one's CUDA inventory and
/// numbers the devices. `prepare` runs on each new session (the first, and one that replaces
/// a lost session). Servers that cannot be reached are logged and left out; `Err` says why
/// no device can be found at all (no servers given, a malformed selection).
pub fn find_cuda_devices(prepare: fn(&Arc<Connection>)) -> Result<RemoteDevices, String> {
    let config = ClientConfig::from_env()?;
    if config.servers.is_empty() {
        return Err("RGPU_SERVERS is not set: no CUDA devices".into());
    }
    // A malformed selection fails before any connection.
    DeviceSelection::from_env().map_err(|e| e.to_string())?;
    let mut found = Vec::new();
    let mut servers = 0;
    let mut reached = 0;
    let mut lowest_driver_version: Option<i32> = None;
    for (endpoint, result) in config.servers.iter().zip(config.connect_all()) {
        let inventory = result.and_then(|conn| Ok((conn.clone(), inventory_of(&conn)?)));
        match inventory {
            Ok((conn, inventory)) => {
                reached += 1;
                if inventory.devices.is_empty() {
                    log::info!("rgpu: server {endpoint} has no CUDA devices");
                    continue;
                }
                servers += 1;
                lowest_driver_version = Some(
                    lowest_driver_version.map_or(inventory.driver_version, |lowest| {
                        lowest.min(inventory.driver_version)
                    }),
                );
                prepare(&conn);
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
                    prepare(fresh);
                    Ok(())
                });
                for (ordinal, info) in inventory.devices.into_iter().enumerate() {
                    found.push(RemoteDevice {
                        link: link.clone(),
                        remote_ordinal: ordinal as u32,
                        info,
                    });
                }
            }
            Err(e) => log::error!("rgpu: server {endpoint} is not available: {e}"),
        }
    }
    let devices = choose_devices(found, |device| device.info.name.clone())?;
    Ok(RemoteDevices {
        devices,
        servers,
        reached,
        lowest_driver_version,
    })
}

/// The program's devices among `found` (every server's CUDA devices, in server order), by the
/// environment's selection; their order is the program's device order.
pub fn choose_devices<T>(found: Vec<T>, name: impl Fn(&T) -> String) -> Result<Vec<T>, String> {
    let selection = DeviceSelection::from_env().map_err(|e| e.to_string())?;
    let devices = selection
        .choose(found, |device| (name(device), DeviceKind::Gpu))
        .map_err(|e| e.to_string())?;
    if selection.is_active() {
        log::info!(
            "rgpu: {} CUDA devices selected ({selection:?})",
            devices.len()
        );
    }
    Ok(devices)
}

fn inventory_of(conn: &Connection) -> Result<CuInventory, ClientError> {
    conn.cuda().get_inventory()
}
