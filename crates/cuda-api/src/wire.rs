//! Driver structs to and from their wire forms (`rgpu_protocol::cuda`), the same at both ends:
//! the client reads the program's structs into wire forms and writes the server's answers back
//! into the program's structs; the server does the opposite with its driver. Enum fields are
//! read and written as the integers they hold (a program or a newer driver may use values the
//! Rust enums lack, and an invalid enum value is undefined behavior), through raw pointers at
//! their offsets. Device ordinals pass unchanged: translating them between the program's
//! numbering and a server's is the client's business.

use rgpu_protocol::cuda::{MemAccess, MemProp, NodeParams, PoolProps};

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
    }
}
