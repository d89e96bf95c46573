//! Programs and kernels.

use super::*;

/// The largest answer of a sub-group query asked at the caller's size (a local size: three
/// `size_t`s; more is an error of the caller's, answered as two queries).
const MAX_SUB_GROUP_ANSWER: u64 = 1024;

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
        output_size: u64,
    ) -> ClResult<Vec<u8>> {
        let device = device.map_or(null_mut(), |d| d.raw());
        let input_ptr: *const c_void = if input.is_empty() {
            null()
        } else {
            input.as_ptr().cast()
        };
        let query = |size, value, size_ret| {
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
        };
        // The caller's size, where it gave one: an answer's length may depend on it (a local
        // size in as many dimensions), and one query is enough. (Sizes are small: the wire
        // caps a frame.)
        if output_size > 0 && output_size <= MAX_SUB_GROUP_ANSWER {
            let mut value = vec![0u8; output_size as usize];
            let mut size_ret = 0usize;
            check(query(value.len(), value.as_mut_ptr().cast(), &mut size_ret))?;
            value.truncate(size_ret.min(value.len()));
            return Ok(value);
        }
        query_info(query).map_err(|e| e.0)
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
