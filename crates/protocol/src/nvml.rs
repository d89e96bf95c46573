//! What the drop-in `libnvidia-ml.so.1` asks a server (the CUDA table's `Monitoring` group):
//! the server's NVML versions and each CUDA device's fixed facts, fetched once, and a device's
//! live values, fetched per query. Devices are the server's CUDA ordinals (the server maps
//! them to its NVML devices by UUID). Every value is `None` where the server's NVML does not
//! answer it (or the server has no NVML): the client reports NVML_ERROR_NOT_SUPPORTED.

use serde::{Deserialize, Serialize};

/// The server's NVML: versions, and the fixed facts of each CUDA device, in CUDA order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NvmlInventory {
    /// `nvmlSystemGetDriverVersion`, e.g. "580.82.07".
    pub driver_version: Option<String>,
    /// `nvmlSystemGetNVMLVersion`, e.g. "13.580.82.07".
    pub nvml_version: Option<String>,
    /// `nvmlSystemGetCudaDriverVersion_v2`, e.g. 13000.
    pub cuda_driver_version: Option<i32>,
    /// One per CUDA device of the server (`CuInventory::devices`), in that order.
    pub devices: Vec<DeviceFacts>,
    /// The machine the server runs on (a hash of its kernel's boot id): servers that say the
    /// same share a machine, and a pair query over their GPUs is asked of one of them.
    pub host: Option<String>,
}

/// What NVML says of a device that does not change while the server runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceFacts {
    pub serial: Option<String>,
    pub board_id: Option<u32>,
    /// `nvmlBrandType_t`.
    pub brand: Option<u32>,
    /// `nvmlDeviceArchitecture_t`.
    pub architecture: Option<u32>,
    pub minor_number: Option<u32>,
    /// `nvmlPciInfo_t.pciDeviceId` and `.pciSubSystemId`.
    pub pci_ids: Option<(u32, u32)>,
    pub vbios_version: Option<String>,
    pub num_cores: Option<u32>,
    pub memory_bus_width: Option<u32>,
    pub max_pcie_link_generation: Option<u32>,
    pub max_pcie_link_width: Option<u32>,
    /// `(nvmlClockType_t, MHz)` for each clock whose maximum NVML answers.
    pub max_clocks: Vec<(u32, u32)>,
    /// `nvmlDeviceGetPowerManagementDefaultLimit`, milliwatts.
    pub default_power_limit: Option<u32>,
}

/// A device's live values, as NVML reports them at the time of the query.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceStatus {
    pub memory: Option<MemoryStatus>,
    pub utilization: Option<Utilization>,
    /// The GPU's temperature sensor, degrees C.
    pub temperature: Option<u32>,
    /// Milliwatts.
    pub power_usage: Option<u32>,
    pub power_limit: Option<u32>,
    pub enforced_power_limit: Option<u32>,
    /// `(nvmlClockType_t, MHz)` for each clock whose current value NVML answers.
    pub clocks: Vec<(u32, u32)>,
    /// Percent (fan 0).
    pub fan_speed: Option<u32>,
    /// `nvmlPstates_t`.
    pub performance_state: Option<u32>,
    /// `nvmlEnableState_t`.
    pub persistence_mode: Option<u32>,
    /// `nvmlComputeMode_t`.
    pub compute_mode: Option<u32>,
    /// MIG mode: (current, pending).
    pub mig_mode: Option<(u32, u32)>,
    /// ECC mode: (current, pending), `nvmlEnableState_t`.
    pub ecc_mode: Option<(u32, u32)>,
    pub display_mode: Option<u32>,
    pub display_active: Option<u32>,
    pub pcie_link_generation: Option<u32>,
    pub pcie_link_width: Option<u32>,
    /// The asking session's own processes on the device (its worker process; the client shows
    /// them as itself): `None` where the server's NVML cannot list processes.
    pub processes: Option<Vec<ProcessStatus>>,
}

/// `nvmlMemory_v2_t`, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryStatus {
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlUtilization_t`, percent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Utilization {
    pub gpu: u32,
    pub memory: u32,
}

/// One process using the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStatus {
    /// The process on the server.
    pub pid: u32,
    /// Bytes; `None` where NVML cannot say (`NVML_VALUE_NOT_AVAILABLE`).
    pub used_memory: Option<u64>,
}

/// A query forwarded to the server's own NVML: a function of the forwarding table
/// ([`forwarded`]), its device (a server CUDA ordinal), the second device of a pair query
/// (`peer`, unused otherwise), and the caller's arguments in the table's order
/// ([`Param::args`] each). The server calls only what the table lists, with buffers of the
/// sizes it states.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NvmlQuery {
    pub function: String,
    pub device: u32,
    pub peer: u32,
    pub args: Vec<NvmlArg>,
    /// A peer device of another server of the same machine, by UUID (`peer` is then unused).
    pub peer_uuid: Option<String>,
}

/// One argument of a forwarded query.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum NvmlArg {
    /// A number passed by value.
    Value(u64),
    /// A buffer the function fills (its bytes before the call: a versioned struct carries
    /// its version in, a field query its field ids).
    Bytes(Vec<u8>),
    /// A null pointer.
    Null,
}

/// NVML's return code, and each argument's bytes after the call (empty for a value or a null
/// pointer), in the query's order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NvmlAnswer {
    pub ret: u32,
    pub bytes: Vec<Vec<u8>>,
}

/// The most bytes one forwarded query's buffers may hold together.
pub const FORWARD_MAX_BYTES: usize = 64 << 10;
/// The longest text buffer a forwarded query passes (NVML's strings are far shorter).
pub const FORWARD_MAX_TEXT: usize = 4096;

/// The shape of one C parameter (or of a pair) of a forwarded function, a token of
/// crates/protocol/data/nvml-forwarded.txt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// `D`: the device (the query's `device`).
    Device,
    /// `P`: the second device of a pair query (the query's `peer`).
    Peer,
    /// `u`: a 32-bit number or enum by value (one [`NvmlArg::Value`]).
    U32,
    /// `U`: a 64-bit number by value (one [`NvmlArg::Value`]).
    U64,
    /// `oN`: a pointer to N bytes the function fills (one [`NvmlArg::Bytes`] of N, or null).
    Out(usize),
    /// `s`: a `char *` and its `unsigned int` length (one [`NvmlArg::Bytes`] of the length).
    Text,
    /// `cN`: an `unsigned int *` count (in: the capacity, out: how many) and an array of
    /// N-byte items (two arguments: the count's 4 bytes and the array, each maybe null).
    Counted(usize),
    /// `kN`: a count by value and an array of that many N-byte items, read and filled (one
    /// [`NvmlArg::Bytes`]: the count is its length over N).
    Sized(usize),
}

impl Param {
    /// How many query arguments the parameter takes.
    pub fn args(self) -> usize {
        match self {
            Param::Device | Param::Peer => 0,
            Param::Counted(_) => 2,
            _ => 1,
        }
    }

    fn parse(token: &str) -> Option<Param> {
        let size = || token[1..].parse::<usize>().ok().filter(|&n| n > 0);
        Some(match token.as_bytes().first()? {
            b'D' if token.len() == 1 => Param::Device,
            b'P' if token.len() == 1 => Param::Peer,
            b'u' if token.len() == 1 => Param::U32,
            b'U' if token.len() == 1 => Param::U64,
            b's' if token.len() == 1 => Param::Text,
            b'o' => Param::Out(size()?),
            b'c' => Param::Counted(size()?),
            b'k' => Param::Sized(size()?),
            _ => return None,
        })
    }
}

/// The forwarding table: every NVML getter rgpu's NVML asks a server's NVML, by name.
pub const FORWARDED: &str = include_str!("../data/nvml-forwarded.txt");

/// The parameter shapes of a forwarded function (`None`: not forwarded).
pub fn forwarded(function: &str) -> Option<&'static [Param]> {
    static TABLE: std::sync::OnceLock<std::collections::HashMap<&'static str, Vec<Param>>> =
        std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        FORWARDED
            .lines()
            .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
            .map(|line| {
                let mut tokens = line.split_whitespace();
                let name = tokens.next().expect("a name");
                let params = tokens
                    .map(|t| Param::parse(t).unwrap_or_else(|| panic!("{name}: bad token {t}")))
                    .collect();
                (name, params)
            })
            .collect()
    });
    table.get(function).map(Vec::as_slice)
}

/// NVML's spelling of a device UUID (the CUDA UUID's bytes): `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn uuid_string(bytes: &[u8; 16]) -> String {
    let hex = hex::encode(bytes);
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// A server without CUDA has no devices.
impl crate::table::FromStatus<u32> for NvmlInventory {
    fn from_status(_: u32) -> Self {
        NvmlInventory::default()
    }
}

/// A server that cannot serve the query (no CUDA): NVML_ERROR_NOT_SUPPORTED.
impl crate::table::FromStatus<u32> for NvmlAnswer {
    fn from_status(_: u32) -> Self {
        NvmlAnswer {
            ret: 3,
            bytes: Vec::new(),
        }
    }

    fn failure(&self) -> Option<i64> {
        crate::table::failure_of(self.ret)
    }
}

sample_struct! {
    NvmlInventory { driver_version, nvml_version, cuda_driver_version, devices, host },
    DeviceFacts {
        serial, board_id, brand, architecture, minor_number, pci_ids, vbios_version, num_cores,
        memory_bus_width, max_pcie_link_generation, max_pcie_link_width, max_clocks,
        default_power_limit,
    },
    DeviceStatus {
        memory, utilization, temperature, power_usage, power_limit, enforced_power_limit, clocks,
        fan_speed, performance_state, persistence_mode, compute_mode, mig_mode, ecc_mode,
        display_mode, display_active, pcie_link_generation, pcie_link_width, processes,
    },
    MemoryStatus { total, reserved, free, used },
    Utilization { gpu, memory },
    ProcessStatus { pid, used_memory },
    NvmlQuery { function, device, peer, args, peer_uuid },
    NvmlAnswer { ret, bytes },
}

sample_enum!(NvmlArg { Value(value), Bytes(bytes), Null });

#[cfg(test)]
mod tests {
    use super::{forwarded, Param, FORWARDED};

    #[test]
    fn every_forwarded_function_parses() {
        let names: Vec<&str> = FORWARDED
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert!(names.len() > 100);
        for name in names {
            let params = forwarded(name).unwrap();
            // Devices come first; a pair query names two.
            let devices = params
                .iter()
                .take_while(|p| **p == Param::Device || **p == Param::Peer);
            assert_eq!(
                devices.count(),
                params
                    .iter()
                    .filter(|p| matches!(p, Param::Device | Param::Peer))
                    .count(),
                "{name}"
            );
        }
        assert_eq!(
            forwarded("nvmlDeviceGetClock"),
            Some(&[Param::Device, Param::U32, Param::U32, Param::Out(4)][..])
        );
        assert_eq!(forwarded("nvmlDeviceSetPowerManagementLimit"), None);
    }

    #[test]
    fn uuids_are_spelled_as_nvml_does() {
        let bytes = [
            0x2f, 0x1a, 0x3b, 0x4c, 0x5d, 0x6e, 0x7f, 0x80, 0x91, 0xa2, 0xb3, 0xc4, 0xd5, 0xe6,
            0xf7, 0x08,
        ];
        assert_eq!(
            super::uuid_string(&bytes),
            "GPU-2f1a3b4c-5d6e-7f80-91a2-b3c4d5e6f708"
        );
    }
}
