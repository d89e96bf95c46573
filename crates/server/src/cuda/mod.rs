//! The server's CUDA backend: the native driver ([`driver`]), the inventory of its GPUs taken
//! once at start, the cache of module images shared by all sessions, and the per-session state
//! that carries out CUDA requests ([`session`]), one file per group of the CUDA table
//! (`contexts`, `memory`, `copies`, `modules`, `launches`, `streams`, `events`, `graphs`, `vmm`,
//! `monitoring`, `nccl`).

mod arrays;
mod contexts;
mod copies;
mod events;
mod fabric_memory;
mod fabric_ring;
mod graphs;
mod ipc;
mod launcher;
mod launches;
mod memory;
mod modules;
mod monitoring;
mod nccl;
mod nvml_forward;
mod owned;
mod peers;
mod pieces;
mod pools;
mod raw;
mod session;
mod shareable;
mod staging;
mod streams;
mod vmm;

use std::collections::{HashMap, VecDeque};
use std::ffi::c_char;
use std::sync::{Arc, Mutex};

use rgpu_cuda_api::generated::{device_attribute, DEVICE_ATTRIBUTE_VALUES};
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{CuDevice, CuInventory, CuPeer};

use rgpu_cuda_api::cu_call;
pub use rgpu_cuda_api::native::{self as driver, Driver};
pub(crate) use session::CudaSession;

/// Module images kept for reuse across sessions: a client that loads an image the server already
/// holds sends only its hash.
const IMAGE_CACHE_BYTES: usize = 2 << 30;

pub struct Backend {
    pub driver: Driver,
    pub inventory: CuInventory,
    images: Mutex<ImageCache>,
}

#[derive(Default)]
struct ImageCache {
    by_hash: HashMap<[u8; 32], Arc<Vec<u8>>>,
    /// Insertion order, for eviction.
    order: VecDeque<[u8; 32]>,
    bytes: usize,
}

impl Backend {
    /// Loads the driver and takes the inventory of its devices.
    pub fn load(library: Option<&std::path::Path>) -> Result<Backend, String> {
        let driver = Driver::load(library)?;
        let inventory = take_inventory(&driver)?;
        Ok(Backend {
            driver,
            inventory,
            images: Mutex::new(ImageCache::default()),
        })
    }

    pub fn image(&self, hash: &[u8; 32]) -> Option<Arc<Vec<u8>>> {
        self.images.lock().unwrap().by_hash.get(hash).cloned()
    }

    pub fn keep_image(&self, hash: [u8; 32], image: Arc<Vec<u8>>) {
        let mut cache = self.images.lock().unwrap();
        if cache.by_hash.contains_key(&hash) {
            return;
        }
        cache.bytes += image.len();
        cache.by_hash.insert(hash, image);
        cache.order.push_back(hash);
        while cache.bytes > IMAGE_CACHE_BYTES {
            let Some(oldest) = cache.order.pop_front() else {
                break;
            };
            if let Some(evicted) = cache.by_hash.remove(&oldest) {
                cache.bytes -= evicted.len();
            }
        }
    }
}

fn take_inventory(driver: &Driver) -> Result<CuInventory, String> {
    let mut version = 0;
    // SAFETY: this session's live handles and local buffers; the driver checks addresses.
    driver::check(unsafe { cu_call!(driver, cuDriverGetVersion(&mut version)) })
        .map_err(|s| format!("cuDriverGetVersion failed: CUDA error {s}"))?;
    let mut count = 0;
    // SAFETY: this session's live handles and local buffers; the driver checks addresses.
    driver::check(unsafe { cu_call!(driver, cuDeviceGetCount(&mut count)) })
        .map_err(|s| format!("cuDeviceGetCount failed: CUDA error {s}"))?;
    let mut devices = Vec::new();
    for ordinal in 0..count {
        let mut device = describe_device(driver, ordinal)?;
        device.peers = (0..count)
            .filter(|&other| other != ordinal)
            .map(|other| describe_peer(driver, ordinal, other))
            .collect();
        devices.push(device);
    }
    Ok(CuInventory {
        driver_version: version,
        devices,
    })
}

fn describe_device(driver: &Driver, ordinal: i32) -> Result<CuDevice, String> {
    let mut device: CUdevice = 0;
    // SAFETY: this session's live handles and local buffers; the driver checks addresses.
    driver::check(unsafe { cu_call!(driver, cuDeviceGet(&mut device, ordinal)) })
        .map_err(|s| format!("cuDeviceGet({ordinal}) failed: CUDA error {s}"))?;
    let mut name = [0 as c_char; 256];
    // SAFETY: this session's live handles and local buffers; the driver checks addresses.
    unsafe {
        cu_call!(
            driver,
            cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, device)
        )
    };
    let mut uuid = CUuuid { bytes: [0; 16] };
    // SAFETY: this session's live handles and local buffers; the driver checks addresses.
    unsafe { cu_call!(driver, cuDeviceGetUuid_v2(&mut uuid, device)) };
    let mut total_mem = 0usize;
    // SAFETY: this session's live handles and local buffers; the driver checks addresses.
    unsafe { cu_call!(driver, cuDeviceTotalMem_v2(&mut total_mem, device)) };
    let mut bus_id = [0 as c_char; 32];
    // SAFETY: this session's live handles and local buffers; the driver checks addresses.
    unsafe {
        cu_call!(
            driver,
            cuDeviceGetPCIBusId(bus_id.as_mut_ptr(), bus_id.len() as i32, device)
        )
    };
    let attributes = DEVICE_ATTRIBUTE_VALUES
        .iter()
        .filter_map(|&value| {
            let attribute = device_attribute(value)?;
            let mut answer = 0;
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            let status =
                unsafe { cu_call!(driver, cuDeviceGetAttribute(&mut answer, attribute, device)) };
            (status == driver::SUCCESS).then_some((value, answer))
        })
        .collect();
    Ok(CuDevice {
        name: c_string(&name),
        uuid: uuid.bytes.map(|b| b as u8),
        total_mem: total_mem as u64,
        attributes,
        pci_bus_id: c_string(&bus_id),
        peers: Vec::new(),
    })
}

/// How device `ordinal` reaches device `other` (both ordinals are devices of the driver).
fn describe_peer(driver: &Driver, ordinal: i32, other: i32) -> CuPeer {
    use CUdevice_P2PAttribute::*;
    let (mut device, mut peer): (CUdevice, CUdevice) = (0, 0);
    // SAFETY: this session's live handles and local buffers; the driver checks addresses.
    unsafe { cu_call!(driver, cuDeviceGet(&mut device, ordinal)) };
    // SAFETY: this session's live handles and local buffers; the driver checks addresses.
    unsafe { cu_call!(driver, cuDeviceGet(&mut peer, other)) };
    let mut can_access = 0;
    // SAFETY: this session's live handles and local buffers; the driver checks addresses.
    unsafe { cu_call!(driver, cuDeviceCanAccessPeer(&mut can_access, device, peer)) };
    let attributes = [
        CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK,
        CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED,
        CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
        CU_DEVICE_P2P_ATTRIBUTE_ACCESS_ACCESS_SUPPORTED,
    ]
    .into_iter()
    .filter_map(|attribute| {
        let mut value = 0;
        // SAFETY: this session's live handles and local buffers; the driver checks addresses.
        let status = unsafe {
            cu_call!(
                driver,
                cuDeviceGetP2PAttribute(&mut value, attribute, device, peer)
            )
        };
        (status == driver::SUCCESS).then_some((attribute as u32, value))
    })
    .collect();
    CuPeer {
        device: other as u32,
        can_access: can_access != 0,
        attributes,
    }
}

fn c_string(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
