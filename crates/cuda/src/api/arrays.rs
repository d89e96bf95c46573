//! CUDA arrays (the memory textures read), copies into and out of them, and texture and
//! surface objects. An array lives on the server of the context it is made in; copies to and
//! from it go through the copy machinery of copy.rs (host rows streamed like device rows).
//! Texture and surface objects are values kernels receive: the server's own values.

use std::ffi::c_void;
use std::sync::Arc;

use rgpu_client::CudaClient;
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::ArrayDesc;

use super::copy::{array_copy_linear, Linear};
use super::{status, write_out, Outcome};
use crate::objects::{current_context, Array, MipmappedArray};

/// `CU_RESOURCE_TYPE_ARRAY` / `_MIPMAPPED_ARRAY`.
const RESOURCE_ARRAY: u32 = 0;
const RESOURCE_MIPMAPPED_ARRAY: u32 = 1;

/// A descriptor in wire form (the format read as an integer: it may hold values the enum
/// lacks).
///
/// # Safety
/// `desc` is null or a valid descriptor.
unsafe fn desc_3d(desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> Result<ArrayDesc, CUresult> {
    // SAFETY: the caller's guarantee.
    let Some(d) = (unsafe { desc.as_ref() }) else {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    };
    // SAFETY: as above.
    let format = unsafe { std::ptr::addr_of!(d.Format).cast::<u32>().read() };
    Ok(ArrayDesc {
        width: d.Width as u64,
        height: d.Height as u64,
        depth: d.Depth as u64,
        format,
        channels: d.NumChannels,
        flags: d.Flags,
    })
}

/// Makes an array in the current context.
fn create(array: *mut CUarray, desc: ArrayDesc) -> CUresult {
    status(current_context().and_then(|ctx| {
        if array.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let object = Array {
            handle: crate::handles::new_handle(),
            remote: ctx.conn.new_id(),
            ctx: ctx.clone(),
            desc,
        };
        ctx.conn
            .cuda()
            .array_create(ctx.remote, object.remote, desc)
            .outcome()?;
        // SAFETY: checked non-null above.
        unsafe { write_out(array, object.into_handle()) }
    }))
}

pub unsafe fn cuArrayCreate_v2(
    array: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    // SAFETY: the program's descriptor, valid as the API requires; the format read as an integer.
    let Some(d) = (unsafe { desc.as_ref() }) else {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    };
    // SAFETY: as above.
    let format = unsafe { std::ptr::addr_of!(d.Format).cast::<u32>().read() };
    create(
        array,
        ArrayDesc {
            width: d.Width as u64,
            height: d.Height as u64,
            depth: 0,
            format,
            channels: d.NumChannels,
            flags: 0,
        },
    )
}

pub unsafe fn cuArray3DCreate_v2(
    array: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    // SAFETY: the program's descriptor, valid as the API requires.
    match unsafe { desc_3d(desc) } {
        Ok(desc) => create(array, desc),
        Err(e) => e,
    }
}

pub unsafe fn cuMipmappedArrayCreate(
    mipmap: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: std::ffi::c_uint,
) -> CUresult {
    status(current_context().and_then(|ctx| {
        if mipmap.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the program's descriptor, valid as the API requires.
        let desc = unsafe { desc_3d(desc)? };
        let object = MipmappedArray {
            handle: crate::handles::new_handle(),
            remote: ctx.conn.new_id(),
            ctx: ctx.clone(),
            levels: Default::default(),
        };
        ctx.conn
            .cuda()
            .mipmapped_array_create(ctx.remote, object.remote, desc, levels)
            .outcome()?;
        // SAFETY: checked non-null above.
        unsafe { write_out(mipmap, object.into_handle()) }
    }))
}

/// A level of a mipmapped array: an array handle the mipmapped array owns (asked for again,
/// the same handle).
pub unsafe fn cuMipmappedArrayGetLevel(
    array: *mut CUarray,
    mipmap: CUmipmappedArray,
    level: std::ffi::c_uint,
) -> CUresult {
    status((|| {
        let mipmap =
            MipmappedArray::from_handle(mipmap).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        if array.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut levels = mipmap.levels.lock().unwrap();
        if let Some(&handle) = levels.get(&level) {
            // SAFETY: checked non-null above.
            return unsafe { write_out(array, handle as CUarray) };
        }
        let ctx = mipmap.ctx.clone();
        let remote = ctx.conn.new_id();
        let desc = ctx
            .conn
            .cuda()
            .mipmapped_array_get_level(mipmap.remote, level, remote)
            .outcome()?;
        let object = Array {
            handle: crate::handles::new_handle(),
            remote,
            ctx,
            desc,
        };
        let handle = object.into_handle();
        levels.insert(level, handle as usize);
        // SAFETY: checked non-null above.
        unsafe { write_out(array, handle) }
    })())
}

pub unsafe fn cuMipmappedArrayDestroy(mipmap: CUmipmappedArray) -> CUresult {
    status((|| {
        let object = MipmappedArray::destroy(mipmap).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        for (_, level) in object.levels.lock().unwrap().drain() {
            Array::destroy(level as CUarray);
        }
        object
            .ctx
            .conn
            .cuda()
            .mipmapped_array_destroy(object.remote)
            .outcome()
    })())
}

pub unsafe fn cuArrayDestroy(array: CUarray) -> CUresult {
    status((|| {
        let object = Array::destroy(array).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        object
            .ctx
            .conn
            .cuda()
            .array_destroy(object.remote)
            .outcome()
    })())
}

fn desc_of(array: CUarray) -> Result<ArrayDesc, CUresult> {
    Array::from_handle(array)
        .map(|a| a.desc)
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

pub unsafe fn cuArrayGetDescriptor_v2(out: *mut CUDA_ARRAY_DESCRIPTOR, array: CUarray) -> CUresult {
    status(desc_of(array).and_then(|d| {
        if out.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: checked non-null; writable as the API requires; the format written as an
        // integer.
        unsafe {
            (*out).Width = d.width as usize;
            (*out).Height = d.height as usize;
            std::ptr::addr_of_mut!((*out).Format)
                .cast::<u32>()
                .write(d.format);
            (*out).NumChannels = d.channels;
        }
        Ok(())
    }))
}

pub unsafe fn cuArray3DGetDescriptor_v2(
    out: *mut CUDA_ARRAY3D_DESCRIPTOR,
    array: CUarray,
) -> CUresult {
    status(desc_of(array).and_then(|d| {
        if out.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: as in cuArrayGetDescriptor_v2.
        unsafe {
            (*out).Width = d.width as usize;
            (*out).Height = d.height as usize;
            (*out).Depth = d.depth as usize;
            std::ptr::addr_of_mut!((*out).Format)
                .cast::<u32>()
                .write(d.format);
            (*out).NumChannels = d.channels;
            (*out).Flags = d.flags;
        }
        Ok(())
    }))
}

/// The bytes of a plain C descriptor.
///
/// # Safety
/// `value` is null or points to a valid `T`.
unsafe fn bytes_of<T>(value: *const T) -> Vec<u8> {
    if value.is_null() {
        return Vec::new();
    }
    // SAFETY: the caller's guarantee.
    unsafe { std::slice::from_raw_parts(value.cast::<u8>(), std::mem::size_of::<T>()) }.to_vec()
}

/// A resource descriptor's bytes for the server: an array's (or mipmapped array's) handle
/// becomes its session id, on the context's server.
///
/// # Safety
/// `desc` is null or a valid descriptor.
unsafe fn resource_bytes(
    desc: *const CUDA_RESOURCE_DESC,
    conn: &Arc<rgpu_client::Connection>,
) -> Result<Vec<u8>, CUresult> {
    if desc.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's guarantee.
    let mut bytes = unsafe { bytes_of(desc) };
    // SAFETY: the type field read as its integer.
    let kind = unsafe { std::ptr::addr_of!((*desc).resType).cast::<u32>().read() };
    let (owner, remote) = match kind {
        RESOURCE_ARRAY => {
            // SAFETY: an array resource: the union's first word is the array handle.
            let handle = unsafe { (*desc).res.array.hArray };
            let array = Array::from_handle(handle).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
            (array.ctx.clone(), array.remote)
        }
        RESOURCE_MIPMAPPED_ARRAY => {
            // SAFETY: as above, for a mipmapped array.
            let handle = unsafe { (*desc).res.mipmap.hMipmappedArray };
            let mipmap =
                MipmappedArray::from_handle(handle).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
            (mipmap.ctx.clone(), mipmap.remote)
        }
        _ => return Ok(bytes),
    };
    if !Arc::ptr_eq(&owner.conn, conn) {
        return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    let at = std::mem::offset_of!(CUDA_RESOURCE_DESC, res);
    bytes[at..at + 8].copy_from_slice(&remote.to_le_bytes());
    Ok(bytes)
}

/// The descriptors each texture object was made with, as the program gave them (its array
/// handles, its device addresses), for the `cuTexObjectGet*Desc` queries.
struct TextureDescs {
    resource: CUDA_RESOURCE_DESC,
    texture: CUDA_TEXTURE_DESC,
    view: Option<CUDA_RESOURCE_VIEW_DESC>,
}

// SAFETY: plain values; the pointers in them (array handles, device addresses) are the
// program's, handed back as they came and never followed here.
unsafe impl Send for TextureDescs {}

static TEXTURES: std::sync::Mutex<std::collections::BTreeMap<u64, TextureDescs>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

pub unsafe fn cuTexObjectCreate(
    object: *mut CUtexObject,
    resource: *const CUDA_RESOURCE_DESC,
    texture: *const CUDA_TEXTURE_DESC,
    view: *const CUDA_RESOURCE_VIEW_DESC,
) -> CUresult {
    status(current_context().and_then(|ctx| {
        if object.is_null() || texture.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (resource_desc, texture_desc, view_desc) = (resource, texture, view);
        // SAFETY: the program's descriptors, valid as the API requires (view may be null).
        let (resource, texture, view) = unsafe {
            (
                resource_bytes(resource, &ctx.conn)?,
                bytes_of(texture),
                bytes_of(view),
            )
        };
        let value = ctx
            .conn
            .cuda()
            .tex_object_create(ctx.remote, resource, texture, view)
            .outcome()?;
        // SAFETY: the program's descriptors, valid as the API requires (view may be null).
        let descs = unsafe {
            TextureDescs {
                resource: resource_desc.read(),
                texture: texture_desc.read(),
                view: (!view_desc.is_null()).then(|| view_desc.read()),
            }
        };
        TEXTURES.lock().unwrap().insert(value, descs);
        // SAFETY: checked non-null above.
        unsafe { write_out(object, value) }
    }))
}

pub unsafe fn cuSurfObjectCreate(
    object: *mut CUsurfObject,
    resource: *const CUDA_RESOURCE_DESC,
) -> CUresult {
    status(current_context().and_then(|ctx| {
        if object.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the program's descriptor, valid as the API requires.
        let resource = unsafe { resource_bytes(resource, &ctx.conn)? };
        let value = ctx
            .conn
            .cuda()
            .surf_object_create(ctx.remote, resource)
            .outcome()?;
        // SAFETY: checked non-null above.
        unsafe { write_out(object, value) }
    }))
}

/// Destroys a texture or surface object of the current context's server (object values are
/// the server's, so the program destroys them where it made them).
fn destroy_object(object: u64, surface: bool) -> CUresult {
    status(
        current_context().and_then(|ctx| ctx.conn.cuda().object_destroy(object, surface).outcome()),
    )
}

pub unsafe fn cuTexObjectDestroy(object: CUtexObject) -> CUresult {
    let destroyed = destroy_object(object, false);
    if destroyed == CUresult::CUDA_SUCCESS {
        TEXTURES.lock().unwrap().remove(&object);
    }
    destroyed
}

/// Writes what `pick` takes from `object`'s descriptors to `out`.
///
/// # Safety
/// `out` is null (refused) or writable.
unsafe fn texture_desc<T>(
    out: *mut T,
    object: CUtexObject,
    pick: impl FnOnce(&TextureDescs) -> Option<T>,
) -> CUresult {
    let picked = TEXTURES.lock().unwrap().get(&object).map(pick);
    match picked {
        // SAFETY: the caller's guarantee.
        Some(Some(value)) => status(unsafe { write_out(out, value) }),
        // Made without a view: the driver reports an empty one.
        // SAFETY: plain data for which all-zero bytes are valid.
        Some(None) => status(unsafe { write_out(out, std::mem::zeroed()) }),
        None => CUresult::CUDA_ERROR_INVALID_VALUE,
    }
}

pub unsafe fn cuTexObjectGetResourceDesc(
    pResDesc: *mut CUDA_RESOURCE_DESC,
    texObject: CUtexObject,
) -> CUresult {
    // SAFETY: the caller's out-pointer, passed on.
    unsafe { texture_desc(pResDesc, texObject, |descs| Some(descs.resource)) }
}

pub unsafe fn cuTexObjectGetTextureDesc(
    pTexDesc: *mut CUDA_TEXTURE_DESC,
    texObject: CUtexObject,
) -> CUresult {
    // SAFETY: as above.
    unsafe { texture_desc(pTexDesc, texObject, |descs| Some(descs.texture)) }
}

pub unsafe fn cuTexObjectGetResourceViewDesc(
    pResViewDesc: *mut CUDA_RESOURCE_VIEW_DESC,
    texObject: CUtexObject,
) -> CUresult {
    // SAFETY: as above.
    unsafe { texture_desc(pResViewDesc, texObject, |descs| descs.view) }
}

pub unsafe fn cuSurfObjectDestroy(object: CUsurfObject) -> CUresult {
    destroy_object(object, true)
}

// ---- Linear copies into and out of arrays (`offset` bytes into the array's first row).

pub unsafe fn cuMemcpyHtoA_v2(
    array: CUarray,
    offset: usize,
    src: *const c_void,
    bytes: usize,
) -> CUresult {
    // SAFETY: the program's host memory of `bytes`, as the API requires.
    unsafe {
        array_copy_linear(
            (array, offset),
            false,
            Linear::Host(src as u64),
            bytes,
            None,
        )
    }
}

pub unsafe fn cuMemcpyHtoAAsync_v2(
    array: CUarray,
    offset: usize,
    src: *const c_void,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: as above.
    unsafe {
        array_copy_linear(
            (array, offset),
            false,
            Linear::Host(src as u64),
            bytes,
            Some(stream),
        )
    }
}

pub unsafe fn cuMemcpyAtoH_v2(
    dst: *mut c_void,
    array: CUarray,
    offset: usize,
    bytes: usize,
) -> CUresult {
    // SAFETY: as above.
    unsafe { array_copy_linear((array, offset), true, Linear::Host(dst as u64), bytes, None) }
}

pub unsafe fn cuMemcpyAtoHAsync_v2(
    dst: *mut c_void,
    array: CUarray,
    offset: usize,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: as above.
    unsafe {
        array_copy_linear(
            (array, offset),
            true,
            Linear::Host(dst as u64),
            bytes,
            Some(stream),
        )
    }
}

pub unsafe fn cuMemcpyAtoD_v2(
    dst: CUdeviceptr,
    array: CUarray,
    offset: usize,
    bytes: usize,
) -> CUresult {
    // SAFETY: device memory only; the server checks both sides.
    unsafe { array_copy_linear((array, offset), true, Linear::Device(dst), bytes, None) }
}

pub unsafe fn cuMemcpyDtoA_v2(
    array: CUarray,
    offset: usize,
    src: CUdeviceptr,
    bytes: usize,
) -> CUresult {
    // SAFETY: as above.
    unsafe { array_copy_linear((array, offset), false, Linear::Device(src), bytes, None) }
}

pub unsafe fn cuMemcpyAtoA_v2(
    dst: CUarray,
    dst_offset: usize,
    src: CUarray,
    src_offset: usize,
    bytes: usize,
) -> CUresult {
    let from = Linear::Array(src, src_offset);
    // SAFETY: as above.
    unsafe { array_copy_linear((dst, dst_offset), false, from, bytes, None) }
}
