//! Modules and libraries (images kept by hash across sessions: a client sends a large one only
//! when the server lacks it), their functions, kernels and globals, and function attributes.

use std::ffi::CString;
use std::ptr::null_mut;
use std::sync::Arc;

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::generated::{func_cache, function_attribute, FUNCTION_ATTRIBUTE_VALUES};
use rgpu_cuda_api::native::{check, Status, INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED, SUCCESS};
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{serve, Answer, FunctionInfo, Global, Id, ImageKind, Loaded};
use sha2::{Digest, Sha256};

use super::owned::{self, Owned};
use super::session::{CudaSession, Function, Image, ImageHandle, Served, MAX_IMAGE_BYTES};
use crate::session::End;

impl serve::Modules for Served<'_> {
    fn load_image(
        &mut self,
        id: Id,
        ctx: Id,
        kind: ImageKind,
        hash: [u8; 32],
        bulk_len: u64,
    ) -> Result<Loaded, End> {
        let cuda = &mut *self.cuda;
        let bytes = if bulk_len == 0 {
            match cuda.backend.image(&hash) {
                Some(bytes) => bytes,
                None => {
                    return Ok(Loaded {
                        status: SUCCESS,
                        need_image: true,
                        log: String::new(),
                    })
                }
            }
        } else {
            if bulk_len > MAX_IMAGE_BYTES {
                return Err(End::Protocol(format!("a {bulk_len}-byte module image")));
            }
            let mut bytes = vec![0u8; bulk_len as usize];
            self.session.take_bulk(&mut bytes)?;
            if Sha256::digest(&bytes).as_slice() != hash {
                return Err(End::Protocol("module image does not match its hash".into()));
            }
            let bytes = Arc::new(bytes);
            cuda.backend.keep_image(hash, bytes.clone());
            bytes
        };
        Ok(Loaded {
            status: cuda.load_image(id, ctx, kind, bytes),
            need_image: false,
            log: String::new(),
        })
    }

    fn unload_image(&mut self, id: Id) -> Answer<()> {
        check(self.cuda.unload_image(id))
    }

    fn get_function(&mut self, id: Id, image: Id, name: String) -> Answer<FunctionInfo> {
        self.cuda.get_function(id, image, &name)
    }

    fn kernel_get_function(&mut self, id: Id, kernel: Id, ctx: Id) -> Answer<FunctionInfo> {
        self.cuda.kernel_get_function(id, kernel, ctx)
    }

    fn get_global(&mut self, ctx: Id, image: Id, name: String) -> Answer<Global> {
        let found = self.cuda.get_global(ctx, image, &name);
        found.map(|(ptr, size)| Global { ptr, size })
    }

    fn set_function_attribute(
        &mut self,
        function: Id,
        attribute: u32,
        value: i32,
        device: u32,
    ) -> Status {
        self.cuda
            .set_function_attribute(function, attribute, value, device)
    }

    fn get_function_attribute(&mut self, function: Id, attribute: u32, device: u32) -> Answer<i32> {
        let cuda = &*self.cuda;
        cuda.function(function)
            .and_then(|f| function_attribute_raw(&cuda.backend.driver, f, attribute, device))
    }

    fn set_function_cache_config(&mut self, function: Id, config: u32) -> Answer<()> {
        let cuda = &*self.cuda;
        match (cuda.function(function), func_cache(config)) {
            (Ok(f), Some(config)) if !f.is_kernel => {
                // SAFETY: a function of this session and a valid cache config.
                check(unsafe { cu_call!(cuda.backend.driver, cuFuncSetCacheConfig(f.raw, config)) })
            }
            _ => Ok(()),
        }
    }
}

impl CudaSession {
    fn load_image(&mut self, id: Id, ctx: Id, kind: ImageKind, bytes: Arc<Vec<u8>>) -> Status {
        if let Err(status) = self.enter(ctx) {
            return status;
        }
        let driver = &self.backend.driver;
        let code = bytes.as_ptr().cast();
        let handle = match kind {
            ImageKind::Module => {
                let mut module = null_mut();
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                let status = unsafe { cu_call!(driver, cuModuleLoadData(&mut module, code)) };
                if status != SUCCESS {
                    return status;
                }
                ImageHandle::Module(owned::Module::new(module, self.current, &self.backend))
            }
            ImageKind::Library => {
                let mut library = null_mut();
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                let status = unsafe {
                    cu_call!(
                        driver,
                        cuLibraryLoadData(
                            &mut library,
                            code,
                            null_mut(),
                            null_mut(),
                            0,
                            null_mut(),
                            null_mut(),
                            0
                        )
                    )
                };
                if status != SUCCESS {
                    return status;
                }
                ImageHandle::Library(owned::Library::new(library, null_mut(), &self.backend))
            }
        };
        self.images.insert(
            id,
            Image {
                handle,
                _bytes: bytes,
            },
        );
        SUCCESS
    }

    fn unload_image(&mut self, id: Id) -> Status {
        match self.images.remove(&id).map(|image| image.handle) {
            Some(ImageHandle::Module(module)) => module.destroy(),
            Some(ImageHandle::Library(library)) => library.destroy(),
            None => INVALID_HANDLE,
        }
    }

    fn get_function(&mut self, id: Id, image: Id, name: &str) -> Result<FunctionInfo, Status> {
        let name = CString::new(name).map_err(|_| INVALID_VALUE)?;
        let driver = &self.backend.driver;
        let function = match self.images.get(&image).map(|i| &i.handle) {
            Some(ImageHandle::Module(module)) => {
                let mut raw = null_mut();
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                check(unsafe {
                    cu_call!(
                        driver,
                        cuModuleGetFunction(&mut raw, module.raw(), name.as_ptr())
                    )
                })?;
                Function {
                    raw,
                    is_kernel: false,
                }
            }
            Some(ImageHandle::Library(library)) => {
                let mut kernel = null_mut();
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                check(unsafe {
                    cu_call!(
                        driver,
                        cuLibraryGetKernel(&mut kernel, library.raw(), name.as_ptr())
                    )
                })?;
                Function {
                    raw: kernel.cast(),
                    is_kernel: true,
                }
            }
            None => return Err(INVALID_HANDLE),
        };
        let info = self.describe_function(function);
        self.functions.insert(id, function);
        Ok(info)
    }

    fn kernel_get_function(&mut self, id: Id, kernel: Id, ctx: Id) -> Result<FunctionInfo, Status> {
        self.enter(ctx)?;
        let kernel = self.function(kernel)?;
        if !kernel.is_kernel {
            return Err(INVALID_HANDLE);
        }
        let mut raw = null_mut();
        // SAFETY: this session's live handles and local buffers; the driver checks addresses.
        check(unsafe {
            cu_call!(
                self.backend.driver,
                cuKernelGetFunction(&mut raw, kernel.raw.cast())
            )
        })?;
        let function = Function {
            raw,
            is_kernel: false,
        };
        let info = self.describe_function(function);
        self.functions.insert(id, function);
        Ok(info)
    }

    /// The parameter layout and attributes the client caches for a function.
    fn describe_function(&self, function: Function) -> FunctionInfo {
        let driver = &self.backend.driver;
        let mut params = Vec::new();
        loop {
            let (mut offset, mut size) = (0usize, 0usize);
            let index = params.len();
            let status = if function.is_kernel {
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                unsafe {
                    cu_call!(
                        driver,
                        cuKernelGetParamInfo(function.raw.cast(), index, &mut offset, &mut size)
                    )
                }
            } else {
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                unsafe {
                    cu_call!(
                        driver,
                        cuFuncGetParamInfo(function.raw, index, &mut offset, &mut size)
                    )
                }
            };
            if status != SUCCESS {
                break;
            }
            params.push((offset as u32, size as u32));
        }
        let device = self.current_device;
        let attributes = FUNCTION_ATTRIBUTE_VALUES
            .iter()
            .filter_map(|&value| {
                let answer = function_attribute_raw(driver, function, value, device).ok()?;
                Some((value, answer))
            })
            .collect();
        FunctionInfo { params, attributes }
    }

    fn get_global(&mut self, ctx: Id, image: Id, name: &str) -> Result<(u64, u64), Status> {
        self.enter(ctx)?;
        let name = CString::new(name).map_err(|_| INVALID_VALUE)?;
        let driver = &self.backend.driver;
        let (mut ptr, mut size) = (0u64, 0usize);
        let status = match self.images.get(&image).map(|i| &i.handle) {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            Some(ImageHandle::Module(module)) => unsafe {
                cu_call!(
                    driver,
                    cuModuleGetGlobal_v2(&mut ptr, &mut size, module.raw(), name.as_ptr())
                )
            },
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            Some(ImageHandle::Library(library)) => unsafe {
                cu_call!(
                    driver,
                    cuLibraryGetGlobal(&mut ptr, &mut size, library.raw(), name.as_ptr())
                )
            },
            None => INVALID_HANDLE,
        };
        check(status).map(|()| (ptr, size as u64))
    }

    fn set_function_attribute(
        &mut self,
        function: Id,
        attribute: u32,
        value: i32,
        device: u32,
    ) -> Status {
        let (Ok(function), Some(attribute)) =
            (self.function(function), function_attribute(attribute))
        else {
            return INVALID_VALUE;
        };
        let driver = &self.backend.driver;
        if function.is_kernel {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            unsafe {
                cu_call!(
                    driver,
                    cuKernelSetAttribute(attribute, value, function.raw.cast(), device as CUdevice)
                )
            }
        } else {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            unsafe { cu_call!(driver, cuFuncSetAttribute(function.raw, attribute, value)) }
        }
    }
}

/// A function attribute by number, whether or not this build's enum knows it (the wire carries
/// numbers a newer driver may define).
fn function_attribute_raw(
    driver: &rgpu_cuda_api::native::Driver,
    function: Function,
    attribute: u32,
    device: u32,
) -> Result<i32, Status> {
    let mut value = 0;
    // A library kernel's attributes are those of its function in the current context (asking
    // the kernel itself refers to the device's primary context, which sessions do not use).
    let mut in_context = null_mut();
    let function = if function.is_kernel
        // SAFETY: this session's live handles and local buffers; the driver checks addresses.
        && unsafe { cu_call!(
            driver,
            cuKernelGetFunction(&mut in_context, function.raw.cast())
        ) } == SUCCESS
    {
        Function {
            raw: in_context,
            is_kernel: false,
        }
    } else {
        function
    };
    let status = if function.is_kernel {
        let Some(entry) = driver.fns.cuKernelGetAttribute else {
            return Err(NOT_SUPPORTED);
        };
        // SAFETY: the enum parameter is a 32-bit integer in the C ABI; the driver checks the
        // number itself.
        let entry: unsafe extern "C" fn(*mut i32, u32, CUkernel, CUdevice) -> Status =
            unsafe { std::mem::transmute(entry) };
        // SAFETY: a valid out-pointer and kernel handle.
        unsafe {
            entry(
                &mut value,
                attribute,
                function.raw.cast(),
                device as CUdevice,
            )
        }
    } else {
        let Some(entry) = driver.fns.cuFuncGetAttribute else {
            return Err(NOT_SUPPORTED);
        };
        // SAFETY: as above.
        let entry: unsafe extern "C" fn(*mut i32, u32, CUfunction) -> Status =
            unsafe { std::mem::transmute(entry) };
        // SAFETY: a valid out-pointer and function handle.
        unsafe { entry(&mut value, attribute, function.raw) }
    };
    check(status).map(|()| value)
}
