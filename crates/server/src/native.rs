//! The server's window on the machine's OpenCL: every native call the server makes goes
//! through this module, and it is the only place (with the staging pool's allocator) that holds
//! `unsafe` code.
//!
//! The library itself is loaded by `rgpu-cl-api` ([`NativeOpenCl`]). On top of it this module
//! gives owned, typed handles ([`Context`], [`Queue`], [`Mem`], ...): they can only be made
//! from handles the library returned, are retained by `Clone` and released by `Drop`, so the
//! rest of the server is safe code that cannot pass a dangling or mistyped handle. Host memory
//! that a non-blocking command reads or writes is handed over by value ([`InFlight`]) and only
//! given back once the command has completed.

use std::ffi::{c_void, CString};
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::ptr::{null, null_mut};
use std::sync::{Arc, Mutex};

use rgpu_cl_api::native::query_info;
use rgpu_cl_api::sys::{
    self, cl_buffer_region, cl_command_queue, cl_context, cl_device_id, cl_event, cl_image_desc,
    cl_image_format, cl_int, cl_kernel, cl_mem, cl_program, cl_sampler, cl_uint,
};
use rgpu_cl_api::{cl_call, NativeOpenCl};

/// `pub fn $name(&self, param) -> ClResult<Vec<u8>>`: the two-call clGet*Info pattern for a
/// handle type whose query takes only the handle and the parameter name.
macro_rules! info_query {
    ($(#[$attr:meta])* $name:ident => $entry:ident) => {
        $(#[$attr])*
        pub fn $name(&self, param: u32) -> ClResult<Vec<u8>> {
            query_info(|size, value, size_ret| {
                // SAFETY: a live handle of the type the entry point takes; query_info passes a
                // `size`-byte buffer or NULL.
                unsafe { cl_call!(self.lib, $entry(self.raw, param, size, value, size_ret)) }
            })
            .map_err(|e| e.0)
        }
    };
}

pub use rgpu_cl_api::native::{Device, Platform};

use crate::staging::StagingBuf;

/// An OpenCL call's outcome: the value, or the (negative) status code.
pub type ClResult<T> = Result<T, i32>;

/// Called when a watched event completes (from an OpenCL implementation thread).
pub type Waker = Arc<dyn Fn() + Send + Sync>;

fn check(status: cl_int) -> ClResult<()> {
    if status == sys::CL_SUCCESS {
        Ok(())
    } else {
        Err(status)
    }
}

/// A size from the wire as a host size.
pub fn host_size(value: u64) -> ClResult<usize> {
    usize::try_from(value).map_err(|_| sys::CL_INVALID_VALUE)
}

fn host_sizes<const N: usize>(values: [u64; N]) -> ClResult<[usize; N]> {
    let mut out = [0usize; N];
    for (slot, value) in out.iter_mut().zip(values) {
        *slot = host_size(value)?;
    }
    Ok(out)
}

fn c_string(text: &str) -> ClResult<CString> {
    CString::new(text).map_err(|_| sys::CL_INVALID_VALUE)
}

/// The loaded OpenCL library.
#[derive(Clone)]
pub struct Cl {
    lib: Arc<NativeOpenCl>,
}

impl Cl {
    /// Loads `explicit`, else `RGPU_OPENCL_LIBRARY`, else the system ICD loader.
    pub fn load(explicit: Option<&Path>) -> Result<Cl, String> {
        NativeOpenCl::load(explicit).map(|lib| Cl { lib: Arc::new(lib) })
    }

    pub fn library_path(&self) -> &Path {
        self.lib.library_path()
    }

    pub fn platforms(&self) -> ClResult<Vec<Platform>> {
        self.lib.platform_ids().map_err(|e| e.0)
    }

    pub fn devices(&self, platform: Platform) -> ClResult<Vec<Device>> {
        self.lib
            .device_ids(platform, sys::CL_DEVICE_TYPE_ALL)
            .map_err(|e| e.0)
    }

    pub fn platform_info(&self, platform: Platform, param: u32) -> ClResult<Vec<u8>> {
        self.lib.platform_info(platform, param).map_err(|e| e.0)
    }

    pub fn device_info(&self, device: Device, param: u32) -> ClResult<Vec<u8>> {
        self.lib.device_info(device, param).map_err(|e| e.0)
    }

    /// clCreateContext on `devices` of `platform`, with the platform added to `properties`
    /// (a zero-terminated list of name/value pairs without the platform entry).
    pub fn create_context(
        &self,
        platform: Platform,
        devices: &[Device],
        properties: &[u64],
    ) -> ClResult<Context> {
        let mut props: Vec<sys::cl_context_properties> =
            vec![sys::CL_CONTEXT_PLATFORM, platform.raw() as isize];
        for pair in properties
            .as_chunks::<2>()
            .0
            .iter()
            .take_while(|pair| pair[0] != 0)
        {
            props.extend([pair[0] as isize, pair[1] as isize]);
        }
        props.push(0);
        let raw_devices: Vec<cl_device_id> = devices.iter().map(|d| d.raw()).collect();
        let mut status = sys::CL_SUCCESS;
        // SAFETY: `props` is zero-terminated, `raw_devices` holds `len` device handles from
        // this library, no notification callback is registered, and `status` is writable.
        let raw = unsafe {
            cl_call!(
                self.lib,
                clCreateContext(
                    props.as_ptr(),
                    raw_devices.len() as cl_uint,
                    raw_devices.as_ptr(),
                    None,
                    null_mut(),
                    &mut status,
                )
            )
        };
        Context::adopt(&self.lib, raw, status)
    }
}

/// Defines an owned handle type: created only here from a handle the library returned,
/// retained by Clone, released by Drop.
macro_rules! owned_handle {
    ($(#[$doc:meta])* $name:ident, $raw:ty, $retain:ident, $release:ident) => {
        $(#[$doc])*
        pub struct $name {
            raw: $raw,
            lib: Arc<NativeOpenCl>,
        }

        // SAFETY: OpenCL objects may be used from any thread (every call is thread-safe
        // except clSetKernelArg, which only the owning session's request thread makes).
        unsafe impl Send for $name {}
        // SAFETY: as above.
        unsafe impl Sync for $name {}

        impl $name {
            /// Takes ownership of a handle a creation call returned, or its error.
            fn adopt(lib: &Arc<NativeOpenCl>, raw: $raw, status: cl_int) -> ClResult<$name> {
                if raw.is_null() {
                    return Err(if status == sys::CL_SUCCESS {
                        sys::CL_OUT_OF_HOST_MEMORY
                    } else {
                        status
                    });
                }
                Ok($name { raw, lib: lib.clone() })
            }

            /// The native handle's address: identifies the object in info replies.
            #[allow(dead_code)]
            pub fn addr(&self) -> usize {
                self.raw as usize
            }
        }

        impl Clone for $name {
            fn clone(&self) -> Self {
                // SAFETY: `raw` is a live handle owned by self; retaining it backs the copy.
                unsafe { cl_call!(self.lib, $retain(self.raw)) };
                $name { raw: self.raw, lib: self.lib.clone() }
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: self owns one reference to `raw`, given up here exactly once.
                unsafe { cl_call!(self.lib, $release(self.raw)) };
            }
        }
    };
}

owned_handle!(Context, cl_context, clRetainContext, clReleaseContext);
owned_handle!(
    /// A command queue.
    Queue,
    cl_command_queue,
    clRetainCommandQueue,
    clReleaseCommandQueue
);
owned_handle!(
    /// A buffer, sub-buffer or image.
    Mem,
    cl_mem,
    clRetainMemObject,
    clReleaseMemObject
);
owned_handle!(Sampler, cl_sampler, clRetainSampler, clReleaseSampler);
owned_handle!(Program, cl_program, clRetainProgram, clReleaseProgram);
owned_handle!(Kernel, cl_kernel, clRetainKernel, clReleaseKernel);
owned_handle!(Event, cl_event, clRetainEvent, clReleaseEvent);

/// An image format as the wire carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageFormat {
    pub channel_order: u32,
    pub channel_data_type: u32,
}

/// An image description with host sizes; `mem_object` is the buffer or image it wraps.
pub struct ImageDesc<'a> {
    pub image_type: u32,
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub array_size: usize,
    pub row_pitch: usize,
    pub slice_pitch: usize,
    pub num_mip_levels: u32,
    pub num_samples: u32,
    pub mem_object: Option<&'a Mem>,
}

/// A kernel argument value for clSetKernelArg.
pub enum ArgValue<'a> {
    Bytes(&'a [u8]),
    /// A buffer, image or pipe; `None` for a NULL buffer.
    Mem(Option<&'a Mem>),
    Sampler(&'a Sampler),
    /// A `__local` allocation of this many bytes.
    Local(usize),
}

/// The bytes a pixel of `format` takes, if the format is one this server knows.
pub fn image_element_size(format: ImageFormat) -> Option<usize> {
    let packed = match format.channel_data_type {
        sys::CL_UNORM_SHORT_565 | sys::CL_UNORM_SHORT_555 => Some(2),
        sys::CL_UNORM_INT_101010 | sys::CL_UNORM_INT_101010_2 => Some(4),
        _ => None,
    };
    if packed.is_some() {
        return packed;
    }
    let channel = match format.channel_data_type {
        sys::CL_SNORM_INT8 | sys::CL_UNORM_INT8 | sys::CL_SIGNED_INT8 | sys::CL_UNSIGNED_INT8 => 1,
        sys::CL_SNORM_INT16
        | sys::CL_UNORM_INT16
        | sys::CL_SIGNED_INT16
        | sys::CL_UNSIGNED_INT16
        | sys::CL_HALF_FLOAT => 2,
        sys::CL_SIGNED_INT32 | sys::CL_UNSIGNED_INT32 | sys::CL_FLOAT => 4,
        _ => return None,
    };
    let channels = match format.channel_order {
        sys::CL_R
        | sys::CL_A
        | sys::CL_INTENSITY
        | sys::CL_LUMINANCE
        | sys::CL_DEPTH
        | sys::CL_Rx => 1,
        sys::CL_RG | sys::CL_RA | sys::CL_RGx => 2,
        sys::CL_RGB | sys::CL_RGBx | sys::CL_sRGB | sys::CL_sRGBx => 3,
        sys::CL_RGBA
        | sys::CL_BGRA
        | sys::CL_ARGB
        | sys::CL_ABGR
        | sys::CL_sRGBA
        | sys::CL_sBGRA => 4,
        _ => return None,
    };
    Some(channel * channels)
}

/// Bytes of a tightly packed host copy of a whole image.
pub fn packed_image_size(format: ImageFormat, desc: &ImageDesc<'_>) -> Option<usize> {
    let element = image_element_size(format)?;
    let (h, d, a) = (
        desc.height.max(1),
        desc.depth.max(1),
        desc.array_size.max(1),
    );
    let pixels = match desc.image_type {
        sys::CL_MEM_OBJECT_IMAGE1D | sys::CL_MEM_OBJECT_IMAGE1D_BUFFER => Some(desc.width),
        sys::CL_MEM_OBJECT_IMAGE1D_ARRAY => desc.width.checked_mul(a),
        sys::CL_MEM_OBJECT_IMAGE2D => desc.width.checked_mul(h),
        sys::CL_MEM_OBJECT_IMAGE2D_ARRAY => desc.width.checked_mul(h)?.checked_mul(a),
        sys::CL_MEM_OBJECT_IMAGE3D => desc.width.checked_mul(h)?.checked_mul(d),
        _ => None,
    }?;
    pixels.checked_mul(element)
}

/// Event handles of a wait list, for a native call.
fn raw_events(events: &[&Event]) -> (cl_uint, Vec<cl_event>) {
    let raw: Vec<cl_event> = events.iter().map(|e| e.raw).collect();
    (raw.len() as cl_uint, raw)
}

fn list_ptr(raw: &[cl_event]) -> *const cl_event {
    if raw.is_empty() {
        null()
    } else {
        raw.as_ptr()
    }
}

fn raw_device_list(devices: &[Device]) -> Vec<cl_device_id> {
    devices.iter().map(|d| d.raw()).collect()
}

fn device_list_ptr(raw: &[cl_device_id]) -> *const cl_device_id {
    if raw.is_empty() {
        null()
    } else {
        raw.as_ptr()
    }
}

fn decode_usize(bytes: &[u8]) -> usize {
    rgpu_cl_api::params::decode_unsigned(bytes) as usize
}

impl Context {
    info_query! {
        info => clGetContextInfo
    }

    /// clCreateCommandQueueWithProperties when `with_properties`, else clCreateCommandQueue
    /// with the CL_QUEUE_PROPERTIES value of `properties` (zero-terminated name/value pairs).
    pub fn create_queue(
        &self,
        device: Device,
        properties: &[u64],
        with_properties: bool,
    ) -> ClResult<Queue> {
        let pairs: Vec<(u64, u64)> = properties
            .chunks(2)
            .take_while(|pair| pair.len() == 2 && pair[0] != 0)
            .map(|pair| (pair[0], pair[1]))
            .collect();
        let mut status = sys::CL_SUCCESS;
        let raw = if with_properties && self.lib.api.clCreateCommandQueueWithProperties.is_some() {
            let mut props: Vec<sys::cl_queue_properties> =
                pairs.iter().flat_map(|&(n, v)| [n, v]).collect();
            props.push(0);
            // SAFETY: live context, a device of this library, a zero-terminated list.
            unsafe {
                cl_call!(
                    self.lib,
                    clCreateCommandQueueWithProperties(
                        self.raw,
                        device.raw(),
                        props.as_ptr(),
                        &mut status
                    )
                )
            }
        } else {
            let flags = pairs
                .iter()
                .find(|(name, _)| *name == sys::CL_QUEUE_PROPERTIES as u64)
                .map_or(0, |&(_, value)| value);
            // SAFETY: live context and a device of this library.
            #[allow(deprecated)]
            unsafe {
                cl_call!(
                    self.lib,
                    clCreateCommandQueue(self.raw, device.raw(), flags, &mut status)
                )
            }
        };
        Queue::adopt(&self.lib, raw, status)
    }

    /// A buffer; `host` (at least `size` bytes) is copied in with CL_MEM_COPY_HOST_PTR.
    pub fn create_buffer(
        &self,
        flags: u64,
        size: usize,
        host: Option<&[u8]>,
        properties: &[u64],
    ) -> ClResult<Mem> {
        let (flags, host_ptr) = host_flags(flags, host, size)?;
        let mut status = sys::CL_SUCCESS;
        let with_props = !properties.is_empty()
            && properties[0] != 0
            && self.lib.api.clCreateBufferWithProperties.is_some();
        let raw = if with_props {
            let props = zero_terminated(properties);
            // SAFETY: live context; `host_ptr` is NULL or `size` readable bytes that the
            // implementation copies before returning (COPY_HOST_PTR, never USE_HOST_PTR).
            unsafe {
                cl_call!(
                    self.lib,
                    clCreateBufferWithProperties(
                        self.raw,
                        props.as_ptr(),
                        flags,
                        size,
                        host_ptr,
                        &mut status
                    )
                )
            }
        } else {
            // SAFETY: as above.
            unsafe {
                cl_call!(
                    self.lib,
                    clCreateBuffer(self.raw, flags, size, host_ptr, &mut status)
                )
            }
        };
        Mem::adopt(&self.lib, raw, status)
    }

    /// An image; `host`, tightly packed, is copied in with CL_MEM_COPY_HOST_PTR.
    pub fn create_image(
        &self,
        flags: u64,
        format: ImageFormat,
        desc: &ImageDesc<'_>,
        host: Option<&[u8]>,
        properties: &[u64],
    ) -> ClResult<Mem> {
        let needed = match host {
            Some(_) => {
                packed_image_size(format, desc).ok_or(sys::CL_INVALID_IMAGE_FORMAT_DESCRIPTOR)?
            }
            None => 0,
        };
        let (flags, host_ptr) = host_flags(flags, host, needed)?;
        let native_format = cl_image_format {
            image_channel_order: format.channel_order,
            image_channel_data_type: format.channel_data_type,
        };
        // Host data is tightly packed, so the host pitches must be 0 when it is given.
        let (row_pitch, slice_pitch) = match host {
            Some(_) => (0, 0),
            None => (desc.row_pitch, desc.slice_pitch),
        };
        let native_desc = cl_image_desc {
            image_type: desc.image_type,
            image_width: desc.width,
            image_height: desc.height,
            image_depth: desc.depth,
            image_array_size: desc.array_size,
            image_row_pitch: row_pitch,
            image_slice_pitch: slice_pitch,
            num_mip_levels: desc.num_mip_levels,
            num_samples: desc.num_samples,
            buffer: desc.mem_object.map_or(null_mut(), |m| m.raw),
        };
        let mut status = sys::CL_SUCCESS;
        let with_props = !properties.is_empty()
            && properties[0] != 0
            && self.lib.api.clCreateImageWithProperties.is_some();
        let raw = if with_props {
            let props = zero_terminated(properties);
            // SAFETY: live context; format and desc are valid structs whose `buffer` is NULL
            // or a live mem object; `host_ptr` is NULL or a tightly packed copy of the whole
            // image (size checked above) that the implementation copies before returning.
            unsafe {
                cl_call!(
                    self.lib,
                    clCreateImageWithProperties(
                        self.raw,
                        props.as_ptr(),
                        flags,
                        &native_format,
                        &native_desc,
                        host_ptr,
                        &mut status
                    )
                )
            }
        } else {
            // SAFETY: as above.
            unsafe {
                cl_call!(
                    self.lib,
                    clCreateImage(
                        self.raw,
                        flags,
                        &native_format,
                        &native_desc,
                        host_ptr,
                        &mut status
                    )
                )
            }
        };
        Mem::adopt(&self.lib, raw, status)
    }

    pub fn supported_image_formats(
        &self,
        flags: u64,
        image_type: u32,
    ) -> ClResult<Vec<ImageFormat>> {
        let mut count: cl_uint = 0;
        // SAFETY: live context; NULL output with 0 entries asks only for the count.
        check(unsafe {
            cl_call!(
                self.lib,
                clGetSupportedImageFormats(self.raw, flags, image_type, 0, null_mut(), &mut count)
            )
        })?;
        let empty = cl_image_format {
            image_channel_order: 0,
            image_channel_data_type: 0,
        };
        let mut formats = vec![empty; count as usize];
        if count > 0 {
            // SAFETY: `formats` has room for `count` entries.
            check(unsafe {
                cl_call!(
                    self.lib,
                    clGetSupportedImageFormats(
                        self.raw,
                        flags,
                        image_type,
                        count,
                        formats.as_mut_ptr(),
                        null_mut()
                    )
                )
            })?;
        }
        Ok(formats
            .into_iter()
            .map(|f| ImageFormat {
                channel_order: f.image_channel_order,
                channel_data_type: f.image_channel_data_type,
            })
            .collect())
    }

    /// clCreateSamplerWithProperties, or clCreateSampler from the same properties.
    pub fn create_sampler(&self, properties: &[u64]) -> ClResult<Sampler> {
        let mut status = sys::CL_SUCCESS;
        let props = zero_terminated(properties);
        let raw = if self.lib.api.clCreateSamplerWithProperties.is_some() {
            // SAFETY: live context and a zero-terminated property list.
            unsafe {
                cl_call!(
                    self.lib,
                    clCreateSamplerWithProperties(self.raw, props.as_ptr(), &mut status)
                )
            }
        } else {
            let (mut normalized, mut addressing, mut filter) =
                (1u32, sys::CL_ADDRESS_CLAMP, sys::CL_FILTER_NEAREST);
            for pair in props.chunks(2).take_while(|p| p.len() == 2 && p[0] != 0) {
                match pair[0] as u32 {
                    sys::CL_SAMPLER_NORMALIZED_COORDS => normalized = pair[1] as u32,
                    sys::CL_SAMPLER_ADDRESSING_MODE => addressing = pair[1] as u32,
                    sys::CL_SAMPLER_FILTER_MODE => filter = pair[1] as u32,
                    _ => return Err(sys::CL_INVALID_VALUE),
                }
            }
            // SAFETY: live context; plain enum arguments.
            #[allow(deprecated)]
            unsafe {
                cl_call!(
                    self.lib,
                    clCreateSampler(self.raw, normalized, addressing, filter, &mut status)
                )
            }
        };
        Sampler::adopt(&self.lib, raw, status)
    }

    pub fn create_program_with_source(&self, source: &str) -> ClResult<Program> {
        let text = source.as_ptr().cast::<std::ffi::c_char>();
        let mut strings = [text];
        let lengths = [source.len()];
        let mut status = sys::CL_SUCCESS;
        // SAFETY: one string of the given length (need not be NUL-terminated).
        let raw = unsafe {
            cl_call!(
                self.lib,
                clCreateProgramWithSource(
                    self.raw,
                    1,
                    strings.as_mut_ptr(),
                    lengths.as_ptr(),
                    &mut status
                )
            )
        };
        Program::adopt(&self.lib, raw, status)
    }

    /// Returns the program (or error) and each binary's status.
    pub fn create_program_with_binary(
        &self,
        devices: &[Device],
        binaries: &[Vec<u8>],
    ) -> (ClResult<Program>, Vec<i32>) {
        let mut binary_status = vec![sys::CL_INVALID_VALUE; devices.len()];
        if devices.is_empty() || devices.len() != binaries.len() {
            return (Err(sys::CL_INVALID_VALUE), binary_status);
        }
        if binaries.iter().any(|b| b.is_empty()) {
            return (Err(sys::CL_INVALID_VALUE), binary_status);
        }
        let raw_devices = raw_device_list(devices);
        let lengths: Vec<usize> = binaries.iter().map(|b| b.len()).collect();
        let mut pointers: Vec<*const u8> = binaries.iter().map(|b| b.as_ptr()).collect();
        let mut status = sys::CL_SUCCESS;
        // SAFETY: equal-length arrays of devices, lengths, binary pointers (each binary has its
        // length) and statuses; all outlive the call.
        let raw = unsafe {
            cl_call!(
                self.lib,
                clCreateProgramWithBinary(
                    self.raw,
                    raw_devices.len() as cl_uint,
                    raw_devices.as_ptr(),
                    lengths.as_ptr(),
                    pointers.as_mut_ptr(),
                    binary_status.as_mut_ptr(),
                    &mut status
                )
            )
        };
        (Program::adopt(&self.lib, raw, status), binary_status)
    }

    pub fn create_program_with_il(&self, il: &[u8]) -> ClResult<Program> {
        if il.is_empty() {
            return Err(sys::CL_INVALID_VALUE);
        }
        let mut status = sys::CL_SUCCESS;
        // SAFETY: `il` is `len` readable bytes.
        let raw = unsafe {
            cl_call!(
                self.lib,
                clCreateProgramWithIL(self.raw, il.as_ptr().cast(), il.len(), &mut status)
            )
        };
        Program::adopt(&self.lib, raw, status)
    }

    pub fn create_program_with_built_in_kernels(
        &self,
        devices: &[Device],
        names: &str,
    ) -> ClResult<Program> {
        let names = c_string(names)?;
        let raw_devices = raw_device_list(devices);
        let mut status = sys::CL_SUCCESS;
        // SAFETY: device array of the given length, NUL-terminated names.
        let raw = unsafe {
            cl_call!(
                self.lib,
                clCreateProgramWithBuiltInKernels(
                    self.raw,
                    raw_devices.len() as cl_uint,
                    device_list_ptr(&raw_devices),
                    names.as_ptr(),
                    &mut status
                )
            )
        };
        Program::adopt(&self.lib, raw, status)
    }

    /// clLinkProgram. The implementation may return a program even when linking failed (its
    /// log explains why), so both are returned.
    pub fn link_program(
        &self,
        devices: &[Device],
        options: &str,
        inputs: &[&Program],
    ) -> (Option<Program>, i32) {
        let Ok(options) = c_string(options) else {
            return (None, sys::CL_INVALID_VALUE);
        };
        let raw_devices = raw_device_list(devices);
        let raw_inputs: Vec<cl_program> = inputs.iter().map(|p| p.raw).collect();
        let mut status = sys::CL_SUCCESS;
        // SAFETY: arrays of the given lengths with live handles; no callback, so the call is
        // synchronous.
        let raw = unsafe {
            cl_call!(
                self.lib,
                clLinkProgram(
                    self.raw,
                    raw_devices.len() as cl_uint,
                    device_list_ptr(&raw_devices),
                    options.as_ptr(),
                    raw_inputs.len() as cl_uint,
                    if raw_inputs.is_empty() {
                        null()
                    } else {
                        raw_inputs.as_ptr()
                    },
                    None,
                    null_mut(),
                    &mut status
                )
            )
        };
        match Program::adopt(&self.lib, raw, status) {
            Ok(program) => (Some(program), status),
            Err(e) => (None, e),
        }
    }

    pub fn create_user_event(&self) -> ClResult<Event> {
        let mut status = sys::CL_SUCCESS;
        // SAFETY: live context.
        let raw = unsafe { cl_call!(self.lib, clCreateUserEvent(self.raw, &mut status)) };
        Event::adopt(&self.lib, raw, status)
    }
}

/// The flags and host pointer for a creation with optional initial contents: host data is
/// always copied (a host pointer of the server's must never be kept by the implementation).
fn host_flags(flags: u64, host: Option<&[u8]>, needed: usize) -> ClResult<(u64, *mut c_void)> {
    let host_bits = sys::CL_MEM_USE_HOST_PTR | sys::CL_MEM_COPY_HOST_PTR;
    match host {
        Some(bytes) => {
            if bytes.len() < needed {
                return Err(sys::CL_INVALID_HOST_PTR);
            }
            let flags = (flags & !sys::CL_MEM_USE_HOST_PTR) | sys::CL_MEM_COPY_HOST_PTR;
            Ok((flags, bytes.as_ptr().cast_mut().cast()))
        }
        None if flags & host_bits != 0 => Err(sys::CL_INVALID_HOST_PTR),
        None => Ok((flags, null_mut())),
    }
}

fn zero_terminated(list: &[u64]) -> Vec<u64> {
    let mut out: Vec<u64> = list
        .chunks(2)
        .take_while(|pair| pair.len() == 2 && pair[0] != 0)
        .flatten()
        .copied()
        .collect();
    out.push(0);
    out
}

impl Queue {
    info_query! {
        info => clGetCommandQueueInfo
    }

    pub fn is_out_of_order(&self) -> bool {
        self.info(sys::CL_QUEUE_PROPERTIES).is_ok_and(|bytes| {
            rgpu_cl_api::params::decode_unsigned(&bytes)
                & sys::CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE
                != 0
        })
    }

    pub fn flush(&self) -> ClResult<()> {
        // SAFETY: live queue.
        check(unsafe { cl_call!(self.lib, clFlush(self.raw)) })
    }

    pub fn finish(&self) -> ClResult<()> {
        // SAFETY: live queue.
        check(unsafe { cl_call!(self.lib, clFinish(self.raw)) })
    }

    /// A user event in the queue's context, already set to the (negative) `status`: stands
    /// for a command that failed before it reached the device.
    pub fn failed_event(&self, status: i32) -> ClResult<Event> {
        let bytes = self.info(sys::CL_QUEUE_CONTEXT)?;
        let raw_context = decode_usize(&bytes) as cl_context;
        let mut err = sys::CL_SUCCESS;
        // SAFETY: the queue holds a reference to its context, so the handle is live.
        let raw = unsafe { cl_call!(self.lib, clCreateUserEvent(raw_context, &mut err)) };
        let event = Event::adopt(&self.lib, raw, err)?;
        event.set_user_status(status.min(-1))?;
        Ok(event)
    }

    fn new_event(&self, raw: cl_event, status: cl_int) -> ClResult<Event> {
        check(status)?;
        Event::adopt(&self.lib, raw, status)
    }

    /// Starts a non-blocking write of `len` bytes of `data` to `buffer` at `offset`.
    pub fn write_buffer(
        &self,
        buffer: &Mem,
        offset: usize,
        mut data: StagingBuf,
        len: usize,
        wait: &[&Event],
        waker: Option<Waker>,
    ) -> ClResult<InFlight> {
        if len > data.capacity() {
            return Err(sys::CL_INVALID_VALUE);
        }
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: `data` holds `len` bytes and is moved into the returned InFlight, which keeps
        // it until the command completes; handles are live.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueWriteBuffer(
                    self.raw,
                    buffer.raw,
                    sys::CL_NON_BLOCKING,
                    offset,
                    len,
                    data.as_mut_ptr().cast(),
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        InFlight::start(self.new_event(event, status)?, data, waker)
    }

    /// Starts a non-blocking read of `len` bytes of `buffer` at `offset` into `data`.
    pub fn read_buffer(
        &self,
        buffer: &Mem,
        offset: usize,
        mut data: StagingBuf,
        len: usize,
        wait: &[&Event],
        waker: Option<Waker>,
    ) -> ClResult<InFlight> {
        if len > data.capacity() {
            return Err(sys::CL_INVALID_VALUE);
        }
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: as in write_buffer; the device writes at most `len` bytes into `data`.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueReadBuffer(
                    self.raw,
                    buffer.raw,
                    sys::CL_NON_BLOCKING,
                    offset,
                    len,
                    data.as_mut_ptr().cast(),
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        InFlight::start(self.new_event(event, status)?, data, waker)
    }

    /// Starts a non-blocking rectangular write (read when `read`) between `buffer` and a
    /// tightly packed host region in `data` (row pitch region[0], slice pitch
    /// region[0] * region[1]). `pitches` are the buffer's row and slice pitches.
    #[allow(clippy::too_many_arguments)]
    pub fn transfer_buffer_rect(
        &self,
        read: bool,
        buffer: &Mem,
        origin: [usize; 3],
        region: [usize; 3],
        pitches: [usize; 2],
        mut data: StagingBuf,
        wait: &[&Event],
        waker: Option<Waker>,
    ) -> ClResult<InFlight> {
        let host_row = region[0];
        let host_slice = region[0]
            .checked_mul(region[1])
            .ok_or(sys::CL_INVALID_VALUE)?;
        let needed = host_slice
            .checked_mul(region[2])
            .ok_or(sys::CL_INVALID_VALUE)?;
        if needed > data.capacity() {
            return Err(sys::CL_INVALID_VALUE);
        }
        let host_origin = [0usize; 3];
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        let ptr = data.as_mut_ptr().cast::<c_void>();
        // SAFETY: the host region (tight pitches) spans `needed` <= capacity bytes of `data`,
        // which the returned InFlight keeps until the command completes; arrays have 3 entries.
        let status = unsafe {
            if read {
                cl_call!(
                    self.lib,
                    clEnqueueReadBufferRect(
                        self.raw,
                        buffer.raw,
                        sys::CL_NON_BLOCKING,
                        origin.as_ptr(),
                        host_origin.as_ptr(),
                        region.as_ptr(),
                        pitches[0],
                        pitches[1],
                        host_row,
                        host_slice,
                        ptr,
                        n,
                        list_ptr(&list),
                        &mut event
                    )
                )
            } else {
                cl_call!(
                    self.lib,
                    clEnqueueWriteBufferRect(
                        self.raw,
                        buffer.raw,
                        sys::CL_NON_BLOCKING,
                        origin.as_ptr(),
                        host_origin.as_ptr(),
                        region.as_ptr(),
                        pitches[0],
                        pitches[1],
                        host_row,
                        host_slice,
                        ptr,
                        n,
                        list_ptr(&list),
                        &mut event
                    )
                )
            }
        };
        InFlight::start(self.new_event(event, status)?, data, waker)
    }

    /// Starts a non-blocking image write (read when `read`) between `image` and a tightly
    /// packed host region in `data`.
    #[allow(clippy::too_many_arguments)]
    pub fn transfer_image(
        &self,
        read: bool,
        image: &Mem,
        origin: [usize; 3],
        region: [usize; 3],
        mut data: StagingBuf,
        wait: &[&Event],
        waker: Option<Waker>,
    ) -> ClResult<InFlight> {
        let layout = image.image_layout()?;
        let row = region[0]
            .checked_mul(layout.element_size)
            .ok_or(sys::CL_INVALID_VALUE)?;
        let packed = row
            .checked_mul(region[1])
            .and_then(|v| v.checked_mul(region[2]))
            .ok_or(sys::CL_INVALID_VALUE)?;
        if packed > data.capacity() {
            return Err(sys::CL_INVALID_VALUE);
        }
        // 1D and 2D images take a zero slice pitch; a 1D array steps layers by rows.
        let slice = match layout.image_type {
            sys::CL_MEM_OBJECT_IMAGE1D_ARRAY => row,
            sys::CL_MEM_OBJECT_IMAGE2D_ARRAY | sys::CL_MEM_OBJECT_IMAGE3D => row * region[1],
            _ => 0,
        };
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        let ptr = data.as_mut_ptr().cast::<c_void>();
        // SAFETY: with these pitches the host region spans `packed` <= capacity bytes of
        // `data`, which the InFlight keeps until the command completes.
        let status = unsafe {
            if read {
                cl_call!(
                    self.lib,
                    clEnqueueReadImage(
                        self.raw,
                        image.raw,
                        sys::CL_NON_BLOCKING,
                        origin.as_ptr(),
                        region.as_ptr(),
                        row,
                        slice,
                        ptr,
                        n,
                        list_ptr(&list),
                        &mut event
                    )
                )
            } else {
                cl_call!(
                    self.lib,
                    clEnqueueWriteImage(
                        self.raw,
                        image.raw,
                        sys::CL_NON_BLOCKING,
                        origin.as_ptr(),
                        region.as_ptr(),
                        row,
                        slice,
                        ptr,
                        n,
                        list_ptr(&list),
                        &mut event
                    )
                )
            }
        };
        InFlight::start(self.new_event(event, status)?, data, waker)
    }

    pub fn copy_buffer(
        &self,
        src: &Mem,
        dst: &Mem,
        offsets: [u64; 3],
        wait: &[&Event],
    ) -> ClResult<Event> {
        let [src_offset, dst_offset, size] = host_sizes(offsets)?;
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: live handles; device-side copy only.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueCopyBuffer(
                    self.raw,
                    src.raw,
                    dst.raw,
                    src_offset,
                    dst_offset,
                    size,
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        self.new_event(event, status)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn copy_buffer_rect(
        &self,
        src: &Mem,
        dst: &Mem,
        src_origin: [u64; 3],
        dst_origin: [u64; 3],
        region: [u64; 3],
        pitches: [u64; 4],
        wait: &[&Event],
    ) -> ClResult<Event> {
        let (src_origin, dst_origin, region) = (
            host_sizes(src_origin)?,
            host_sizes(dst_origin)?,
            host_sizes(region)?,
        );
        let pitches = host_sizes(pitches)?;
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: live handles, 3-entry arrays; device-side copy only.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueCopyBufferRect(
                    self.raw,
                    src.raw,
                    dst.raw,
                    src_origin.as_ptr(),
                    dst_origin.as_ptr(),
                    region.as_ptr(),
                    pitches[0],
                    pitches[1],
                    pitches[2],
                    pitches[3],
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        self.new_event(event, status)
    }

    pub fn fill_buffer(
        &self,
        buffer: &Mem,
        pattern: &[u8],
        offset: u64,
        size: u64,
        wait: &[&Event],
    ) -> ClResult<Event> {
        let [offset, size] = host_sizes([offset, size])?;
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: `pattern` is `len` bytes, copied by the implementation at enqueue time.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueFillBuffer(
                    self.raw,
                    buffer.raw,
                    pattern.as_ptr().cast(),
                    pattern.len(),
                    offset,
                    size,
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        self.new_event(event, status)
    }

    pub fn copy_image(
        &self,
        src: &Mem,
        dst: &Mem,
        src_origin: [u64; 3],
        dst_origin: [u64; 3],
        region: [u64; 3],
        wait: &[&Event],
    ) -> ClResult<Event> {
        let (src_origin, dst_origin, region) = (
            host_sizes(src_origin)?,
            host_sizes(dst_origin)?,
            host_sizes(region)?,
        );
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: live handles, 3-entry arrays; device-side copy only.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueCopyImage(
                    self.raw,
                    src.raw,
                    dst.raw,
                    src_origin.as_ptr(),
                    dst_origin.as_ptr(),
                    region.as_ptr(),
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        self.new_event(event, status)
    }

    pub fn fill_image(
        &self,
        image: &Mem,
        color: &[u8; 16],
        origin: [u64; 3],
        region: [u64; 3],
        wait: &[&Event],
    ) -> ClResult<Event> {
        let (origin, region) = (host_sizes(origin)?, host_sizes(region)?);
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: the fill color is at most 16 bytes (a float4/int4/uint4), all readable.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueFillImage(
                    self.raw,
                    image.raw,
                    color.as_ptr().cast(),
                    origin.as_ptr(),
                    region.as_ptr(),
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        self.new_event(event, status)
    }

    pub fn copy_image_to_buffer(
        &self,
        src: &Mem,
        dst: &Mem,
        src_origin: [u64; 3],
        region: [u64; 3],
        dst_offset: u64,
        wait: &[&Event],
    ) -> ClResult<Event> {
        let (src_origin, region) = (host_sizes(src_origin)?, host_sizes(region)?);
        let dst_offset = host_size(dst_offset)?;
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: live handles, 3-entry arrays; device-side copy only.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueCopyImageToBuffer(
                    self.raw,
                    src.raw,
                    dst.raw,
                    src_origin.as_ptr(),
                    region.as_ptr(),
                    dst_offset,
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        self.new_event(event, status)
    }

    pub fn copy_buffer_to_image(
        &self,
        src: &Mem,
        dst: &Mem,
        src_offset: u64,
        dst_origin: [u64; 3],
        region: [u64; 3],
        wait: &[&Event],
    ) -> ClResult<Event> {
        let (dst_origin, region) = (host_sizes(dst_origin)?, host_sizes(region)?);
        let src_offset = host_size(src_offset)?;
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: live handles, 3-entry arrays; device-side copy only.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueCopyBufferToImage(
                    self.raw,
                    src.raw,
                    dst.raw,
                    src_offset,
                    dst_origin.as_ptr(),
                    region.as_ptr(),
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        self.new_event(event, status)
    }

    /// clEnqueueNDRangeKernel. Each given array must have `work_dim` (1..=3) entries.
    pub fn nd_range(
        &self,
        kernel: &Kernel,
        work_dim: u32,
        offset: Option<&[u64]>,
        global: &[u64],
        local: Option<&[u64]>,
        wait: &[&Event],
    ) -> ClResult<Event> {
        let dims = work_dim as usize;
        if !(1..=3).contains(&dims) {
            return Err(sys::CL_INVALID_WORK_DIMENSION);
        }
        let convert = |values: &[u64], error: i32| -> ClResult<Vec<usize>> {
            if values.len() != dims {
                return Err(error);
            }
            values.iter().map(|&v| host_size(v)).collect()
        };
        let global = convert(global, sys::CL_INVALID_GLOBAL_WORK_SIZE)?;
        let offset = offset
            .map(|o| convert(o, sys::CL_INVALID_GLOBAL_OFFSET))
            .transpose()?;
        let local = local
            .map(|l| convert(l, sys::CL_INVALID_WORK_GROUP_SIZE))
            .transpose()?;
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: every array has exactly `work_dim` entries (checked above); live handles.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueNDRangeKernel(
                    self.raw,
                    kernel.raw,
                    work_dim,
                    offset.as_ref().map_or(null(), |o| o.as_ptr()),
                    global.as_ptr(),
                    local.as_ref().map_or(null(), |l| l.as_ptr()),
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        self.new_event(event, status)
    }

    pub fn marker(&self, wait: &[&Event]) -> ClResult<Event> {
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: live handles.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueMarkerWithWaitList(self.raw, n, list_ptr(&list), &mut event)
            )
        };
        self.new_event(event, status)
    }

    pub fn barrier(&self, wait: &[&Event]) -> ClResult<Event> {
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: live handles.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueBarrierWithWaitList(self.raw, n, list_ptr(&list), &mut event)
            )
        };
        self.new_event(event, status)
    }

    pub fn migrate(&self, objects: &[&Mem], flags: u64, wait: &[&Event]) -> ClResult<Event> {
        let raw_objects: Vec<cl_mem> = objects.iter().map(|m| m.raw).collect();
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: an array of `len` live mem handles.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueMigrateMemObjects(
                    self.raw,
                    raw_objects.len() as cl_uint,
                    if raw_objects.is_empty() {
                        null()
                    } else {
                        raw_objects.as_ptr()
                    },
                    flags,
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        self.new_event(event, status)
    }
}

/// What image transfers need to know about an image.
pub struct ImageLayout {
    pub element_size: usize,
    pub image_type: u32,
}

impl Mem {
    info_query! {
        info => clGetMemObjectInfo
    }

    info_query! {
        image_info => clGetImageInfo
    }

    pub fn image_layout(&self) -> ClResult<ImageLayout> {
        let element_size = decode_usize(&self.image_info(sys::CL_IMAGE_ELEMENT_SIZE)?);
        let image_type = decode_usize(&self.info(sys::CL_MEM_TYPE)?) as u32;
        if element_size == 0 {
            return Err(sys::CL_INVALID_MEM_OBJECT);
        }
        Ok(ImageLayout {
            element_size,
            image_type,
        })
    }

    pub fn create_sub_buffer(&self, flags: u64, origin: u64, size: u64) -> ClResult<Mem> {
        let region = cl_buffer_region {
            origin: host_size(origin)?,
            size: host_size(size)?,
        };
        let mut status = sys::CL_SUCCESS;
        // SAFETY: live buffer; the region struct is what CL_BUFFER_CREATE_TYPE_REGION takes.
        let raw = unsafe {
            cl_call!(
                self.lib,
                clCreateSubBuffer(
                    self.raw,
                    flags,
                    sys::CL_BUFFER_CREATE_TYPE_REGION,
                    (&region as *const cl_buffer_region).cast(),
                    &mut status
                )
            )
        };
        Mem::adopt(&self.lib, raw, status)
    }
}

impl Sampler {
    info_query! {
        info => clGetSamplerInfo
    }
}

impl Program {
    pub fn info(&self, param: u32) -> ClResult<Vec<u8>> {
        if param == sys::CL_PROGRAM_BINARIES {
            return self.binaries();
        }
        query_info(|size, value, size_ret| {
            // SAFETY: live program; query_info passes a `size`-byte buffer or NULL.
            unsafe {
                cl_call!(
                    self.lib,
                    clGetProgramInfo(self.raw, param, size, value, size_ret)
                )
            }
        })
        .map_err(|e| e.0)
    }

    /// All binaries concatenated in the order of CL_PROGRAM_DEVICES.
    fn binaries(&self) -> ClResult<Vec<u8>> {
        let sizes: Vec<usize> = self
            .info(sys::CL_PROGRAM_BINARY_SIZES)?
            .as_chunks::<{ std::mem::size_of::<usize>() }>()
            .0
            .iter()
            .map(|word| decode_usize(word))
            .collect();
        let mut binaries: Vec<Vec<u8>> = sizes.iter().map(|&s| vec![0u8; s]).collect();
        let mut pointers: Vec<*mut u8> = binaries
            .iter_mut()
            .map(|b| {
                if b.is_empty() {
                    null_mut()
                } else {
                    b.as_mut_ptr()
                }
            })
            .collect();
        // SAFETY: one pointer per device, each to a buffer of that device's binary size (NULL
        // for an empty one, which the implementation skips).
        check(unsafe {
            cl_call!(
                self.lib,
                clGetProgramInfo(
                    self.raw,
                    sys::CL_PROGRAM_BINARIES,
                    pointers.len() * std::mem::size_of::<*mut u8>(),
                    pointers.as_mut_ptr().cast(),
                    null_mut()
                )
            )
        })?;
        Ok(binaries.concat())
    }

    pub fn build_info(&self, device: Device, param: u32) -> ClResult<Vec<u8>> {
        query_info(|size, value, size_ret| {
            // SAFETY: live program, a device of this library; `size`-byte buffer or NULL.
            unsafe {
                cl_call!(
                    self.lib,
                    clGetProgramBuildInfo(self.raw, device.raw(), param, size, value, size_ret)
                )
            }
        })
        .map_err(|e| e.0)
    }

    pub fn build(&self, devices: &[Device], options: &str) -> ClResult<()> {
        let options = c_string(options)?;
        let raw_devices = raw_device_list(devices);
        // SAFETY: device array of the given length; no callback, so the build is synchronous.
        check(unsafe {
            cl_call!(
                self.lib,
                clBuildProgram(
                    self.raw,
                    raw_devices.len() as cl_uint,
                    device_list_ptr(&raw_devices),
                    options.as_ptr(),
                    None,
                    null_mut()
                )
            )
        })
    }

    pub fn compile(
        &self,
        devices: &[Device],
        options: &str,
        headers: &[(&Program, &str)],
    ) -> ClResult<()> {
        let options = c_string(options)?;
        let raw_devices = raw_device_list(devices);
        let names: Vec<CString> = headers
            .iter()
            .map(|(_, name)| c_string(name))
            .collect::<ClResult<_>>()?;
        let name_ptrs: Vec<*const std::ffi::c_char> = names.iter().map(|n| n.as_ptr()).collect();
        let programs: Vec<cl_program> = headers.iter().map(|(p, _)| p.raw).collect();
        // SAFETY: equal-length arrays of live header programs and NUL-terminated names; no
        // callback, so the compile is synchronous.
        check(unsafe {
            cl_call!(
                self.lib,
                clCompileProgram(
                    self.raw,
                    raw_devices.len() as cl_uint,
                    device_list_ptr(&raw_devices),
                    options.as_ptr(),
                    programs.len() as cl_uint,
                    if programs.is_empty() {
                        null()
                    } else {
                        programs.as_ptr()
                    },
                    if name_ptrs.is_empty() {
                        null_mut()
                    } else {
                        name_ptrs.as_ptr().cast_mut()
                    },
                    None,
                    null_mut()
                )
            )
        })
    }

    pub fn create_kernel(&self, name: &str) -> ClResult<Kernel> {
        let name = c_string(name)?;
        let mut status = sys::CL_SUCCESS;
        // SAFETY: live program, NUL-terminated name.
        let raw = unsafe {
            cl_call!(
                self.lib,
                clCreateKernel(self.raw, name.as_ptr(), &mut status)
            )
        };
        Kernel::adopt(&self.lib, raw, status)
    }

    /// Every kernel of the program, in the implementation's order.
    pub fn create_all_kernels(&self) -> ClResult<Vec<Kernel>> {
        let mut count: cl_uint = 0;
        // SAFETY: NULL output with 0 entries asks only for the count.
        check(unsafe {
            cl_call!(
                self.lib,
                clCreateKernelsInProgram(self.raw, 0, null_mut(), &mut count)
            )
        })?;
        let mut raw = vec![null_mut(); count as usize];
        if count > 0 {
            // SAFETY: `raw` has room for `count` kernels.
            check(unsafe {
                cl_call!(
                    self.lib,
                    clCreateKernelsInProgram(self.raw, count, raw.as_mut_ptr(), null_mut())
                )
            })?;
        }
        raw.into_iter()
            .map(|k| Kernel::adopt(&self.lib, k, sys::CL_SUCCESS))
            .collect()
    }
}

impl Kernel {
    info_query! {
        info => clGetKernelInfo
    }

    pub fn work_group_info(&self, device: Option<Device>, param: u32) -> ClResult<Vec<u8>> {
        let device = device.map_or(null_mut(), |d| d.raw());
        query_info(|size, value, size_ret| {
            // SAFETY: live kernel; device NULL or of this library; `size` bytes or NULL.
            unsafe {
                cl_call!(
                    self.lib,
                    clGetKernelWorkGroupInfo(self.raw, device, param, size, value, size_ret)
                )
            }
        })
        .map_err(|e| e.0)
    }

    pub fn arg_info(&self, index: u32, param: u32) -> ClResult<Vec<u8>> {
        query_info(|size, value, size_ret| {
            // SAFETY: live kernel; `size` bytes or NULL.
            unsafe {
                cl_call!(
                    self.lib,
                    clGetKernelArgInfo(self.raw, index, param, size, value, size_ret)
                )
            }
        })
        .map_err(|e| e.0)
    }

    pub fn sub_group_info(
        &self,
        device: Option<Device>,
        param: u32,
        input: &[u8],
    ) -> ClResult<Vec<u8>> {
        let device = device.map_or(null_mut(), |d| d.raw());
        let input_ptr: *const c_void = if input.is_empty() {
            null()
        } else {
            input.as_ptr().cast()
        };
        query_info(|size, value, size_ret| {
            // SAFETY: live kernel; `input` is `len` readable bytes; `size` bytes or NULL.
            unsafe {
                cl_call!(
                    self.lib,
                    clGetKernelSubGroupInfo(
                        self.raw,
                        device,
                        param,
                        input.len(),
                        input_ptr,
                        size,
                        value,
                        size_ret
                    )
                )
            }
        })
        .map_err(|e| e.0)
    }

    pub fn clone_kernel(&self) -> ClResult<Kernel> {
        let mut status = sys::CL_SUCCESS;
        // SAFETY: live kernel.
        let raw = unsafe { cl_call!(self.lib, clCloneKernel(self.raw, &mut status)) };
        Kernel::adopt(&self.lib, raw, status)
    }

    /// clSetKernelArg. Only the session's request thread calls this for a given kernel.
    pub fn set_arg(&self, index: u32, value: ArgValue<'_>) -> ClResult<()> {
        let null_mem: cl_mem = null_mut();
        let handle: cl_mem;
        let sampler: cl_sampler;
        let (size, ptr): (usize, *const c_void) = match value {
            ArgValue::Bytes(bytes) => (
                bytes.len(),
                if bytes.is_empty() {
                    null()
                } else {
                    bytes.as_ptr().cast()
                },
            ),
            ArgValue::Mem(Some(mem)) => {
                handle = mem.raw;
                (
                    std::mem::size_of::<cl_mem>(),
                    (&handle as *const cl_mem).cast(),
                )
            }
            ArgValue::Mem(None) => (
                std::mem::size_of::<cl_mem>(),
                (&null_mem as *const cl_mem).cast(),
            ),
            ArgValue::Sampler(s) => {
                sampler = s.raw;
                (
                    std::mem::size_of::<cl_sampler>(),
                    (&sampler as *const cl_sampler).cast(),
                )
            }
            ArgValue::Local(bytes) => (bytes, null()),
        };
        // SAFETY: `ptr` is NULL or points to `size` readable bytes (the argument value, or a
        // live handle); the implementation copies the value before returning.
        check(unsafe { cl_call!(self.lib, clSetKernelArg(self.raw, index, size, ptr)) })
    }
}

type EventCallback = Box<dyn FnOnce(i32) + Send>;

/// Called by the OpenCL implementation for a callback registered in [`Event::on_status`].
unsafe extern "C" fn event_trampoline(_event: cl_event, status: cl_int, user_data: *mut c_void) {
    // SAFETY: `user_data` is the Box<EventCallback> leaked by on_status, and the
    // implementation calls each registered callback exactly once, so it is reclaimed once.
    let callback = unsafe { Box::from_raw(user_data.cast::<EventCallback>()) };
    // A panic must not unwind into the C caller.
    let _ = std::panic::catch_unwind(AssertUnwindSafe(move || callback(status)));
}

impl Event {
    info_query! {
        info => clGetEventInfo
    }

    info_query! {
        profiling_info => clGetEventProfilingInfo
    }

    /// CL_EVENT_COMMAND_EXECUTION_STATUS (CL_COMPLETE = 0, negative when it failed).
    pub fn status(&self) -> ClResult<i32> {
        let bytes = self.info(sys::CL_EVENT_COMMAND_EXECUTION_STATUS)?;
        Ok(rgpu_cl_api::params::decode_unsigned(&bytes) as u32 as i32)
    }

    pub fn set_user_status(&self, status: i32) -> ClResult<()> {
        // SAFETY: live event (the implementation rejects a non-user event).
        check(unsafe { cl_call!(self.lib, clSetUserEventStatus(self.raw, status)) })
    }

    /// Flushes the queue the event's command was enqueued on, so that a callback or wait on
    /// it can make progress (no-op for user events).
    pub fn flush_queue(&self) {
        let Ok(bytes) = self.info(sys::CL_EVENT_COMMAND_QUEUE) else {
            return;
        };
        let raw_queue = decode_usize(&bytes) as cl_command_queue;
        if !raw_queue.is_null() {
            // SAFETY: an event holds a reference to its queue, so the handle is live.
            unsafe { cl_call!(self.lib, clFlush(raw_queue)) };
        }
    }

    /// Waits until the event completed or failed. Where cores are plentiful it polls the
    /// status for a short while first: implementations often sleep in clWaitForEvents and
    /// wake tens of microseconds after the device finished, which a small synchronous call
    /// would pay in full. On a machine with few cores polling would take a core from the
    /// implementation's own threads (a CPU device runs on them), so it just waits.
    pub fn wait_fast(&self) {
        static SPIN: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
        let spin = *SPIN.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            std::time::Duration::from_micros(if cores >= 8 { 100 } else { 0 })
        });
        let start = std::time::Instant::now();
        while start.elapsed() < spin {
            match self.status() {
                Ok(status) if status > sys::CL_COMPLETE => std::hint::spin_loop(),
                _ => return,
            }
        }
        let _ = Event::wait_all(&[self]);
    }

    /// Blocks until every event is complete; CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST if
    /// one failed.
    pub fn wait_all(events: &[&Event]) -> ClResult<()> {
        let Some(first) = events.first() else {
            return Err(sys::CL_INVALID_VALUE);
        };
        let (n, list) = raw_events(events);
        // SAFETY: an array of `n` live events.
        check(unsafe { cl_call!(first.lib, clWaitForEvents(n, list.as_ptr())) })
    }

    /// Runs `callback` with the event's status once it reaches `callback_type` (CL_COMPLETE,
    /// CL_RUNNING or CL_SUBMITTED) or fails. The callback runs on an implementation thread.
    pub fn on_status(&self, callback_type: i32, callback: EventCallback) -> ClResult<()> {
        let user_data = Box::into_raw(Box::new(callback));
        // SAFETY: live event; the trampoline reclaims `user_data` when called.
        let status = unsafe {
            cl_call!(
                self.lib,
                clSetEventCallback(
                    self.raw,
                    callback_type,
                    Some(event_trampoline),
                    user_data.cast()
                )
            )
        };
        if status != sys::CL_SUCCESS {
            // SAFETY: registration failed, so the implementation never saw `user_data`.
            drop(unsafe { Box::from_raw(user_data) });
            return Err(status);
        }
        Ok(())
    }
}

struct TransferState {
    /// The command's final status once its completion callback ran.
    status: Option<i32>,
    buf: Option<StagingBuf>,
    /// Drop the buffer (back to its pool) as soon as the command completes.
    recycle_on_complete: bool,
}

/// A non-blocking transfer between staging memory and the device. Owns the staging buffer
/// until the command completes: dropping an InFlight early hands the buffer to the completion
/// callback instead of freeing memory the device may still use.
pub struct InFlight {
    event: Event,
    state: Arc<Mutex<TransferState>>,
}

fn lock(state: &Mutex<TransferState>) -> std::sync::MutexGuard<'_, TransferState> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl InFlight {
    fn start(event: Event, buf: StagingBuf, waker: Option<Waker>) -> ClResult<InFlight> {
        let state = Arc::new(Mutex::new(TransferState {
            status: None,
            buf: Some(buf),
            recycle_on_complete: false,
        }));
        let shared = state.clone();
        let wake = waker.clone();
        let registered = event.on_status(
            sys::CL_COMPLETE,
            Box::new(move |status| {
                let mut s = lock(&shared);
                s.status = Some(status);
                if s.recycle_on_complete {
                    s.buf = None;
                }
                drop(s);
                if let Some(wake) = wake {
                    wake();
                }
            }),
        );
        if registered.is_err() {
            // No callback: wait here so the buffer is never released early.
            let status = match Event::wait_all(&[&event]) {
                Ok(()) => event.status().unwrap_or(sys::CL_COMPLETE),
                Err(e) => e,
            };
            lock(&state).status = Some(status);
            if let Some(wake) = waker {
                wake();
            }
        }
        Ok(InFlight { event, state })
    }

    pub fn event(&self) -> &Event {
        &self.event
    }

    /// Once the command has completed: its status and the staging buffer (with the data, for
    /// a read). `None` while it is still running.
    pub fn take_if_complete(&self) -> Option<(i32, Option<StagingBuf>)> {
        let mut s = lock(&self.state);
        // The callback may come well after the command completed; the event's status tells
        // sooner. Once complete, the device no longer uses the buffer.
        let status = match s.status {
            Some(status) => status,
            None => self
                .event
                .status()
                .ok()
                .filter(|&st| st <= sys::CL_COMPLETE)?,
        };
        // The callback's status may say CL_COMPLETE for a failed command on some
        // implementations; the event's recorded status tells.
        let status = status.min(self.event.status().unwrap_or(status));
        Some((status, s.buf.take()))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = lock(&self.state);
        if s.status.is_some() {
            s.buf = None;
        } else {
            s.recycle_on_complete = true;
        }
    }
}

/// What the device behind a queue is, for choosing how bulk data reaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueDevice {
    /// The context's handle address: identifies the context (pinned staging is per context).
    pub context: usize,
    /// A CPU device: its buffers live in host memory, so mapping them costs no copy.
    pub cpu: bool,
}

impl Queue {
    /// The queue's context and whether its device is a CPU.
    pub fn device(&self) -> ClResult<QueueDevice> {
        let context = decode_usize(&self.info(sys::CL_QUEUE_CONTEXT)?);
        let raw_device = decode_usize(&self.info(sys::CL_QUEUE_DEVICE)?) as cl_device_id;
        let bytes = query_info(|size, value, size_ret| {
            // SAFETY: the queue holds a reference to its device, so the handle is live;
            // query_info passes a `size`-byte buffer or NULL.
            unsafe {
                cl_call!(
                    self.lib,
                    clGetDeviceInfo(raw_device, sys::CL_DEVICE_TYPE, size, value, size_ret)
                )
            }
        })
        .map_err(|e| e.0)?;
        let device_type = rgpu_cl_api::params::decode_unsigned(&bytes);
        Ok(QueueDevice {
            context,
            cpu: device_type & sys::CL_DEVICE_TYPE_CPU != 0,
        })
    }

    /// Maps `len` bytes of `buffer` at `offset` (for writing the whole range when `write`,
    /// which spares the implementation reading it first; else for reading) once the commands
    /// before it and `wait` are done, and waits until the mapping is there. On a CPU device the
    /// mapping is the buffer's own memory, so data received into it or sent from it is never
    /// copied.
    pub fn map_buffer(
        &self,
        buffer: &Mem,
        write: bool,
        offset: usize,
        len: usize,
        wait: &[&Event],
    ) -> ClResult<Mapping> {
        let flags = if write {
            sys::CL_MAP_WRITE_INVALIDATE_REGION
        } else {
            sys::CL_MAP_READ
        };
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        let mut status = sys::CL_SUCCESS;
        // SAFETY: live handles; the implementation checks the range against the buffer.
        let ptr = unsafe {
            cl_call!(
                self.lib,
                clEnqueueMapBuffer(
                    self.raw,
                    buffer.raw,
                    sys::CL_NON_BLOCKING,
                    flags,
                    offset,
                    len,
                    n,
                    list_ptr(&list),
                    &mut event,
                    &mut status
                )
            )
        };
        let event = self.new_event(event, status)?;
        if ptr.is_null() {
            return Err(sys::CL_MAP_FAILURE);
        }
        let mapping = Mapping {
            queue: self.clone(),
            mem: buffer.clone(),
            ptr: ptr.cast(),
            len,
            unmapped: false,
        };
        self.flush()?;
        event.wait_fast();
        match event.status() {
            // Dropping the mapping unmaps it.
            Ok(status) if status < 0 => Err(status),
            Err(e) => Err(e),
            Ok(_) => Ok(mapping),
        }
    }
}

/// A mapped range of a buffer, unmapped when dropped (or by [`Mapping::unmap`]).
pub struct Mapping {
    queue: Queue,
    mem: Mem,
    ptr: *mut u8,
    len: usize,
    unmapped: bool,
}

impl Mapping {
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the map command completed, so `ptr` points to `len` bytes of host-accessible
        // memory that stay valid until the unmap, which needs `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Enqueues the unmap; its event completes once the device sees what was written.
    pub fn unmap(mut self) -> ClResult<Event> {
        self.unmapped = true;
        let mut event = null_mut();
        // SAFETY: `ptr` was returned by clEnqueueMapBuffer of `mem` and not unmapped yet.
        let status = unsafe {
            cl_call!(
                self.queue.lib,
                clEnqueueUnmapMemObject(
                    self.queue.raw,
                    self.mem.raw,
                    self.ptr.cast(),
                    0,
                    null(),
                    &mut event
                )
            )
        };
        self.queue.new_event(event, status)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if !self.unmapped {
            // SAFETY: as in unmap.
            unsafe {
                cl_call!(
                    self.queue.lib,
                    clEnqueueUnmapMemObject(
                        self.queue.raw,
                        self.mem.raw,
                        self.ptr.cast(),
                        0,
                        null(),
                        null_mut()
                    )
                )
            };
            let _ = self.queue.flush();
        }
    }
}

/// Host memory the implementation allocated for a buffer of its own (CL_MEM_ALLOC_HOST_PTR)
/// and mapped once for good: NVIDIA pins such memory, so device copies from and to it run
/// by DMA at full speed instead of through the driver's own bounce buffers.
pub struct PinnedHost {
    queue: Queue,
    mem: Mem,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned exclusively (like a Box<[u8]>); the handles are thread-safe.
unsafe impl Send for PinnedHost {}
// SAFETY: shared access only reads the memory.
unsafe impl Sync for PinnedHost {}

impl PinnedHost {
    /// `len` bytes of pinned host memory for transfers on `queue`'s device.
    pub fn new(queue: &Queue, len: usize) -> ClResult<PinnedHost> {
        let raw_context = decode_usize(&queue.info(sys::CL_QUEUE_CONTEXT)?) as cl_context;
        let mut status = sys::CL_SUCCESS;
        // SAFETY: the queue holds a reference to its context, so the handle is live.
        let raw = unsafe {
            cl_call!(
                queue.lib,
                clCreateBuffer(
                    raw_context,
                    sys::CL_MEM_READ_WRITE | sys::CL_MEM_ALLOC_HOST_PTR,
                    len,
                    null_mut(),
                    &mut status
                )
            )
        };
        let mem = Mem::adopt(&queue.lib, raw, status)?;
        // The mapping is made on the client's queue, but the buffer is private: nothing else
        // ever waits for or touches it.
        let mut mapping = queue.map_buffer(&mem, true, 0, len, &[])?;
        mapping.unmapped = true;
        Ok(PinnedHost {
            queue: queue.clone(),
            mem,
            ptr: mapping.ptr,
            len,
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        // SAFETY: `ptr` is the live mapping of `mem` made in new.
        unsafe {
            cl_call!(
                self.queue.lib,
                clEnqueueUnmapMemObject(
                    self.queue.raw,
                    self.mem.raw,
                    self.ptr.cast(),
                    0,
                    null(),
                    null_mut()
                )
            )
        };
        let _ = self.queue.flush();
    }
}
