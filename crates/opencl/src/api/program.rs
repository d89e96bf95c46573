//! Programs: creation from source, binaries, IL and built-in kernels; build, compile and link;
//! program and build info. Also [`server_info`], the GetInfo round trip every object's
//! server-side queries use.

use std::ffi::{c_char, c_uchar, c_void, CStr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use opencl_sys::*;
use rgpu_client::Connection;
use rgpu_client::OpenClClient;
use rgpu_protocol::opencl::{BinaryStatus, Id, InfoQuery};

use crate::api::context::context_from;
use crate::api::device::devices_from;
use crate::handle::{self, Ref};
use crate::objects::{Context, Device, Program};
use crate::util::{
    bytes_of, bytes_of_slice, c_string, client_error, creation, guard, slice, string_bytes,
    write_info, Outcome,
};

/// The callback of clBuildProgram, clCompileProgram and clLinkProgram.
pub type ProgramNotify = unsafe extern "C" fn(cl_program, *mut c_void);

pub fn program_from(program: cl_program) -> Result<Ref<Program>, cl_int> {
    handle::lookup::<Program>(program)
}

/// A clGet*Info query answered by the server: the value bytes, or the server's error.
pub fn server_info(conn: &Connection, query: InfoQuery, param: u32) -> Result<Vec<u8>, cl_int> {
    conn.opencl().get_info(query, param).outcome()
}

/// A list of `size_t` values as the server sends them (64-bit little-endian).
pub fn size_list(value: &[u8]) -> Result<Vec<usize>, cl_int> {
    let (words, rest) = value.as_chunks::<8>();
    if !rest.is_empty() {
        log::error!(
            "rgpu: malformed size_t list of {} bytes from the server",
            value.len()
        );
        return Err(CL_OUT_OF_RESOURCES);
    }
    words
        .iter()
        .map(|&raw| usize::try_from(u64::from_le_bytes(raw)).map_err(|_| CL_OUT_OF_RESOURCES))
        .collect()
}

/// Turns the result of an info query into the clGet*Info convention.
///
/// # Safety
/// The pointers are the application's for this query.
pub unsafe fn answer_info(
    value: Result<Vec<u8>, cl_int>,
    param_value_size: usize,
    param_value: *mut c_void,
    param_value_size_ret: *mut usize,
) -> cl_int {
    match value {
        // SAFETY: see the function contract.
        Ok(bytes) => unsafe {
            write_info(&bytes, param_value_size, param_value, param_value_size_ret)
        },
        Err(code) => code,
    }
}

/// The devices an operation applies to: those the application listed, which must all be in
/// `allowed`, or all of `allowed` when the list is empty.
///
/// # Safety
/// `device_list` points to `num_devices` handles (or is null with 0).
unsafe fn device_subset(
    allowed: &[Ref<Device>],
    num_devices: cl_uint,
    device_list: *const cl_device_id,
) -> Result<Vec<Ref<Device>>, cl_int> {
    // SAFETY: see the function contract.
    let chosen = unsafe { devices_from(device_list, num_devices) }?;
    if chosen.is_empty() {
        return Ok(allowed.to_vec());
    }
    if chosen
        .iter()
        .any(|d| !allowed.iter().any(|a| Arc::ptr_eq(a, d)))
    {
        return Err(CL_INVALID_DEVICE);
    }
    Ok(chosen)
}

/// A device of the program for a per-device query. `NULL` names the program's only device
/// where the API allows that (kernel work-group and sub-group queries).
pub fn program_device(
    program: &Program,
    device: cl_device_id,
    null_means_only: bool,
) -> Result<Ref<Device>, cl_int> {
    if device.is_null() && null_means_only {
        return match program.devices.as_slice() {
            [only] => Ok(only.clone()),
            _ => Err(CL_INVALID_DEVICE),
        };
    }
    let device = handle::lookup::<Device>(device)?;
    if !program.devices.iter().any(|d| Arc::ptr_eq(d, &device)) {
        return Err(CL_INVALID_DEVICE);
    }
    Ok(device)
}

fn ids(devices: &[Ref<Device>]) -> Vec<Id> {
    devices.iter().map(|d| d.id).collect()
}

fn new_program(
    context: Ref<Context>,
    id: Id,
    devices: Vec<Ref<Device>>,
    source: Option<String>,
    include_dirs: Vec<String>,
    il: Option<Vec<u8>>,
) -> *mut c_void {
    let program = handle::create(Program {
        conn: Arc::clone(&context.conn),
        id,
        context,
        devices,
        include_dirs,
        source,
        il,
        live_kernels: AtomicU32::new(0),
        options: Mutex::new(None),
        replicas: Default::default(),
    });
    handle::raw(&program)
}

pub unsafe extern "C" fn clCreateProgramWithSource(
    context: cl_context,
    count: cl_uint,
    strings: *mut *const c_char,
    lengths: *const usize,
    errcode_ret: *mut cl_int,
) -> cl_program {
    guard(std::ptr::null_mut(), || {
        let result = (|| {
            let context = context_from(context)?;
            if count == 0 || strings.is_null() {
                return Err(CL_INVALID_VALUE);
            }
            // SAFETY: the application passes `count` string pointers (and lengths, if any).
            let (strings, lengths) = unsafe {
                (
                    slice(strings as *const *const c_char, count as usize),
                    slice(lengths, count as usize),
                )
            };
            let mut source = Vec::new();
            for (i, &s) in strings.iter().enumerate() {
                if s.is_null() {
                    return Err(CL_INVALID_VALUE);
                }
                let len = lengths.get(i).copied().unwrap_or(0);
                let bytes = if len == 0 {
                    // SAFETY: a zero length means a NUL-terminated string.
                    unsafe { CStr::from_ptr(s) }.to_bytes()
                } else {
                    // SAFETY: the application gives `len` readable bytes at `s`.
                    unsafe { std::slice::from_raw_parts(s as *const u8, len) }
                };
                source.extend_from_slice(bytes);
            }
            let source = String::from_utf8(source)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
            let id = context.conn.new_id();
            let (sent, include_dirs) = crate::includes::localize_absolute(&source);
            context
                .conn
                .opencl()
                .create_program_with_source(id, context.id, sent.into_owned())
                .outcome()?;
            let devices = context.devices.clone();
            Ok(new_program(
                context,
                id,
                devices,
                Some(source),
                include_dirs,
                None,
            ))
        })();
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

pub unsafe extern "C" fn clCreateProgramWithBinary(
    context: cl_context,
    num_devices: cl_uint,
    device_list: *const cl_device_id,
    lengths: *const usize,
    binaries: *mut *const c_uchar,
    binary_status: *mut cl_int,
    errcode_ret: *mut cl_int,
) -> cl_program {
    guard(std::ptr::null_mut(), || {
        let result = (|| {
            let context = context_from(context)?;
            if num_devices == 0 || device_list.is_null() || lengths.is_null() || binaries.is_null()
            {
                return Err(CL_INVALID_VALUE);
            }
            // SAFETY: the application's device array of `num_devices` entries.
            let devices = unsafe { device_subset(&context.devices, num_devices, device_list) }?;
            let n = num_devices as usize;
            // SAFETY: `num_devices` lengths and binary pointers.
            let (lengths, binary_ptrs) = unsafe {
                (
                    slice(lengths, n),
                    slice(binaries as *const *const c_uchar, n),
                )
            };
            let statuses: Vec<cl_int> = lengths
                .iter()
                .zip(binary_ptrs)
                .map(|(&len, ptr)| {
                    if len == 0 || ptr.is_null() {
                        CL_INVALID_VALUE
                    } else {
                        CL_SUCCESS
                    }
                })
                .collect();
            if statuses.iter().any(|&s| s != CL_SUCCESS) {
                if !binary_status.is_null() {
                    // SAFETY: the application provides `num_devices` status slots.
                    unsafe { std::ptr::copy_nonoverlapping(statuses.as_ptr(), binary_status, n) };
                }
                return Err(CL_INVALID_VALUE);
            }
            let blobs: Vec<Vec<u8>> = lengths
                .iter()
                .zip(binary_ptrs)
                // SAFETY: each binary has `len` readable bytes (checked non-null above).
                .map(|(&len, &ptr)| unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec())
                .collect();
            let id = context.conn.new_id();
            let server = context.conn.opencl();
            let BinaryStatus {
                status,
                binary_status: per_device,
            } = server
                .create_program_with_binary(id, context.id, ids(&devices), blobs)
                .map_err(client_error)?;
            if !binary_status.is_null() {
                for i in 0..n {
                    // A status the server did not report: the binary was not looked at.
                    let s = per_device.get(i).copied().unwrap_or(status);
                    // SAFETY: `num_devices` status slots.
                    unsafe { *binary_status.add(i) = s };
                }
            }
            if status != CL_SUCCESS {
                return Err(status);
            }
            Ok(new_program(context, id, devices, None, Vec::new(), None))
        })();
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

pub unsafe extern "C" fn clCreateProgramWithIL(
    context: cl_context,
    il: *const c_void,
    length: usize,
    errcode_ret: *mut cl_int,
) -> cl_program {
    guard(std::ptr::null_mut(), || {
        let result = (|| {
            let context = context_from(context)?;
            if il.is_null() || length == 0 {
                return Err(CL_INVALID_VALUE);
            }
            // SAFETY: the application gives `length` readable bytes of IL.
            let il = unsafe { std::slice::from_raw_parts(il as *const u8, length) }.to_vec();
            let id = context.conn.new_id();
            context
                .conn
                .opencl()
                .create_program_with_il(id, context.id, il.clone())
                .outcome()?;
            let devices = context.devices.clone();
            Ok(new_program(
                context,
                id,
                devices,
                None,
                Vec::new(),
                Some(il),
            ))
        })();
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

pub unsafe extern "C" fn clCreateProgramWithBuiltInKernels(
    context: cl_context,
    num_devices: cl_uint,
    device_list: *const cl_device_id,
    kernel_names: *const c_char,
    errcode_ret: *mut cl_int,
) -> cl_program {
    guard(std::ptr::null_mut(), || {
        let result = (|| {
            let context = context_from(context)?;
            if num_devices == 0 || device_list.is_null() {
                return Err(CL_INVALID_VALUE);
            }
            // SAFETY: a NUL-terminated string (or null).
            let names = unsafe { c_string(kernel_names) }.ok_or(CL_INVALID_VALUE)?;
            // SAFETY: the application's device array of `num_devices` entries.
            let devices = unsafe { device_subset(&context.devices, num_devices, device_list) }?;
            let id = context.conn.new_id();
            context
                .conn
                .opencl()
                .create_program_with_built_in_kernels(id, context.id, ids(&devices), names)
                .outcome()?;
            Ok(new_program(context, id, devices, None, Vec::new(), None))
        })();
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

pub unsafe extern "C" fn clRetainProgram(program: cl_program) -> cl_int {
    handle::retain::<Program>(program)
}

pub unsafe extern "C" fn clReleaseProgram(program: cl_program) -> cl_int {
    handle::release::<Program>(program)
}

/// Calls a build/compile/link callback. The operation is synchronous, so it has completed.
fn notify(pfn_notify: Option<ProgramNotify>, program: cl_program, user_data: *mut c_void) {
    if let Some(func) = pfn_notify {
        // SAFETY: the application's callback with its own user data, for this program.
        unsafe { func(program, user_data) };
    }
}

pub unsafe extern "C" fn clBuildProgram(
    program: cl_program,
    num_devices: cl_uint,
    device_list: *const cl_device_id,
    options: *const c_char,
    pfn_notify: Option<ProgramNotify>,
    user_data: *mut c_void,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let result = (|| {
            let prog = program_from(program)?;
            if pfn_notify.is_none() && !user_data.is_null() {
                return Err(CL_INVALID_VALUE);
            }
            // SAFETY: the application's device array of `num_devices` entries.
            let devices = unsafe { device_subset(&prog.devices, num_devices, device_list) }?;
            if prog.live_kernels.load(Ordering::Relaxed) > 0 {
                return Err(CL_INVALID_OPERATION);
            }
            // SAFETY: a NUL-terminated string (or null).
            let options = unsafe { c_string(options) }.unwrap_or_default();
            rgpu_cl_api::validate::build_options(&options)?;
            *prog.options.lock().unwrap_or_else(|e| e.into_inner()) = Some(options.clone());
            let options = crate::includes::with_include_dirs(&options, &prog.include_dirs);
            let includes = crate::includes::collect(&options);
            let status = match &prog.context.spanning {
                None => {
                    let server = prog.conn.opencl();
                    let built = server.build_program(prog.id, ids(&devices), options, includes);
                    crate::util::status(built.outcome())
                }
                Some(spanning) => crate::spanning::build(&prog, spanning, &devices, &options),
            };
            notify(pfn_notify, program, user_data);
            Ok(status)
        })();
        result.unwrap_or_else(|code| code)
    })
}

pub unsafe extern "C" fn clCompileProgram(
    program: cl_program,
    num_devices: cl_uint,
    device_list: *const cl_device_id,
    options: *const c_char,
    num_input_headers: cl_uint,
    input_headers: *const cl_program,
    header_include_names: *mut *const c_char,
    pfn_notify: Option<ProgramNotify>,
    user_data: *mut c_void,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let result = (|| {
            let prog = program_from(program)?;
            if pfn_notify.is_none() && !user_data.is_null() {
                return Err(CL_INVALID_VALUE);
            }
            // SAFETY: the application's device array of `num_devices` entries.
            let devices = unsafe { device_subset(&prog.devices, num_devices, device_list) }?;
            let headers_given = !input_headers.is_null() || !header_include_names.is_null();
            let headers_complete = !input_headers.is_null() && !header_include_names.is_null();
            if (num_input_headers == 0 && headers_given)
                || (num_input_headers > 0 && !headers_complete)
            {
                return Err(CL_INVALID_VALUE);
            }
            let n = num_input_headers as usize;
            // SAFETY: `num_input_headers` program handles and name pointers.
            let (header_programs, names) = unsafe {
                (
                    slice(input_headers, n),
                    slice(header_include_names as *const *const c_char, n),
                )
            };
            let mut headers = Vec::with_capacity(n);
            let mut include_dirs = prog.include_dirs.clone();
            for (&header, &name) in header_programs.iter().zip(names) {
                let header = program_from(header)?;
                if !Arc::ptr_eq(&header.conn, &prog.conn) {
                    return Err(CL_INVALID_PROGRAM);
                }
                // SAFETY: a NUL-terminated include name (or null).
                let name = unsafe { c_string(name) }.ok_or(CL_INVALID_VALUE)?;
                headers.push((header.id, name));
                include_dirs.extend(header.include_dirs.iter().cloned());
            }
            if prog.live_kernels.load(Ordering::Relaxed) > 0 {
                return Err(CL_INVALID_OPERATION);
            }
            // SAFETY: a NUL-terminated string (or null).
            let options = unsafe { c_string(options) }.unwrap_or_default();
            rgpu_cl_api::validate::build_options(&options)?;
            *prog.options.lock().unwrap_or_else(|e| e.into_inner()) = Some(options.clone());
            include_dirs.sort();
            include_dirs.dedup();
            let options = crate::includes::with_include_dirs(&options, &include_dirs);
            let includes = crate::includes::collect(&options);
            let server = prog.conn.opencl();
            let compiled =
                server.compile_program(prog.id, ids(&devices), options, headers, includes);
            let status = crate::util::status(compiled.outcome());
            notify(pfn_notify, program, user_data);
            Ok(status)
        })();
        result.unwrap_or_else(|code| code)
    })
}

pub unsafe extern "C" fn clLinkProgram(
    context: cl_context,
    num_devices: cl_uint,
    device_list: *const cl_device_id,
    options: *const c_char,
    num_input_programs: cl_uint,
    input_programs: *const cl_program,
    pfn_notify: Option<ProgramNotify>,
    user_data: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_program {
    guard(std::ptr::null_mut(), || {
        let result = (|| {
            let context = context_from(context)?;
            if pfn_notify.is_none() && !user_data.is_null() {
                return Err(CL_INVALID_VALUE);
            }
            if num_input_programs == 0 || input_programs.is_null() {
                return Err(CL_INVALID_VALUE);
            }
            // SAFETY: the application's device array of `num_devices` entries.
            let devices = unsafe { device_subset(&context.devices, num_devices, device_list) }?;
            // SAFETY: `num_input_programs` program handles.
            let inputs = unsafe { slice(input_programs, num_input_programs as usize) };
            let mut input_ids = Vec::with_capacity(inputs.len());
            for &input in inputs {
                let input = program_from(input)?;
                if !Arc::ptr_eq(&input.context, &context) {
                    return Err(CL_INVALID_PROGRAM);
                }
                input_ids.push(input.id);
            }
            // SAFETY: a NUL-terminated string (or null).
            let options = unsafe { c_string(options) }.unwrap_or_default();
            rgpu_cl_api::validate::build_options(&options)?;
            let id = context.conn.new_id();
            // On failure the server keeps no program under `id`, so there is nothing to return
            // (or release).
            context
                .conn
                .opencl()
                .link_program(id, context.id, ids(&devices), options, input_ids)
                .outcome()?;
            let linked = new_program(context, id, devices, None, Vec::new(), None);
            notify(pfn_notify, linked, user_data);
            Ok(linked)
        })();
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

/// The program's binary for each of its devices, from its server (empty: none for that device).
pub(crate) fn binaries_of(program: &Program) -> Result<Vec<Vec<u8>>, cl_int> {
    let query = || InfoQuery::Program(program.id);
    let sizes = size_list(&server_info(
        &program.conn,
        query(),
        CL_PROGRAM_BINARY_SIZES,
    )?)?;
    let all = server_info(&program.conn, query(), CL_PROGRAM_BINARIES)?;
    if sizes.len() != program.devices.len() || sizes.iter().sum::<usize>() != all.len() {
        log::error!(
            "rgpu: program binaries from the server ({} bytes) do not match their sizes {sizes:?}",
            all.len()
        );
        return Err(CL_OUT_OF_RESOURCES);
    }
    let mut offset = 0;
    Ok(sizes
        .iter()
        .map(|&size| {
            offset += size;
            all[offset - size..offset].to_vec()
        })
        .collect())
}

/// CL_PROGRAM_BINARIES: the application passes an array of one pointer per device; each
/// non-null one receives that device's binary (sized as CL_PROGRAM_BINARY_SIZES said).
///
/// # Safety
/// The pointers are the application's for this query.
unsafe fn program_binaries(
    program: &Program,
    param_value_size: usize,
    param_value: *mut c_void,
    param_value_size_ret: *mut usize,
) -> Result<(), cl_int> {
    let n = program.devices.len();
    let needed = n * std::mem::size_of::<*mut c_uchar>();
    if !param_value.is_null() {
        if param_value_size < needed {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: checked: at least `n` pointer slots.
        let targets = unsafe { slice(param_value as *const *mut c_uchar, n) };
        if targets.iter().any(|t| !t.is_null()) {
            for (&target, binary) in targets.iter().zip(binaries_of(program)?) {
                if !target.is_null() {
                    // SAFETY: the application sized each buffer by CL_PROGRAM_BINARY_SIZES.
                    unsafe { std::ptr::copy_nonoverlapping(binary.as_ptr(), target, binary.len()) };
                }
            }
        }
    }
    if !param_value_size_ret.is_null() {
        // SAFETY: the application's size pointer, checked non-null.
        unsafe { *param_value_size_ret = needed };
    }
    Ok(())
}

pub unsafe extern "C" fn clGetProgramInfo(
    program: cl_program,
    param_name: cl_program_info,
    param_value_size: usize,
    param_value: *mut c_void,
    param_value_size_ret: *mut usize,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let program = match program_from(program) {
            Ok(p) => p,
            Err(code) => return code,
        };
        let value = match param_name {
            CL_PROGRAM_REFERENCE_COUNT => Ok(bytes_of(&handle::app_refs(&program))),
            CL_PROGRAM_CONTEXT => Ok(bytes_of(&handle::raw(&program.context))),
            CL_PROGRAM_NUM_DEVICES => Ok(bytes_of(&(program.devices.len() as cl_uint))),
            CL_PROGRAM_DEVICES => {
                let raws: Vec<*mut c_void> = program.devices.iter().map(handle::raw).collect();
                Ok(bytes_of_slice(&raws))
            }
            CL_PROGRAM_SOURCE => Ok(string_bytes(program.source.as_deref().unwrap_or(""))),
            CL_PROGRAM_IL => Ok(program.il.clone().unwrap_or_default()),
            CL_PROGRAM_BINARIES => {
                // SAFETY: the application's out-pointers for this query.
                let done = unsafe {
                    program_binaries(
                        &program,
                        param_value_size,
                        param_value,
                        param_value_size_ret,
                    )
                };
                return crate::util::status(done);
            }
            other => server_info(&program.conn, InfoQuery::Program(program.id), other),
        };
        // SAFETY: the application's out-pointers for this query.
        unsafe { answer_info(value, param_value_size, param_value, param_value_size_ret) }
    })
}

pub unsafe extern "C" fn clGetProgramBuildInfo(
    program: cl_program,
    device: cl_device_id,
    param_name: cl_program_build_info,
    param_value_size: usize,
    param_value: *mut c_void,
    param_value_size_ret: *mut usize,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let value = (|| {
            let program = program_from(program)?;
            let device = program_device(&program, device, false)?;
            if param_name == CL_PROGRAM_BUILD_OPTIONS {
                let options = program.options.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(options) = options.as_deref() {
                    return Ok(crate::util::string_bytes(options));
                }
            }
            // A device of another server: the program's replica there (spanning.rs).
            let part = program
                .context
                .spanning
                .as_ref()
                .and_then(|s| s.part_of(&device));
            let (conn, id) = match part {
                Some(part) if !Arc::ptr_eq(&part.conn, &program.conn) => {
                    let id = crate::spanning::program_on(&program, &part.conn)?;
                    (part.conn.clone(), id)
                }
                _ => (program.conn.clone(), program.id),
            };
            server_info(
                &conn,
                InfoQuery::ProgramBuild {
                    program: id,
                    device: device.id,
                },
                param_name,
            )
        })();
        // SAFETY: the application's out-pointers for this query.
        unsafe { answer_info(value, param_value_size, param_value, param_value_size_ret) }
    })
}

pub unsafe extern "C" fn clSetProgramReleaseCallback(
    program: cl_program,
    _pfn_notify: Option<ProgramNotify>,
    _user_data: *mut c_void,
) -> cl_int {
    // Deprecated in OpenCL 3.0: no device offers program-scope global destructors through rgpu.
    guard(CL_OUT_OF_HOST_MEMORY, || match program_from(program) {
        Ok(_) => CL_INVALID_OPERATION,
        Err(code) => code,
    })
}

pub unsafe extern "C" fn clSetProgramSpecializationConstant(
    program: cl_program,
    _spec_id: cl_uint,
    spec_size: usize,
    spec_value: *const c_void,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let program = match program_from(program) {
            Ok(p) => p,
            Err(code) => return code,
        };
        if program.il.is_none() {
            return CL_INVALID_PROGRAM;
        }
        if spec_size == 0 || spec_value.is_null() {
            return CL_INVALID_VALUE;
        }
        // The wire protocol has no message for specialization constants yet.
        crate::unsupported::report("clSetProgramSpecializationConstant");
        CL_INVALID_OPERATION
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_lists() {
        let mut bytes = 5u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(&9u64.to_le_bytes());
        assert_eq!(size_list(&bytes), Ok(vec![5, 9]));
        assert_eq!(size_list(&bytes[..7]), Err(CL_OUT_OF_RESOURCES));
    }

    #[test]
    fn invalid_handles() {
        let null = std::ptr::null_mut();
        // SAFETY: invalid handles are rejected before any pointer is used.
        unsafe {
            assert_eq!(
                clBuildProgram(null, 0, std::ptr::null(), std::ptr::null(), None, null),
                CL_INVALID_PROGRAM
            );
            assert_eq!(
                clGetProgramInfo(null, CL_PROGRAM_SOURCE, 0, null, std::ptr::null_mut()),
                CL_INVALID_PROGRAM
            );
            assert_eq!(clRetainProgram(null), CL_INVALID_PROGRAM);
        }
    }
}
