//! Contexts, and everything made in one: queues, buffers, images, samplers, programs.

use super::*;

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

    /// A buffer whose memory is `size` bytes at `host`, which the caller keeps mapped until
    /// the buffer is destroyed (CL_MEM_USE_HOST_PTR: on a CPU device the buffer is that
    /// memory; a GPU's implementation copies at maps and unmaps). `flags` may say
    /// CL_MEM_ALLOC_HOST_PTR, which this replaces.
    pub fn create_buffer_in(&self, flags: u64, size: usize, host: *mut u8) -> ClResult<Mem> {
        let flags = (flags & !(sys::CL_MEM_ALLOC_HOST_PTR | sys::CL_MEM_COPY_HOST_PTR))
            | sys::CL_MEM_USE_HOST_PTR;
        let mut status = sys::CL_SUCCESS;
        // SAFETY: live context; `host` is `size` bytes the caller keeps mapped for the
        // buffer's life (see above).
        let raw = unsafe {
            cl_call!(
                self.lib,
                clCreateBuffer(self.raw, flags, size, host.cast(), &mut status)
            )
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
