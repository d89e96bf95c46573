//! The process-wide state: connections to the servers and the device list, taken once at
//! `cuInit`. Every GPU of every server in `RGPU_SERVERS` is a device of the program, numbered
//! in server order; all device queries are answered from the inventory fetched here.

use std::sync::{Arc, OnceLock};

use rgpu_client::{RemoteDevice, ServerLink};
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

/// The program's ordinal of device `remote` of the server `conn` reaches.
pub fn program_ordinal(conn: &Arc<rgpu_client::Connection>, remote: u32) -> Option<i32> {
    servers()
        .ok()?
        .devices
        .iter()
        .find(|device| {
            device.remote_ordinal == remote && Arc::ptr_eq(&device.link.connection(), conn)
        })
        .map(|device| device.ordinal)
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
    rgpu_client::init_logging();
}

fn connect() -> Result<Servers, CUresult> {
    init_logging();
    // Launches and async copies are posted; they must reach the GPU while the program goes
    // on posting, not only at its next synchronizing call.
    let found = rgpu_client::find_cuda_devices(|conn| conn.flush_in_background()).map_err(|e| {
        log::error!("rgpu: {e}");
        CUresult::CUDA_ERROR_NO_DEVICE
    })?;
    let devices: Vec<Device> = found
        .devices
        .into_iter()
        .enumerate()
        .map(|(global, found)| make_device(found, global as i32))
        .collect();
    if devices.is_empty() {
        return Err(CUresult::CUDA_ERROR_NO_DEVICE);
    }
    Ok(Servers {
        devices,
        servers: found.servers,
        driver_version: found
            .lowest_driver_version
            .map_or(API_VERSION, |v| v.min(API_VERSION)),
    })
}

/// Attributes whose truth through rgpu differs from the server's GPU: host memory the device
/// reads at its own address or directly from its page tables, and concurrent or pageable
/// access to managed memory, all need the GPU on the program's own machine
/// (docs/managed-memory.md). Managed memory itself is served. Mapped host memory that kernels
/// get as parameters is mirrored (api/host_mirror.rs), but a program that asks is told no: the
/// mirror is in step only at launches, synchronizations and queries, so a host loop polling
/// memory a running kernel writes would wait for ever.
const ANSWERED_HERE: &[(u32, i32)] = &[
    (19, 0),  // CAN_MAP_HOST_MEMORY
    (88, 0),  // PAGEABLE_MEMORY_ACCESS
    (89, 0),  // CONCURRENT_MANAGED_ACCESS
    (91, 0),  // CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
    (100, 0), // PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES
    (101, 0), // DIRECT_MANAGED_MEM_ACCESS_FROM_HOST
];

fn make_device(found: RemoteDevice, global: i32) -> Device {
    let info = found.info;
    let size = info.attributes.iter().map(|&(a, _)| a as usize + 1).max();
    let mut attributes = vec![None; size.unwrap_or(0)];
    for &(attribute, value) in &info.attributes {
        attributes[attribute as usize] = Some(value);
    }
    for &(attribute, value) in ANSWERED_HERE {
        if let Some(slot) = attributes.get_mut(attribute as usize) {
            *slot = Some(value);
        }
    }
    Device {
        link: found.link,
        ordinal: global,
        remote_ordinal: found.remote_ordinal,
        info,
        attributes,
    }
}
