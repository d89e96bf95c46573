//! Contexts.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use opencl_sys::*;

use crate::api::device::devices_from;
use crate::api::platform::platform_from;
use crate::handle::{self, Ref};
use crate::objects::{Context, ContextNotify, Device, UserCallback};
use crate::runtime::runtime;
use crate::util::{bytes_of, bytes_of_slice, creation, guard, property_list, write_info};

pub fn context_from(context: cl_context) -> Result<Ref<Context>, cl_int> {
    handle::lookup::<Context>(context)
}

/// Validates the property list; the platform, if given, must be rgpu's. Returns the list to
/// send to the server (platform removed, zero-terminated).
pub(crate) fn server_properties(props: &[cl_context_properties]) -> Result<Vec<u64>, cl_int> {
    let mut out = Vec::new();
    for pair in props.as_chunks::<2>().0 {
        let (key, value) = (pair[0], pair[1]);
        match key {
            k if k == CL_CONTEXT_PLATFORM as cl_context_properties => {
                platform_from(value as cl_platform_id).map(|_| ())?
            }
            k if k == CL_CONTEXT_INTEROP_USER_SYNC as cl_context_properties => {
                out.extend_from_slice(&[key as u64, value as u64])
            }
            _ => return Err(CL_INVALID_PROPERTY),
        }
    }
    out.push(0);
    Ok(out)
}

fn create_context(
    properties: *const cl_context_properties,
    devices: Vec<Ref<Device>>,
    pfn_notify: Option<ContextNotify>,
    user_data: *mut c_void,
) -> Result<*mut c_void, cl_int> {
    // SAFETY: a zero-terminated list from the application (or null).
    let props = unsafe { property_list(properties) };
    let server_props = server_properties(&props)?;
    if devices.is_empty() {
        return Err(CL_INVALID_VALUE);
    }
    // A context on each server of the devices; over several, one context as VirtualCL makes
    // (spanning.rs).
    let (conn, id, spanning) = crate::spanning::create_parts(&devices, &server_props)?;
    let context = handle::create(Context {
        conn,
        id,
        devices,
        properties: props,
        notify: pfn_notify.map(|func| UserCallback {
            func,
            user_data: user_data as usize,
        }),
        destructors: Mutex::new(Vec::new()),
        spanning,
    });
    Ok(handle::raw(&context))
}

pub unsafe extern "C" fn clCreateContext(
    properties: *const cl_context_properties,
    num_devices: cl_uint,
    devices: *const cl_device_id,
    pfn_notify: Option<ContextNotify>,
    user_data: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_context {
    guard(std::ptr::null_mut(), || {
        let result = (|| {
            if num_devices == 0
                || devices.is_null()
                || (pfn_notify.is_none() && !user_data.is_null())
            {
                return Err(CL_INVALID_VALUE);
            }
            // SAFETY: the application's device array.
            let devices = unsafe { devices_from(devices, num_devices) }?;
            create_context(properties, devices, pfn_notify, user_data)
        })();
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

pub unsafe extern "C" fn clCreateContextFromType(
    properties: *const cl_context_properties,
    device_type: cl_device_type,
    pfn_notify: Option<ContextNotify>,
    user_data: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_context {
    guard(std::ptr::null_mut(), || {
        let result = (|| {
            if pfn_notify.is_none() && !user_data.is_null() {
                return Err(CL_INVALID_VALUE);
            }
            let rt = runtime().ok_or(CL_INVALID_PLATFORM)?;
            let all = rt.devices();
            let chosen: Vec<Ref<Device>> = match device_type {
                CL_DEVICE_TYPE_ALL => all.to_vec(),
                CL_DEVICE_TYPE_DEFAULT => all.iter().take(1).cloned().collect(),
                t => all
                    .iter()
                    .filter(|d| d.device_type & t != 0)
                    .cloned()
                    .collect(),
            };
            // One server's devices, those of the first match: a context over several servers
            // (spanning.rs) is made only where the program names their devices, so that a
            // program that asks for "all GPUs" does not move its buffers between servers
            // unknowingly.
            let Some(first) = chosen.first() else {
                return Err(CL_DEVICE_NOT_FOUND);
            };
            let link = Arc::clone(&first.link);
            let same_server: Vec<Ref<Device>> = chosen
                .into_iter()
                .filter(|d| Arc::ptr_eq(&d.link, &link))
                .collect();
            create_context(properties, same_server, pfn_notify, user_data)
        })();
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

pub unsafe extern "C" fn clRetainContext(context: cl_context) -> cl_int {
    handle::retain::<Context>(context)
}

pub unsafe extern "C" fn clReleaseContext(context: cl_context) -> cl_int {
    handle::release::<Context>(context)
}

pub unsafe extern "C" fn clGetContextInfo(
    context: cl_context,
    param_name: cl_context_info,
    param_value_size: usize,
    param_value: *mut c_void,
    param_value_size_ret: *mut usize,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let context = match context_from(context) {
            Ok(c) => c,
            Err(code) => return code,
        };
        let value = match param_name {
            CL_CONTEXT_REFERENCE_COUNT => bytes_of(&handle::app_refs(&context)),
            CL_CONTEXT_NUM_DEVICES => bytes_of(&(context.devices.len() as cl_uint)),
            CL_CONTEXT_DEVICES => {
                let raws: Vec<*mut c_void> = context.devices.iter().map(handle::raw).collect();
                bytes_of_slice(&raws)
            }
            CL_CONTEXT_PROPERTIES => bytes_of_slice(&context.properties),
            _ => return CL_INVALID_VALUE,
        };
        // SAFETY: the application's out-pointers for this query.
        unsafe { write_info(&value, param_value_size, param_value, param_value_size_ret) }
    })
}

pub unsafe extern "C" fn clSetContextDestructorCallback(
    context: cl_context,
    pfn_notify: Option<unsafe extern "C" fn(cl_context, *mut c_void)>,
    user_data: *mut c_void,
) -> cl_int {
    let context = match context_from(context) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let Some(func) = pfn_notify else {
        return CL_INVALID_VALUE;
    };
    context.destructors.lock().unwrap().push(UserCallback {
        func,
        user_data: user_data as usize,
    });
    CL_SUCCESS
}
