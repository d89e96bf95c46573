//! Command queues, clFlush and clFinish.

use std::ffi::c_void;

use opencl_sys::*;
use rgpu_client::OpenClClient;

use crate::api::context::context_from;
use crate::api::device::device_from;
use crate::handle::{self, Ref};
use crate::objects::{Pending, Queue};
use crate::util::{
    bytes_of, bytes_of_slice, client_error, creation, guard, property_list, write_info, Outcome,
};

pub fn queue_from(queue: cl_command_queue) -> Result<Ref<Queue>, cl_int> {
    handle::lookup::<Queue>(queue)
}

const KNOWN_QUEUE_FLAGS: cl_command_queue_properties =
    CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE | CL_QUEUE_PROFILING_ENABLE;
const ON_DEVICE_FLAGS: cl_command_queue_properties =
    CL_QUEUE_ON_DEVICE | CL_QUEUE_ON_DEVICE_DEFAULT;

/// A queue's properties as the server takes them: the flags, then the rest of the list.
pub(crate) fn wire_properties(
    properties: cl_command_queue_properties,
    properties_array: &[cl_queue_properties],
) -> Vec<u64> {
    let mut wire = vec![CL_QUEUE_PROPERTIES as u64, properties];
    for pair in properties_array.as_chunks::<2>().0 {
        if pair[0] != CL_QUEUE_PROPERTIES as u64 {
            wire.extend_from_slice(pair);
        }
    }
    wire.push(0);
    wire
}

fn create_queue(
    context: cl_context,
    device: cl_device_id,
    properties: cl_command_queue_properties,
    properties_array: Vec<cl_queue_properties>,
) -> Result<*mut c_void, cl_int> {
    let context = context_from(context)?;
    let device = device_from(device)?;
    if !context.has_device(&device) {
        return Err(CL_INVALID_DEVICE);
    }
    if properties & !(KNOWN_QUEUE_FLAGS | ON_DEVICE_FLAGS) != 0 {
        return Err(CL_INVALID_VALUE);
    }
    if properties & ON_DEVICE_FLAGS != 0 {
        // Valid, but on-device queues are not offered through rgpu.
        return Err(CL_INVALID_QUEUE_PROPERTIES);
    }
    // On the device's server (a context over several has a part on each).
    let (conn, context_id) = crate::spanning::queue_context(&context, &device);
    let id = conn.new_id();
    conn.opencl()
        .create_queue(
            id,
            context_id,
            device.id,
            wire_properties(properties, &properties_array),
        )
        .outcome()?;
    let queue = handle::create(Queue {
        conn,
        id,
        context,
        device,
        properties,
        properties_array,
        pending_reads: Pending::default(),
    });
    Ok(handle::raw(&queue))
}

pub unsafe extern "C" fn clCreateCommandQueue(
    context: cl_context,
    device: cl_device_id,
    properties: cl_command_queue_properties,
    errcode_ret: *mut cl_int,
) -> cl_command_queue {
    guard(std::ptr::null_mut(), || {
        let result = create_queue(context, device, properties, Vec::new());
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

pub unsafe extern "C" fn clCreateCommandQueueWithProperties(
    context: cl_context,
    device: cl_device_id,
    properties: *const cl_queue_properties,
    errcode_ret: *mut cl_int,
) -> cl_command_queue {
    guard(std::ptr::null_mut(), || {
        // SAFETY: a zero-terminated list from the application (or null).
        let list = unsafe { property_list(properties) };
        let mut flags = 0;
        let mut valid = true;
        for pair in list.as_chunks::<2>().0 {
            match pair[0] as cl_uint {
                CL_QUEUE_PROPERTIES => flags = pair[1],
                CL_QUEUE_SIZE => {}
                _ => valid = false,
            }
        }
        let result = if valid {
            create_queue(context, device, flags, list)
        } else {
            Err(CL_INVALID_VALUE)
        };
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

pub unsafe extern "C" fn clRetainCommandQueue(queue: cl_command_queue) -> cl_int {
    handle::retain::<Queue>(queue)
}

pub unsafe extern "C" fn clReleaseCommandQueue(queue: cl_command_queue) -> cl_int {
    // Releasing a queue implies a flush of what was queued on it.
    if let Ok(q) = queue_from(queue) {
        let _ = q.conn.flush();
    }
    handle::release::<Queue>(queue)
}

pub unsafe extern "C" fn clGetCommandQueueInfo(
    queue: cl_command_queue,
    param_name: cl_command_queue_info,
    param_value_size: usize,
    param_value: *mut c_void,
    param_value_size_ret: *mut usize,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let queue = match queue_from(queue) {
            Ok(q) => q,
            Err(code) => return code,
        };
        let value = match param_name {
            CL_QUEUE_CONTEXT => bytes_of(&handle::raw(&queue.context)),
            CL_QUEUE_DEVICE => bytes_of(&handle::raw(&queue.device)),
            CL_QUEUE_REFERENCE_COUNT => bytes_of(&handle::app_refs(&queue)),
            CL_QUEUE_PROPERTIES => bytes_of(&queue.properties),
            CL_QUEUE_PROPERTIES_ARRAY => bytes_of_slice(&queue.properties_array),
            CL_QUEUE_SIZE => return CL_INVALID_COMMAND_QUEUE,
            CL_QUEUE_DEVICE_DEFAULT => bytes_of(&std::ptr::null_mut::<c_void>()),
            _ => return CL_INVALID_VALUE,
        };
        // SAFETY: the application's out-pointers for this query.
        unsafe { write_info(&value, param_value_size, param_value, param_value_size_ret) }
    })
}

pub unsafe extern "C" fn clFlush(queue: cl_command_queue) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let queue = match queue_from(queue) {
            Ok(q) => q,
            Err(code) => return code,
        };
        let sent = queue
            .conn
            .opencl()
            .flush(queue.id)
            .and_then(|()| queue.conn.flush());
        match sent {
            Ok(()) => CL_SUCCESS,
            Err(e) => client_error(e),
        }
    })
}

/// clFinish: the server finishes the queue (and reports errors deferred until now), then the
/// client waits for the data of reads still streaming in.
pub fn finish(queue: &Queue) -> Result<(), cl_int> {
    let result = queue.conn.opencl().finish(queue.id).outcome();
    if !queue
        .pending_reads
        .wait_idle(*crate::api::event::WAIT_TIMEOUT)
    {
        return Err(CL_OUT_OF_RESOURCES);
    }
    result
}

pub unsafe extern "C" fn clFinish(queue: cl_command_queue) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || match queue_from(queue) {
        Ok(q) => crate::util::status(finish(&q)),
        Err(code) => code,
    })
}

pub unsafe extern "C" fn clSetCommandQueueProperty(
    queue: cl_command_queue,
    _properties: cl_command_queue_properties,
    _enable: cl_bool,
    _old_properties: *mut cl_command_queue_properties,
) -> cl_int {
    // Deprecated since OpenCL 1.1; properties are fixed at creation.
    match queue_from(queue) {
        Ok(_) => CL_INVALID_OPERATION,
        Err(code) => code,
    }
}
