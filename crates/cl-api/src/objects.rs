//! The few OpenCL objects `rgpu devices` and `rgpu bench` use, as owning wrappers over
//! [`NativeOpenCl`] (the ICD loader), so the same code drives local and rgpu devices. All
//! native OpenCL calls of the tools are here.

use std::ffi::CString;
use std::ptr::{null, null_mut};

use crate::native::Device;
use crate::sys::{
    cl_command_queue, cl_context, cl_device_type, cl_kernel, cl_mem, cl_program, CL_DEVICE_NAME,
    CL_FALSE, CL_MEM_READ_WRITE, CL_PLATFORM_NAME, CL_PROGRAM_BUILD_LOG, CL_SUCCESS, CL_TRUE,
};
use crate::{cl_call, native, ClError, NativeOpenCl};

/// A device with the names people pick it by.
#[derive(Clone, Debug)]
pub struct NamedDevice {
    pub platform_name: String,
    pub device: Device,
    pub name: String,
}

/// Every device of every platform, in the loader's order.
pub fn all_devices(
    native: &NativeOpenCl,
    device_type: cl_device_type,
) -> Result<Vec<NamedDevice>, ClError> {
    let mut devices = Vec::new();
    for platform in native.platform_ids()? {
        let platform_name = native.platform_info_string(platform, CL_PLATFORM_NAME)?;
        for device in native.device_ids(platform, device_type)? {
            devices.push(NamedDevice {
                platform_name: platform_name.clone(),
                device,
                name: native.device_info_string(device, CL_DEVICE_NAME)?,
            });
        }
    }
    Ok(devices)
}

fn check_created<T>(handle: *mut T, status: i32) -> Result<*mut T, ClError> {
    if status != CL_SUCCESS {
        return Err(ClError(status));
    }
    if handle.is_null() {
        return Err(ClError(crate::sys::CL_INVALID_OPERATION));
    }
    Ok(handle)
}

pub struct Context<'a> {
    native: &'a NativeOpenCl,
    raw: cl_context,
}

impl<'a> Context<'a> {
    pub fn new(native: &'a NativeOpenCl, device: Device) -> Result<Self, ClError> {
        let raw_device = device.raw();
        let mut status = CL_SUCCESS;
        // SAFETY: one valid device handle; no callback; status is writable.
        let raw = unsafe {
            cl_call!(
                native,
                clCreateContext(null(), 1, &raw_device, None, null_mut(), &mut status)
            )
        };
        Ok(Context {
            native,
            raw: check_created(raw, status)?,
        })
    }
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        // SAFETY: releases the reference this wrapper owns.
        unsafe { cl_call!(self.native, clReleaseContext(self.raw)) };
    }
}

pub struct Buffer<'a> {
    native: &'a NativeOpenCl,
    raw: cl_mem,
    size: usize,
}

impl<'a> Buffer<'a> {
    pub fn new(context: &Context<'a>, size: usize) -> Result<Self, ClError> {
        let mut status = CL_SUCCESS;
        // SAFETY: valid context, no host pointer, status is writable.
        let raw = unsafe {
            cl_call!(
                context.native,
                clCreateBuffer(
                    context.raw,
                    CL_MEM_READ_WRITE,
                    size,
                    null_mut(),
                    &mut status
                )
            )
        };
        Ok(Buffer {
            native: context.native,
            raw: check_created(raw, status)?,
            size,
        })
    }
}

impl Drop for Buffer<'_> {
    fn drop(&mut self) {
        // SAFETY: releases the reference this wrapper owns.
        unsafe { cl_call!(self.native, clReleaseMemObject(self.raw)) };
    }
}

pub struct Kernel<'a> {
    native: &'a NativeOpenCl,
    program: cl_program,
    raw: cl_kernel,
}

impl<'a> Kernel<'a> {
    /// Builds `source` for `device` and creates its kernel `name`. A build failure returns
    /// the build log.
    pub fn build(
        context: &Context<'a>,
        device: Device,
        source: &str,
        name: &str,
    ) -> Result<Self, String> {
        let native = context.native;
        let source = CString::new(source).map_err(|e| e.to_string())?;
        let name = CString::new(name).map_err(|e| e.to_string())?;
        let mut source_ptr = source.as_ptr();
        let mut status = CL_SUCCESS;
        // SAFETY: one NUL-terminated source string (lengths NULL), status is writable; the
        // implementation only reads the string array (opencl-sys declares it *mut).
        let program = unsafe {
            cl_call!(
                native,
                clCreateProgramWithSource(context.raw, 1, &mut source_ptr, null(), &mut status)
            )
        };
        let program = check_created(program, status).map_err(|e| e.to_string())?;
        let raw_device = device.raw();
        // SAFETY: valid program and device; no options, no callback (a blocking build).
        let build_status = unsafe {
            cl_call!(
                native,
                clBuildProgram(program, 1, &raw_device, null(), None, null_mut())
            )
        };
        if build_status != CL_SUCCESS {
            let log = native::query_info(|size, value, size_ret| {
                // SAFETY: query_info passes a buffer of `size` bytes and a valid size_ret.
                unsafe {
                    cl_call!(
                        native,
                        clGetProgramBuildInfo(
                            program,
                            raw_device,
                            CL_PROGRAM_BUILD_LOG,
                            size,
                            value,
                            size_ret
                        )
                    )
                }
            })
            .map(|bytes| crate::params::decode_string(&bytes))
            .unwrap_or_default();
            // SAFETY: releases the program created above.
            unsafe { cl_call!(native, clReleaseProgram(program)) };
            return Err(format!("build failed: {}: {log}", ClError(build_status)));
        }
        // SAFETY: built program, NUL-terminated name, status is writable.
        let kernel =
            unsafe { cl_call!(native, clCreateKernel(program, name.as_ptr(), &mut status)) };
        match check_created(kernel, status) {
            Ok(raw) => Ok(Kernel {
                native,
                program,
                raw,
            }),
            Err(e) => {
                // SAFETY: releases the program created above.
                unsafe { cl_call!(native, clReleaseProgram(program)) };
                Err(e.to_string())
            }
        }
    }
}

impl Drop for Kernel<'_> {
    fn drop(&mut self) {
        // SAFETY: releases the references this wrapper owns.
        unsafe {
            cl_call!(self.native, clReleaseKernel(self.raw));
            cl_call!(self.native, clReleaseProgram(self.program));
        }
    }
}

pub struct Queue<'a> {
    native: &'a NativeOpenCl,
    raw: cl_command_queue,
}

impl<'a> Queue<'a> {
    pub fn new(context: &Context<'a>, device: Device) -> Result<Self, ClError> {
        let mut status = CL_SUCCESS;
        // SAFETY: valid context and device, default properties, status is writable.
        // clCreateCommandQueue (deprecated in 2.0, present everywhere) works on 1.x devices too.
        #[allow(deprecated)]
        let raw = unsafe {
            cl_call!(
                context.native,
                clCreateCommandQueue(context.raw, device.raw(), 0, &mut status)
            )
        };
        Ok(Queue {
            native: context.native,
            raw: check_created(raw, status)?,
        })
    }

    pub fn finish(&self) -> Result<(), ClError> {
        // SAFETY: valid queue.
        ClError::check(unsafe { cl_call!(self.native, clFinish(self.raw)) })
    }

    /// Enqueues `count` non-blocking writes of `data` to the start of `buffer`, then waits for
    /// all of them. Waiting before returning is what keeps `data` borrowed long enough.
    pub fn write_window(&self, buffer: &Buffer, data: &[u8], count: usize) -> Result<(), ClError> {
        assert!(data.len() <= buffer.size);
        self.window(count, || {
            // SAFETY: `data` stays borrowed until the finish in `window` completes every write.
            unsafe {
                cl_call!(
                    self.native,
                    clEnqueueWriteBuffer(
                        self.raw,
                        buffer.raw,
                        CL_FALSE,
                        0,
                        data.len(),
                        data.as_ptr().cast(),
                        0,
                        null(),
                        null_mut()
                    )
                )
            }
        })
    }

    /// Enqueues `count` non-blocking reads of the start of `buffer` into `data`, then waits.
    pub fn read_window(
        &self,
        buffer: &Buffer,
        data: &mut [u8],
        count: usize,
    ) -> Result<(), ClError> {
        assert!(data.len() <= buffer.size);
        let (len, ptr) = (data.len(), data.as_mut_ptr());
        self.window(count, || {
            // SAFETY: `data` stays mutably borrowed until the finish in `window` completes every
            // read; the reads all store the same bytes, so their overlap is harmless.
            unsafe {
                cl_call!(
                    self.native,
                    clEnqueueReadBuffer(
                        self.raw,
                        buffer.raw,
                        CL_FALSE,
                        0,
                        len,
                        ptr.cast(),
                        0,
                        null(),
                        null_mut()
                    )
                )
            }
        })
    }

    /// Runs `enqueue` `count` times (stopping at the first error), then finishes the queue.
    fn window(&self, count: usize, enqueue: impl Fn() -> i32) -> Result<(), ClError> {
        let first_error = (0..count)
            .map(|_| enqueue())
            .find(|&status| status != CL_SUCCESS)
            .map_or(Ok(()), |status| Err(ClError(status)));
        let finished = self.finish();
        first_error.and(finished)
    }

    /// A blocking read of the start of `buffer` into `data`.
    pub fn read_blocking(&self, buffer: &Buffer, data: &mut [u8]) -> Result<(), ClError> {
        assert!(data.len() <= buffer.size);
        // SAFETY: a blocking read completes before returning, while `data` is borrowed.
        ClError::check(unsafe {
            cl_call!(
                self.native,
                clEnqueueReadBuffer(
                    self.raw,
                    buffer.raw,
                    CL_TRUE,
                    0,
                    data.len(),
                    data.as_mut_ptr().cast(),
                    0,
                    null(),
                    null_mut()
                )
            )
        })
    }

    /// Launches a kernel without arguments over `global` work-items.
    pub fn launch(&self, kernel: &Kernel, global: usize) -> Result<(), ClError> {
        // SAFETY: valid queue and kernel; one dimension whose size array outlives the call.
        ClError::check(unsafe {
            cl_call!(
                self.native,
                clEnqueueNDRangeKernel(
                    self.raw,
                    kernel.raw,
                    1,
                    null(),
                    &global,
                    null(),
                    0,
                    null(),
                    null_mut()
                )
            )
        })
    }
}

impl Drop for Queue<'_> {
    fn drop(&mut self) {
        // SAFETY: releases the reference this wrapper owns.
        unsafe { cl_call!(self.native, clReleaseCommandQueue(self.raw)) };
    }
}
