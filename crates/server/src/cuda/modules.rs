//! Modules and libraries (images kept by hash across sessions: a client sends a large one only
//! when the server lacks it), their functions, kernels and globals, and function attributes.

use std::ffi::{c_void, CStr, CString};
use std::ptr::null_mut;
use std::sync::Arc;

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::generated::{func_cache, function_attribute, FUNCTION_ATTRIBUTE_VALUES};
use rgpu_cuda_api::native::{check, Status, INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED, SUCCESS};
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{
    serve, Answer, FunctionInfo, Global, Id, ImageKind, JitLogs, JitOption, Linked, Loaded,
};
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
        jit: Vec<JitOption>,
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
                        logs: JitLogs::default(),
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
        let mut options = match Jit::new(&jit) {
            Ok(options) => options,
            Err(status) => return Ok(Loaded::from_status_only(status)),
        };
        Ok(Loaded {
            status: cuda.load_image(id, ctx, kind, bytes, &mut options),
            need_image: false,
            logs: options.logs(),
        })
    }

    fn link_create(&mut self, id: Id, ctx: Id, jit: Vec<JitOption>) -> Answer<()> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx)?;
        let mut options = Jit::new(&jit)?;
        let mut state = null_mut();
        let (n, opts, values) = options.raw();
        // SAFETY: the option arrays and log buffers live in `options`, which the link keeps
        // until the driver's link state is destroyed (the driver writes logs into them).
        check(unsafe {
            cu_call!(
                cuda.backend.driver,
                cuLinkCreate_v2(n, opts, values, &mut state)
            )
        })?;
        let state = owned::LinkState::new(state, cuda.current, &cuda.backend);
        cuda.links.insert(id, Link { state, options });
        Ok(())
    }

    fn link_add_data(
        &mut self,
        link: Id,
        input: u32,
        name: String,
        jit: Vec<JitOption>,
        bulk_len: u64,
    ) -> Result<Linked, End> {
        if bulk_len > MAX_IMAGE_BYTES {
            return Err(End::Protocol(format!("a {bulk_len}-byte link input")));
        }
        let mut data = vec![0u8; bulk_len as usize];
        self.session.take_bulk(&mut data)?;
        let cuda = &mut *self.cuda;
        Ok(cuda.link_add_data(link, input, &name, &jit, data))
    }

    fn link_complete(&mut self, link: Id) -> Linked {
        let cuda = &mut *self.cuda;
        let Some(found) = cuda.links.get_mut(&link) else {
            return Linked::from_status_only(INVALID_HANDLE);
        };
        let (mut cubin, mut size) = (null_mut(), 0usize);
        // SAFETY: a live link state of this session; the driver writes the out-pointers.
        let status = unsafe {
            cu_call!(
                cuda.backend.driver,
                cuLinkComplete(found.state.raw(), &mut cubin, &mut size)
            )
        };
        let mut linked = Linked {
            status,
            logs: found.options.logs(),
            cubin: Vec::new(),
        };
        if status == SUCCESS && !cubin.is_null() {
            // SAFETY: the driver's linked image, `size` bytes, valid until the link is destroyed.
            let bytes = unsafe { std::slice::from_raw_parts(cubin.cast::<u8>(), size) }.to_vec();
            // Kept by hash: the program loads it next, and it then travels as its hash.
            let hash: [u8; 32] = Sha256::digest(&bytes).into();
            cuda.backend.keep_image(hash, Arc::new(bytes.clone()));
            linked.cubin = bytes;
        }
        linked
    }

    fn image_functions(&mut self, image: Id) -> Answer<Vec<String>> {
        let cuda = &mut *self.cuda;
        let driver = &cuda.backend.driver;
        let name_of = |get: &dyn Fn(*mut *const std::ffi::c_char) -> Status| {
            let mut name = std::ptr::null();
            check(get(&mut name))?;
            if name.is_null() {
                return Err(INVALID_VALUE);
            }
            // SAFETY: the driver's NUL-terminated name, valid while the image is loaded.
            Ok(unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned())
        };
        match cuda.images.get(&image).map(|i| &i.handle) {
            Some(ImageHandle::Module(module)) => {
                let mut count = 0u32;
                // SAFETY: a live module of this session and local out-values.
                check(unsafe {
                    cu_call!(driver, cuModuleGetFunctionCount(&mut count, module.raw()))
                })?;
                let mut functions = vec![null_mut(); count as usize];
                // SAFETY: room for `count` handles.
                check(unsafe {
                    cu_call!(
                        driver,
                        cuModuleEnumerateFunctions(functions.as_mut_ptr(), count, module.raw())
                    )
                })?;
                functions
                    .into_iter()
                    // SAFETY: handles the driver just listed.
                    .map(|f| name_of(&|out| unsafe { cu_call!(driver, cuFuncGetName(out, f)) }))
                    .collect()
            }
            Some(ImageHandle::Library(library)) => {
                let mut count = 0u32;
                // SAFETY: a live library of this session and local out-values.
                check(unsafe {
                    cu_call!(driver, cuLibraryGetKernelCount(&mut count, library.raw()))
                })?;
                let mut kernels = vec![null_mut(); count as usize];
                // SAFETY: room for `count` handles.
                check(unsafe {
                    cu_call!(
                        driver,
                        cuLibraryEnumerateKernels(kernels.as_mut_ptr(), count, library.raw())
                    )
                })?;
                kernels
                    .into_iter()
                    // SAFETY: handles the driver just listed.
                    .map(|k| name_of(&|out| unsafe { cu_call!(driver, cuKernelGetName(out, k)) }))
                    .collect()
            }
            None => Err(INVALID_HANDLE),
        }
    }

    fn link_destroy(&mut self, link: Id) -> Answer<()> {
        match self.cuda.links.remove(&link) {
            Some(link) => check(link.state.destroy()),
            None => Err(INVALID_HANDLE),
        }
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

/// A JIT link in progress: the driver's state and the options (with the log buffers) it
/// writes into until it is destroyed.
pub(super) struct Link {
    state: owned::LinkState,
    options: Jit,
}

/// Log buffer bytes the server gives the JIT compiler and linker, for each log.
const JIT_LOG_BYTES: usize = 64 << 10;

/// A request's JIT options as the driver takes them, with the server's own log buffers and
/// wall-time slot appended (the client hands the logs to the program's buffers).
pub(super) struct Jit {
    options: Vec<u32>,
    values: Vec<*mut c_void>,
    info: Box<[u8]>,
    error: Box<[u8]>,
}

impl Jit {
    /// The options the driver gets for `requested`; host-address options (symbol tables) are
    /// not supported, and the log options are the server's.
    fn new(requested: &[JitOption]) -> Result<Jit, Status> {
        use CUjit_option_enum::*;
        let host_addresses = [
            CU_JIT_GLOBAL_SYMBOL_NAMES,
            CU_JIT_GLOBAL_SYMBOL_ADDRESSES,
            CU_JIT_REFERENCED_KERNEL_NAMES,
            CU_JIT_REFERENCED_VARIABLE_NAMES,
        ];
        let logs = [
            CU_JIT_WALL_TIME,
            CU_JIT_INFO_LOG_BUFFER,
            CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
            CU_JIT_ERROR_LOG_BUFFER,
            CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        let mut jit = Jit {
            options: Vec::with_capacity(requested.len() + logs.len()),
            values: Vec::with_capacity(requested.len() + logs.len()),
            info: vec![0u8; JIT_LOG_BYTES].into_boxed_slice(),
            error: vec![0u8; JIT_LOG_BYTES].into_boxed_slice(),
        };
        for option in requested {
            if option.option >= CU_JIT_NUM_OPTIONS as u32 {
                return Err(INVALID_VALUE);
            }
            if host_addresses.iter().any(|&o| o as u32 == option.option) {
                return Err(NOT_SUPPORTED);
            }
            if logs.iter().any(|&o| o as u32 == option.option) {
                continue;
            }
            jit.options.push(option.option);
            jit.values.push(option.value as usize as *mut c_void);
        }
        let (info, error) = (jit.info.as_mut_ptr().cast(), jit.error.as_mut_ptr().cast());
        let size = (JIT_LOG_BYTES - 1) as *mut c_void;
        for (option, value) in [
            (CU_JIT_WALL_TIME, null_mut()),
            (CU_JIT_INFO_LOG_BUFFER, info),
            (CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, size),
            (CU_JIT_ERROR_LOG_BUFFER, error),
            (CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, size),
        ] {
            jit.options.push(option as u32);
            jit.values.push(value);
        }
        Ok(jit)
    }

    /// Count, options and values, as the driver's calls take them.
    fn raw(&mut self) -> (u32, *mut CUjit_option, *mut *mut c_void) {
        (
            self.options.len() as u32,
            // `CUjit_option` is a u32 enum; the values are only read by the driver.
            self.options.as_mut_ptr().cast(),
            self.values.as_mut_ptr(),
        )
    }

    /// What the compiler or linker wrote so far.
    fn logs(&self) -> JitLogs {
        let text = |buffer: &[u8]| {
            CStr::from_bytes_until_nul(buffer)
                .map(|s| s.to_string_lossy().trim_end().to_string())
                .unwrap_or_default()
        };
        let wall = self
            .options
            .iter()
            .position(|&o| o == CUjit_option_enum::CU_JIT_WALL_TIME as u32)
            .map_or(0.0, |i| f32::from_bits(self.values[i] as usize as u32));
        JitLogs {
            info: text(&self.info),
            error: text(&self.error),
            wall_time_ms: wall,
        }
    }
}

/// `CUjitInputType` from the wire.
fn jit_input(input: u32) -> Option<CUjitInputType> {
    use CUjitInputType_enum::*;
    Some(match input {
        0 => CU_JIT_INPUT_CUBIN,
        1 => CU_JIT_INPUT_PTX,
        2 => CU_JIT_INPUT_FATBINARY,
        3 => CU_JIT_INPUT_OBJECT,
        4 => CU_JIT_INPUT_LIBRARY,
        5 => CU_JIT_INPUT_NVVM,
        _ => return None,
    })
}

impl CudaSession {
    fn link_add_data(
        &mut self,
        link: Id,
        input: u32,
        name: &str,
        jit: &[JitOption],
        mut data: Vec<u8>,
    ) -> Linked {
        let Some(found) = self.links.get_mut(&link) else {
            return Linked::from_status_only(INVALID_HANDLE);
        };
        let (Some(input), Ok(name)) = (jit_input(input), CString::new(name)) else {
            return Linked::from_status_only(INVALID_VALUE);
        };
        let mut options = match Jit::new(jit) {
            Ok(options) => options,
            Err(status) => return Linked::from_status_only(status),
        };
        // The link's own options carry the logs: these are the input's.
        let keep = options.options.len() - 5;
        options.options.truncate(keep);
        options.values.truncate(keep);
        let (n, opts, values) = options.raw();
        // SAFETY: a live link state of this session, and local buffers that outlive the call
        // (the driver copies the input).
        let status = unsafe {
            cu_call!(
                self.backend.driver,
                cuLinkAddData_v2(
                    found.state.raw(),
                    input,
                    data.as_mut_ptr().cast(),
                    data.len(),
                    name.as_ptr(),
                    n,
                    opts,
                    values
                )
            )
        };
        Linked {
            status,
            logs: found.options.logs(),
            cubin: Vec::new(),
        }
    }

    fn load_image(
        &mut self,
        id: Id,
        ctx: Id,
        kind: ImageKind,
        bytes: Arc<Vec<u8>>,
        jit: &mut Jit,
    ) -> Status {
        if let Err(status) = self.enter(ctx) {
            return status;
        }
        let driver = &self.backend.driver;
        let code = bytes.as_ptr().cast();
        let (n, opts, values) = jit.raw();
        let handle = match kind {
            ImageKind::Module => {
                let mut module = null_mut();
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                let status = unsafe {
                    cu_call!(
                        driver,
                        cuModuleLoadDataEx(&mut module, code, n, opts, values)
                    )
                };
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
                            opts,
                            values,
                            n,
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
        self.param_offsets
            .insert(id, info.params.iter().map(|&(offset, _)| offset).collect());
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
        self.param_offsets
            .insert(id, info.params.iter().map(|&(offset, _)| offset).collect());
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
