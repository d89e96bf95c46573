//! Buffers, sub-buffers and the queries shared by all memory objects.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use opencl_sys::*;
use rgpu_client::{Connection, OpenClClient};
use rgpu_protocol::opencl::{ClReply, ClRequest, Id};
use rgpu_protocol::{ClientMsg, ServerMsg};

use crate::api::context::context_from;
use crate::handle::{self, Ref};
use crate::objects::{Context, Mem, MemKind, UserCallback};
use crate::util::{bytes_of, bytes_of_slice, creation, guard, property_list, write_info, Outcome};

pub fn mem_from(mem: cl_mem) -> Result<Ref<Mem>, cl_int> {
    handle::lookup::<Mem>(mem)
}

const ACCESS_FLAGS: cl_mem_flags = CL_MEM_READ_WRITE | CL_MEM_WRITE_ONLY | CL_MEM_READ_ONLY;
const HOST_ACCESS_FLAGS: cl_mem_flags =
    CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS;
const HOST_PTR_FLAGS: cl_mem_flags = CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR;
const ALL_FLAGS: cl_mem_flags = ACCESS_FLAGS
    | HOST_ACCESS_FLAGS
    | HOST_PTR_FLAGS
    | CL_MEM_ALLOC_HOST_PTR
    | CL_MEM_KERNEL_READ_AND_WRITE;

/// Checks memory flags and their agreement with `host_ptr`, as clCreateBuffer and
/// clCreateImage specify. Returns the flags the server should see: the data behind a
/// USE_HOST_PTR lives on the client, so the server gets a copy.
pub fn check_flags(flags: cl_mem_flags, host_ptr: *const c_void) -> Result<cl_mem_flags, cl_int> {
    let flags = if flags == 0 { CL_MEM_READ_WRITE } else { flags };
    if flags & !ALL_FLAGS != 0
        || (flags & ACCESS_FLAGS).count_ones() > 1
        || (flags & HOST_ACCESS_FLAGS).count_ones() > 1
        || (flags & CL_MEM_USE_HOST_PTR != 0
            && flags & (CL_MEM_COPY_HOST_PTR | CL_MEM_ALLOC_HOST_PTR) != 0)
    {
        return Err(CL_INVALID_VALUE);
    }
    if host_ptr.is_null() == (flags & HOST_PTR_FLAGS != 0) {
        return Err(CL_INVALID_HOST_PTR);
    }
    let mut wire = flags;
    if wire & CL_MEM_USE_HOST_PTR != 0 {
        wire = (wire & !CL_MEM_USE_HOST_PTR) | CL_MEM_COPY_HOST_PTR;
    }
    Ok(wire)
}

/// The largest single allocation any device of the context allows.
fn max_alloc(context: &Context) -> u64 {
    context
        .devices
        .iter()
        .filter_map(|d| d.info.get(&CL_DEVICE_MAX_MEM_ALLOC_SIZE))
        .filter_map(|v| {
            v.get(..8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        })
        .min()
        .unwrap_or(u64::MAX)
}

fn create_buffer(
    context: cl_context,
    properties: Vec<cl_mem_properties>,
    flags: cl_mem_flags,
    size: usize,
    host_ptr: *mut c_void,
) -> Result<*mut c_void, cl_int> {
    let context = context_from(context)?;
    let wire_flags = check_flags(flags, host_ptr)?;
    if size == 0 || size as u64 > max_alloc(&context) {
        return Err(CL_INVALID_BUFFER_SIZE);
    }
    if properties.len() > 1 {
        // No buffer properties are defined by core OpenCL.
        return Err(CL_INVALID_PROPERTY);
    }
    let initial: &[u8] = if host_ptr.is_null() {
        &[]
    } else {
        // SAFETY: with a host-pointer flag the application provides `size` readable bytes.
        unsafe { std::slice::from_raw_parts(host_ptr as *const u8, size) }
    };
    let conn = Arc::clone(&context.conn);
    let id = conn.new_id();
    // Small buffers are not worth a mapping of their own and a round trip more.
    let in_place = flags & CL_MEM_ALLOC_HOST_PTR != 0
        && size as u64 >= rgpu_protocol::RING_MIN
        && properties.is_empty()
        && context.spanning.is_none();
    let shared_host = match in_place {
        true => create_in_shared_memory(&conn, id, &context, wire_flags, size, initial),
        false => None,
    };
    if shared_host.is_none() {
        conn.opencl()
            .create_buffer(
                id,
                context.id,
                wire_flags,
                size as u64,
                properties.clone(),
                initial,
            )
            .outcome()?;
    }
    let mem = handle::create(Mem {
        conn,
        id,
        context,
        flags: if flags == 0 { CL_MEM_READ_WRITE } else { flags },
        size,
        shared_host: shared_host.map_or(0, |base| base as usize),
        host_ptr: if flags & CL_MEM_USE_HOST_PTR != 0 {
            host_ptr as usize
        } else {
            0
        },
        properties,
        kind: MemKind::Buffer { parent: None },
        maps: Mutex::new(Vec::new()),
        destructors: Mutex::new(Vec::new()),
        residence: Default::default(),
    });
    Ok(handle::raw(&mem))
}

/// An `ALLOC_HOST_PTR` buffer whose memory is host memory shared with the server, where the
/// connection has shared memory (the server is on this host): the server makes its buffer in
/// that memory, so maps and unmaps move no data (on a CPU device, the buffer is that memory).
/// The buffer's address here, or `None` (no shared memory, or it failed): then the buffer is
/// made as any other.
fn create_in_shared_memory(
    conn: &Connection,
    id: Id,
    context: &Context,
    wire_flags: cl_mem_flags,
    size: usize,
    initial: &[u8],
) -> Option<*mut u8> {
    let base = conn.share_host_memory(size)?;
    // SAFETY: a new mapping of at least `size` bytes, this buffer's alone.
    let memory = unsafe { std::slice::from_raw_parts_mut(base, size) };
    if !initial.is_empty() {
        memory.copy_from_slice(&initial[..size]);
    }
    let request = ClientMsg::Cl(ClRequest::CreateBuffer {
        id,
        context: context.id,
        flags: (wire_flags & !CL_MEM_COPY_HOST_PTR) | CL_MEM_ALLOC_HOST_PTR,
        size: size as u64,
        properties: Vec::new(),
    });
    match conn.call_in_place(&request, memory) {
        Ok(ServerMsg::Cl(ClReply::CreateBuffer(Ok(())))) => Some(base),
        outcome => {
            log::debug!("ALLOC_HOST_PTR buffer in shared memory refused ({outcome:?}); copied");
            conn.unshare_host_memory(base);
            None
        }
    }
}

pub unsafe extern "C" fn clCreateBuffer(
    context: cl_context,
    flags: cl_mem_flags,
    size: usize,
    host_ptr: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    guard(std::ptr::null_mut(), || {
        let result = create_buffer(context, Vec::new(), flags, size, host_ptr);
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

pub unsafe extern "C" fn clCreateBufferWithProperties(
    context: cl_context,
    properties: *const cl_mem_properties,
    flags: cl_mem_flags,
    size: usize,
    host_ptr: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    guard(std::ptr::null_mut(), || {
        // SAFETY: a zero-terminated list from the application (or null).
        let props = unsafe { property_list(properties) };
        let result = create_buffer(context, props, flags, size, host_ptr);
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

/// Whether a sub-buffer may start at `origin` on `device` (CL_DEVICE_MEM_BASE_ADDR_ALIGN is
/// in bits). Implementations do not all check this themselves.
fn origin_aligned(device: &crate::objects::Device, origin: usize) -> bool {
    let align_bits = device
        .info
        .get(&CL_DEVICE_MEM_BASE_ADDR_ALIGN)
        .and_then(|v| v.get(..4))
        .map_or(8, |b| u32::from_le_bytes(b.try_into().unwrap()));
    let align = (align_bits as usize / 8).max(1);
    origin.is_multiple_of(align)
}

pub unsafe extern "C" fn clCreateSubBuffer(
    buffer: cl_mem,
    flags: cl_mem_flags,
    buffer_create_type: cl_buffer_create_type,
    buffer_create_info: *const c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    guard(std::ptr::null_mut(), || {
        let result = (|| {
            let parent = mem_from(buffer)?;
            if !matches!(parent.kind, MemKind::Buffer { parent: None }) {
                return Err(CL_INVALID_MEM_OBJECT);
            }
            if buffer_create_type != CL_BUFFER_CREATE_TYPE_REGION || buffer_create_info.is_null() {
                return Err(CL_INVALID_VALUE);
            }
            // SAFETY: for CL_BUFFER_CREATE_TYPE_REGION the info is a cl_buffer_region.
            let region = unsafe { *(buffer_create_info as *const cl_buffer_region) };
            if region.size == 0 {
                return Err(CL_INVALID_BUFFER_SIZE);
            }
            if region
                .origin
                .checked_add(region.size)
                .is_none_or(|end| end > parent.size)
            {
                return Err(CL_INVALID_VALUE);
            }
            if flags & (HOST_PTR_FLAGS | CL_MEM_ALLOC_HOST_PTR) != 0 {
                return Err(CL_INVALID_VALUE);
            }
            if !parent
                .context
                .devices
                .iter()
                .any(|d| origin_aligned(d, region.origin))
            {
                return Err(CL_MISALIGNED_SUB_BUFFER_OFFSET);
            }
            // Access flags not given are inherited from the parent.
            let mut own_flags = flags;
            if flags & ACCESS_FLAGS == 0 {
                own_flags |= parent.flags & ACCESS_FLAGS;
            }
            if flags & HOST_ACCESS_FLAGS == 0 {
                own_flags |= parent.flags & HOST_ACCESS_FLAGS;
            }
            own_flags |= parent.flags & (HOST_PTR_FLAGS | CL_MEM_ALLOC_HOST_PTR);
            let conn = Arc::clone(&parent.conn);
            let id = conn.new_id();
            conn.opencl()
                .create_sub_buffer(
                    id,
                    parent.id,
                    flags,
                    region.origin as u64,
                    region.size as u64,
                )
                .outcome()?;
            // The parent's host memory (0: none), at the sub-buffer's origin.
            let inside = |base: usize| if base == 0 { 0 } else { base + region.origin };
            let (host_ptr, shared_host) = (inside(parent.host_ptr), inside(parent.shared_host));
            let mem = handle::create(Mem {
                conn,
                id,
                context: parent.context.clone(),
                flags: own_flags,
                size: region.size,
                host_ptr,
                shared_host,
                properties: Vec::new(),
                kind: MemKind::Buffer {
                    parent: Some((parent.clone(), region.origin)),
                },
                maps: Mutex::new(Vec::new()),
                destructors: Mutex::new(Vec::new()),
                residence: Default::default(),
            });
            Ok(handle::raw(&mem))
        })();
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

pub unsafe extern "C" fn clRetainMemObject(memobj: cl_mem) -> cl_int {
    handle::retain::<Mem>(memobj)
}

pub unsafe extern "C" fn clReleaseMemObject(memobj: cl_mem) -> cl_int {
    handle::release::<Mem>(memobj)
}

/// rgpu offers no pipes (CL_DEVICE_PIPE_SUPPORT is false), so no memory object is one.
pub unsafe extern "C" fn clGetPipeInfo(
    _pipe: cl_mem,
    _param_name: cl_pipe_info,
    _param_value_size: usize,
    _param_value: *mut c_void,
    _param_value_size_ret: *mut usize,
) -> cl_int {
    CL_INVALID_MEM_OBJECT
}

pub unsafe extern "C" fn clGetMemObjectInfo(
    memobj: cl_mem,
    param_name: cl_mem_info,
    param_value_size: usize,
    param_value: *mut c_void,
    param_value_size_ret: *mut usize,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let mem = match mem_from(memobj) {
            Ok(m) => m,
            Err(code) => return code,
        };
        let null = std::ptr::null_mut::<c_void>();
        let value = match param_name {
            CL_MEM_TYPE => bytes_of(&match &mem.kind {
                MemKind::Buffer { .. } => CL_MEM_OBJECT_BUFFER,
                MemKind::Image(info) => info.desc.image_type,
            }),
            CL_MEM_FLAGS => bytes_of(&mem.flags),
            CL_MEM_SIZE => bytes_of(&mem.size),
            CL_MEM_HOST_PTR => bytes_of(&(mem.host_ptr as *mut c_void)),
            CL_MEM_MAP_COUNT => bytes_of(&mem.map_count()),
            CL_MEM_REFERENCE_COUNT => bytes_of(&handle::app_refs(&mem)),
            CL_MEM_CONTEXT => bytes_of(&handle::raw(&mem.context)),
            CL_MEM_ASSOCIATED_MEMOBJECT => bytes_of(&match &mem.kind {
                MemKind::Buffer {
                    parent: Some((parent, _)),
                } => handle::raw(parent),
                MemKind::Image(info) => info.source.as_ref().map_or(null, handle::raw),
                MemKind::Buffer { parent: None } => null,
            }),
            CL_MEM_OFFSET => bytes_of(&match &mem.kind {
                MemKind::Buffer {
                    parent: Some((_, origin)),
                } => *origin,
                _ => 0usize,
            }),
            CL_MEM_USES_SVM_POINTER => bytes_of(&(CL_FALSE as cl_bool)),
            CL_MEM_PROPERTIES => bytes_of_slice(&mem.properties),
            _ => return CL_INVALID_VALUE,
        };
        // SAFETY: the application's out-pointers for this query.
        unsafe { write_info(&value, param_value_size, param_value, param_value_size_ret) }
    })
}

pub unsafe extern "C" fn clSetMemObjectDestructorCallback(
    memobj: cl_mem,
    pfn_notify: Option<unsafe extern "C" fn(cl_mem, *mut c_void)>,
    user_data: *mut c_void,
) -> cl_int {
    let mem = match mem_from(memobj) {
        Ok(m) => m,
        Err(code) => return code,
    };
    let Some(func) = pfn_notify else {
        return CL_INVALID_VALUE;
    };
    mem.destructors.lock().unwrap().push(UserCallback {
        func,
        user_data: user_data as usize,
    });
    CL_SUCCESS
}
