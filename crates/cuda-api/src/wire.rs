//! Driver structs to and from their wire forms (`rgpu_protocol::cuda`), the same at both ends:
//! the client reads the program's structs into wire forms and writes the server's answers back
//! into the program's structs; the server does the opposite with its driver. Enum fields are
//! read and written as the integers they hold (a program or a newer driver may use values the
//! Rust enums lack, and an invalid enum value is undefined behavior), through raw pointers at
//! their offsets. Device ordinals pass unchanged: translating them between the program's
//! numbering and a server's is the client's business.

use rgpu_protocol::cuda::{Extent, MemAccess, MemProp, NodeParams, Pitch, PoolProps};

use crate::sys::*;

// `allocation_prop` and `mem_prop` move the allocation flags as 8 bytes.
const _: () = assert!(std::mem::size_of::<CUmemAllocationProp_st__bindgen_ty_1>() == 8);

/// `CUmemAllocationProp` from its wire form.
pub fn allocation_prop(prop: &MemProp) -> CUmemAllocationProp {
    // SAFETY: plain data for which all-zero bytes are valid; each field is written as an
    // integer of its width at its offset.
    unsafe {
        let mut raw: CUmemAllocationProp = std::mem::zeroed();
        let base = std::ptr::addr_of_mut!(raw);
        std::ptr::addr_of_mut!((*base).type_)
            .cast::<u32>()
            .write(prop.kind);
        std::ptr::addr_of_mut!((*base).requestedHandleTypes)
            .cast::<u32>()
            .write(prop.handle_types);
        std::ptr::addr_of_mut!((*base).location.type_)
            .cast::<u32>()
            .write(prop.location_type);
        (*base).location.id = prop.location_id;
        std::ptr::addr_of_mut!((*base).allocFlags)
            .cast::<[u8; 8]>()
            .write_unaligned(prop.alloc_flags);
        raw
    }
}

/// The wire form of a `CUmemAllocationProp`.
pub fn mem_prop(raw: &CUmemAllocationProp) -> MemProp {
    let base = std::ptr::addr_of!(*raw);
    // SAFETY: fields of a valid struct, each read as an integer of its width.
    unsafe {
        MemProp {
            kind: std::ptr::addr_of!((*base).type_).cast::<u32>().read(),
            handle_types: std::ptr::addr_of!((*base).requestedHandleTypes)
                .cast::<u32>()
                .read(),
            location_type: std::ptr::addr_of!((*base).location.type_)
                .cast::<u32>()
                .read(),
            location_id: (*base).location.id,
            alloc_flags: std::ptr::addr_of!((*base).allocFlags)
                .cast::<[u8; 8]>()
                .read_unaligned(),
        }
    }
}

/// `CUmemAccessDesc` from its wire form.
pub fn access_desc(access: &MemAccess) -> CUmemAccessDesc {
    // SAFETY: as in `allocation_prop`.
    unsafe {
        let mut raw: CUmemAccessDesc = std::mem::zeroed();
        let base = std::ptr::addr_of_mut!(raw);
        std::ptr::addr_of_mut!((*base).location.type_)
            .cast::<u32>()
            .write(access.location_type);
        (*base).location.id = access.location_id;
        std::ptr::addr_of_mut!((*base).flags)
            .cast::<u32>()
            .write(access.flags);
        raw
    }
}

/// The wire form of a `CUmemAccessDesc`.
pub fn mem_access(raw: &CUmemAccessDesc) -> MemAccess {
    let base = std::ptr::addr_of!(*raw);
    // SAFETY: as in `mem_prop`.
    unsafe {
        MemAccess {
            location_type: std::ptr::addr_of!((*base).location.type_)
                .cast::<u32>()
                .read(),
            location_id: (*base).location.id,
            flags: std::ptr::addr_of!((*base).flags).cast::<u32>().read(),
        }
    }
}

/// `CUmemPoolProps` from its wire form.
pub fn pool_props(props: &PoolProps) -> CUmemPoolProps {
    // SAFETY: as in `allocation_prop`.
    unsafe {
        let mut raw: CUmemPoolProps = std::mem::zeroed();
        let base = std::ptr::addr_of_mut!(raw);
        std::ptr::addr_of_mut!((*base).allocType)
            .cast::<u32>()
            .write(props.alloc_type);
        std::ptr::addr_of_mut!((*base).handleTypes)
            .cast::<u32>()
            .write(props.handle_types);
        std::ptr::addr_of_mut!((*base).location.type_)
            .cast::<u32>()
            .write(props.location_type);
        (*base).location.id = props.location_id;
        (*base).maxSize = props.max_size as usize;
        (*base).usage = props.usage;
        raw
    }
}

/// The wire form of a `CUmemPoolProps`.
pub fn wire_pool_props(raw: &CUmemPoolProps) -> PoolProps {
    let base = std::ptr::addr_of!(*raw);
    // SAFETY: as in `mem_prop`.
    unsafe {
        PoolProps {
            alloc_type: std::ptr::addr_of!((*base).allocType).cast::<u32>().read(),
            handle_types: std::ptr::addr_of!((*base).handleTypes).cast::<u32>().read(),
            location_type: std::ptr::addr_of!((*base).location.type_)
                .cast::<u32>()
                .read(),
            location_id: (*base).location.id,
            max_size: (*base).maxSize as u64,
            usage: (*base).usage,
        }
    }
}

/// `CUDA_MEMSET_NODE_PARAMS` from the fields of a memset node's wire form.
pub fn memset_params(
    dst: u64,
    value: u32,
    element_size: u8,
    width: u64,
    height: u64,
    pitch: u64,
) -> CUDA_MEMSET_NODE_PARAMS {
    CUDA_MEMSET_NODE_PARAMS {
        dst,
        pitch: pitch as usize,
        value,
        elementSize: element_size.into(),
        width: width as usize,
        height: height as usize,
    }
}

/// The wire form of a memset node's `CUDA_MEMSET_NODE_PARAMS`.
pub fn memset_node(p: &CUDA_MEMSET_NODE_PARAMS) -> NodeParams {
    NodeParams::Memset {
        dst: p.dst,
        value: p.value,
        element_size: p.elementSize as u8,
        width: p.width as u64,
        height: p.height as u64,
        pitch: p.pitch as u64,
    }
}

/// `CU_MEMORYTYPE_DEVICE` and `CU_MEMORYTYPE_UNIFIED`, as integers.
const MEMORY_DEVICE: u32 = 2;
const MEMORY_UNIFIED: u32 = 4;

/// `CUDA_MEMCPY3D` of a copy between device addresses (a copy node's wire form, `Copy`).
pub fn device_copy_params(
    dst: u64,
    dst_pitch: Pitch,
    src: u64,
    src_pitch: Pitch,
    extent: Extent,
) -> CUDA_MEMCPY3D {
    // With one slice the rows per slice do not matter; the driver still wants them to hold
    // the copy's rows.
    let slice_rows = |pitch: Pitch| match extent.depth {
        0 | 1 => pitch.slice_rows.max(extent.height) as usize,
        _ => pitch.slice_rows as usize,
    };
    let device = CUmemorytype::CU_MEMORYTYPE_DEVICE;
    let null = std::ptr::null_mut();
    CUDA_MEMCPY3D {
        srcXInBytes: 0,
        srcY: 0,
        srcZ: 0,
        srcLOD: 0,
        srcMemoryType: device,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: null,
        reserved0: null.cast(),
        srcPitch: src_pitch.row as usize,
        srcHeight: slice_rows(src_pitch),
        dstXInBytes: 0,
        dstY: 0,
        dstZ: 0,
        dstLOD: 0,
        dstMemoryType: device,
        dstHost: null.cast(),
        dstDevice: dst,
        dstArray: null,
        reserved1: null.cast(),
        dstPitch: dst_pitch.row as usize,
        dstHeight: slice_rows(dst_pitch),
        WidthInBytes: extent.width as usize,
        Height: extent.height as usize,
        Depth: extent.depth as usize,
    }
}

/// The wire form (`Copy`) of a copy node's descriptor whose sides are both device (or
/// unified) addresses, offsets folded into the addresses; `None` for host sides and arrays.
pub fn device_copy_node(p: &CUDA_MEMCPY3D) -> Option<NodeParams> {
    let base = std::ptr::addr_of!(*p);
    // SAFETY: the memory type fields of a valid struct, read as the integers they hold.
    let (src_type, dst_type) = unsafe {
        (
            std::ptr::addr_of!((*base).srcMemoryType)
                .cast::<u32>()
                .read(),
            std::ptr::addr_of!((*base).dstMemoryType)
                .cast::<u32>()
                .read(),
        )
    };
    let device = |kind| kind == MEMORY_DEVICE || kind == MEMORY_UNIFIED;
    if !device(src_type) || !device(dst_type) || p.srcLOD != 0 || p.dstLOD != 0 {
        return None;
    }
    let side = |start: u64, (x, y, z): (usize, usize, usize), row: usize, rows: usize| {
        let offset = x as u64 + (z as u64 * rows as u64 + y as u64) * row as u64;
        let pitch = Pitch {
            row: row as u64,
            slice_rows: rows as u64,
        };
        (start.wrapping_add(offset), pitch)
    };
    let (src, src_pitch) = side(
        p.srcDevice,
        (p.srcXInBytes, p.srcY, p.srcZ),
        p.srcPitch,
        p.srcHeight,
    );
    let (dst, dst_pitch) = side(
        p.dstDevice,
        (p.dstXInBytes, p.dstY, p.dstZ),
        p.dstPitch,
        p.dstHeight,
    );
    Some(NodeParams::Copy {
        dst,
        dst_pitch,
        src,
        src_pitch,
        extent: Extent {
            width: p.WidthInBytes as u64,
            height: p.Height as u64,
            depth: p.Depth as u64,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_struct_comes_back_as_it_went() {
        let prop = MemProp {
            kind: 1,
            handle_types: 9,
            location_type: 1,
            location_id: 3,
            alloc_flags: [1, 2, 3, 4, 5, 6, 7, 8],
        };
        assert_eq!(mem_prop(&allocation_prop(&prop)), prop);
        let access = MemAccess {
            location_type: 1,
            location_id: 2,
            flags: 3,
        };
        assert_eq!(mem_access(&access_desc(&access)), access);
        let props = PoolProps {
            alloc_type: 1,
            handle_types: 1,
            location_type: 1,
            location_id: 5,
            max_size: 1 << 30,
            usage: 0,
        };
        assert_eq!(wire_pool_props(&pool_props(&props)), props);
        // Values the enums lack travel as they are.
        let odd = MemProp {
            kind: 0x7fff_0001,
            ..prop
        };
        assert_eq!(mem_prop(&allocation_prop(&odd)), odd);
        let memset = NodeParams::Memset {
            dst: 0x7000_0000,
            value: 0x4000_0000,
            element_size: 4,
            width: 4096,
            height: 2,
            pitch: 16384,
        };
        let raw = memset_params(0x7000_0000, 0x4000_0000, 4, 4096, 2, 16384);
        assert_eq!(memset_node(&raw), memset);
        let (row, slice_rows) = (1024, 8);
        let pitch = Pitch { row, slice_rows };
        let extent = Extent {
            width: 512,
            height: 4,
            depth: 3,
        };
        let copy = NodeParams::Copy {
            dst: 0x7000_0000,
            dst_pitch: pitch,
            src: 0x7100_0000,
            src_pitch: pitch,
            extent,
        };
        let mut raw = device_copy_params(0x7000_0000, pitch, 0x7100_0000, pitch, extent);
        assert_eq!(device_copy_node(&raw), Some(copy));
        // Offsets fold into the address; a host side has no wire form.
        raw.srcDevice = 0x7100_0000 - 1024 * 8 - 1024 - 16;
        (raw.srcXInBytes, raw.srcY, raw.srcZ) = (16, 1, 1);
        let Some(NodeParams::Copy { src, .. }) = device_copy_node(&raw) else {
            panic!("not a device copy");
        };
        assert_eq!(src, 0x7100_0000);
        // SAFETY: the memory type field of a local struct, written as its integer.
        unsafe {
            std::ptr::addr_of_mut!(raw.srcMemoryType)
                .cast::<u32>()
                .write(1)
        };
        assert_eq!(device_copy_node(&raw), None);
    }
}
