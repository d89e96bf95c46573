//! Kernels: creation, arguments and info queries.
//!
//! clSetKernelArg never talks to the server: the value is recorded in the kernel's
//! [`KernelArgs`] and marked dirty; the next clEnqueueNDRangeKernel carries the dirty ones.
//! Immutable info (attributes, work-group facts per device, argument info) is fetched once and
//! cached in the kernel.

use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use opencl_sys::*;
use rgpu_client::OpenClClient;
use rgpu_protocol::opencl::{ArgKind, Id, InfoQuery, KernelArg, KernelFacts};

use crate::api::program::{answer_info, program_device, program_from, server_info, size_list};
use crate::handle::{self, Ref};
use crate::objects::{Kernel, KernelArgs, Mem, Program, Sampler};
use crate::util::{bytes_of, c_string, creation, guard, slice, string_bytes, Outcome};

/// `info_cache` key kinds.
const CACHE_KERNEL: u8 = 0;
const CACHE_WORK_GROUP: u8 = 1;
const CACHE_ARG: u8 = 2;

pub fn kernel_from(kernel: cl_kernel) -> Result<Ref<Kernel>, cl_int> {
    handle::lookup::<Kernel>(kernel)
}

fn new_kernel(
    program: &Ref<Program>,
    id: Id,
    name: String,
    facts: KernelFacts,
    args: Option<KernelArgs>,
) -> Ref<Kernel> {
    let KernelFacts {
        num_args,
        args: arg_kinds,
        limits: work_group_limits,
    } = facts;
    let n = num_args as usize;
    let args = args.unwrap_or_else(|| KernelArgs {
        values: vec![None; n],
        dirty: vec![false; n],
    });
    program.live_kernels.fetch_add(1, Ordering::Relaxed);
    handle::create(Kernel {
        conn: Arc::clone(&program.conn),
        id,
        program: program.clone(),
        name,
        num_args,
        arg_kinds,
        work_group_limits,
        accepted_group_sizes: Default::default(),
        args: Mutex::new(args),
        info_cache: Mutex::new(HashMap::new()),
        replicas: Mutex::new(Vec::new()),
        mem_args: Mutex::new(HashMap::new()),
    })
}

pub unsafe extern "C" fn clCreateKernel(
    program: cl_program,
    kernel_name: *const c_char,
    errcode_ret: *mut cl_int,
) -> cl_kernel {
    guard(std::ptr::null_mut(), || {
        let result = (|| {
            let program = program_from(program)?;
            // SAFETY: a NUL-terminated string (or null).
            let name = unsafe { c_string(kernel_name) }.ok_or(CL_INVALID_VALUE)?;
            let id = program.conn.new_id();
            let server = program.conn.opencl();
            let facts = server
                .create_kernel(id, program.id, name.clone())
                .outcome()?;
            Ok(handle::raw(&new_kernel(&program, id, name, facts, None)))
        })();
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

pub unsafe extern "C" fn clCreateKernelsInProgram(
    program: cl_program,
    num_kernels: cl_uint,
    kernels: *mut cl_kernel,
    num_kernels_ret: *mut cl_uint,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let result = (|| {
            let program = program_from(program)?;
            if !kernels.is_null() && num_kernels == 0 {
                return Err(CL_INVALID_VALUE);
            }
            // Also fails with CL_INVALID_PROGRAM_EXECUTABLE when nothing was built.
            let count = size_list(&server_info(
                &program.conn,
                InfoQuery::Program(program.id),
                CL_PROGRAM_NUM_KERNELS,
            )?)?
            .first()
            .copied()
            .ok_or(CL_OUT_OF_RESOURCES)?;
            if kernels.is_null() || count == 0 {
                return Ok(count);
            }
            if (num_kernels as usize) < count {
                return Err(CL_INVALID_VALUE);
            }
            let ids: Vec<Id> = (0..count).map(|_| program.conn.new_id()).collect();
            let server = program.conn.opencl();
            let created = server
                .create_kernels_in_program(program.id, ids.clone())
                .outcome()?;
            if created.len() > ids.len() {
                log::error!(
                    "rgpu: {} kernels created for {} ids",
                    created.len(),
                    ids.len()
                );
                return Err(CL_OUT_OF_RESOURCES);
            }
            for (i, ((name, facts), id)) in created.into_iter().zip(ids).enumerate() {
                let kernel = new_kernel(&program, id, name, facts, None);
                // SAFETY: the application provides `num_kernels` >= `count` slots.
                unsafe { *kernels.add(i) = handle::raw(&kernel) };
            }
            Ok(count)
        })();
        match result {
            Ok(count) => {
                if !num_kernels_ret.is_null() {
                    // SAFETY: the application's count pointer, checked non-null.
                    unsafe { *num_kernels_ret = count as cl_uint };
                }
                CL_SUCCESS
            }
            Err(code) => code,
        }
    })
}

pub unsafe extern "C" fn clCloneKernel(
    source_kernel: cl_kernel,
    errcode_ret: *mut cl_int,
) -> cl_kernel {
    guard(std::ptr::null_mut(), || {
        let result = (|| {
            let source = kernel_from(source_kernel)?;
            let id = source.conn.new_id();
            let facts = source.conn.opencl().clone_kernel(id, source.id).outcome()?;
            // The server's clone has the arguments of the source's last launch; those set
            // since then (still dirty) have not reached the server, so they stay dirty in the
            // clone too.
            let args = source.args.lock().unwrap().clone();
            let kernel = new_kernel(&source.program, id, source.name.clone(), facts, Some(args));
            // Same function of the same program: the same immutable info.
            *kernel.info_cache.lock().unwrap() = source.info_cache.lock().unwrap().clone();
            Ok(handle::raw(&kernel))
        })();
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

pub unsafe extern "C" fn clRetainKernel(kernel: cl_kernel) -> cl_int {
    handle::retain::<Kernel>(kernel)
}

pub unsafe extern "C" fn clReleaseKernel(kernel: cl_kernel) -> cl_int {
    handle::release::<Kernel>(kernel)
}

/// The arguments changed since they last reached the server, marked clean.
pub fn take_dirty(args: &mut KernelArgs) -> Vec<(u32, KernelArg)> {
    let KernelArgs { values, dirty } = args;
    let mut changed = Vec::new();
    for (index, (value, dirty)) in values.iter().zip(dirty.iter_mut()).enumerate() {
        if std::mem::take(dirty) {
            if let Some(value) = value {
                changed.push((index as u32, value.clone()));
            }
        }
    }
    changed
}

/// A new argument value; plain bytes stay borrowed until stored, so an argument set again with
/// the same size reuses its buffer.
enum NewArg<'a> {
    Bytes(&'a [u8]),
    Other(KernelArg),
}

/// Stores an argument value, marking it dirty only if it differs from the value the kernel
/// holds (an unchanged argument need not travel with the next launch).
fn store_arg(args: &mut KernelArgs, index: usize, new: NewArg<'_>) {
    let KernelArgs { values, dirty } = args;
    if values.len() <= index {
        values.resize(index + 1, None);
    }
    if dirty.len() < values.len() {
        dirty.resize(values.len(), false);
    }
    let slot = &mut values[index];
    let changed = match (slot, new) {
        (Some(KernelArg::Bytes(old)), NewArg::Bytes(bytes)) if old.len() == bytes.len() => {
            if old.as_slice() == bytes {
                false
            } else {
                old.copy_from_slice(bytes);
                true
            }
        }
        (slot, NewArg::Bytes(bytes)) => {
            *slot = Some(KernelArg::Bytes(bytes.to_vec()));
            true
        }
        (slot, NewArg::Other(value)) => {
            if slot.as_ref() == Some(&value) {
                false
            } else {
                *slot = Some(value);
                true
            }
        }
    };
    if changed {
        dirty[index] = true;
    }
}

/// The object handle an argument value points to (a pointer-sized value), or null.
///
/// # Safety
/// `arg_value` is null or points to `arg_size` readable bytes.
unsafe fn pointed_handle(arg_size: usize, arg_value: *const c_void) -> *const c_void {
    if arg_value.is_null() || arg_size != std::mem::size_of::<cl_mem>() {
        return std::ptr::null();
    }
    // SAFETY: `arg_size` bytes are readable; the pointer may be unaligned.
    unsafe { (arg_value as *const *const c_void).read_unaligned() }
}

fn mem_arg(kernel: &Kernel, handle: *const c_void) -> Option<Result<KernelArg, cl_int>> {
    let mem = handle::get::<Mem>(handle)?;
    Some(
        if Arc::ptr_eq(&mem.conn, &kernel.conn)
            && Arc::ptr_eq(&mem.context, &kernel.program.context)
        {
            Ok(KernelArg::Mem(mem.id))
        } else {
            Err(CL_INVALID_MEM_OBJECT)
        },
    )
}

fn sampler_arg(kernel: &Kernel, handle: *const c_void) -> Option<Result<KernelArg, cl_int>> {
    let sampler = handle::get::<Sampler>(handle)?;
    Some(
        if Arc::ptr_eq(&sampler.conn, &kernel.conn)
            && Arc::ptr_eq(&sampler.context, &kernel.program.context)
        {
            Ok(KernelArg::Sampler(sampler.id))
        } else {
            Err(CL_INVALID_SAMPLER)
        },
    )
}

/// Checks an argument value against what the argument takes (the checks clSetKernelArg
/// specifies) and turns it into what travels with the next launch.
///
/// # Safety
/// `arg_value` is null or points to `arg_size` readable bytes.
unsafe fn checked_arg<'a>(
    kernel: &Kernel,
    kind: ArgKind,
    arg_size: usize,
    arg_value: *const c_void,
) -> Result<NewArg<'a>, cl_int> {
    // SAFETY: see the function contract.
    let handle = unsafe { pointed_handle(arg_size, arg_value) };
    let bytes = || {
        // SAFETY: see the function contract; checked non-null by the callers.
        unsafe { std::slice::from_raw_parts(arg_value as *const u8, arg_size) }
    };
    match kind {
        ArgKind::Local => {
            if !arg_value.is_null() {
                return Err(CL_INVALID_ARG_VALUE);
            }
            if arg_size == 0 {
                return Err(CL_INVALID_ARG_SIZE);
            }
            Ok(NewArg::Other(KernelArg::Local(arg_size as u64)))
        }
        ArgKind::MemObject => {
            if arg_size != std::mem::size_of::<cl_mem>() {
                return Err(CL_INVALID_ARG_SIZE);
            }
            if handle.is_null() {
                return Ok(NewArg::Other(KernelArg::Mem(0)));
            }
            mem_arg(kernel, handle)
                .unwrap_or(Err(CL_INVALID_MEM_OBJECT))
                .map(NewArg::Other)
        }
        ArgKind::Sampler => {
            if arg_size != std::mem::size_of::<cl_sampler>() {
                return Err(CL_INVALID_ARG_SIZE);
            }
            if arg_value.is_null() {
                return Err(CL_INVALID_ARG_VALUE);
            }
            sampler_arg(kernel, handle)
                .unwrap_or(Err(CL_INVALID_SAMPLER))
                .map(NewArg::Other)
        }
        ArgKind::Value { size } => {
            if arg_value.is_null() {
                return Err(CL_INVALID_ARG_VALUE);
            }
            if size.is_some_and(|size| size as usize != arg_size) || arg_size == 0 {
                return Err(CL_INVALID_ARG_SIZE);
            }
            Ok(NewArg::Bytes(bytes()))
        }
        // No argument info: recognise object handles by value.
        ArgKind::Unknown => {
            if arg_value.is_null() {
                // A __local argument of `arg_size` bytes, or a NULL buffer: the server passes
                // (size, NULL) either way. No argument of either kind has size 0.
                if arg_size == 0 {
                    return Err(CL_INVALID_ARG_SIZE);
                }
                return Ok(NewArg::Other(KernelArg::Local(arg_size as u64)));
            }
            match mem_arg(kernel, handle).or_else(|| sampler_arg(kernel, handle)) {
                Some(arg) => arg.map(NewArg::Other),
                None => Ok(NewArg::Bytes(bytes())),
            }
        }
    }
}

pub unsafe extern "C" fn clSetKernelArg(
    kernel: cl_kernel,
    arg_index: cl_uint,
    arg_size: usize,
    arg_value: *const c_void,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let kernel = match kernel_from(kernel) {
            Ok(k) => k,
            Err(code) => return code,
        };
        if arg_index >= kernel.num_args {
            return CL_INVALID_ARG_INDEX;
        }
        let kind = kernel
            .arg_kinds
            .get(arg_index as usize)
            .copied()
            .unwrap_or(ArgKind::Unknown);
        // SAFETY: the application promises `arg_size` readable bytes at `arg_value`.
        let new = match unsafe { checked_arg(&kernel, kind, arg_size, arg_value) } {
            Ok(new) => new,
            Err(code) => return code,
        };
        if kernel.program.context.spanning.is_some() {
            // Which buffer: it is moved to whichever server runs the kernel (spanning.rs).
            let mem = match &new {
                NewArg::Other(KernelArg::Mem(id)) if *id != 0 => {
                    // SAFETY: as above.
                    let handle = unsafe { pointed_handle(arg_size, arg_value) };
                    handle::get::<Mem>(handle).map(|mem| Arc::downgrade(&mem))
                }
                _ => None,
            };
            let mut mems = kernel.mem_args.lock().unwrap();
            match mem {
                Some(mem) => mems.insert(arg_index, mem),
                None => mems.remove(&arg_index),
            };
        }
        store_arg(&mut kernel.args.lock().unwrap(), arg_index as usize, new);
        CL_SUCCESS
    })
}

/// A cached immutable value, fetched from the server the first time.
fn cached(
    kernel: &Kernel,
    key: (u8, u64, u32),
    fetch: impl FnOnce() -> Result<Vec<u8>, cl_int>,
) -> Result<Vec<u8>, cl_int> {
    if let Some(value) = kernel.info_cache.lock().unwrap().get(&key) {
        return Ok(value.clone());
    }
    let value = fetch()?;
    kernel.info_cache.lock().unwrap().insert(key, value.clone());
    Ok(value)
}

pub unsafe extern "C" fn clGetKernelInfo(
    kernel: cl_kernel,
    param_name: cl_kernel_info,
    param_value_size: usize,
    param_value: *mut c_void,
    param_value_size_ret: *mut usize,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let kernel = match kernel_from(kernel) {
            Ok(k) => k,
            Err(code) => return code,
        };
        let query = || server_info(&kernel.conn, InfoQuery::Kernel(kernel.id), param_name);
        let value = match param_name {
            CL_KERNEL_FUNCTION_NAME => Ok(string_bytes(&kernel.name)),
            CL_KERNEL_NUM_ARGS => Ok(bytes_of(&kernel.num_args)),
            CL_KERNEL_REFERENCE_COUNT => Ok(bytes_of(&handle::app_refs(&kernel))),
            CL_KERNEL_CONTEXT => Ok(bytes_of(&handle::raw(&kernel.program.context))),
            CL_KERNEL_PROGRAM => Ok(bytes_of(&handle::raw(&kernel.program))),
            CL_KERNEL_ATTRIBUTES => cached(&kernel, (CACHE_KERNEL, 0, param_name), query),
            _ => query(),
        };
        // SAFETY: the application's out-pointers for this query.
        unsafe { answer_info(value, param_value_size, param_value, param_value_size_ret) }
    })
}

pub unsafe extern "C" fn clGetKernelWorkGroupInfo(
    kernel: cl_kernel,
    device: cl_device_id,
    param_name: cl_kernel_work_group_info,
    param_value_size: usize,
    param_value: *mut c_void,
    param_value_size_ret: *mut usize,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let value = (|| {
            let kernel = kernel_from(kernel)?;
            let device = program_device(&kernel.program, device, true)?;
            // A device of another server: the kernel's replica there (spanning.rs).
            let spanning = kernel.program.context.spanning.as_ref();
            let (conn, id) = match spanning.and_then(|s| s.part_of(&device)) {
                Some(part) if !Arc::ptr_eq(&part.conn, &kernel.conn) => {
                    let replica = crate::spanning::kernel_on(&kernel, &part.conn)?;
                    (part.conn.clone(), replica.id)
                }
                _ => (kernel.conn.clone(), kernel.id),
            };
            let query = || {
                server_info(
                    &conn,
                    InfoQuery::KernelWorkGroup {
                        kernel: id,
                        device: device.id,
                    },
                    param_name,
                )
            };
            // The local memory size counts __local arguments as last set: not immutable.
            if param_name == CL_KERNEL_LOCAL_MEM_SIZE {
                // The server must see the arguments as set now.
                if id == kernel.id {
                    let args = take_dirty(&mut kernel.args.lock().unwrap());
                    if !args.is_empty() {
                        let server = kernel.conn.opencl();
                        server.set_kernel_args(kernel.id, args).outcome()?;
                    }
                }
                return query();
            }
            // Keyed by the device's handle: devices of two servers may share an id.
            let key = crate::handle::raw(&device) as u64;
            cached(&kernel, (CACHE_WORK_GROUP, key, param_name), query)
        })();
        // SAFETY: the application's out-pointers for this query.
        unsafe { answer_info(value, param_value_size, param_value, param_value_size_ret) }
    })
}

pub unsafe extern "C" fn clGetKernelArgInfo(
    kernel: cl_kernel,
    arg_index: cl_uint,
    param_name: cl_kernel_arg_info,
    param_value_size: usize,
    param_value: *mut c_void,
    param_value_size_ret: *mut usize,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let value = (|| {
            let kernel = kernel_from(kernel)?;
            if arg_index >= kernel.num_args {
                return Err(CL_INVALID_ARG_INDEX);
            }
            cached(
                &kernel,
                (CACHE_ARG, u64::from(arg_index), param_name),
                || {
                    server_info(
                        &kernel.conn,
                        InfoQuery::KernelArg {
                            kernel: kernel.id,
                            index: arg_index,
                        },
                        param_name,
                    )
                },
            )
        })();
        // SAFETY: the application's out-pointers for this query.
        unsafe { answer_info(value, param_value_size, param_value, param_value_size_ret) }
    })
}

pub unsafe extern "C" fn clGetKernelSubGroupInfo(
    kernel: cl_kernel,
    device: cl_device_id,
    param_name: cl_kernel_sub_group_info,
    input_value_size: usize,
    input_value: *const c_void,
    param_value_size: usize,
    param_value: *mut c_void,
    param_value_size_ret: *mut usize,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let value = (|| {
            let kernel = kernel_from(kernel)?;
            let device = program_device(&kernel.program, device, true)?;
            // SAFETY: the application gives `input_value_size` readable bytes (or null).
            let input = unsafe { slice(input_value as *const u8, input_value_size) }.to_vec();
            server_info(
                &kernel.conn,
                InfoQuery::KernelSubGroup {
                    kernel: kernel.id,
                    device: device.id,
                    input,
                    output_size: if param_value.is_null() {
                        0
                    } else {
                        param_value_size as u64
                    },
                },
                param_name,
            )
        })();
        // SAFETY: the application's out-pointers for this query.
        unsafe { answer_info(value, param_value_size, param_value, param_value_size_ret) }
    })
}

pub unsafe extern "C" fn clSetKernelExecInfo(
    kernel: cl_kernel,
    param_name: cl_kernel_exec_info,
    _param_value_size: usize,
    _param_value: *const c_void,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        if let Err(code) = kernel_from(kernel) {
            return code;
        }
        match param_name {
            // rgpu devices report no SVM capabilities: that comes first, whatever the value.
            CL_KERNEL_EXEC_INFO_SVM_PTRS | CL_KERNEL_EXEC_INFO_SVM_FINE_GRAIN_SYSTEM => {
                CL_INVALID_OPERATION
            }
            // The other names (CL_KERNEL_EXEC_INFO_*_ARM, ...) are unknown here.
            _ => CL_INVALID_VALUE,
        }
    })
}

pub unsafe extern "C" fn clSetKernelArgSVMPointer(
    kernel: cl_kernel,
    arg_index: cl_uint,
    _arg_value: *const c_void,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let kernel = match kernel_from(kernel) {
            Ok(k) => k,
            Err(code) => return code,
        };
        if arg_index >= kernel.num_args {
            return CL_INVALID_ARG_INDEX;
        }
        // rgpu devices report no SVM capabilities.
        CL_INVALID_OPERATION
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_are_dirty_only_when_changed() {
        let mut args = KernelArgs {
            values: vec![None; 3],
            dirty: vec![false; 3],
        };
        store_arg(&mut args, 0, NewArg::Bytes(&[1, 2, 3, 4]));
        store_arg(&mut args, 1, NewArg::Other(KernelArg::Mem(7)));
        store_arg(&mut args, 2, NewArg::Other(KernelArg::Local(64)));
        assert_eq!(args.dirty, [true, true, true]);
        let buffer = match &args.values[0] {
            Some(KernelArg::Bytes(b)) => b.as_ptr(),
            _ => panic!("bytes expected"),
        };
        args.dirty.fill(false);
        // Unchanged values stay clean; a changed value of the same size reuses its buffer.
        store_arg(&mut args, 0, NewArg::Bytes(&[1, 2, 3, 4]));
        store_arg(&mut args, 1, NewArg::Other(KernelArg::Mem(7)));
        assert_eq!(args.dirty, [false, false, false]);
        store_arg(&mut args, 0, NewArg::Bytes(&[5, 6, 7, 8]));
        assert_eq!(args.values[0], Some(KernelArg::Bytes(vec![5, 6, 7, 8])));
        assert!(matches!(&args.values[0], Some(KernelArg::Bytes(b)) if b.as_ptr() == buffer));
        store_arg(&mut args, 1, NewArg::Bytes(&[0; 8]));
        assert_eq!(args.values[1], Some(KernelArg::Bytes(vec![0; 8])));
        assert_eq!(args.dirty, [true, true, false]);
    }

    #[test]
    fn invalid_handles() {
        let null = std::ptr::null_mut();
        let value = 0u32;
        // SAFETY: invalid handles are rejected before any pointer is used.
        unsafe {
            assert_eq!(
                clSetKernelArg(null, 0, 4, &value as *const u32 as *const c_void),
                CL_INVALID_KERNEL
            );
            assert_eq!(
                clGetKernelInfo(null, CL_KERNEL_NUM_ARGS, 0, null, std::ptr::null_mut()),
                CL_INVALID_KERNEL
            );
            let mut err = 0;
            assert!(clCreateKernel(null, c"k".as_ptr(), &mut err).is_null());
            assert_eq!(err, CL_INVALID_PROGRAM);
        }
    }
}
