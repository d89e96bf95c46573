//! NCCL's C types (nccl.h), for rgpu's drop-in `libnccl.so.2`, the table it calls rgpu's
//! CUDA library through ([`crate::nccl_table`]), and the server, which loads the machine's
//! NCCL. Enumerations are `int`s, as C passes them (a program may pass values an enum lacks).

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use rgpu_protocol::cuda::NcclConfig;

pub type ncclResult_t = c_int;
pub type ncclComm_t = *mut c_void;
pub type ncclDataType_t = c_int;
pub type ncclRedOp_t = c_int;
pub type ncclScalarResidence_t = c_int;
/// Read through [`read_config`] only: its layout grows with NCCL's versions.
pub type ncclConfig_t = c_void;

pub const NCCL_SUCCESS: ncclResult_t = 0;
pub const NCCL_UNHANDLED_CUDA_ERROR: ncclResult_t = 1;
pub const NCCL_SYSTEM_ERROR: ncclResult_t = 2;
pub const NCCL_INTERNAL_ERROR: ncclResult_t = 3;
pub const NCCL_INVALID_ARGUMENT: ncclResult_t = 4;
pub const NCCL_INVALID_USAGE: ncclResult_t = 5;
pub const NCCL_REMOTE_ERROR: ncclResult_t = 6;
pub const NCCL_IN_PROGRESS: ncclResult_t = 7;

/// `ncclNumTypes` (`ncclInt8` … `ncclFloat8e5m2`) and `ncclNumOps` (`ncclSum` … `ncclAvg`): the
/// built-in data types and reductions; user reductions
/// (`ncclRedOpCreatePreMulSum`) take numbers from `ncclNumOps` on.
pub const NCCL_NUM_TYPES: c_int = 12;
pub const NCCL_NUM_OPS: c_int = 5;
/// `ncclScalarDevice` and `ncclScalarHostImmediate`.
pub const NCCL_SCALAR_DEVICE: c_int = 0;
pub const NCCL_SCALAR_HOST_IMMEDIATE: c_int = 1;
/// `NCCL_SPLIT_NOCOLOR`.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;

/// Bytes of one element of each built-in data type, by `ncclDataType_t`.
pub const DATA_TYPE_BYTES: [usize; NCCL_NUM_TYPES as usize] = [1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1];

pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: passed by value, 128 bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

impl ncclUniqueId {
    pub fn bytes(&self) -> Vec<u8> {
        self.internal.iter().map(|&c| c as u8).collect()
    }

    /// The id of `bytes` (None unless exactly 128).
    pub fn from_bytes(bytes: &[u8]) -> Option<ncclUniqueId> {
        let mut id = ncclUniqueId {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        };
        if bytes.len() != NCCL_UNIQUE_ID_BYTES {
            return None;
        }
        for (to, &from) in id.internal.iter_mut().zip(bytes) {
            *to = from as c_char;
        }
        Some(id)
    }
}

/// `NCCL_API_MAGIC`, which an initialized `ncclConfig_t` holds.
pub const NCCL_CONFIG_MAGIC: c_uint = 0xcafe_beef;
/// `NCCL_CONFIG_UNDEF_INT`: a field the program left to NCCL.
pub const NCCL_CONFIG_UNDEF_INT: c_int = i32::MIN;

/// The layout of `ncclConfig_t` as NCCL 2.30 has it; older programs' structs are prefixes of
/// it (their `size` says how long), and NCCL reads a longer one only as far as it knows.
#[repr(C)]
pub struct ConfigLayout {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cga_cluster_size: c_int,
    pub min_ctas: c_int,
    pub max_ctas: c_int,
    pub net_name: *const c_char,
    pub split_share: c_int,
    pub traffic_class: c_int,
    pub comm_name: *const c_char,
    /// `collnetEnable`, `CTAPolicy`, `shrinkShare`, `nvlsCTAs`, `nChannelsPerNetPeer`,
    /// `nvlinkCentricSched`, `graphUsageMode`, `numRmaCtx`, `maxP2pPeers`,
    /// `graphStreamOrdering`.
    pub rest: [c_int; 10],
}

impl ConfigLayout {
    /// `NCCL_CONFIG_INITIALIZER` for a program of NCCL `version`.
    pub fn new(version: c_uint) -> ConfigLayout {
        ConfigLayout {
            size: std::mem::size_of::<ConfigLayout>(),
            magic: NCCL_CONFIG_MAGIC,
            version,
            blocking: NCCL_CONFIG_UNDEF_INT,
            cga_cluster_size: NCCL_CONFIG_UNDEF_INT,
            min_ctas: NCCL_CONFIG_UNDEF_INT,
            max_ctas: NCCL_CONFIG_UNDEF_INT,
            net_name: std::ptr::null(),
            split_share: NCCL_CONFIG_UNDEF_INT,
            traffic_class: NCCL_CONFIG_UNDEF_INT,
            comm_name: std::ptr::null(),
            rest: [NCCL_CONFIG_UNDEF_INT; 10],
        }
    }

    /// The integer fields in the header's order (the wire form's `ints`).
    fn ints(&self) -> Vec<c_int> {
        let mut ints = vec![
            self.blocking,
            self.cga_cluster_size,
            self.min_ctas,
            self.max_ctas,
            self.split_share,
            self.traffic_class,
        ];
        ints.extend(self.rest);
        ints
    }

    /// The layout of a wire form; its strings point into `strings`, which must outlive it.
    pub fn from_wire(config: &NcclConfig, strings: &mut Vec<std::ffi::CString>) -> ConfigLayout {
        let mut raw = ConfigLayout::new(config.version);
        let mut ints = config.ints.iter().copied();
        let mut next = |field: &mut c_int| {
            if let Some(value) = ints.next() {
                *field = value;
            }
        };
        next(&mut raw.blocking);
        next(&mut raw.cga_cluster_size);
        next(&mut raw.min_ctas);
        next(&mut raw.max_ctas);
        next(&mut raw.split_share);
        next(&mut raw.traffic_class);
        for field in raw.rest.iter_mut() {
            next(field);
        }
        let mut text = |value: &Option<String>| match value
            .as_deref()
            .and_then(|s| std::ffi::CString::new(s).ok())
        {
            Some(s) => {
                strings.push(s);
                strings.last().map_or(std::ptr::null(), |s| s.as_ptr())
            }
            None => std::ptr::null(),
        };
        raw.net_name = text(&config.net_name);
        raw.comm_name = text(&config.comm_name);
        raw
    }
}

/// The wire form of a program's `ncclConfig_t` (None: null). `Err`: not initialized with
/// `NCCL_CONFIG_INITIALIZER` (NCCL answers ncclInvalidArgument).
///
/// # Safety
/// `config` is null or points to a config of at least its own `size` bytes (at least the
/// header), its strings null or NUL-terminated.
pub unsafe fn read_config(config: *const ncclConfig_t) -> Result<Option<NcclConfig>, ncclResult_t> {
    if config.is_null() {
        return Ok(None);
    }
    let header = config.cast::<usize>();
    // SAFETY: the caller's guarantee: the struct starts with its size, magic and version.
    let (size, magic) = unsafe {
        (
            header.read_unaligned(),
            config.cast::<u8>().add(8).cast::<c_uint>().read_unaligned(),
        )
    };
    if magic != NCCL_CONFIG_MAGIC || size < 16 {
        return Err(NCCL_INVALID_ARGUMENT);
    }
    let mut raw = ConfigLayout::new(0);
    let len = size.min(std::mem::size_of::<ConfigLayout>());
    // SAFETY: `len` bytes of the program's struct into a local of at least that size.
    unsafe {
        std::ptr::copy_nonoverlapping(
            config.cast::<u8>(),
            std::ptr::addr_of_mut!(raw).cast::<u8>(),
            len,
        )
    };
    let text = |p: *const c_char, offset: usize| {
        (offset + 8 <= len && !p.is_null()).then(|| {
            // SAFETY: a field the program's struct holds (`offset` within its size), not
            // null: a NUL-terminated string (the caller's guarantee).
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned()
        })
    };
    let net_name = text(raw.net_name, std::mem::offset_of!(ConfigLayout, net_name));
    let comm_name = text(raw.comm_name, std::mem::offset_of!(ConfigLayout, comm_name));
    // Only the integers the program's struct holds: the rest stay NCCL's defaults.
    let held = |offset: usize| offset + 4 <= len;
    let offsets = [
        std::mem::offset_of!(ConfigLayout, blocking),
        std::mem::offset_of!(ConfigLayout, cga_cluster_size),
        std::mem::offset_of!(ConfigLayout, min_ctas),
        std::mem::offset_of!(ConfigLayout, max_ctas),
        std::mem::offset_of!(ConfigLayout, split_share),
        std::mem::offset_of!(ConfigLayout, traffic_class),
    ]
    .into_iter()
    .chain((0..10).map(|i| std::mem::offset_of!(ConfigLayout, rest) + 4 * i));
    let ints = raw
        .ints()
        .into_iter()
        .zip(offsets)
        .map(|(value, offset)| {
            if held(offset) {
                value
            } else {
                NCCL_CONFIG_UNDEF_INT
            }
        })
        .collect();
    Ok(Some(NcclConfig {
        version: raw.version,
        ints,
        net_name,
        comm_name,
    }))
}

/// `ncclGetErrorString`'s texts, as NCCL words them.
pub fn error_string(result: ncclResult_t) -> &'static std::ffi::CStr {
    match result {
        NCCL_SUCCESS => c"no error",
        NCCL_UNHANDLED_CUDA_ERROR => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        NCCL_SYSTEM_ERROR => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        NCCL_INTERNAL_ERROR => c"internal error - please report this issue to the NCCL developers",
        NCCL_INVALID_ARGUMENT => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        NCCL_INVALID_USAGE => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        NCCL_REMOTE_ERROR => c"remote process exited or there was a network error",
        NCCL_IN_PROGRESS => c"NCCL operation in progress",
        _ => c"unknown result code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire form of a local config.
    fn read(raw: &ConfigLayout) -> Result<Option<NcclConfig>, ncclResult_t> {
        // SAFETY: a local config, at least as long as its size says.
        unsafe { read_config(std::ptr::addr_of!(*raw).cast()) }
    }

    #[test]
    fn a_config_reads_as_far_as_the_programs_struct_goes() {
        let mut raw = ConfigLayout::new(22_800);
        raw.blocking = 0;
        raw.max_ctas = 16;
        raw.rest[0] = 1;
        let name = c"ring";
        raw.net_name = name.as_ptr();
        let full = read(&raw).unwrap().unwrap();
        assert_eq!(full.version, 22_800);
        let undef = NCCL_CONFIG_UNDEF_INT;
        assert_eq!(&full.ints[..4], &[0, undef, undef, 16]);
        assert_eq!(full.ints[6], 1);
        assert_eq!(full.net_name.as_deref(), Some("ring"));
        // An older program's struct ends before `collnetEnable`: that field stays unset.
        raw.size = std::mem::offset_of!(ConfigLayout, rest);
        let older = read(&raw).unwrap().unwrap();
        assert_eq!(older.ints[6], undef);
        assert_eq!(older.ints[3], 16);
        // Back to the layout, which the server hands its NCCL.
        let mut strings = Vec::new();
        let again = ConfigLayout::from_wire(&full, &mut strings);
        assert_eq!((again.blocking, again.max_ctas, again.rest[0]), (0, 16, 1));
        // SAFETY: the string lives in `strings`.
        assert_eq!(unsafe { std::ffi::CStr::from_ptr(again.net_name) }, name);
        // Not made by NCCL_CONFIG_INITIALIZER.
        raw.magic = 0;
        assert_eq!(read(&raw).err(), Some(NCCL_INVALID_ARGUMENT));
        // SAFETY: null is allowed.
        assert!(unsafe { read_config(std::ptr::null()) }.unwrap().is_none());
    }
}
