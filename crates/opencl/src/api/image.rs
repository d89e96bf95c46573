//! Images: creation (including images made from buffers), supported formats and image info,
//! plus the pitch helpers that image and rectangle transfers share.
//!
//! Image data crosses the wire tightly packed; the pitches an application gives describe only
//! its own host memory, so they are applied on the client.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use opencl_sys::*;
use rgpu_client::OpenClClient;
use rgpu_protocol::opencl::{ImageDesc, ImageFormat};

use crate::api::context::context_from;
use crate::api::memory::{check_flags, mem_from};
use crate::handle::{self, Ref};
use crate::objects::{Context, Device, ImageInfo, Mem, MemKind};
use crate::region::HostRegion;
use crate::util::{bytes_of, creation, guard, property_list, write_info, Outcome};

/// cl_khr_gl_depth_images (not in opencl-sys's core constants).
const CL_DEPTH_STENCIL: cl_channel_order = 0x10BE;
const CL_UNORM_INT24: cl_channel_type = 0x10DF;

const ACCESS_FLAGS: cl_mem_flags = CL_MEM_READ_WRITE | CL_MEM_WRITE_ONLY | CL_MEM_READ_ONLY;
const HOST_ACCESS_FLAGS: cl_mem_flags =
    CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS;
const HOST_PTR_FLAGS: cl_mem_flags =
    CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR | CL_MEM_ALLOC_HOST_PTR;
const ALL_FLAGS: cl_mem_flags =
    ACCESS_FLAGS | HOST_ACCESS_FLAGS | HOST_PTR_FLAGS | CL_MEM_KERNEL_READ_AND_WRITE;

/// `cl_image_desc` as laid out in C. opencl-sys names the `buffer`/`mem_object` union
/// differently depending on a feature; the layout is the same either way.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawImageDesc {
    image_type: cl_mem_object_type,
    width: usize,
    height: usize,
    depth: usize,
    array_size: usize,
    row_pitch: usize,
    slice_pitch: usize,
    num_mip_levels: cl_uint,
    num_samples: cl_uint,
    mem_object: cl_mem,
}

const _: () = assert!(std::mem::size_of::<RawImageDesc>() == std::mem::size_of::<cl_image_desc>());

/// The size in bytes of one element (pixel) of an image format; None for a format rgpu does
/// not know (CL_INVALID_IMAGE_FORMAT_DESCRIPTOR).
#[allow(non_upper_case_globals)] // CL_Rx, CL_sRGB, ... are the API's names
pub fn element_size(format: &ImageFormat) -> Option<usize> {
    let channels = match format.channel_order {
        CL_R | CL_A | CL_Rx | CL_INTENSITY | CL_LUMINANCE | CL_DEPTH => 1,
        CL_RG | CL_RA | CL_RGx => 2,
        CL_RGB | CL_RGBx | CL_sRGB | CL_sRGBx => 3,
        CL_RGBA | CL_BGRA | CL_ARGB | CL_ABGR | CL_sRGBA | CL_sBGRA => 4,
        CL_DEPTH_STENCIL => {
            // 24-bit depth + 8-bit stencil, or a float depth + 8-bit stencil padded to 64 bits.
            return match format.channel_data_type {
                CL_UNORM_INT24 => Some(4),
                CL_FLOAT => Some(8),
                _ => None,
            };
        }
        _ => return None,
    };
    let channel_size = match format.channel_data_type {
        CL_SNORM_INT8 | CL_UNORM_INT8 | CL_SIGNED_INT8 | CL_UNSIGNED_INT8 => 1,
        CL_SNORM_INT16 | CL_UNORM_INT16 | CL_SIGNED_INT16 | CL_UNSIGNED_INT16 | CL_HALF_FLOAT => 2,
        CL_SIGNED_INT32 | CL_UNSIGNED_INT32 | CL_FLOAT => 4,
        // Packed formats: the size is that of the whole element.
        CL_UNORM_SHORT_565 | CL_UNORM_SHORT_555 => return Some(2),
        CL_UNORM_INT_101010 | CL_UNORM_INT_101010_2 | CL_UNORM_INT24 => return Some(4),
        _ => return None,
    };
    Some(channels * channel_size)
}

/// The bytes of an image region (`region` in pixels, rows, slices/array layers), tightly packed.
pub fn image_region_bytes(info: &ImageInfo, region: [usize; 3]) -> usize {
    region
        .iter()
        .try_fold(info.element_size, |acc, &r| acc.checked_mul(r))
        .unwrap_or(usize::MAX)
}

fn device_bool(device: &Device, param: cl_device_info) -> bool {
    device.info.get(&param).is_some_and(|v| {
        v.iter()
            .take(std::mem::size_of::<cl_bool>())
            .any(|&b| b != 0)
    })
}

/// A `size_t` device limit (the server's size_t is 64-bit little-endian); None if unknown.
fn device_size(device: &Device, param: cl_device_info) -> Option<u64> {
    let bytes = device.info.get(&param)?.get(..8)?;
    let mut raw = [0u8; 8];
    raw.copy_from_slice(bytes);
    Some(u64::from_le_bytes(raw))
}

/// Whether any device of the context supports images (CL_DEVICE_IMAGE_SUPPORT).
pub fn context_supports_images(context: &Context) -> bool {
    context
        .devices
        .iter()
        .any(|d| device_bool(d, CL_DEVICE_IMAGE_SUPPORT))
}

/// Whether the image's dimensions are within the device's limits.
fn fits(device: &Device, desc: &ImageDesc) -> bool {
    let within = |value: u64, param| device_size(device, param).is_none_or(|max| value <= max);
    let (w, h, d, a) = (desc.width, desc.height, desc.depth, desc.array_size);
    match desc.image_type {
        CL_MEM_OBJECT_IMAGE1D => within(w, CL_DEVICE_IMAGE2D_MAX_WIDTH),
        CL_MEM_OBJECT_IMAGE1D_BUFFER => within(w, CL_DEVICE_IMAGE_MAX_BUFFER_SIZE),
        CL_MEM_OBJECT_IMAGE1D_ARRAY => {
            within(w, CL_DEVICE_IMAGE2D_MAX_WIDTH) && within(a, CL_DEVICE_IMAGE_MAX_ARRAY_SIZE)
        }
        CL_MEM_OBJECT_IMAGE2D => {
            within(w, CL_DEVICE_IMAGE2D_MAX_WIDTH) && within(h, CL_DEVICE_IMAGE2D_MAX_HEIGHT)
        }
        CL_MEM_OBJECT_IMAGE2D_ARRAY => {
            within(w, CL_DEVICE_IMAGE2D_MAX_WIDTH)
                && within(h, CL_DEVICE_IMAGE2D_MAX_HEIGHT)
                && within(a, CL_DEVICE_IMAGE_MAX_ARRAY_SIZE)
        }
        CL_MEM_OBJECT_IMAGE3D => {
            within(w, CL_DEVICE_IMAGE3D_MAX_WIDTH)
                && within(h, CL_DEVICE_IMAGE3D_MAX_HEIGHT)
                && within(d, CL_DEVICE_IMAGE3D_MAX_DEPTH)
        }
        _ => false,
    }
}

/// Checks the flags of an image made from another memory object against that object's, as
/// clCreateImage specifies, and returns the flags the image has (unspecified access and host
/// access flags, and the host-pointer flags, are inherited).
fn flags_from_source(flags: cl_mem_flags, source: &Mem) -> Result<cl_mem_flags, cl_int> {
    let src = source.flags;
    let conflicting_access = (src & CL_MEM_WRITE_ONLY != 0
        && flags & (CL_MEM_READ_WRITE | CL_MEM_READ_ONLY) != 0)
        || (src & CL_MEM_READ_ONLY != 0 && flags & (CL_MEM_READ_WRITE | CL_MEM_WRITE_ONLY) != 0);
    let conflicting_host = (src & CL_MEM_HOST_WRITE_ONLY != 0
        && flags & CL_MEM_HOST_READ_ONLY != 0)
        || (src & CL_MEM_HOST_READ_ONLY != 0 && flags & CL_MEM_HOST_WRITE_ONLY != 0)
        || (src & CL_MEM_HOST_NO_ACCESS != 0
            && flags & (CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_WRITE_ONLY) != 0);
    let ambiguous =
        (flags & ACCESS_FLAGS).count_ones() > 1 || (flags & HOST_ACCESS_FLAGS).count_ones() > 1;
    if ambiguous || conflicting_access || conflicting_host || flags & HOST_PTR_FLAGS != 0 {
        return Err(CL_INVALID_VALUE);
    }
    let mut own = flags;
    if flags & ACCESS_FLAGS == 0 {
        own |= src & ACCESS_FLAGS;
    }
    if flags & HOST_ACCESS_FLAGS == 0 {
        own |= src & HOST_ACCESS_FLAGS;
    }
    own |= src & HOST_PTR_FLAGS;
    if own & ACCESS_FLAGS == 0 {
        own |= CL_MEM_READ_WRITE;
    }
    Ok(own)
}

/// clCreateImage and clCreateImageWithProperties; the 1.1 forms come here too.
fn create_image(
    context: cl_context,
    properties: Vec<cl_mem_properties>,
    flags: cl_mem_flags,
    image_format: *const cl_image_format,
    image_desc: Option<RawImageDesc>,
    host_ptr: *mut c_void,
) -> Result<*mut c_void, cl_int> {
    let context = context_from(context)?;
    if properties.len() > 1 {
        // No image properties are defined by core OpenCL.
        return Err(CL_INVALID_PROPERTY);
    }
    if flags & !ALL_FLAGS != 0 {
        return Err(CL_INVALID_VALUE);
    }
    if image_format.is_null() {
        return Err(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR);
    }
    // SAFETY: checked non-null; the application's image format.
    let raw_format = unsafe { *image_format };
    let format = ImageFormat {
        channel_order: raw_format.image_channel_order,
        channel_data_type: raw_format.image_channel_data_type,
    };
    let element = element_size(&format).ok_or(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR)?;
    let raw = image_desc.ok_or(CL_INVALID_IMAGE_DESCRIPTOR)?;

    // Geometry. Fields that do not apply to the image type are reported (and sent) as 0.
    let t = raw.image_type;
    let (w, h, d, a) = (raw.width, raw.height, raw.depth, raw.array_size);
    let (height, depth, array_size, rows, slices) = match t {
        CL_MEM_OBJECT_IMAGE1D | CL_MEM_OBJECT_IMAGE1D_BUFFER => (0, 0, 0, 1, 1),
        CL_MEM_OBJECT_IMAGE1D_ARRAY => (0, 0, a, 1, a),
        CL_MEM_OBJECT_IMAGE2D => (h, 0, 0, h, 1),
        CL_MEM_OBJECT_IMAGE2D_ARRAY => (h, 0, a, h, a),
        CL_MEM_OBJECT_IMAGE3D => (h, d, 0, h, d),
        _ => return Err(CL_INVALID_IMAGE_DESCRIPTOR),
    };
    if w == 0 || rows == 0 || slices == 0 || raw.num_mip_levels != 0 || raw.num_samples != 0 {
        return Err(CL_INVALID_IMAGE_DESCRIPTOR);
    }

    // The buffer or image the image is made from.
    let source = if raw.mem_object.is_null() {
        None
    } else {
        let source = mem_from(raw.mem_object).map_err(|_| CL_INVALID_IMAGE_DESCRIPTOR)?;
        let allowed = match (&source.kind, t) {
            (MemKind::Buffer { .. }, CL_MEM_OBJECT_IMAGE1D_BUFFER | CL_MEM_OBJECT_IMAGE2D) => true,
            (MemKind::Image(info), CL_MEM_OBJECT_IMAGE2D) => {
                info.desc.image_type == CL_MEM_OBJECT_IMAGE2D
            }
            _ => false,
        };
        if !allowed || !Arc::ptr_eq(&source.context, &context) {
            return Err(CL_INVALID_IMAGE_DESCRIPTOR);
        }
        Some(source)
    };
    if t == CL_MEM_OBJECT_IMAGE1D_BUFFER && source.is_none() {
        return Err(CL_INVALID_IMAGE_DESCRIPTOR);
    }
    let source_info = source.as_ref().and_then(|s| s.image().cloned());
    let from_buffer = source.is_some() && source_info.is_none();

    // Pitches of the host memory (or of the buffer the image is made from).
    let has_host = !host_ptr.is_null();
    let row_bytes = w.checked_mul(element).ok_or(CL_INVALID_IMAGE_SIZE)?;
    let row_pitch = if raw.row_pitch == 0 {
        source_info
            .as_ref()
            .map_or(row_bytes, |info| info.row_pitch)
    } else {
        if !(has_host || source.is_some())
            || raw.row_pitch < row_bytes
            || raw.row_pitch % element != 0
        {
            return Err(CL_INVALID_IMAGE_DESCRIPTOR);
        }
        raw.row_pitch
    };
    let slice_pitch = match t {
        CL_MEM_OBJECT_IMAGE1D_ARRAY | CL_MEM_OBJECT_IMAGE2D_ARRAY | CL_MEM_OBJECT_IMAGE3D => {
            let min = if t == CL_MEM_OBJECT_IMAGE1D_ARRAY {
                row_pitch
            } else {
                row_pitch.checked_mul(rows).ok_or(CL_INVALID_IMAGE_SIZE)?
            };
            if raw.slice_pitch == 0 {
                min
            } else {
                if !has_host || raw.slice_pitch < min || raw.slice_pitch % row_pitch != 0 {
                    return Err(CL_INVALID_IMAGE_DESCRIPTOR);
                }
                raw.slice_pitch
            }
        }
        _ => 0,
    };
    let size = row_bytes
        .checked_mul(rows)
        .and_then(|s| s.checked_mul(slices))
        .ok_or(CL_INVALID_IMAGE_SIZE)?;

    let desc = ImageDesc {
        image_type: t,
        width: w as u64,
        height: height as u64,
        depth: depth as u64,
        array_size: array_size as u64,
        row_pitch: if source.is_some() {
            raw.row_pitch as u64
        } else {
            0
        },
        slice_pitch: if source.is_some() {
            raw.slice_pitch as u64
        } else {
            0
        },
        num_mip_levels: 0,
        num_samples: 0,
        mem_object: source.as_ref().map_or(0, |s| s.id),
    };
    if !context_supports_images(&context) {
        return Err(CL_INVALID_OPERATION);
    }
    let supported: Vec<&Ref<Device>> = context
        .devices
        .iter()
        .filter(|dev| device_bool(dev, CL_DEVICE_IMAGE_SUPPORT))
        .collect();
    if !supported.iter().any(|dev| fits(dev, &desc)) {
        return Err(CL_INVALID_IMAGE_SIZE);
    }

    // Flags, and the initial contents.
    let (own_flags, wire_flags, own_host_ptr) = match &source {
        Some(source) => {
            let own = flags_from_source(flags, source)?;
            if has_host {
                return Err(CL_INVALID_HOST_PTR);
            }
            if from_buffer {
                // The image aliases the buffer's storage, so the buffer must hold it.
                let needed = match t {
                    CL_MEM_OBJECT_IMAGE2D => {
                        row_pitch.checked_mul(rows).ok_or(CL_INVALID_IMAGE_SIZE)?
                    }
                    _ => row_bytes,
                };
                if needed > source.size {
                    return Err(CL_INVALID_IMAGE_SIZE);
                }
            }
            // The server applies the inheritance itself from the flags as given.
            (own, flags, source.host_ptr)
        }
        None => {
            let wire = check_flags(flags, host_ptr)?;
            let own = if flags == 0 { CL_MEM_READ_WRITE } else { flags };
            let own_host = if flags & CL_MEM_USE_HOST_PTR != 0 {
                host_ptr as usize
            } else {
                0
            };
            (own, wire, own_host)
        }
    };
    let mut initial = Vec::new();
    if has_host && flags & (CL_MEM_COPY_HOST_PTR | CL_MEM_USE_HOST_PTR) != 0 {
        let host = HostRegion::new(
            host_ptr as *mut u8,
            row_bytes,
            rows,
            slices,
            row_pitch,
            slice_pitch,
        );
        // SAFETY: with a host-pointer flag the application provides the image's data at
        // `host_ptr`, laid out with these (validated) pitches.
        initial = unsafe { host.pack() };
    }

    let conn = Arc::clone(&context.conn);
    let id = conn.new_id();
    conn.opencl()
        .create_image(
            id,
            context.id,
            wire_flags,
            format,
            desc,
            properties.clone(),
            &initial,
        )
        .outcome()?;
    let mem = handle::create(Mem {
        conn,
        id,
        context,
        flags: own_flags,
        size,
        host_ptr: own_host_ptr,
        shared_host: 0,
        properties,
        kind: MemKind::Image(ImageInfo {
            format,
            desc,
            element_size: element,
            row_pitch,
            slice_pitch,
            source,
        }),
        maps: Mutex::new(Vec::new()),
        destructors: Mutex::new(Vec::new()),
        residence: Default::default(),
    });
    Ok(handle::raw(&mem))
}

/// Reads the application's image descriptor.
///
/// # Safety
/// `desc` is null or points to a `cl_image_desc`.
unsafe fn read_desc(desc: *const cl_image_desc) -> Option<RawImageDesc> {
    // SAFETY: see the function contract; RawImageDesc has cl_image_desc's layout.
    (!desc.is_null()).then(|| unsafe { (desc as *const RawImageDesc).read_unaligned() })
}

pub unsafe extern "C" fn clCreateImage(
    context: cl_context,
    flags: cl_mem_flags,
    image_format: *const cl_image_format,
    image_desc: *const cl_image_desc,
    host_ptr: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    guard(std::ptr::null_mut(), || {
        // SAFETY: the application's descriptor (or null).
        let desc = unsafe { read_desc(image_desc) };
        let result = create_image(context, Vec::new(), flags, image_format, desc, host_ptr);
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

pub unsafe extern "C" fn clCreateImageWithProperties(
    context: cl_context,
    properties: *const cl_mem_properties,
    flags: cl_mem_flags,
    image_format: *const cl_image_format,
    image_desc: *const cl_image_desc,
    host_ptr: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    guard(std::ptr::null_mut(), || {
        // SAFETY: a zero-terminated list from the application (or null).
        let props = unsafe { property_list(properties) };
        // SAFETY: the application's descriptor (or null).
        let desc = unsafe { read_desc(image_desc) };
        let result = create_image(context, props, flags, image_format, desc, host_ptr);
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

/// A descriptor for the OpenCL 1.1 image functions.
fn legacy_desc(
    image_type: cl_mem_object_type,
    dims: [usize; 3],
    row_pitch: usize,
    slice_pitch: usize,
) -> RawImageDesc {
    RawImageDesc {
        image_type,
        width: dims[0],
        height: dims[1],
        depth: dims[2],
        array_size: 0,
        row_pitch,
        slice_pitch,
        num_mip_levels: 0,
        num_samples: 0,
        mem_object: std::ptr::null_mut(),
    }
}

/// OpenCL 1.1 reports bad dimensions and pitches as CL_INVALID_IMAGE_SIZE.
fn legacy_error(result: Result<*mut c_void, cl_int>) -> Result<*mut c_void, cl_int> {
    result.map_err(|code| {
        if code == CL_INVALID_IMAGE_DESCRIPTOR {
            CL_INVALID_IMAGE_SIZE
        } else {
            code
        }
    })
}

pub unsafe extern "C" fn clCreateImage2D(
    context: cl_context,
    flags: cl_mem_flags,
    image_format: *const cl_image_format,
    image_width: usize,
    image_height: usize,
    image_row_pitch: usize,
    host_ptr: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    guard(std::ptr::null_mut(), || {
        let desc = legacy_desc(
            CL_MEM_OBJECT_IMAGE2D,
            [image_width, image_height, 0],
            image_row_pitch,
            0,
        );
        let result = legacy_error(create_image(
            context,
            Vec::new(),
            flags,
            image_format,
            Some(desc),
            host_ptr,
        ));
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

pub unsafe extern "C" fn clCreateImage3D(
    context: cl_context,
    flags: cl_mem_flags,
    image_format: *const cl_image_format,
    image_width: usize,
    image_height: usize,
    image_depth: usize,
    image_row_pitch: usize,
    image_slice_pitch: usize,
    host_ptr: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    guard(std::ptr::null_mut(), || {
        let result = if image_depth <= 1 {
            // OpenCL 1.1 requires a 3-D image to have a depth of at least 2.
            context_from(context).and(Err(CL_INVALID_IMAGE_SIZE))
        } else {
            let dims = [image_width, image_height, image_depth];
            let desc = legacy_desc(
                CL_MEM_OBJECT_IMAGE3D,
                dims,
                image_row_pitch,
                image_slice_pitch,
            );
            legacy_error(create_image(
                context,
                Vec::new(),
                flags,
                image_format,
                Some(desc),
                host_ptr,
            ))
        };
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

pub unsafe extern "C" fn clGetSupportedImageFormats(
    context: cl_context,
    flags: cl_mem_flags,
    image_type: cl_mem_object_type,
    num_entries: cl_uint,
    image_formats: *mut cl_image_format,
    num_image_formats: *mut cl_uint,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let result = (|| {
            let context = context_from(context)?;
            let known_type = matches!(
                image_type,
                CL_MEM_OBJECT_IMAGE1D
                    | CL_MEM_OBJECT_IMAGE1D_BUFFER
                    | CL_MEM_OBJECT_IMAGE1D_ARRAY
                    | CL_MEM_OBJECT_IMAGE2D
                    | CL_MEM_OBJECT_IMAGE2D_ARRAY
                    | CL_MEM_OBJECT_IMAGE3D
            );
            if !known_type
                || flags & !ALL_FLAGS != 0
                || (num_entries == 0 && !image_formats.is_null())
            {
                return Err(CL_INVALID_VALUE);
            }
            let server = context.conn.opencl();
            server
                .get_supported_image_formats(context.id, flags, image_type)
                .outcome()
        })();
        let formats = match result {
            Ok(formats) => formats,
            Err(code) => return code,
        };
        if !image_formats.is_null() {
            for (i, f) in formats.iter().take(num_entries as usize).enumerate() {
                // SAFETY: the application provides `num_entries` slots.
                unsafe {
                    *image_formats.add(i) = cl_image_format {
                        image_channel_order: f.channel_order,
                        image_channel_data_type: f.channel_data_type,
                    }
                };
            }
        }
        if !num_image_formats.is_null() {
            // SAFETY: the application's count pointer, checked non-null.
            unsafe { *num_image_formats = formats.len() as cl_uint };
        }
        CL_SUCCESS
    })
}

pub unsafe extern "C" fn clGetImageInfo(
    image: cl_mem,
    param_name: cl_image_info,
    param_value_size: usize,
    param_value: *mut c_void,
    param_value_size_ret: *mut usize,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let mem = match mem_from(image) {
            Ok(m) => m,
            Err(code) => return code,
        };
        let Some(info) = mem.image() else {
            return CL_INVALID_MEM_OBJECT;
        };
        let desc = &info.desc;
        let value = match param_name {
            CL_IMAGE_FORMAT => bytes_of(&cl_image_format {
                image_channel_order: info.format.channel_order,
                image_channel_data_type: info.format.channel_data_type,
            }),
            CL_IMAGE_ELEMENT_SIZE => bytes_of(&info.element_size),
            CL_IMAGE_ROW_PITCH => bytes_of(&info.row_pitch),
            CL_IMAGE_SLICE_PITCH => bytes_of(&info.slice_pitch),
            CL_IMAGE_WIDTH => bytes_of(&(desc.width as usize)),
            CL_IMAGE_HEIGHT => bytes_of(&(desc.height as usize)),
            CL_IMAGE_DEPTH => bytes_of(&(desc.depth as usize)),
            CL_IMAGE_ARRAY_SIZE => bytes_of(&(desc.array_size as usize)),
            CL_IMAGE_BUFFER => bytes_of(&match &info.source {
                Some(source) if source.image().is_none() => handle::raw(source),
                _ => std::ptr::null_mut(),
            }),
            CL_IMAGE_NUM_MIP_LEVELS => bytes_of(&desc.num_mip_levels),
            CL_IMAGE_NUM_SAMPLES => bytes_of(&desc.num_samples),
            _ => return CL_INVALID_VALUE,
        };
        // SAFETY: the application's out-pointers for this query.
        unsafe { write_info(&value, param_value_size, param_value, param_value_size_ret) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format(order: cl_channel_order, data: cl_channel_type) -> ImageFormat {
        ImageFormat {
            channel_order: order,
            channel_data_type: data,
        }
    }

    #[test]
    fn element_sizes() {
        assert_eq!(element_size(&format(CL_RGBA, CL_UNORM_INT8)), Some(4));
        assert_eq!(element_size(&format(CL_RGBA, CL_FLOAT)), Some(16));
        assert_eq!(element_size(&format(CL_R, CL_HALF_FLOAT)), Some(2));
        assert_eq!(element_size(&format(CL_RG, CL_SIGNED_INT32)), Some(8));
        assert_eq!(element_size(&format(CL_RGB, CL_UNORM_SHORT_565)), Some(2));
        assert_eq!(element_size(&format(CL_RGBx, CL_UNORM_INT_101010)), Some(4));
        assert_eq!(element_size(&format(CL_DEPTH, CL_FLOAT)), Some(4));
        assert_eq!(
            element_size(&format(CL_DEPTH_STENCIL, CL_UNORM_INT24)),
            Some(4)
        );
        assert_eq!(element_size(&format(0, CL_FLOAT)), None);
        assert_eq!(element_size(&format(CL_RGBA, 0)), None);
    }

    #[test]
    fn region_bytes() {
        let info = ImageInfo {
            format: format(CL_RGBA, CL_FLOAT),
            desc: ImageDesc {
                image_type: CL_MEM_OBJECT_IMAGE2D,
                width: 8,
                height: 8,
                depth: 0,
                array_size: 0,
                row_pitch: 0,
                slice_pitch: 0,
                num_mip_levels: 0,
                num_samples: 0,
                mem_object: 0,
            },
            element_size: 16,
            row_pitch: 128,
            slice_pitch: 0,
            source: None,
        };
        assert_eq!(image_region_bytes(&info, [3, 2, 1]), 96);
        assert_eq!(image_region_bytes(&info, [usize::MAX, 2, 1]), usize::MAX);
    }

    #[test]
    fn invalid_handles() {
        let null = std::ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: invalid handles are rejected before any pointer is used.
        unsafe {
            assert_eq!(
                clGetImageInfo(null, CL_IMAGE_WIDTH, 0, null, &mut size),
                CL_INVALID_MEM_OBJECT
            );
            let mut err = 0;
            let fmt = cl_image_format {
                image_channel_order: CL_RGBA,
                image_channel_data_type: CL_FLOAT,
            };
            assert!(clCreateImage2D(null, 0, &fmt, 4, 4, 0, null, &mut err).is_null());
            assert_eq!(err, CL_INVALID_CONTEXT);
        }
    }
}
