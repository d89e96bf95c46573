//! Every platform and device info parameter of OpenCL 1.0–3.0 and the common KHR/EXT/vendor
//! extensions, with its name and the kind of its value. The server's inventory queries each of
//! them (a device that does not know one answers CL_INVALID_VALUE and it is skipped); `rgpu
//! devices` prints them.
//!
//! Not listed: parameters whose value is a pointer into the implementation (e.g.
//! CL_DEVICE_SPIRV_EXTENSIONS_KHR, an array of `const char*`), which means nothing on another
//! machine, and values that change while the device is in use (free memory).

use crate::sys;

/// How to read a parameter's raw bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueKind {
    /// NUL-terminated `char[]`.
    String,
    U32,
    U64,
    Usize,
    /// `size_t[]`.
    UsizeArray,
    /// `cl_uint[]` (enumerations such as handle types).
    U32Array,
    /// A `cl_bitfield` (u64) of flags.
    Bitfield,
    /// `cl_bool`.
    Bool,
    /// A `cl_version` (major 10 bits, minor 10 bits, patch 12 bits).
    Version,
    /// `cl_name_version[]`.
    NameVersions,
    /// A zero-terminated `intptr_t[]` property list.
    Properties,
    /// A handle (cl_platform_id, cl_device_id): meaningful only in the answering process.
    Handle,
    /// `cl_device_id[]`.
    HandleArray,
    /// Opaque bytes or a fixed-size struct (UUID, PCI bus info).
    Bytes,
}

/// (parameter, its name, its value kind)
pub type ParamInfo = (u32, &'static str, ValueKind);

/// Builds a table entry from the opencl-sys constant's name, so each name is written once.
macro_rules! params {
    ($($name:ident => $kind:ident),* $(,)?) => {
        &[$((sys::$name as u32, stringify!($name), ValueKind::$kind)),*]
    };
}

pub const PLATFORM_INFO_PARAMS: &[ParamInfo] = params![
    CL_PLATFORM_PROFILE => String,
    CL_PLATFORM_VERSION => String,
    CL_PLATFORM_NAME => String,
    CL_PLATFORM_VENDOR => String,
    CL_PLATFORM_EXTENSIONS => String,
    CL_PLATFORM_HOST_TIMER_RESOLUTION => U64,
    CL_PLATFORM_NUMERIC_VERSION => Version,
    CL_PLATFORM_EXTENSIONS_WITH_VERSION => NameVersions,
    CL_PLATFORM_ICD_SUFFIX_KHR => String,
    CL_PLATFORM_UNLOADABLE_KHR => Bool,
    CL_PLATFORM_COMMAND_BUFFER_CAPABILITIES_KHR => Bitfield,
    CL_PLATFORM_EXTERNAL_MEMORY_IMPORT_HANDLE_TYPES_KHR => U32Array,
    CL_PLATFORM_SEMAPHORE_TYPES_KHR => U32Array,
    CL_PLATFORM_SEMAPHORE_IMPORT_HANDLE_TYPES_KHR => U32Array,
    CL_PLATFORM_SEMAPHORE_EXPORT_HANDLE_TYPES_KHR => U32Array,
];

pub const DEVICE_INFO_PARAMS: &[ParamInfo] = params![
    // OpenCL 1.0
    CL_DEVICE_TYPE => Bitfield,
    CL_DEVICE_VENDOR_ID => U32,
    CL_DEVICE_MAX_COMPUTE_UNITS => U32,
    CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS => U32,
    CL_DEVICE_MAX_WORK_GROUP_SIZE => Usize,
    CL_DEVICE_MAX_WORK_ITEM_SIZES => UsizeArray,
    CL_DEVICE_PREFERRED_VECTOR_WIDTH_CHAR => U32,
    CL_DEVICE_PREFERRED_VECTOR_WIDTH_SHORT => U32,
    CL_DEVICE_PREFERRED_VECTOR_WIDTH_INT => U32,
    CL_DEVICE_PREFERRED_VECTOR_WIDTH_LONG => U32,
    CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT => U32,
    CL_DEVICE_PREFERRED_VECTOR_WIDTH_DOUBLE => U32,
    CL_DEVICE_MAX_CLOCK_FREQUENCY => U32,
    CL_DEVICE_ADDRESS_BITS => U32,
    CL_DEVICE_MAX_READ_IMAGE_ARGS => U32,
    CL_DEVICE_MAX_WRITE_IMAGE_ARGS => U32,
    CL_DEVICE_MAX_MEM_ALLOC_SIZE => U64,
    CL_DEVICE_IMAGE2D_MAX_WIDTH => Usize,
    CL_DEVICE_IMAGE2D_MAX_HEIGHT => Usize,
    CL_DEVICE_IMAGE3D_MAX_WIDTH => Usize,
    CL_DEVICE_IMAGE3D_MAX_HEIGHT => Usize,
    CL_DEVICE_IMAGE3D_MAX_DEPTH => Usize,
    CL_DEVICE_IMAGE_SUPPORT => Bool,
    CL_DEVICE_MAX_PARAMETER_SIZE => Usize,
    CL_DEVICE_MAX_SAMPLERS => U32,
    CL_DEVICE_MEM_BASE_ADDR_ALIGN => U32,
    CL_DEVICE_MIN_DATA_TYPE_ALIGN_SIZE => U32,
    CL_DEVICE_SINGLE_FP_CONFIG => Bitfield,
    CL_DEVICE_GLOBAL_MEM_CACHE_TYPE => U32,
    CL_DEVICE_GLOBAL_MEM_CACHELINE_SIZE => U32,
    CL_DEVICE_GLOBAL_MEM_CACHE_SIZE => U64,
    CL_DEVICE_GLOBAL_MEM_SIZE => U64,
    CL_DEVICE_MAX_CONSTANT_BUFFER_SIZE => U64,
    CL_DEVICE_MAX_CONSTANT_ARGS => U32,
    CL_DEVICE_LOCAL_MEM_TYPE => U32,
    CL_DEVICE_LOCAL_MEM_SIZE => U64,
    CL_DEVICE_ERROR_CORRECTION_SUPPORT => Bool,
    CL_DEVICE_PROFILING_TIMER_RESOLUTION => Usize,
    CL_DEVICE_ENDIAN_LITTLE => Bool,
    CL_DEVICE_AVAILABLE => Bool,
    CL_DEVICE_COMPILER_AVAILABLE => Bool,
    CL_DEVICE_EXECUTION_CAPABILITIES => Bitfield,
    // CL_DEVICE_QUEUE_PROPERTIES in OpenCL 1.x; the same parameter.
    CL_DEVICE_QUEUE_ON_HOST_PROPERTIES => Bitfield,
    CL_DEVICE_NAME => String,
    CL_DEVICE_VENDOR => String,
    CL_DRIVER_VERSION => String,
    CL_DEVICE_PROFILE => String,
    CL_DEVICE_VERSION => String,
    CL_DEVICE_EXTENSIONS => String,
    CL_DEVICE_PLATFORM => Handle,
    // OpenCL 1.1 (and cl_khr_fp64 / cl_khr_fp16 in 1.0)
    CL_DEVICE_DOUBLE_FP_CONFIG => Bitfield,
    CL_DEVICE_HALF_FP_CONFIG => Bitfield,
    CL_DEVICE_PREFERRED_VECTOR_WIDTH_HALF => U32,
    CL_DEVICE_HOST_UNIFIED_MEMORY => Bool,
    CL_DEVICE_NATIVE_VECTOR_WIDTH_CHAR => U32,
    CL_DEVICE_NATIVE_VECTOR_WIDTH_SHORT => U32,
    CL_DEVICE_NATIVE_VECTOR_WIDTH_INT => U32,
    CL_DEVICE_NATIVE_VECTOR_WIDTH_LONG => U32,
    CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT => U32,
    CL_DEVICE_NATIVE_VECTOR_WIDTH_DOUBLE => U32,
    CL_DEVICE_NATIVE_VECTOR_WIDTH_HALF => U32,
    CL_DEVICE_OPENCL_C_VERSION => String,
    // OpenCL 1.2
    CL_DEVICE_LINKER_AVAILABLE => Bool,
    CL_DEVICE_BUILT_IN_KERNELS => String,
    CL_DEVICE_IMAGE_MAX_BUFFER_SIZE => Usize,
    CL_DEVICE_IMAGE_MAX_ARRAY_SIZE => Usize,
    CL_DEVICE_PARENT_DEVICE => Handle,
    CL_DEVICE_PARTITION_MAX_SUB_DEVICES => U32,
    CL_DEVICE_PARTITION_PROPERTIES => Properties,
    CL_DEVICE_PARTITION_AFFINITY_DOMAIN => Bitfield,
    CL_DEVICE_PARTITION_TYPE => Properties,
    CL_DEVICE_REFERENCE_COUNT => U32,
    CL_DEVICE_PREFERRED_INTEROP_USER_SYNC => Bool,
    CL_DEVICE_PRINTF_BUFFER_SIZE => Usize,
    // OpenCL 2.0
    CL_DEVICE_IMAGE_PITCH_ALIGNMENT => U32,
    CL_DEVICE_IMAGE_BASE_ADDRESS_ALIGNMENT => U32,
    CL_DEVICE_MAX_READ_WRITE_IMAGE_ARGS => U32,
    CL_DEVICE_MAX_GLOBAL_VARIABLE_SIZE => Usize,
    CL_DEVICE_QUEUE_ON_DEVICE_PROPERTIES => Bitfield,
    CL_DEVICE_QUEUE_ON_DEVICE_PREFERRED_SIZE => U32,
    CL_DEVICE_QUEUE_ON_DEVICE_MAX_SIZE => U32,
    CL_DEVICE_MAX_ON_DEVICE_QUEUES => U32,
    CL_DEVICE_MAX_ON_DEVICE_EVENTS => U32,
    CL_DEVICE_SVM_CAPABILITIES => Bitfield,
    CL_DEVICE_GLOBAL_VARIABLE_PREFERRED_TOTAL_SIZE => Usize,
    CL_DEVICE_MAX_PIPE_ARGS => U32,
    CL_DEVICE_PIPE_MAX_ACTIVE_RESERVATIONS => U32,
    CL_DEVICE_PIPE_MAX_PACKET_SIZE => U32,
    CL_DEVICE_PREFERRED_PLATFORM_ATOMIC_ALIGNMENT => U32,
    CL_DEVICE_PREFERRED_GLOBAL_ATOMIC_ALIGNMENT => U32,
    CL_DEVICE_PREFERRED_LOCAL_ATOMIC_ALIGNMENT => U32,
    // OpenCL 2.1
    CL_DEVICE_IL_VERSION => String,
    CL_DEVICE_MAX_NUM_SUB_GROUPS => U32,
    CL_DEVICE_SUB_GROUP_INDEPENDENT_FORWARD_PROGRESS => Bool,
    // OpenCL 3.0
    CL_DEVICE_NUMERIC_VERSION => Version,
    CL_DEVICE_EXTENSIONS_WITH_VERSION => NameVersions,
    CL_DEVICE_ILS_WITH_VERSION => NameVersions,
    CL_DEVICE_BUILT_IN_KERNELS_WITH_VERSION => NameVersions,
    CL_DEVICE_ATOMIC_MEMORY_CAPABILITIES => Bitfield,
    CL_DEVICE_ATOMIC_FENCE_CAPABILITIES => Bitfield,
    CL_DEVICE_NON_UNIFORM_WORK_GROUP_SUPPORT => Bool,
    CL_DEVICE_OPENCL_C_ALL_VERSIONS => NameVersions,
    CL_DEVICE_PREFERRED_WORK_GROUP_SIZE_MULTIPLE => Usize,
    CL_DEVICE_WORK_GROUP_COLLECTIVE_FUNCTIONS_SUPPORT => Bool,
    CL_DEVICE_GENERIC_ADDRESS_SPACE_SUPPORT => Bool,
    CL_DEVICE_OPENCL_C_FEATURES => NameVersions,
    CL_DEVICE_DEVICE_ENQUEUE_CAPABILITIES => Bitfield,
    CL_DEVICE_PIPE_SUPPORT => Bool,
    CL_DEVICE_LATEST_CONFORMANCE_VERSION_PASSED => String,
    // cl_khr_extended_versioning
    CL_DEVICE_OPENCL_C_NUMERIC_VERSION_KHR => Version,
    // cl_khr_device_uuid
    CL_DEVICE_UUID => Bytes,
    CL_DRIVER_UUID_KHR => Bytes,
    CL_DEVICE_LUID_VALID => Bool,
    CL_DEVICE_LUID => Bytes,
    CL_DEVICE_NODE_MASK => U32,
    // cl_khr_pci_bus_info
    CL_DEVICE_PCI_BUS_INFO_KHR => Bytes,
    // cl_khr_integer_dot_product
    CL_DEVICE_INTEGER_DOT_PRODUCT_CAPABILITIES => Bitfield,
    CL_DEVICE_INTEGER_DOT_PRODUCT_ACCELERATION_PROPERTIES_8BIT => Bytes,
    CL_DEVICE_INTEGER_DOT_PRODUCT_ACCELERATION_PROPERTIES_4x8BIT_PACKED => Bytes,
    // cl_khr_kernel_clock, cl_khr_terminate_context, cl_khr_subgroup_named_barrier
    CL_DEVICE_KERNEL_CLOCK_CAPABILITIES_KHR => Bitfield,
    CL_DEVICE_TERMINATE_CAPABILITY_KHR => Bitfield,
    CL_DEVICE_MAX_NAMED_BARRIER_COUNT_KHR => U32,
    // cl_khr_spir, cl_ext_cxx_for_opencl
    CL_DEVICE_SPIR_VERSIONS => String,
    CL_DEVICE_CXX_FOR_OPENCL_NUMERIC_VERSION_EXT => Version,
    // cl_khr_command_buffer
    CL_DEVICE_COMMAND_BUFFER_CAPABILITIES_KHR => Bitfield,
    CL_DEVICE_COMMAND_BUFFER_SUPPORTED_QUEUE_PROPERTIES_KHR => Bitfield,
    CL_DEVICE_COMMAND_BUFFER_REQUIRED_QUEUE_PROPERTIES_KHR => Bitfield,
    // cl_khr_external_memory, cl_khr_external_semaphore, cl_khr_semaphore
    CL_DEVICE_EXTERNAL_MEMORY_IMPORT_HANDLE_TYPES_KHR => U32Array,
    CL_DEVICE_SEMAPHORE_TYPES_KHR => U32Array,
    CL_DEVICE_SEMAPHORE_IMPORT_HANDLE_TYPES_KHR => U32Array,
    CL_DEVICE_SEMAPHORE_EXPORT_HANDLE_TYPES_KHR => U32Array,
    // cl_ext_device_fission
    CL_DEVICE_PARENT_DEVICE_EXT => Handle,
    CL_DEVICE_PARTITION_TYPES_EXT => Properties,
    CL_DEVICE_AFFINITY_DOMAINS_EXT => Properties,
    CL_DEVICE_PARTITION_STYLE_EXT => Properties,
    // cl_nv_device_attribute_query
    CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV => U32,
    CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV => U32,
    CL_DEVICE_REGISTERS_PER_BLOCK_NV => U32,
    CL_DEVICE_WARP_SIZE_NV => U32,
    CL_DEVICE_GPU_OVERLAP_NV => Bool,
    CL_DEVICE_KERNEL_EXEC_TIMEOUT_NV => Bool,
    CL_DEVICE_INTEGRATED_MEMORY_NV => Bool,
    CL_DEVICE_PCI_BUS_ID_NV => U32,
    CL_DEVICE_PCI_SLOT_ID_NV => U32,
    // cl_amd_device_attribute_query
    CL_DEVICE_BOARD_NAME_AMD => String,
    CL_DEVICE_TOPOLOGY_AMD => Bytes,
    CL_DEVICE_SIMD_PER_COMPUTE_UNIT_AMD => U32,
    CL_DEVICE_SIMD_WIDTH_AMD => U32,
    CL_DEVICE_SIMD_INSTRUCTION_WIDTH_AMD => U32,
    CL_DEVICE_WAVEFRONT_WIDTH_AMD => U32,
    CL_DEVICE_GLOBAL_MEM_CHANNELS_AMD => U32,
    CL_DEVICE_GLOBAL_MEM_CHANNEL_BANKS_AMD => U32,
    CL_DEVICE_GLOBAL_MEM_CHANNEL_BANK_WIDTH_AMD => U32,
    CL_DEVICE_LOCAL_MEM_SIZE_PER_COMPUTE_UNIT_AMD => U32,
    CL_DEVICE_LOCAL_MEM_BANKS_AMD => U32,
    CL_DEVICE_GFXIP_MAJOR_AMD => U32,
    CL_DEVICE_GFXIP_MINOR_AMD => U32,
    CL_DEVICE_PCIE_ID_AMD => U32,
    // cl_intel_device_attribute_query, cl_intel_required_subgroup_size,
    // cl_intel_unified_shared_memory
    CL_DEVICE_IP_VERSION_INTEL => U32,
    CL_DEVICE_ID_INTEL => U32,
    CL_DEVICE_NUM_SLICES_INTEL => U32,
    CL_DEVICE_NUM_SUB_SLICES_PER_SLICE_INTEL => U32,
    CL_DEVICE_NUM_EUS_PER_SUB_SLICE_INTEL => U32,
    CL_DEVICE_NUM_THREADS_PER_EU_INTEL => U32,
    CL_DEVICE_FEATURE_CAPABILITIES_INTEL => Bitfield,
    CL_DEVICE_SUB_GROUP_SIZES_INTEL => UsizeArray,
    CL_DEVICE_HOST_MEM_CAPABILITIES_INTEL => Bitfield,
    CL_DEVICE_DEVICE_MEM_CAPABILITIES_INTEL => Bitfield,
    CL_DEVICE_SINGLE_DEVICE_SHARED_MEM_CAPABILITIES_INTEL => Bitfield,
    CL_DEVICE_CROSS_DEVICE_SHARED_MEM_CAPABILITIES_INTEL => Bitfield,
    CL_DEVICE_SHARED_SYSTEM_MEM_CAPABILITIES_INTEL => Bitfield,
];

/// The entry for a device parameter, if listed.
pub fn device_param(param: u32) -> Option<&'static ParamInfo> {
    DEVICE_INFO_PARAMS.iter().find(|(p, _, _)| *p == param)
}

/// The entry for a platform parameter, if listed.
pub fn platform_param(param: u32) -> Option<&'static ParamInfo> {
    PLATFORM_INFO_PARAMS.iter().find(|(p, _, _)| *p == param)
}

/// A `char[]` value as text, without its NUL terminator.
pub fn decode_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// A little-endian unsigned integer of 1 to 8 bytes (cl_uint, cl_ulong, size_t, cl_bool).
pub fn decode_unsigned(bytes: &[u8]) -> u64 {
    let mut raw = [0u8; 8];
    let len = bytes.len().min(8);
    raw[..len].copy_from_slice(&bytes[..len]);
    u64::from_le_bytes(raw)
}

/// Splits a `cl_version` into (major, minor, patch).
pub fn decode_version(version: u32) -> (u32, u32, u32) {
    (version >> 22, (version >> 12) & 0x3ff, version & 0xfff)
}

/// A value as people read it (clinfo style).
pub fn format_value(kind: ValueKind, bytes: &[u8]) -> String {
    let words = |width: usize| -> Vec<u64> { bytes.chunks(width).map(decode_unsigned).collect() };
    let list = |items: Vec<String>| format!("[{}]", items.join(", "));
    let usize_width = std::mem::size_of::<usize>();
    match kind {
        ValueKind::String => decode_string(bytes),
        ValueKind::U32 | ValueKind::U64 | ValueKind::Usize => decode_unsigned(bytes).to_string(),
        ValueKind::Bool => (decode_unsigned(bytes) != 0).to_string(),
        ValueKind::Bitfield | ValueKind::Handle => format!("{:#x}", decode_unsigned(bytes)),
        ValueKind::Version => {
            let (major, minor, patch) = decode_version(decode_unsigned(bytes) as u32);
            format!("{major}.{minor}.{patch}")
        }
        ValueKind::UsizeArray => list(words(usize_width).iter().map(u64::to_string).collect()),
        ValueKind::U32Array => list(words(4).iter().map(u64::to_string).collect()),
        ValueKind::HandleArray | ValueKind::Properties => list(
            words(usize_width)
                .iter()
                .map(|w| format!("{w:#x}"))
                .collect(),
        ),
        ValueKind::NameVersions => {
            let entry = std::mem::size_of::<sys::cl_name_version>();
            list(
                bytes
                    .chunks_exact(entry)
                    .map(|item| {
                        let (major, minor, patch) =
                            decode_version(decode_unsigned(&item[..4]) as u32);
                        format!("{} {major}.{minor}.{patch}", decode_string(&item[4..]))
                    })
                    .collect(),
            )
        }
        ValueKind::Bytes => hex::encode(bytes),
    }
}

/// The names of the device types set in a CL_DEVICE_TYPE value ("GPU", "CPU | DEFAULT").
pub fn device_type_names(device_type: u64) -> String {
    let names = [
        (sys::CL_DEVICE_TYPE_DEFAULT, "DEFAULT"),
        (sys::CL_DEVICE_TYPE_CPU, "CPU"),
        (sys::CL_DEVICE_TYPE_GPU, "GPU"),
        (sys::CL_DEVICE_TYPE_ACCELERATOR, "ACCELERATOR"),
        (sys::CL_DEVICE_TYPE_CUSTOM, "CUSTOM"),
    ];
    let set: Vec<&str> = names
        .iter()
        .filter(|(bit, _)| device_type & bit != 0)
        .map(|(_, name)| *name)
        .collect();
    if set.is_empty() {
        format!("{device_type:#x}")
    } else {
        set.join(" | ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn tables_have_no_duplicates_and_cover_the_core() {
        for table in [PLATFORM_INFO_PARAMS, DEVICE_INFO_PARAMS] {
            let params: HashSet<u32> = table.iter().map(|(p, _, _)| *p).collect();
            assert_eq!(params.len(), table.len(), "a parameter is listed twice");
        }
        // Every core device parameter 0x1000..=0x1072 is listed.
        for param in 0x1000..=0x1072u32 {
            assert!(
                device_param(param).is_some(),
                "device param {param:#x} missing"
            );
        }
        for param in 0x0900..=0x0907u32 {
            assert!(
                platform_param(param).is_some(),
                "platform param {param:#x} missing"
            );
        }
        let uuid = device_param(sys::CL_DEVICE_UUID).unwrap();
        assert_eq!((uuid.1, uuid.2), ("CL_DEVICE_UUID", ValueKind::Bytes));
    }

    #[test]
    fn formats_values() {
        assert_eq!(format_value(ValueKind::String, b"pthread\0"), "pthread");
        assert_eq!(format_value(ValueKind::U32, &7u32.to_le_bytes()), "7");
        assert_eq!(format_value(ValueKind::Bool, &1u32.to_le_bytes()), "true");
        let version = (3u32 << 22) | (1 << 12) | 2;
        assert_eq!(
            format_value(ValueKind::Version, &version.to_le_bytes()),
            "3.1.2"
        );
        let sizes: Vec<u8> = [4096usize, 4096, 64]
            .iter()
            .flat_map(|s| s.to_le_bytes())
            .collect();
        assert_eq!(
            format_value(ValueKind::UsizeArray, &sizes),
            "[4096, 4096, 64]"
        );
        let mut name_version = vec![0u8; 68];
        name_version[..4].copy_from_slice(&((1u32 << 22) | (2 << 12)).to_le_bytes());
        name_version[4..11].copy_from_slice(b"cl_khr_");
        assert_eq!(
            format_value(ValueKind::NameVersions, &name_version),
            "[cl_khr_ 1.2.0]"
        );
        assert_eq!(format_value(ValueKind::Bytes, &[0xab, 0x01]), "ab01");
        assert_eq!(device_type_names(sys::CL_DEVICE_TYPE_GPU), "GPU");
    }
}
