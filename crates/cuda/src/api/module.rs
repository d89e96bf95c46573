//! Modules, libraries, functions and kernels. Images travel once per server: they are named by
//! their SHA-256, and a server that already holds one (from any session) is sent only the name.
//! A function's parameter layout and attributes come with its lookup and are cached here.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::Arc;

use rgpu_client::CudaClient;
use rgpu_cuda_api::image::image_bytes;
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{Id, ImageKind};
use sha2::{Digest, Sha256};

use super::jit::JitRequest;
use super::{from_remote, status, write_out, Outcome};
use crate::objects::PrimaryContext;
use crate::objects::{current_context, server_key, Context, Function, Image};
use crate::results::client_error;

/// Images up to this size go with the first request; larger ones only when the server asks.
const SEND_WITH_FIRST_REQUEST: usize = 64 << 10;

/// Loads an image on the server of `ctx` under session id `id`: by hash first when it is
/// large (the server may hold it already), with the bytes when the server asks.
fn send_image(
    ctx: &Context,
    kind: ImageKind,
    id: Id,
    hash: [u8; 32],
    bytes: &[u8],
    jit: &JitRequest,
) -> Result<(), CUresult> {
    let request = |with_image: bool| {
        let bulk: &[u8] = if with_image { bytes } else { &[] };
        let server = ctx.conn.cuda();
        server
            .load_image(id, ctx.remote, kind, hash, jit.wire.clone(), bulk)
            .map_err(client_error)
    };
    let mut loaded = request(bytes.len() <= SEND_WITH_FIRST_REQUEST)?;
    if loaded.need_image {
        loaded = request(true)?;
    }
    jit.deliver(&loaded.logs);
    if loaded.status != 0 && !loaded.logs.error.is_empty() {
        log::warn!("rgpu: module load: {}", loaded.logs.error);
    }
    from_remote(loaded.status)
}

fn load(
    ctx: &Context,
    kind: ImageKind,
    image: *const c_void,
    jit: &JitRequest,
) -> Result<Image, CUresult> {
    // SAFETY: the API contract: `image` points at a module image (fatbin, cubin or PTX).
    let bytes = unsafe { image_bytes(image) }.ok_or(CUresult::CUDA_ERROR_INVALID_IMAGE)?;
    load_bytes(ctx, kind, bytes, jit)
}

fn load_bytes(
    ctx: &Context,
    kind: ImageKind,
    bytes: &[u8],
    jit: &JitRequest,
) -> Result<Image, CUresult> {
    let hash: [u8; 32] = Sha256::digest(bytes).into();
    // A library may be used on every server; keep its bytes for the others.
    let several_servers = crate::servers::servers().is_ok_and(|rt| rt.servers > 1);
    let kept = (kind == ImageKind::Library && several_servers).then(|| Arc::from(bytes));
    let object = Image::new(&ctx.conn, kind, hash, kept);
    send_image(ctx, kind, object.remote, hash, bytes, jit)?;
    Ok(object)
}

/// The id of a library on the server of `ctx`, loading it there on first use.
fn image_on(image: &Image, ctx: &Context) -> Result<Id, CUresult> {
    if Arc::ptr_eq(&image.conn, &ctx.conn) {
        return Ok(image.remote);
    }
    let key = server_key(&ctx.conn);
    if let Some(&id) = image.other_servers.lock().unwrap().get(&key) {
        return Ok(id);
    }
    // Modules belong to their context; only libraries travel.
    let bytes = image
        .bytes
        .as_ref()
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    let id = ctx.conn.new_id();
    send_image(
        ctx,
        image.kind,
        id,
        image.hash,
        bytes,
        &JitRequest::default(),
    )?;
    image.other_servers.lock().unwrap().insert(key, id);
    Ok(id)
}

/// The id of a function on the server of `ctx`: library kernels are looked up there on first
/// use; a module function exists only where its module is.
pub(crate) fn function_on(function: &Function, ctx: &Context) -> Result<Id, CUresult> {
    if Arc::ptr_eq(&function.conn, &ctx.conn) {
        return Ok(function.remote);
    }
    let key = server_key(&ctx.conn);
    if let Some(&id) = function.other_servers.lock().unwrap().get(&key) {
        return Ok(id);
    }
    let image = Image::from_handle(function.library as *mut c_void)
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    let image_id = image_on(&image, ctx)?;
    let id = ctx.conn.new_id();
    let server = ctx.conn.cuda();
    server
        .get_function(id, image_id, function.name.clone())
        .outcome()?;
    function.other_servers.lock().unwrap().insert(key, id);
    Ok(id)
}

pub unsafe fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuModuleLoadDataEx(module, image, 0, std::ptr::null_mut(), std::ptr::null_mut()) }
}

pub unsafe fn cuModuleLoadDataEx(
    module: *mut CUmodule,
    image: *const c_void,
    num_options: c_uint,
    options: *mut u32,
    values: *mut *mut c_void,
) -> CUresult {
    status(current_context().and_then(|ctx| {
        if module.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the program's option arrays, valid for the call as the API requires.
        let jit = unsafe { JitRequest::parse(num_options, options, values)? };
        let object = load(&ctx, ImageKind::Module, image, &jit)?;
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(module, object.into_handle().cast()) }
    }))
}

pub unsafe fn cuModuleLoadFatBinary(module: *mut CUmodule, fatbin: *const c_void) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuModuleLoadData(module, fatbin) }
}

/// `cuModuleLoad`: a cubin, fatbin or PTX file of the client's, loaded on the server.
pub unsafe fn cuModuleLoad(module: *mut CUmodule, path: *const c_char) -> CUresult {
    status(current_context().and_then(|ctx| {
        if module.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated path, as the API requires.
        let bytes = unsafe { super::jit::read_file(path)? };
        let object = load_bytes(&ctx, ImageKind::Module, &bytes, &JitRequest::default())?;
        // SAFETY: checked non-null above.
        unsafe { write_out(module, object.into_handle().cast()) }
    }))
}

pub unsafe fn cuModuleUnload(module: CUmodule) -> CUresult {
    // SAFETY: the caller's handle (looked up before use) and name, passed on.
    unsafe { unload(module.cast()) }
}

unsafe fn unload(handle: *mut c_void) -> CUresult {
    status((|| {
        let image = Image::from_handle(handle).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        image.conn.cuda().unload_image(image.remote).outcome()?;
        // SAFETY: the program gives the handle up by unloading it.
        Image::destroy(handle);
        Ok(())
    })())
}

pub unsafe fn cuModuleGetLoadingMode(mode: *mut c_uint) -> CUresult {
    // CU_MODULE_LAZY_LOADING: the server's driver loads kernels at first use.
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
    status(unsafe { write_out(mode, 2) })
}

pub unsafe fn cuLibraryLoadData(
    library: *mut CUlibrary,
    code: *const c_void,
    jit_options: *mut u32,
    jit_values: *mut *mut c_void,
    num_jit_options: c_uint,
    _library_options: *mut u32,
    _library_values: *mut *mut c_void,
    _num_library_options: c_uint,
) -> CUresult {
    // Library options (binary preservation, unified-function loading) only tune how the
    // driver keeps the image; the server's driver keeps it as it does by default.
    status(library_context().and_then(|ctx| {
        if library.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the program's option arrays, valid for the call as the API requires.
        let jit = unsafe { JitRequest::parse(num_jit_options, jit_options, jit_values)? };
        let object = load(&ctx, ImageKind::Library, code, &jit)?;
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(library, object.into_handle().cast()) }
    }))
}

pub unsafe fn cuLibraryLoadFromFile(
    library: *mut CUlibrary,
    path: *const c_char,
    jit_options: *mut u32,
    jit_values: *mut *mut c_void,
    num_jit_options: c_uint,
    _library_options: *mut u32,
    _library_values: *mut *mut c_void,
    _num_library_options: c_uint,
) -> CUresult {
    status(library_context().and_then(|ctx| {
        if library.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated path and the program's option arrays, as the API requires.
        let (bytes, jit) = unsafe {
            (
                super::jit::read_file(path)?,
                JitRequest::parse(num_jit_options, jit_options, jit_values)?,
            )
        };
        let object = load_bytes(&ctx, ImageKind::Library, &bytes, &jit)?;
        // SAFETY: checked non-null above.
        unsafe { write_out(library, object.into_handle().cast()) }
    }))
}

/// Libraries belong to no context; they load on the server of the current context, or of the
/// first device when there is none.
fn library_context() -> Result<Arc<Context>, CUresult> {
    current_context().or_else(|_| {
        let device = crate::servers::device(0)?;
        device.primary().ensure_created()?;
        Ok(device.primary())
    })
}

pub unsafe fn cuLibraryUnload(library: CUlibrary) -> CUresult {
    // SAFETY: the caller's handle (looked up before use) and name, passed on.
    unsafe { unload(library.cast()) }
}

/// Looks a function or kernel up by name (cached per image).
unsafe fn get_function(image: *mut c_void, name: *const c_char) -> Result<*mut c_void, CUresult> {
    let image = Image::from_handle(image).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    if name.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the API contract: a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned();
    if let Some(&found) = image.functions.lock().unwrap().get(&name) {
        return Ok(found as *mut c_void);
    }
    let id = image.conn.new_id();
    let server = image.conn.cuda();
    let info = server
        .get_function(id, image.remote, name.clone())
        .outcome()?;
    let is_kernel = image.kind == ImageKind::Library;
    let mut function = Function::new(&image.conn, id, is_kernel, &name, info);
    if is_kernel {
        function.library = image.handle;
    } else {
        function.module = image.handle;
    }
    let handle = function.into_handle();
    image
        .functions
        .lock()
        .unwrap()
        .insert(name, handle as usize);
    Ok(handle)
}

/// Every function of an image (kernels of a library), in the driver's order: its handle and
/// name, listed by the server once and looked up like `cuModuleGetFunction`.
pub(crate) fn listed_functions(image: *mut c_void) -> Result<Arc<Image>, CUresult> {
    let object = Image::from_handle(image).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    if object.listed.get().is_none() {
        let names = object
            .conn
            .cuda()
            .image_functions(object.remote)
            .outcome()?;
        let mut listed = Vec::with_capacity(names.len());
        for name in names {
            let name =
                std::ffi::CString::new(name).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
            // SAFETY: a live image handle and a NUL-terminated name.
            let handle = unsafe { get_function(image, name.as_ptr())? };
            listed.push((handle as usize, name));
        }
        let _ = object.listed.set(listed);
    }
    Ok(object)
}

/// `cuModuleGetFunctionCount` / `cuLibraryGetKernelCount`.
fn function_count(count: *mut c_uint, image: *mut c_void) -> CUresult {
    status(listed_functions(image).and_then(|object| {
        let n = object.listed.get().map_or(0, Vec::len) as c_uint;
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(count, n) }
    }))
}

/// `cuModuleEnumerateFunctions` / `cuLibraryEnumerateKernels`: up to `n` handles.
///
/// # Safety
/// `out` has room for `n` handles.
unsafe fn enumerate(out: *mut *mut c_void, n: c_uint, image: *mut c_void) -> CUresult {
    status(listed_functions(image).and_then(|object| {
        let listed = object.listed.get().map(Vec::as_slice).unwrap_or(&[]);
        if out.is_null() || (n as usize) < listed.len() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        for (i, (handle, _)) in listed.iter().enumerate() {
            // SAFETY: the caller's guarantee: room for `n` >= listed handles.
            unsafe { out.add(i).write(*handle as *mut c_void) };
        }
        Ok(())
    }))
}

pub unsafe fn cuModuleGetFunctionCount(count: *mut c_uint, module: CUmodule) -> CUresult {
    function_count(count, module.cast())
}

pub unsafe fn cuModuleEnumerateFunctions(
    functions: *mut CUfunction,
    n: c_uint,
    module: CUmodule,
) -> CUresult {
    // SAFETY: the program's array of `n` handles, as the API requires.
    unsafe { enumerate(functions.cast(), n, module.cast()) }
}

pub unsafe fn cuLibraryGetKernelCount(count: *mut c_uint, library: CUlibrary) -> CUresult {
    function_count(count, library.cast())
}

pub unsafe fn cuLibraryEnumerateKernels(
    kernels: *mut CUkernel,
    n: c_uint,
    library: CUlibrary,
) -> CUresult {
    // SAFETY: as above.
    unsafe { enumerate(kernels.cast(), n, library.cast()) }
}

pub unsafe fn cuFuncGetModule(module: *mut CUmodule, function: CUfunction) -> CUresult {
    let Some(object) = Function::from_handle(function.cast()) else {
        return CUresult::CUDA_ERROR_INVALID_HANDLE;
    };
    if object.module == 0 {
        // A library kernel's function: its module is the driver's per-context one, which
        // the program never holds here.
        return crate::unsupported::not_supported("cuFuncGetModule of a library kernel's function");
    }
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable.
    status(unsafe { write_out(module, object.module as CUmodule) })
}

pub unsafe fn cuKernelGetLibrary(library: *mut CUlibrary, kernel: CUkernel) -> CUresult {
    match Function::from_handle(kernel.cast()) {
        Some(object) if object.is_kernel => {
            // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable.
            status(unsafe { write_out(library, object.library as CUlibrary) })
        }
        _ => CUresult::CUDA_ERROR_INVALID_HANDLE,
    }
}

pub unsafe fn cuModuleGetFunction(
    function: *mut CUfunction,
    module: CUmodule,
    name: *const c_char,
) -> CUresult {
    status(
        // SAFETY: the caller's handle (looked up before use) and name, passed on.
        unsafe { get_function(module.cast(), name) }
            // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
            .and_then(|f| unsafe { write_out(function, f.cast()) }),
    )
}

pub unsafe fn cuLibraryGetKernel(
    kernel: *mut CUkernel,
    library: CUlibrary,
    name: *const c_char,
) -> CUresult {
    status(
        // SAFETY: the caller's handle (looked up before use) and name, passed on.
        unsafe { get_function(library.cast(), name) }
            // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
            .and_then(|k| unsafe { write_out(kernel, k.cast()) }),
    )
}

pub unsafe fn cuKernelGetFunction(function: *mut CUfunction, kernel: CUkernel) -> CUresult {
    status(current_context().and_then(|ctx| {
        let kernel =
            Function::from_handle(kernel.cast()).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        if !kernel.is_kernel {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        if let Some(&found) = kernel.per_context.lock().unwrap().get(&ctx.remote) {
            // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
            return unsafe { write_out(function, found as CUfunction) };
        }
        let id = ctx.conn.new_id();
        let remote_kernel = function_on(&kernel, &ctx)?;
        let server = ctx.conn.cuda();
        let info = server
            .kernel_get_function(id, remote_kernel, ctx.remote)
            .outcome()?;
        let mut in_context = Function::new(&ctx.conn, id, false, &kernel.name, info);
        in_context.kernel = kernel.handle;
        let handle = in_context.into_handle();
        kernel
            .per_context
            .lock()
            .unwrap()
            .insert(ctx.remote, handle as usize);
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(function, handle.cast()) }
    }))
}

fn get_global(
    image: *mut c_void,
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    name: *const c_char,
) -> Result<(), CUresult> {
    let ctx = current_context()?;
    let image = Image::from_handle(image).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    if name.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the API contract: a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned();
    // A library serves every context, of any server: loaded on this one at its first use.
    let image_id = image_on(&image, &ctx)?;
    let server = ctx.conn.cuda();
    let global = server.get_global(ctx.remote, image_id, name).outcome()?;
    super::memory::record_device_range(global.ptr, global.size, &ctx);
    // SAFETY: the caller's out-pointers, each written only when non-null.
    unsafe {
        if !dptr.is_null() {
            dptr.write(global.ptr);
        }
        if !bytes.is_null() {
            bytes.write(global.size as usize);
        }
    }
    Ok(())
}

pub unsafe fn cuModuleGetGlobal_v2(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    module: CUmodule,
    name: *const c_char,
) -> CUresult {
    status(get_global(module.cast(), dptr, bytes, name))
}

pub unsafe fn cuLibraryGetGlobal(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    library: CUlibrary,
    name: *const c_char,
) -> CUresult {
    status(get_global(library.cast(), dptr, bytes, name))
}

fn function(handle: *mut c_void) -> Result<Arc<Function>, CUresult> {
    Function::from_handle(handle).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

/// A function attribute: from the table that came with the function, else from the server
/// (then kept).
fn function_attribute(f: &Function, attribute: c_uint, device: u32) -> Result<c_int, CUresult> {
    if let Some(answer) = f.attribute(attribute) {
        return Ok(answer);
    }
    let server = f.conn.cuda();
    let value = server
        .get_function_attribute(f.remote, attribute, device)
        .outcome()?;
    f.set_attribute(attribute, value);
    Ok(value)
}

pub unsafe fn cuFuncGetAttribute(value: *mut c_int, attribute: c_uint, f: CUfunction) -> CUresult {
    status(function(f.cast()).and_then(|f| {
        let answer = function_attribute(&f, attribute, 0)?;
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(value, answer) }
    }))
}

pub unsafe fn cuKernelGetAttribute(
    value: *mut c_int,
    attribute: c_uint,
    kernel: CUkernel,
    dev: CUdevice,
) -> CUresult {
    status(function(kernel.cast()).and_then(|f| {
        let device = crate::servers::device(dev)?;
        let answer = function_attribute(&f, attribute, device.remote_ordinal)?;
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        unsafe { write_out(value, answer) }
    }))
}

fn set_attribute(
    f: &Function,
    attribute: c_uint,
    value: c_int,
    device: u32,
) -> Result<(), CUresult> {
    // Libraries set the same value before every launch: only a change costs a round trip.
    if f.attribute(attribute) == Some(value) {
        return Ok(());
    }
    let server = f.conn.cuda();
    server
        .set_function_attribute(f.remote, attribute, value, device)
        .outcome()?;
    f.set_attribute(attribute, value);
    Ok(())
}

pub unsafe fn cuFuncSetAttribute(f: CUfunction, attribute: c_uint, value: c_int) -> CUresult {
    status(function(f.cast()).and_then(|f| set_attribute(&f, attribute, value, 0)))
}

pub unsafe fn cuKernelSetAttribute(
    attribute: c_uint,
    value: c_int,
    kernel: CUkernel,
    dev: CUdevice,
) -> CUresult {
    status(function(kernel.cast()).and_then(|f| {
        let device = crate::servers::device(dev)?;
        set_attribute(&f, attribute, value, device.remote_ordinal)
    }))
}

pub unsafe fn cuFuncSetCacheConfig(f: CUfunction, config: c_uint) -> CUresult {
    status(function(f.cast()).and_then(|func| {
        let server = func.conn.cuda();
        server
            .set_function_cache_config(func.remote, config)
            .outcome()
    }))
}

pub unsafe fn cuKernelSetCacheConfig(kernel: CUkernel, config: c_uint, _dev: CUdevice) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuFuncSetCacheConfig(kernel.cast(), config) }
}

pub unsafe fn cuFuncGetParamInfo(
    f: CUfunction,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    status(function(f.cast()).and_then(|f| {
        let &(o, s) = f
            .params
            .get(index)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's out-pointers, each written only when non-null.
        unsafe {
            if !offset.is_null() {
                offset.write(o as usize);
            }
            if !size.is_null() {
                size.write(s as usize);
            }
        }
        Ok(())
    }))
}

pub unsafe fn cuKernelGetParamInfo(
    kernel: CUkernel,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuFuncGetParamInfo(kernel.cast(), index, offset, size) }
}

/// The function's name, kept in a C string that lives as long as the process.
fn leak_name(f: &Function) -> *const c_char {
    let name = std::ffi::CString::new(f.name.clone()).unwrap_or_default();
    Box::leak(name.into_boxed_c_str()).as_ptr()
}

pub unsafe fn cuFuncGetName(name: *mut *const c_char, f: CUfunction) -> CUresult {
    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
    status(function(f.cast()).and_then(|f| unsafe { write_out(name, leak_name(&f)) }))
}

pub unsafe fn cuKernelGetName(name: *mut *const c_char, kernel: CUkernel) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuFuncGetName(name, kernel.cast()) }
}
