//! NVML's answers from a recorded inventory of two servers (no GPU, no server): the library
//! reads it at its first nvmlInit from `RGPU_TEST_NVML_RECORDED`. One test, in order, because
//! the library's state is the process's.

use std::ffi::{c_char, c_uint, CStr, CString};
use std::ptr::null_mut;

use rgpu_nvml::devices::{Recorded, RecordedServer};
use rgpu_nvml::generated_exports::*;
use rgpu_nvml::types::*;
use rgpu_protocol::cuda::{CuDevice, CuInventory};
use rgpu_protocol::nvml::{
    DeviceFacts, DeviceStatus, MemoryStatus, NvmlInventory, ProcessStatus, Utilization,
};

fn device(name: &str, uuid_byte: u8, bus: &str) -> CuDevice {
    CuDevice {
        name: name.into(),
        uuid: [uuid_byte; 16],
        total_mem: 80 << 30,
        attributes: vec![(75, 9), (76, 0)],
        pci_bus_id: bus.into(),
        peers: Vec::new(),
    }
}

fn busy_status() -> DeviceStatus {
    DeviceStatus {
        memory: Some(MemoryStatus {
            total: 80 << 30,
            reserved: 1 << 20,
            free: 70 << 30,
            used: 10 << 30,
        }),
        utilization: Some(Utilization {
            gpu: 37,
            memory: 12,
        }),
        temperature: Some(41),
        clocks: vec![(1, 1755)],
        mig_mode: Some((0, 0)),
        processes: Some(vec![ProcessStatus {
            pid: 4242,
            used_memory: Some(1 << 30),
        }]),
        ..DeviceStatus::default()
    }
}

/// Server A: two H100s; server B: one L4 whose server is lost (no live values).
fn recording() -> Recorded {
    Recorded {
        servers: vec![
            RecordedServer {
                inventory: CuInventory {
                    driver_version: 13000,
                    devices: vec![
                        device("NVIDIA H100", 0xa0, "0000:1b:00.0"),
                        device("NVIDIA H100", 0xa1, "0000:2c:00.0"),
                    ],
                },
                nvml: NvmlInventory {
                    driver_version: Some("580.82.07".into()),
                    nvml_version: Some("13.580.82.07".into()),
                    cuda_driver_version: Some(13000),
                    devices: vec![
                        DeviceFacts {
                            serial: Some("S-A0".into()),
                            pci_ids: Some((0x2330_10de, 0x16c1_10de)),
                            ..DeviceFacts::default()
                        },
                        DeviceFacts::default(),
                    ],
                    host: None,
                },
                status: vec![Some(busy_status()), Some(DeviceStatus::default())],
            },
            RecordedServer {
                inventory: CuInventory {
                    driver_version: 12080,
                    devices: vec![device("NVIDIA L4", 0xb0, "0000:1b:00.0")],
                },
                nvml: NvmlInventory::default(),
                status: vec![None],
            },
        ],
    }
}

fn handle(index: u32) -> nvmlDevice_t {
    let mut handle = std::ptr::null();
    // SAFETY: a writable handle slot.
    let status = unsafe { nvmlDeviceGetHandleByIndex_v2(index, &mut handle) };
    assert_eq!(status, NVML_SUCCESS);
    handle
}

fn text(call: impl FnOnce(*mut c_char, c_uint) -> nvmlReturn_t) -> String {
    let mut buffer = [0 as c_char; 96];
    assert_eq!(call(buffer.as_mut_ptr(), 96), NVML_SUCCESS);
    // SAFETY: NVML wrote a C string into the buffer.
    unsafe { CStr::from_ptr(buffer.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn nvml_answers_from_the_recorded_inventory() {
    let path = std::env::temp_dir().join(format!("rgpu-nvml-recorded-{}.json", std::process::id()));
    std::fs::write(&path, serde_json::to_string(&recording()).unwrap()).unwrap();
    std::env::set_var("RGPU_TEST_NVML_RECORDED", &path);
    let mut count: c_uint = 99;

    // SAFETY: every pointer passed below is a live local of the type the entry point takes.
    unsafe {
        // Before init: UNINITIALIZED, as NVML says.
        assert_eq!(nvmlDeviceGetCount_v2(&mut count), NVML_ERROR_UNINITIALIZED);
        assert_eq!(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
        assert_eq!(nvmlInit(), NVML_SUCCESS);
        assert_eq!(nvmlInitWithFlags(0), NVML_SUCCESS);

        // Both servers' devices, in server order (the CUDA numbering).
        assert_eq!(nvmlDeviceGetCount_v2(&mut count), NVML_SUCCESS);
        assert_eq!(count, 3);
        assert_eq!(nvmlDeviceGetCount(null_mut()), NVML_ERROR_INVALID_ARGUMENT);
        let names: Vec<String> = (0..3)
            .map(|i| text(|b, n| nvmlDeviceGetName(handle(i), b, n)))
            .collect();
        assert_eq!(names, ["NVIDIA H100", "NVIDIA H100", "NVIDIA L4"]);
        for i in 0..3 {
            let mut index = 99;
            assert_eq!(nvmlDeviceGetIndex(handle(i), &mut index), NVML_SUCCESS);
            assert_eq!(index, i);
        }
        let mut none = std::ptr::null();
        assert_eq!(
            nvmlDeviceGetHandleByIndex_v2(3, &mut none),
            NVML_ERROR_INVALID_ARGUMENT
        );

        // UUIDs as NVML spells them; lookups by UUID, PCI bus id (several spellings), serial.
        let uuid = text(|b, n| nvmlDeviceGetUUID(handle(1), b, n));
        assert_eq!(uuid, "GPU-a1a1a1a1-a1a1-a1a1-a1a1-a1a1a1a1a1a1");
        let mut found = std::ptr::null();
        let wanted = CString::new(uuid.to_uppercase()).unwrap();
        assert_eq!(
            nvmlDeviceGetHandleByUUID(wanted.as_ptr(), &mut found),
            NVML_SUCCESS
        );
        assert_eq!(found, handle(1));
        let unknown = CString::new("GPU-00000000-0000-0000-0000-000000000000").unwrap();
        assert_eq!(
            nvmlDeviceGetHandleByUUID(unknown.as_ptr(), &mut found),
            NVML_ERROR_NOT_FOUND
        );
        for spelling in ["00000000:2C:00.0", "0000:2c:00.0", "2c:00.0"] {
            let bus = CString::new(spelling).unwrap();
            assert_eq!(
                nvmlDeviceGetHandleByPciBusId_v2(bus.as_ptr(), &mut found),
                NVML_SUCCESS
            );
            assert_eq!(found, handle(1), "{spelling}");
        }
        let serial = CString::new("S-A0").unwrap();
        assert_eq!(
            nvmlDeviceGetHandleBySerial(serial.as_ptr(), &mut found),
            NVML_SUCCESS
        );
        assert_eq!(found, handle(0));

        // PCI info: ids from NVML, bus ids in both lengths; v1 writes only its 36 bytes.
        let mut pci: nvmlPciInfo_t = std::mem::zeroed();
        assert_eq!(nvmlDeviceGetPciInfo_v3(handle(0), &mut pci), NVML_SUCCESS);
        assert_eq!((pci.domain, pci.bus, pci.device), (0, 0x1b, 0));
        assert_eq!(pci.pciDeviceId, 0x2330_10de);
        assert_eq!(
            CStr::from_ptr(pci.busId.as_ptr()).to_str(),
            Ok("00000000:1B:00.0")
        );
        assert_eq!(
            CStr::from_ptr(pci.busIdLegacy.as_ptr()).to_str(),
            Ok("0000:1B:00.0")
        );
        let mut v1 = [0x55u8; 68];
        assert_eq!(
            nvmlDeviceGetPciInfo(handle(0), v1.as_mut_ptr().cast()),
            NVML_SUCCESS
        );
        assert!(v1[PCI_INFO_V1_SIZE..].iter().all(|&b| b == 0x55));

        // Live values; a value the server's NVML lacks is NOT_SUPPORTED; a lost server's
        // device is GPU_IS_LOST.
        let mut memory = nvmlMemory_t::default();
        assert_eq!(
            nvmlDeviceGetMemoryInfo(handle(0), &mut memory),
            NVML_SUCCESS
        );
        assert_eq!(
            (memory.total, memory.used),
            (80 << 30, (10 << 30) + (1 << 20))
        );
        let mut memory2 = nvmlMemory_v2_t::default();
        assert_eq!(
            nvmlDeviceGetMemoryInfo_v2(handle(0), &mut memory2),
            NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        );
        memory2.version = NVML_MEMORY_V2;
        assert_eq!(
            nvmlDeviceGetMemoryInfo_v2(handle(0), &mut memory2),
            NVML_SUCCESS
        );
        assert_eq!((memory2.reserved, memory2.free), (1 << 20, 70 << 30));
        let mut utilization = nvmlUtilization_t::default();
        assert_eq!(
            nvmlDeviceGetUtilizationRates(handle(0), &mut utilization),
            NVML_SUCCESS
        );
        assert_eq!((utilization.gpu, utilization.memory), (37, 12));
        let mut value = 0;
        assert_eq!(
            nvmlDeviceGetTemperature(handle(0), 0, &mut value),
            NVML_SUCCESS
        );
        assert_eq!(value, 41);
        assert_eq!(
            nvmlDeviceGetTemperature(handle(0), 7, &mut value),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetClockInfo(handle(0), 1, &mut value),
            NVML_SUCCESS
        );
        assert_eq!(value, 1755);
        assert_eq!(
            nvmlDeviceGetClockInfo(handle(0), 2, &mut value),
            NVML_ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            nvmlDeviceGetPowerUsage(handle(1), &mut value),
            NVML_ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            nvmlDeviceGetPowerUsage(handle(2), &mut value),
            NVML_ERROR_GPU_IS_LOST
        );
        let (mut major, mut minor) = (0, 0);
        assert_eq!(
            nvmlDeviceGetCudaComputeCapability(handle(2), &mut major, &mut minor),
            0
        );
        assert_eq!((major, minor), (9, 0));

        // Bad handles and buffers get NVML's errors.
        let bogus = 8usize as nvmlDevice_t;
        assert_eq!(
            nvmlDeviceGetTemperature(bogus, 0, &mut value),
            NVML_ERROR_INVALID_ARGUMENT
        );
        let mut small = [0 as c_char; 8];
        assert_eq!(
            nvmlDeviceGetName(handle(0), small.as_mut_ptr(), 8),
            NVML_ERROR_INSUFFICIENT_SIZE
        );
        assert_eq!(
            nvmlDeviceGetName(handle(0), null_mut(), 96),
            NVML_ERROR_INVALID_ARGUMENT
        );

        // Process lists, sized NVML's way, this program's pid for its session's process.
        let mut count: c_uint = 0;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(handle(0), &mut count, null_mut()),
            NVML_ERROR_INSUFFICIENT_SIZE
        );
        assert_eq!(count, 1);
        let mut infos = [nvmlProcessInfo_t::default(); 4];
        count = 4;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(handle(0), &mut count, infos.as_mut_ptr()),
            NVML_SUCCESS
        );
        assert_eq!(count, 1);
        assert_eq!(infos[0].pid, std::process::id());
        assert_eq!(infos[0].usedGpuMemory, 1 << 30);
        let mut v1 = [nvmlProcessInfo_v1_t::default(); 1];
        count = 1;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses(handle(0), &mut count, v1.as_mut_ptr()),
            NVML_SUCCESS
        );
        assert_eq!(v1[0].pid, std::process::id());
        count = 0;
        assert_eq!(
            nvmlDeviceGetGraphicsRunningProcesses_v3(handle(0), &mut count, null_mut()),
            NVML_SUCCESS
        );
        assert_eq!(count, 0);

        // Versions from the first server with devices; what rgpu does not implement says so.
        assert_eq!(text(|b, n| nvmlSystemGetDriverVersion(b, n)), "580.82.07");
        assert_eq!(nvmlDeviceClearCpuAffinity(), NVML_ERROR_NOT_SUPPORTED);

        // Forwarded getters ask the device's server (a recording has none to ask); a pair
        // of devices of two servers is answered here: no peer-to-peer, the furthest level.
        let mut value = 7u32;
        let clock = nvmlDeviceGetClock(handle(0), 0, 0, (&raw mut value).cast());
        assert_eq!(clock, NVML_ERROR_NOT_SUPPORTED);
        let bad = nvmlDeviceGetClock(std::ptr::null(), 0, 0, (&raw mut value).cast());
        assert_eq!(bad, NVML_ERROR_INVALID_ARGUMENT);
        let p2p = nvmlDeviceGetP2PStatus(handle(0), handle(2), 0, (&raw mut value).cast());
        assert_eq!((p2p, value), (NVML_SUCCESS, 5));
        let level =
            nvmlDeviceGetTopologyCommonAncestor(handle(1), handle(2), (&raw mut value).cast());
        assert_eq!((level, value), (NVML_SUCCESS, 50));
        let message = CStr::from_ptr(rgpu_nvml::api::nvmlErrorString(7));
        assert_eq!(message.to_str(), Ok("Insufficient Size"));

        // Two inits, two shutdowns; then UNINITIALIZED again.
        assert_eq!(nvmlShutdown(), NVML_SUCCESS);
        assert_eq!(nvmlDeviceGetCount_v2(&mut count), NVML_SUCCESS);
        assert_eq!(nvmlShutdown(), NVML_SUCCESS);
        assert_eq!(nvmlDeviceGetCount_v2(&mut count), NVML_ERROR_UNINITIALIZED);
        assert_eq!(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
    }
    std::fs::remove_file(path).unwrap();
}

#[test]
fn every_implemented_entry_point_is_exported() {
    for name in IMPLEMENTED {
        assert!(EXPORTS.contains(name), "{name}");
    }
    for name in [
        "nvmlInit",
        "nvmlInit_v2",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetUUID",
    ] {
        assert!(IMPLEMENTED.contains(&name), "{name}");
    }
}
