//! Every clEnqueue*. Commands are queued on the connection without waiting (their errors
//! surface at the next synchronizing call); reads register where their data goes and, when
//! blocking, wait for it; writes hand their data to the socket before returning, so the host
//! memory is free for reuse at once.

use std::ffi::c_void;
use std::sync::Arc;

use opencl_sys::*;
use rgpu_client::OpenClClient;
use rgpu_client::{Handoff, ReadSink, SendPtr};
use rgpu_protocol::opencl::{BufferRect, Command, Id, KernelArg, Transfer, WorkGroupLimits};

use crate::api::event::{event_from, new_event, set_status, WAIT_TIMEOUT};
use crate::api::memory::mem_from;
use crate::api::queue::queue_from;
use crate::handle::{self, Ref};
use crate::objects::{AlignedBuf, Completion, Device, Kernel, Mapping, Mem, MemKind, Queue};
use crate::region::HostRegion;
use crate::spanning::{mem_on, Access};
use crate::util::{client_error, guard, slice, status};

/// A queue and the server ids of a command's wait list, validated.
struct Submission {
    queue: Ref<Queue>,
    wait: Vec<Id>,
    /// Events standing in for other servers' events in `wait`: kept until the command is sent.
    _bridges: Vec<crate::spanning::Bridge>,
}

fn prepare(
    queue: cl_command_queue,
    num_events: cl_uint,
    event_wait_list: *const cl_event,
) -> Result<Submission, cl_int> {
    let queue = queue_from(queue)?;
    if event_wait_list.is_null() != (num_events == 0) {
        return Err(CL_INVALID_EVENT_WAIT_LIST);
    }
    // SAFETY: the application's array of `num_events` events.
    let raw = unsafe { slice(event_wait_list, num_events as usize) };
    let mut events = Vec::with_capacity(raw.len());
    for &e in raw {
        let event = event_from(e).map_err(|_| CL_INVALID_EVENT_WAIT_LIST)?;
        if !Arc::ptr_eq(&event.context, &queue.context) {
            return Err(CL_INVALID_CONTEXT);
        }
        events.push(event);
    }
    let (wait, bridges) = match queue.context.spanning.is_some() {
        // Events of other servers are waited for through one of this server's.
        true => crate::spanning::wait_list(&queue, events)?,
        false => (events.iter().map(|e| e.id).collect(), Vec::new()),
    };
    Ok(Submission {
        queue,
        wait,
        _bridges: bridges,
    })
}

/// How a write of `size` bytes at `offset` uses the buffer: all of it, or part.
fn writing(mem: &Mem, offset: usize, size: usize) -> Access {
    match offset == 0 && size == mem.size {
        true => Access::Overwrite,
        false => Access::ReadWrite,
    }
}

/// A memory object of the queue's context.
fn mem_of_queue(queue: &Queue, mem: cl_mem) -> Result<Ref<Mem>, cl_int> {
    let mem = mem_from(mem)?;
    if !Arc::ptr_eq(&mem.context, &queue.context) {
        return Err(CL_INVALID_CONTEXT);
    }
    Ok(mem)
}

pub(crate) fn buffer_of_queue(queue: &Queue, mem: cl_mem) -> Result<Ref<Mem>, cl_int> {
    let mem = mem_of_queue(queue, mem)?;
    match mem.kind {
        MemKind::Buffer { .. } => Ok(mem),
        MemKind::Image(_) => Err(CL_INVALID_MEM_OBJECT),
    }
}

fn image_of_queue(queue: &Queue, mem: cl_mem) -> Result<Ref<Mem>, cl_int> {
    let mem = mem_of_queue(queue, mem)?;
    match mem.kind {
        MemKind::Image(_) => Ok(mem),
        MemKind::Buffer { .. } => Err(CL_INVALID_MEM_OBJECT),
    }
}

pub(crate) fn check_range(mem: &Mem, offset: usize, size: usize) -> Result<(), cl_int> {
    if size == 0 || offset.checked_add(size).is_none_or(|end| end > mem.size) {
        return Err(CL_INVALID_VALUE);
    }
    Ok(())
}

/// Host access the memory object's flags forbid.
fn check_host_access(mem: &Mem, reading: bool) -> Result<(), cl_int> {
    let forbidden = if reading {
        CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_NO_ACCESS
    } else {
        CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS
    };
    if mem.flags & forbidden != 0 {
        return Err(CL_INVALID_OPERATION);
    }
    Ok(())
}

fn store_event(event_out: *mut cl_event, event: Option<Ref<crate::objects::Event>>) {
    if let Some(event) = event {
        // SAFETY: the application's event out-pointer, non-null when an event was made.
        unsafe { *event_out = handle::raw(&event) };
    }
}

/// What a posted enqueue sends: a command, or a write of the bulk data.
enum Posted {
    Command(Command),
    /// A command whose validity only the implementation knows: sent as a call, its verdict
    /// the enqueue's result.
    Judged(Command),
    Write(Transfer),
}

impl From<Command> for Posted {
    fn from(command: Command) -> Posted {
        Posted::Command(command)
    }
}

impl From<Transfer> for Posted {
    fn from(transfer: Transfer) -> Posted {
        Posted::Write(transfer)
    }
}

/// Queues a command that returns no data (a write's data is `bulk`).
fn post(
    sub: Submission,
    event_out: *mut cl_event,
    command_type: cl_command_type,
    work: impl Into<Posted>,
    bulk: &[u8],
) -> Result<(), cl_int> {
    let queue = &sub.queue;
    let event = (!event_out.is_null()).then(|| {
        new_event(
            &queue.conn,
            &queue.context,
            Some(queue),
            command_type,
            Completion::Remote,
        )
    });
    let (server, event_id) = (queue.conn.opencl(), event.as_ref().map_or(0, |e| e.id));
    let posted = match work.into() {
        Posted::Command(command) => {
            debug_assert!(bulk.is_empty(), "bulk data with {command:?}");
            server
                .enqueue(queue.id, sub.wait, event_id, command)
                .map_err(client_error)
        }
        Posted::Judged(command) => server
            .enqueue_now(queue.id, sub.wait, event_id, command)
            .map_err(client_error)
            .and_then(|answer| answer),
        Posted::Write(transfer) => server
            .enqueue_write(queue.id, sub.wait, event_id, transfer, bulk)
            .map_err(client_error),
    };
    if let Err(e) = posted {
        if let Some(event) = event {
            handle::release::<crate::objects::Event>(handle::raw(&event));
        }
        return Err(e);
    }
    if let (Some(event), Some(rt)) = (&event, crate::runtime::runtime_if_ready()) {
        rt.track_command_event(event);
    }
    store_event(event_out, event);
    Ok(())
}

/// Where a read's data goes.
enum ReadTarget {
    /// Straight into this memory (tightly packed destination).
    Direct(*mut u8),
    /// Into a packed staging vector, then scattered into pitched host memory.
    Scatter(HostRegion),
}

/// Starts a read; with `blocking`, waits until its data is in place.
fn read(
    sub: Submission,
    event_out: *mut cl_event,
    command_type: cl_command_type,
    transfer: Transfer,
    blocking: bool,
    len: usize,
    target: ReadTarget,
) -> Result<(), cl_int> {
    let queue = sub.queue.clone();
    let event = (!event_out.is_null()).then(|| {
        new_event(
            &queue.conn,
            &queue.context,
            Some(&queue),
            command_type,
            Completion::Local,
        )
    });
    let (dst, scatter) = match target {
        ReadTarget::Direct(ptr) => (ptr, None),
        ReadTarget::Scatter(region) => {
            let mut staging = vec![0u8; len];
            (staging.as_mut_ptr(), Some((staging, region)))
        }
    };
    let finished = blocking.then(|| Arc::new(Handoff::<cl_int>::default()));
    let done_event = event.clone();
    let done_queue = queue.clone();
    let done_signal = finished.clone();
    let sink = ReadSink {
        dst: SendPtr(dst),
        len,
        done: Box::new(move |result| {
            let status = result.unwrap_or_else(client_error);
            if let (CL_SUCCESS, Some((staging, region))) = (status, &scatter) {
                // SAFETY: the application's destination, valid while the read is pending.
                unsafe { region.unpack(staging) };
            }
            drop(scatter);
            if let Some(event) = &done_event {
                set_status(
                    event,
                    if status == CL_SUCCESS {
                        CL_COMPLETE
                    } else {
                        status.min(-1)
                    },
                );
            }
            done_queue.pending_reads.done();
            if let Some(signal) = done_signal {
                signal.fill(status);
            }
        }),
    };
    queue.pending_reads.add();
    let (server, event_id) = (queue.conn.opencl(), event.as_ref().map_or(0, |e| e.id));
    if let Err(e) = server.enqueue_read(queue.id, sub.wait, event_id, transfer, sink) {
        // The sink's completion already ran with the error.
        if let Some(event) = event {
            handle::release::<crate::objects::Event>(handle::raw(&event));
        }
        return Err(client_error(e));
    }
    store_event(event_out, event);
    match finished {
        None => Ok(()),
        Some(signal) => match signal.wait(*WAIT_TIMEOUT) {
            Some(CL_SUCCESS) => Ok(()),
            Some(status) => Err(status),
            None => Err(CL_OUT_OF_RESOURCES),
        },
    }
}

/// Runs an enqueue body with the usual error plumbing.
fn enqueue(body: impl FnOnce() -> Result<(), cl_int>) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || status(body()))
}

// ---- Buffers ----------------------------------------------------------------------------

pub unsafe extern "C" fn clEnqueueReadBuffer(
    command_queue: cl_command_queue,
    buffer: cl_mem,
    blocking_read: cl_bool,
    offset: usize,
    size: usize,
    ptr: *mut c_void,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
        let mem = buffer_of_queue(&sub.queue, buffer)?;
        check_range(&mem, offset, size)?;
        check_host_access(&mem, true)?;
        if ptr.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        let command = Transfer::Buffer {
            buffer: mem_on(&mem, &sub.queue, Access::Read)?,
            offset: offset as u64,
            size: size as u64,
        };
        read(
            sub,
            event,
            CL_COMMAND_READ_BUFFER,
            command,
            blocking_read != 0,
            size,
            ReadTarget::Direct(ptr as *mut u8),
        )
    })
}

pub unsafe extern "C" fn clEnqueueWriteBuffer(
    command_queue: cl_command_queue,
    buffer: cl_mem,
    _blocking_write: cl_bool,
    offset: usize,
    size: usize,
    ptr: *const c_void,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
        let mem = buffer_of_queue(&sub.queue, buffer)?;
        check_range(&mem, offset, size)?;
        check_host_access(&mem, false)?;
        if ptr.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: the application provides `size` readable bytes at `ptr`.
        let data = unsafe { std::slice::from_raw_parts(ptr as *const u8, size) };
        let command = Transfer::Buffer {
            buffer: mem_on(&mem, &sub.queue, writing(&mem, offset, size))?,
            offset: offset as u64,
            size: size as u64,
        };
        post(sub, event, CL_COMMAND_WRITE_BUFFER, command, data)
    })
}

/// Pitches and bounds of a rectangular buffer access, with OpenCL's defaults for 0 pitches.
fn buffer_rect(
    mem: &Mem,
    origin: *const usize,
    region: *const usize,
    row_pitch: usize,
    slice_pitch: usize,
) -> Result<BufferRect, cl_int> {
    if origin.is_null() || region.is_null() {
        return Err(CL_INVALID_VALUE);
    }
    // SAFETY: the API passes three values each.
    let (origin, region) = unsafe {
        (
            *(origin as *const [usize; 3]),
            *(region as *const [usize; 3]),
        )
    };
    if region.contains(&0) {
        return Err(CL_INVALID_VALUE);
    }
    let row_pitch = if row_pitch == 0 { region[0] } else { row_pitch };
    let slice_pitch = if slice_pitch == 0 {
        region[1] * row_pitch
    } else {
        slice_pitch
    };
    if row_pitch < region[0] || slice_pitch < region[1] * row_pitch {
        return Err(CL_INVALID_VALUE);
    }
    let start = origin[2] * slice_pitch + origin[1] * row_pitch + origin[0];
    let end = start + (region[2] - 1) * slice_pitch + (region[1] - 1) * row_pitch + region[0];
    if end > mem.size {
        return Err(CL_INVALID_VALUE);
    }
    Ok(BufferRect {
        buffer_origin: origin.map(|v| v as u64),
        region: region.map(|v| v as u64),
        buffer_row_pitch: row_pitch as u64,
        buffer_slice_pitch: slice_pitch as u64,
    })
}

/// The client side of a rectangle: host memory at `host_origin` with the host pitches.
fn host_rect(
    ptr: *mut u8,
    host_origin: *const usize,
    rect: &BufferRect,
    row_pitch: usize,
    slice_pitch: usize,
) -> Result<HostRegion, cl_int> {
    if ptr.is_null() || host_origin.is_null() {
        return Err(CL_INVALID_VALUE);
    }
    // SAFETY: the API passes three values.
    let origin = unsafe { *(host_origin as *const [usize; 3]) };
    let [w, h, d] = rect.region.map(|v| v as usize);
    let region = HostRegion::new(std::ptr::null_mut(), w, h, d, row_pitch, slice_pitch);
    if region.row_pitch < w || region.slice_pitch < h * region.row_pitch {
        return Err(CL_INVALID_VALUE);
    }
    let offset = origin[2] * region.slice_pitch + origin[1] * region.row_pitch + origin[0];
    // SAFETY: the application's host memory covers the rectangle it describes.
    Ok(HostRegion {
        // SAFETY: the application's host memory covers the rectangle it describes.
        base: unsafe { ptr.add(offset) },
        ..region
    })
}

fn read_target(region: HostRegion) -> ReadTarget {
    if region.is_packed() {
        ReadTarget::Direct(region.base)
    } else {
        ReadTarget::Scatter(region)
    }
}

pub unsafe extern "C" fn clEnqueueReadBufferRect(
    command_queue: cl_command_queue,
    buffer: cl_mem,
    blocking_read: cl_bool,
    buffer_origin: *const usize,
    host_origin: *const usize,
    region: *const usize,
    buffer_row_pitch: usize,
    buffer_slice_pitch: usize,
    host_row_pitch: usize,
    host_slice_pitch: usize,
    ptr: *mut c_void,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
        let mem = buffer_of_queue(&sub.queue, buffer)?;
        check_host_access(&mem, true)?;
        let rect = buffer_rect(
            &mem,
            buffer_origin,
            region,
            buffer_row_pitch,
            buffer_slice_pitch,
        )?;
        let host = host_rect(
            ptr as *mut u8,
            host_origin,
            &rect,
            host_row_pitch,
            host_slice_pitch,
        )?;
        let command = Transfer::BufferRect {
            buffer: mem_on(&mem, &sub.queue, Access::Read)?,
            rect,
        };
        read(
            sub,
            event,
            CL_COMMAND_READ_BUFFER_RECT,
            command,
            blocking_read != 0,
            host.packed_len(),
            read_target(host),
        )
    })
}

pub unsafe extern "C" fn clEnqueueWriteBufferRect(
    command_queue: cl_command_queue,
    buffer: cl_mem,
    _blocking_write: cl_bool,
    buffer_origin: *const usize,
    host_origin: *const usize,
    region: *const usize,
    buffer_row_pitch: usize,
    buffer_slice_pitch: usize,
    host_row_pitch: usize,
    host_slice_pitch: usize,
    ptr: *const c_void,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
        let mem = buffer_of_queue(&sub.queue, buffer)?;
        check_host_access(&mem, false)?;
        let rect = buffer_rect(
            &mem,
            buffer_origin,
            region,
            buffer_row_pitch,
            buffer_slice_pitch,
        )?;
        let host = host_rect(
            ptr as *mut u8,
            host_origin,
            &rect,
            host_row_pitch,
            host_slice_pitch,
        )?;
        // SAFETY: the application's host memory covers the rectangle.
        let packed = unsafe { host.pack() };
        let buffer = mem_on(&mem, &sub.queue, Access::ReadWrite)?;
        post(
            sub,
            event,
            CL_COMMAND_WRITE_BUFFER_RECT,
            Transfer::BufferRect { buffer, rect },
            &packed,
        )
    })
}

pub unsafe extern "C" fn clEnqueueCopyBuffer(
    command_queue: cl_command_queue,
    src_buffer: cl_mem,
    dst_buffer: cl_mem,
    src_offset: usize,
    dst_offset: usize,
    size: usize,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
        let src = buffer_of_queue(&sub.queue, src_buffer)?;
        let dst = buffer_of_queue(&sub.queue, dst_buffer)?;
        check_range(&src, src_offset, size)?;
        check_range(&dst, dst_offset, size)?;
        if Arc::ptr_eq(&src, &dst) && src_offset.abs_diff(dst_offset) < size {
            return Err(CL_MEM_COPY_OVERLAP);
        }
        let command = Command::CopyBuffer {
            src: mem_on(&src, &sub.queue, Access::Read)?,
            dst: mem_on(&dst, &sub.queue, writing(&dst, dst_offset, size))?,
            src_offset: src_offset as u64,
            dst_offset: dst_offset as u64,
            size: size as u64,
        };
        post(sub, event, CL_COMMAND_COPY_BUFFER, command, &[])
    })
}

/// Three values from an API array argument.
fn triple(ptr: *const usize) -> Result<[u64; 3], cl_int> {
    if ptr.is_null() {
        return Err(CL_INVALID_VALUE);
    }
    // SAFETY: the API passes three values.
    Ok(unsafe { *(ptr as *const [usize; 3]) }.map(|v| v as u64))
}

pub unsafe extern "C" fn clEnqueueCopyBufferRect(
    command_queue: cl_command_queue,
    src_buffer: cl_mem,
    dst_buffer: cl_mem,
    src_origin: *const usize,
    dst_origin: *const usize,
    region: *const usize,
    src_row_pitch: usize,
    src_slice_pitch: usize,
    dst_row_pitch: usize,
    dst_slice_pitch: usize,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
        let src = buffer_of_queue(&sub.queue, src_buffer)?;
        let dst = buffer_of_queue(&sub.queue, dst_buffer)?;
        let src_rect = buffer_rect(&src, src_origin, region, src_row_pitch, src_slice_pitch)?;
        let dst_rect = buffer_rect(&dst, dst_origin, region, dst_row_pitch, dst_slice_pitch)?;
        let command = Command::CopyBufferRect {
            src: mem_on(&src, &sub.queue, Access::Read)?,
            dst: mem_on(&dst, &sub.queue, Access::ReadWrite)?,
            src_origin: src_rect.buffer_origin,
            dst_origin: dst_rect.buffer_origin,
            region: src_rect.region,
            src_row_pitch: src_rect.buffer_row_pitch,
            src_slice_pitch: src_rect.buffer_slice_pitch,
            dst_row_pitch: dst_rect.buffer_row_pitch,
            dst_slice_pitch: dst_rect.buffer_slice_pitch,
        };
        post(sub, event, CL_COMMAND_COPY_BUFFER_RECT, command, &[])
    })
}

pub unsafe extern "C" fn clEnqueueFillBuffer(
    command_queue: cl_command_queue,
    buffer: cl_mem,
    pattern: *const c_void,
    pattern_size: usize,
    offset: usize,
    size: usize,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
        let mem = buffer_of_queue(&sub.queue, buffer)?;
        if pattern.is_null()
            || !pattern_size.is_power_of_two()
            || pattern_size > 128
            || !offset.is_multiple_of(pattern_size)
            || !size.is_multiple_of(pattern_size)
        {
            return Err(CL_INVALID_VALUE);
        }
        check_range(&mem, offset, size)?;
        // SAFETY: the application provides `pattern_size` bytes.
        let pattern =
            unsafe { std::slice::from_raw_parts(pattern as *const u8, pattern_size) }.to_vec();
        let command = Command::FillBuffer {
            buffer: mem_on(&mem, &sub.queue, writing(&mem, offset, size))?,
            pattern,
            offset: offset as u64,
            size: size as u64,
        };
        post(sub, event, CL_COMMAND_FILL_BUFFER, command, &[])
    })
}

// ---- Images -----------------------------------------------------------------------------

/// The host side of an image transfer: `region` pixels with the given pitches at `ptr`.
fn image_host_region(
    mem: &Mem,
    ptr: *mut u8,
    region: [u64; 3],
    row_pitch: usize,
    slice_pitch: usize,
) -> Result<HostRegion, cl_int> {
    let info = mem.image().ok_or(CL_INVALID_MEM_OBJECT)?;
    if ptr.is_null() || region.contains(&0) {
        return Err(CL_INVALID_VALUE);
    }
    let [w, mut h, mut d] = region.map(|v| v as usize);
    if info.desc.image_type == CL_MEM_OBJECT_IMAGE1D_ARRAY {
        // The layers of a 1-D array are its "rows", but they lie a slice pitch apart.
        (h, d) = (1, h);
    }
    let row_bytes = w * info.element_size;
    let host = HostRegion::new(ptr, row_bytes, h, d, row_pitch, slice_pitch);
    if host.row_pitch < row_bytes || (d > 1 && host.slice_pitch < host.row_pitch * h) {
        return Err(CL_INVALID_VALUE);
    }
    Ok(host)
}

pub unsafe extern "C" fn clEnqueueReadImage(
    command_queue: cl_command_queue,
    image: cl_mem,
    blocking_read: cl_bool,
    origin: *const usize,
    region: *const usize,
    row_pitch: usize,
    slice_pitch: usize,
    ptr: *mut c_void,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
        let mem = image_of_queue(&sub.queue, image)?;
        check_host_access(&mem, true)?;
        let (origin, region) = (triple(origin)?, triple(region)?);
        let host = image_host_region(&mem, ptr as *mut u8, region, row_pitch, slice_pitch)?;
        let command = Transfer::Image {
            image: mem.id,
            origin,
            region,
        };
        read(
            sub,
            event,
            CL_COMMAND_READ_IMAGE,
            command,
            blocking_read != 0,
            host.packed_len(),
            read_target(host),
        )
    })
}

pub unsafe extern "C" fn clEnqueueWriteImage(
    command_queue: cl_command_queue,
    image: cl_mem,
    _blocking_write: cl_bool,
    origin: *const usize,
    region: *const usize,
    input_row_pitch: usize,
    input_slice_pitch: usize,
    ptr: *const c_void,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
        let mem = image_of_queue(&sub.queue, image)?;
        check_host_access(&mem, false)?;
        let (origin, region) = (triple(origin)?, triple(region)?);
        let host = image_host_region(
            &mem,
            ptr as *mut u8,
            region,
            input_row_pitch,
            input_slice_pitch,
        )?;
        // SAFETY: the application's host memory covers the region.
        let packed = unsafe { host.pack() };
        post(
            sub,
            event,
            CL_COMMAND_WRITE_IMAGE,
            Transfer::Image {
                image: mem.id,
                origin,
                region,
            },
            &packed,
        )
    })
}

pub unsafe extern "C" fn clEnqueueCopyImage(
    command_queue: cl_command_queue,
    src_image: cl_mem,
    dst_image: cl_mem,
    src_origin: *const usize,
    dst_origin: *const usize,
    region: *const usize,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
        let src = image_of_queue(&sub.queue, src_image)?;
        let dst = image_of_queue(&sub.queue, dst_image)?;
        let command = Command::CopyImage {
            src: src.id,
            dst: dst.id,
            src_origin: triple(src_origin)?,
            dst_origin: triple(dst_origin)?,
            region: triple(region)?,
        };
        post(sub, event, CL_COMMAND_COPY_IMAGE, command, &[])
    })
}

pub unsafe extern "C" fn clEnqueueFillImage(
    command_queue: cl_command_queue,
    image: cl_mem,
    fill_color: *const c_void,
    origin: *const usize,
    region: *const usize,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
        let mem = image_of_queue(&sub.queue, image)?;
        if fill_color.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: the fill color is four 32-bit components.
        let color = unsafe { *(fill_color as *const [u8; 16]) };
        let command = Command::FillImage {
            image: mem.id,
            color,
            origin: triple(origin)?,
            region: triple(region)?,
        };
        post(sub, event, CL_COMMAND_FILL_IMAGE, command, &[])
    })
}

pub unsafe extern "C" fn clEnqueueCopyImageToBuffer(
    command_queue: cl_command_queue,
    src_image: cl_mem,
    dst_buffer: cl_mem,
    src_origin: *const usize,
    region: *const usize,
    dst_offset: usize,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
        let src = image_of_queue(&sub.queue, src_image)?;
        let dst = buffer_of_queue(&sub.queue, dst_buffer)?;
        let command = Command::CopyImageToBuffer {
            src: src.id,
            dst: dst.id,
            src_origin: triple(src_origin)?,
            region: triple(region)?,
            dst_offset: dst_offset as u64,
        };
        post(sub, event, CL_COMMAND_COPY_IMAGE_TO_BUFFER, command, &[])
    })
}

pub unsafe extern "C" fn clEnqueueCopyBufferToImage(
    command_queue: cl_command_queue,
    src_buffer: cl_mem,
    dst_image: cl_mem,
    src_offset: usize,
    dst_origin: *const usize,
    region: *const usize,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
        let src = buffer_of_queue(&sub.queue, src_buffer)?;
        let dst = image_of_queue(&sub.queue, dst_image)?;
        let command = Command::CopyBufferToImage {
            src: src.id,
            dst: dst.id,
            src_offset: src_offset as u64,
            dst_origin: triple(dst_origin)?,
            region: triple(region)?,
        };
        post(sub, event, CL_COMMAND_COPY_BUFFER_TO_IMAGE, command, &[])
    })
}

// ---- Map and unmap ----------------------------------------------------------------------
//
// The client owns mapped memory: a map for reading copies the region back (into the
// USE_HOST_PTR memory, or into memory rgpu allocates), and an unmap of a writing map sends it.

const MAP_FLAGS: cl_map_flags = CL_MAP_READ | CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION;

fn check_map_flags(flags: cl_map_flags) -> Result<(), cl_int> {
    if flags & !MAP_FLAGS != 0
        || (flags & CL_MAP_WRITE_INVALIDATE_REGION != 0
            && flags & (CL_MAP_READ | CL_MAP_WRITE) != 0)
    {
        return Err(CL_INVALID_VALUE);
    }
    Ok(())
}

/// Whether a map must fetch the current contents.
fn map_reads(flags: cl_map_flags) -> bool {
    flags & CL_MAP_WRITE_INVALIDATE_REGION == 0
}

/// Whether an unmap must send the contents back.
fn map_writes(flags: cl_map_flags) -> bool {
    flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION) != 0
}

pub unsafe extern "C" fn clEnqueueMapBuffer(
    command_queue: cl_command_queue,
    buffer: cl_mem,
    blocking_map: cl_bool,
    map_flags: cl_map_flags,
    offset: usize,
    size: usize,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
    errcode_ret: *mut cl_int,
) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        let result = (|| {
            let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
            let mem = buffer_of_queue(&sub.queue, buffer)?;
            check_map_flags(map_flags)?;
            check_range(&mem, offset, size)?;
            if mem.shared_host != 0 {
                return map_shared(sub, event, &mem, blocking_map != 0, map_flags, offset, size);
            }
            let (ptr, owned) = if mem.host_ptr != 0 {
                ((mem.host_ptr + offset) as *mut u8, None)
            } else {
                let owned = AlignedBuf::new(size).ok_or(CL_OUT_OF_HOST_MEMORY)?;
                (owned.as_ptr(), Some(owned))
            };
            if map_reads(map_flags) {
                let command = Transfer::Buffer {
                    buffer: mem_on(&mem, &sub.queue, Access::ReadWrite)?,
                    offset: offset as u64,
                    size: size as u64,
                };
                read(
                    sub,
                    event,
                    CL_COMMAND_MAP_BUFFER,
                    command,
                    blocking_map != 0,
                    size,
                    ReadTarget::Direct(ptr),
                )?;
            } else {
                post(
                    sub,
                    event,
                    CL_COMMAND_MAP_BUFFER,
                    Command::MarkerWithWaitList,
                    &[],
                )?;
            }
            let mapping = Mapping {
                flags: map_flags,
                origin: [offset, 0, 0],
                region: [size, 1, 1],
                owned,
                row_pitch: 0,
                slice_pitch: 0,
            };
            mem.maps.lock().unwrap().push((ptr as usize, mapping));
            Ok(ptr as *mut c_void)
        })();
        // SAFETY: the application's errcode pointer.
        unsafe { crate::util::creation(result, errcode_ret) }
    })
}

/// Maps a buffer whose memory is shared with its server (`Mem::shared_host`): the mapping is
/// that memory, brought up to date by the server (unless the map invalidates the range).
fn map_shared(
    sub: Submission,
    event: *mut cl_event,
    mem: &Ref<Mem>,
    blocking: bool,
    map_flags: cl_map_flags,
    offset: usize,
    size: usize,
) -> Result<*mut c_void, cl_int> {
    let ptr = mem.shared_host + offset;
    let command = match map_reads(map_flags) {
        true => Command::SyncHostMemory {
            buffer: mem_on(mem, &sub.queue, Access::ReadWrite)?,
            offset: offset as u64,
            size: size as u64,
            to_device: false,
        },
        false => Command::MarkerWithWaitList,
    };
    // A blocking map waits for the command's event, one of its own if the program asked none.
    let mut own_event: cl_event = std::ptr::null_mut();
    let event_out = match (blocking, event.is_null()) {
        (true, true) => &mut own_event as *mut cl_event,
        _ => event,
    };
    post(sub, event_out, CL_COMMAND_MAP_BUFFER, command, &[])?;
    if blocking {
        // SAFETY: `event_out` was just filled in by `post`.
        let made = unsafe { *event_out };
        let waited = event_from(made).and_then(|e| crate::api::event::wait_for(&[e]));
        if !own_event.is_null() {
            handle::release::<crate::objects::Event>(own_event);
        }
        match waited {
            Ok(true) => {}
            Ok(false) => return Err(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST),
            Err(status) => return Err(status),
        }
    }
    let mapping = Mapping {
        flags: map_flags,
        origin: [offset, 0, 0],
        region: [size, 1, 1],
        owned: None,
        row_pitch: 0,
        slice_pitch: 0,
    };
    mem.maps.lock().unwrap().push((ptr, mapping));
    Ok(ptr as *mut c_void)
}

pub unsafe extern "C" fn clEnqueueMapImage(
    command_queue: cl_command_queue,
    image: cl_mem,
    blocking_map: cl_bool,
    map_flags: cl_map_flags,
    origin: *const usize,
    region: *const usize,
    image_row_pitch: *mut usize,
    image_slice_pitch: *mut usize,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
    errcode_ret: *mut cl_int,
) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        let result = (|| {
            let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
            let mem = image_of_queue(&sub.queue, image)?;
            check_map_flags(map_flags)?;
            if image_row_pitch.is_null() {
                return Err(CL_INVALID_VALUE);
            }
            let info = mem.image().ok_or(CL_INVALID_MEM_OBJECT)?.clone();
            let (origin, region) = (triple(origin)?, triple(region)?);
            let [ox, oy, oz] = origin.map(|v| v as usize);
            // USE_HOST_PTR images map onto the application's memory with its pitches;
            // otherwise rgpu allocates a tightly packed region.
            let (ptr, owned, row_pitch, slice_pitch) = if mem.host_ptr != 0 {
                let offset = if info.desc.image_type == CL_MEM_OBJECT_IMAGE1D_ARRAY {
                    oy * info.slice_pitch + ox * info.element_size
                } else {
                    oz * info.slice_pitch + oy * info.row_pitch + ox * info.element_size
                };
                (
                    (mem.host_ptr + offset) as *mut u8,
                    None,
                    info.row_pitch,
                    info.slice_pitch,
                )
            } else {
                let row_pitch = region[0] as usize * info.element_size;
                // The layers of a 1-D array are its slices, one row each (region[1] of them).
                let (slice_pitch, slices) = if info.desc.image_type == CL_MEM_OBJECT_IMAGE1D_ARRAY {
                    (row_pitch, region[1] as usize)
                } else {
                    (row_pitch * region[1] as usize, region[2] as usize)
                };
                let owned = AlignedBuf::new(slice_pitch * slices).ok_or(CL_OUT_OF_HOST_MEMORY)?;
                (owned.as_ptr(), Some(owned), row_pitch, slice_pitch)
            };
            let host = image_host_region(&mem, ptr, region, row_pitch, slice_pitch)?;
            if map_reads(map_flags) {
                let command = Transfer::Image {
                    image: mem.id,
                    origin,
                    region,
                };
                read(
                    sub,
                    event,
                    CL_COMMAND_MAP_IMAGE,
                    command,
                    blocking_map != 0,
                    host.packed_len(),
                    read_target(host),
                )?;
            } else {
                post(
                    sub,
                    event,
                    CL_COMMAND_MAP_IMAGE,
                    Command::MarkerWithWaitList,
                    &[],
                )?;
            }
            // SAFETY: checked non-null above; image_slice_pitch may be null for 1-D/2-D images.
            unsafe {
                *image_row_pitch = row_pitch;
                if !image_slice_pitch.is_null() {
                    // Images without slices (1-D, 1-D buffer, 2-D) report 0.
                    *image_slice_pitch = match info.desc.image_type {
                        CL_MEM_OBJECT_IMAGE1D_ARRAY
                        | CL_MEM_OBJECT_IMAGE2D_ARRAY
                        | CL_MEM_OBJECT_IMAGE3D => slice_pitch,
                        _ => 0,
                    };
                }
            }
            let mapping = Mapping {
                flags: map_flags,
                origin: [ox, oy, oz],
                region: region.map(|v| v as usize),
                owned,
                row_pitch,
                slice_pitch,
            };
            mem.maps.lock().unwrap().push((ptr as usize, mapping));
            Ok(ptr as *mut c_void)
        })();
        // SAFETY: the application's errcode pointer.
        unsafe { crate::util::creation(result, errcode_ret) }
    })
}

pub unsafe extern "C" fn clEnqueueUnmapMemObject(
    command_queue: cl_command_queue,
    memobj: cl_mem,
    mapped_ptr: *mut c_void,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
        let mem = mem_of_queue(&sub.queue, memobj)?;
        let mapping = {
            let mut maps = mem.maps.lock().unwrap();
            let index = maps
                .iter()
                .position(|(ptr, _)| *ptr == mapped_ptr as usize)
                .ok_or(CL_INVALID_VALUE)?;
            maps.remove(index).1
        };
        let ptr = mapped_ptr as *mut u8;
        if !map_writes(mapping.flags) {
            return post(
                sub,
                event,
                CL_COMMAND_UNMAP_MEM_OBJECT,
                Command::MarkerWithWaitList,
                &[],
            );
        }
        if mem.shared_host != 0 {
            // The server's buffer is this memory: it only brings the device up to date.
            let command = Command::SyncHostMemory {
                buffer: mem_on(&mem, &sub.queue, Access::Read)?,
                offset: mapping.origin[0] as u64,
                size: mapping.region[0] as u64,
                to_device: true,
            };
            return post(sub, event, CL_COMMAND_UNMAP_MEM_OBJECT, command, &[]);
        }
        // The data leaves the mapped memory before this returns, so it can be freed after.
        match mem.image() {
            None => {
                // SAFETY: the mapped region is `region[0]` bytes at `ptr`.
                let data = unsafe { std::slice::from_raw_parts(ptr, mapping.region[0]) };
                let command = Transfer::Buffer {
                    buffer: mem_on(&mem, &sub.queue, Access::Read)?,
                    offset: mapping.origin[0] as u64,
                    size: mapping.region[0] as u64,
                };
                post(sub, event, CL_COMMAND_UNMAP_MEM_OBJECT, command, data)
            }
            Some(_) => {
                let region = mapping.region.map(|v| v as u64);
                let host =
                    image_host_region(&mem, ptr, region, mapping.row_pitch, mapping.slice_pitch)?;
                // SAFETY: the mapped region as the map described it.
                let packed = unsafe { host.pack() };
                let command = Transfer::Image {
                    image: mem.id,
                    origin: mapping.origin.map(|v| v as u64),
                    region,
                };
                post(sub, event, CL_COMMAND_UNMAP_MEM_OBJECT, command, &packed)
            }
        }
    })
}

pub unsafe extern "C" fn clEnqueueMigrateMemObjects(
    command_queue: cl_command_queue,
    num_mem_objects: cl_uint,
    mem_objects: *const cl_mem,
    flags: cl_mem_migration_flags,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
        if num_mem_objects == 0 || mem_objects.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        if flags & !(CL_MIGRATE_MEM_OBJECT_HOST | CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED) != 0 {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: the application's array of `num_mem_objects` handles.
        let raw = unsafe { slice(mem_objects, num_mem_objects as usize) };
        // Across servers, the contents move to the queue's (unless the program lets them go).
        let migrated = match flags & CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED {
            0 => Access::Read,
            _ => Access::Overwrite,
        };
        let objects = raw
            .iter()
            .map(|&m| mem_of_queue(&sub.queue, m).and_then(|m| mem_on(&m, &sub.queue, migrated)))
            .collect::<Result<Vec<Id>, cl_int>>()?;
        post(
            sub,
            event,
            CL_COMMAND_MIGRATE_MEM_OBJECTS,
            Command::MigrateMemObjects { objects, flags },
            &[],
        )
    })
}

// ---- Kernels ----------------------------------------------------------------------------

/// CL_INVALID_KERNEL_ARGS unless every argument of the kernel is set.
fn all_args_set(kernel: &Kernel) -> Result<(), cl_int> {
    let args = kernel.args.lock().unwrap();
    if args.values.len() < kernel.num_args as usize || args.values.iter().any(Option::is_none) {
        return Err(CL_INVALID_KERNEL_ARGS);
    }
    Ok(())
}

/// The arguments changed since the kernel's last launch (`launch` checked that every one is
/// set; a set argument cannot be unset again).
fn changed_args(kernel: &Kernel) -> Vec<(u32, KernelArg)> {
    let mut args = kernel.args.lock().unwrap();
    crate::api::kernel::take_dirty(&mut args)
}

fn launch(
    command_queue: cl_command_queue,
    kernel: cl_kernel,
    work_dim: cl_uint,
    offset: Option<Vec<u64>>,
    global: Option<Vec<u64>>,
    local: Option<Vec<u64>>,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
    command_type: cl_command_type,
) -> Result<(), cl_int> {
    let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
    let kernel = handle::lookup::<Kernel>(kernel)?;
    if !Arc::ptr_eq(&kernel.program.context, &sub.queue.context) {
        return Err(CL_INVALID_CONTEXT);
    }
    // In a context over several servers, the kernel's replica on the queue's server.
    let replica = match kernel.program.context.spanning.is_some() {
        true if !Arc::ptr_eq(&kernel.conn, &sub.queue.conn) => {
            Some(crate::spanning::kernel_on(&kernel, &sub.queue.conn)?)
        }
        _ => None,
    };
    if replica.is_none() && !Arc::ptr_eq(&kernel.conn, &sub.queue.conn) {
        return Err(CL_INVALID_CONTEXT);
    }
    let device = &sub.queue.device;
    // Unset arguments first, as the implementations check them (even for an empty NDRange).
    all_args_set(&kernel)?;
    let global = match global {
        Some(global) if !global.contains(&0) => global,
        // An empty NDRange: from OpenCL 2.1 on it succeeds once its wait list has (a marker).
        _ if device_version(device) >= (2, 1) => {
            return post(sub, event, command_type, Command::MarkerWithWaitList, &[]);
        }
        _ => return Err(CL_INVALID_GLOBAL_WORK_SIZE),
    };
    let limits = match &replica {
        Some(replica) => &replica.limits,
        None => &kernel.work_group_limits,
    };
    let sizes = check_work_sizes(
        &kernel,
        limits,
        device,
        offset.as_deref(),
        &global,
        local.as_deref(),
    )?;
    let args = match kernel.program.context.spanning.is_some() {
        // Every argument, its buffers moved to this server first.
        true => {
            changed_args(&kernel);
            crate::spanning::launch_args(&kernel, &sub.queue)?
        }
        false => changed_args(&kernel),
    };
    let command = Command::NdRange {
        kernel: replica.as_ref().map_or(kernel.id, |r| r.id),
        work_dim,
        offset,
        global,
        local,
        args,
    };
    match sizes {
        WorkSizes::Valid => post(sub, event, command_type, command, &[]),
        WorkSizes::AskImplementation(total) => {
            let device = device.id;
            post(sub, event, command_type, Posted::Judged(command), &[])?;
            // Taken: the kernel's launches of up to this size need not ask again.
            kernel.accept_group_size(device, total);
            Ok(())
        }
    }
}

/// The errors clEnqueueNDRangeKernel defines from the kernel's and the device's attributes,
/// returned at enqueue as the API requires (not deferred to the device, which only knows them
/// once the command runs).
fn check_work_sizes(
    kernel: &Kernel,
    work_group_limits: &[WorkGroupLimits],
    device: &Device,
    offset: Option<&[u64]>,
    global: &[u64],
    local: Option<&[u64]>,
) -> Result<WorkSizes, cl_int> {
    if let Some(offset) = offset {
        if offset
            .iter()
            .zip(global)
            .any(|(o, g)| o.checked_add(*g).is_none())
        {
            return Err(CL_INVALID_GLOBAL_OFFSET);
        }
    }
    let limits = work_group_limits
        .iter()
        .find(|limits| limits.device == device.id);
    // reqd_work_group_size: zeros when the kernel does not give one.
    let required = limits
        .map(|limits| limits.required)
        .filter(|required| required.iter().any(|&n| n != 0));
    let Some(local) = local else {
        // Without a local size the implementation picks one, unless the kernel requires one.
        return match required {
            Some(_) => Err(CL_INVALID_WORK_GROUP_SIZE),
            None => Ok(WorkSizes::Valid),
        };
    };
    if local.contains(&0) {
        return Err(CL_INVALID_WORK_GROUP_SIZE);
    }
    if let Some(required) = required {
        if local != &required[..local.len()] {
            return Err(CL_INVALID_WORK_GROUP_SIZE);
        }
    }
    let max_items = device_sizes(device, CL_DEVICE_MAX_WORK_ITEM_SIZES);
    if local.iter().zip(&max_items).any(|(size, max)| size > max) {
        return Err(CL_INVALID_WORK_ITEM_SIZE);
    }
    let total = local
        .iter()
        .try_fold(1u64, |total, &size| total.checked_mul(size))
        .ok_or(CL_INVALID_WORK_GROUP_SIZE)?;
    if !non_uniform_allowed(kernel, device) && global.iter().zip(local).any(|(g, l)| g % l != 0) {
        return Err(CL_INVALID_WORK_GROUP_SIZE);
    }
    let over_kernel_limit = limits.is_some_and(|limits| total > limits.max_size);
    if !over_kernel_limit || total <= kernel.accepted_group_size(device.id) {
        return Ok(WorkSizes::Valid);
    }
    // CL_KERNEL_WORK_GROUP_SIZE is a hard limit for PoCL, not for NVIDIA (it says 256 for
    // a simple kernel and runs 1024): within the device's limit, the implementation decides.
    let device_max = device
        .info
        .get(&CL_DEVICE_MAX_WORK_GROUP_SIZE)
        .map_or(0, |v| rgpu_cl_api::params::decode_unsigned(v));
    if total > device_max {
        return Err(CL_INVALID_WORK_GROUP_SIZE);
    }
    Ok(WorkSizes::AskImplementation(total))
}

/// What `check_work_sizes` found.
enum WorkSizes {
    Valid,
    /// Work-groups of this many items, over the kernel's reported limit but within the
    /// device's: the implementation's verdict decides.
    AskImplementation(u64),
}

/// Whether the kernel's work-groups may be non-uniform (a global size that is not a multiple of
/// the local size): only in OpenCL C 2.0 or later (`-cl-std=CL2.0`/`CL3.0`), without
/// `-cl-uniform-work-group-size`, on a device that supports it. A program whose build options
/// rgpu does not know (from a binary or IL, or linked) is left to the implementation.
fn non_uniform_allowed(kernel: &Kernel, device: &Device) -> bool {
    let options = kernel
        .program
        .options
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let Some(options) = options else {
        return true;
    };
    let words: Vec<&str> = options.split_whitespace().collect();
    if words.contains(&"-cl-uniform-work-group-size") {
        return false;
    }
    let c_2_or_later = words
        .iter()
        .any(|w| w.starts_with("-cl-std=CL2.") || w.starts_with("-cl-std=CL3."));
    if !c_2_or_later {
        return false;
    }
    match device_version(device) {
        (2, _) => true,
        (major, _) if major >= 3 => device
            .info
            .get(&CL_DEVICE_NON_UNIFORM_WORK_GROUP_SUPPORT)
            .is_some_and(|v| rgpu_cl_api::params::decode_unsigned(v) != 0),
        _ => false,
    }
}

/// The device's OpenCL version, (major, minor), from CL_DEVICE_VERSION ("OpenCL 3.0 ...").
fn device_version(device: &Device) -> (u32, u32) {
    device
        .info
        .get(&CL_DEVICE_VERSION)
        .map(|v| rgpu_cl_api::params::decode_string(v))
        .and_then(|text| {
            let number = text
                .strip_prefix("OpenCL ")?
                .split_whitespace()
                .next()?
                .to_string();
            let (major, minor) = number.split_once('.')?;
            Some((major.parse().ok()?, minor.parse().ok()?))
        })
        .unwrap_or((1, 2))
}

/// A size_t array of the device's info (the server's size_t: 8 bytes).
fn device_sizes(device: &Device, param: cl_device_info) -> Vec<u64> {
    device.info.get(&param).map_or_else(Vec::new, |v| {
        v.chunks(8)
            .map(rgpu_cl_api::params::decode_unsigned)
            .collect()
    })
}

/// The values of an optional size array of `work_dim` entries.
fn sizes(ptr: *const usize, work_dim: cl_uint) -> Option<Vec<u64>> {
    // SAFETY: the API passes `work_dim` values when the pointer is non-null.
    (!ptr.is_null()).then(|| {
        // SAFETY: the API passes `work_dim` values when the pointer is non-null.
        unsafe { slice(ptr, work_dim as usize) }
            .iter()
            .map(|&v| v as u64)
            .collect()
    })
}

pub unsafe extern "C" fn clEnqueueNDRangeKernel(
    command_queue: cl_command_queue,
    kernel: cl_kernel,
    work_dim: cl_uint,
    global_work_offset: *const usize,
    global_work_size: *const usize,
    local_work_size: *const usize,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        if !(1..=3).contains(&work_dim) {
            // Check the queue and kernel first: their errors take precedence.
            queue_from(command_queue)?;
            handle::lookup::<Kernel>(kernel)?;
            return Err(CL_INVALID_WORK_DIMENSION);
        }
        launch(
            command_queue,
            kernel,
            work_dim,
            sizes(global_work_offset, work_dim),
            sizes(global_work_size, work_dim),
            sizes(local_work_size, work_dim),
            num_events_in_wait_list,
            event_wait_list,
            event,
            CL_COMMAND_NDRANGE_KERNEL,
        )
    })
}

pub unsafe extern "C" fn clEnqueueTask(
    command_queue: cl_command_queue,
    kernel: cl_kernel,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        launch(
            command_queue,
            kernel,
            1,
            None,
            Some(vec![1]),
            Some(vec![1]),
            num_events_in_wait_list,
            event_wait_list,
            event,
            CL_COMMAND_TASK,
        )
    })
}

pub unsafe extern "C" fn clEnqueueNativeKernel(
    command_queue: cl_command_queue,
    _user_func: Option<unsafe extern "C" fn(*mut c_void)>,
    _args: *mut c_void,
    _cb_args: usize,
    _num_mem_objects: cl_uint,
    _mem_list: *const cl_mem,
    _args_mem_loc: *mut *const c_void,
    _num_events_in_wait_list: cl_uint,
    _event_wait_list: *const cl_event,
    _event: *mut cl_event,
) -> cl_int {
    // A host function cannot run on a device of another machine.
    crate::unsupported::report("clEnqueueNativeKernel");
    match queue_from(command_queue) {
        Ok(_) => CL_INVALID_OPERATION,
        Err(code) => code,
    }
}

// ---- Synchronization points in the queue ------------------------------------------------

pub unsafe extern "C" fn clEnqueueMarkerWithWaitList(
    command_queue: cl_command_queue,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
        post(
            sub,
            event,
            CL_COMMAND_MARKER,
            Command::MarkerWithWaitList,
            &[],
        )
    })
}

pub unsafe extern "C" fn clEnqueueBarrierWithWaitList(
    command_queue: cl_command_queue,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        let sub = prepare(command_queue, num_events_in_wait_list, event_wait_list)?;
        post(
            sub,
            event,
            CL_COMMAND_BARRIER,
            Command::BarrierWithWaitList,
            &[],
        )
    })
}

pub unsafe extern "C" fn clEnqueueMarker(
    command_queue: cl_command_queue,
    event: *mut cl_event,
) -> cl_int {
    enqueue(|| {
        if event.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        let sub = prepare(command_queue, 0, std::ptr::null())?;
        post(
            sub,
            event,
            CL_COMMAND_MARKER,
            Command::MarkerWithWaitList,
            &[],
        )
    })
}

pub unsafe extern "C" fn clEnqueueBarrier(command_queue: cl_command_queue) -> cl_int {
    enqueue(|| {
        let sub = prepare(command_queue, 0, std::ptr::null())?;
        post(
            sub,
            std::ptr::null_mut(),
            CL_COMMAND_BARRIER,
            Command::BarrierWithWaitList,
            &[],
        )
    })
}

pub unsafe extern "C" fn clEnqueueWaitForEvents(
    command_queue: cl_command_queue,
    num_events: cl_uint,
    event_list: *const cl_event,
) -> cl_int {
    enqueue(|| {
        if num_events == 0 || event_list.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        let sub = prepare(command_queue, num_events, event_list)?;
        post(
            sub,
            std::ptr::null_mut(),
            CL_COMMAND_BARRIER,
            Command::BarrierWithWaitList,
            &[],
        )
    })
}
