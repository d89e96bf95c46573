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
//!
//! The calls are grouped as the API is: `context` (creation of every object), `queue` (the
//! commands), `memory` (buffers, images, samplers, mappings, pinned host memory), `program`
//! (programs and kernels), `event` (events and the host memory of commands in flight).

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

mod context;
mod event;
mod memory;
mod program;
mod queue;

pub use event::InFlight;

/// Host memory handed by value to a non-blocking command and kept until the command completes
/// (the staging pool's buffers): the command's owner cannot touch or free it meanwhile.
pub trait HostBuffer: Send + 'static {
    /// Bytes the buffer holds.
    fn capacity(&self) -> usize;
    /// Its first byte, for the native call.
    fn as_mut_ptr(&mut self) -> *mut u8;
}
pub use memory::{Mapping, PinnedHost};
pub use queue::QueueDevice;

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
