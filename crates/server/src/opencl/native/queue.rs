//! Commands for queues.

use super::*;

impl Queue {
    info_query! {
        info => clGetCommandQueueInfo
    }

    pub fn is_out_of_order(&self) -> bool {
        self.info(sys::CL_QUEUE_PROPERTIES).is_ok_and(|bytes| {
            rgpu_cl_api::params::decode_unsigned(&bytes)
                & sys::CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE
                != 0
        })
    }

    /// Reads `out.len()` bytes of buffer `mem` from `offset`, waiting for them (the queue's
    /// earlier commands first, in an in-order queue).
    pub fn read_buffer_now(&self, mem: &Mem, offset: u64, out: &mut [u8]) -> ClResult<()> {
        // SAFETY: live queue and buffer; `out` holds the bytes, and the read is blocking.
        check(unsafe {
            cl_call!(
                self.lib,
                clEnqueueReadBuffer(
                    self.raw,
                    mem.raw,
                    sys::CL_TRUE,
                    host_size(offset)?,
                    out.len(),
                    out.as_mut_ptr().cast(),
                    0,
                    std::ptr::null(),
                    std::ptr::null_mut()
                )
            )
        })
    }

    /// Writes `data` into buffer `mem` from `offset`, waiting until it is there.
    pub fn write_buffer_now(&self, mem: &Mem, offset: u64, data: &[u8]) -> ClResult<()> {
        // SAFETY: live queue and buffer; `data` holds the bytes, and the write is blocking.
        check(unsafe {
            cl_call!(
                self.lib,
                clEnqueueWriteBuffer(
                    self.raw,
                    mem.raw,
                    sys::CL_TRUE,
                    host_size(offset)?,
                    data.len(),
                    data.as_ptr().cast(),
                    0,
                    std::ptr::null(),
                    std::ptr::null_mut()
                )
            )
        })
    }

    pub fn flush(&self) -> ClResult<()> {
        // SAFETY: live queue.
        check(unsafe { cl_call!(self.lib, clFlush(self.raw)) })
    }

    pub fn finish(&self) -> ClResult<()> {
        // SAFETY: live queue.
        check(unsafe { cl_call!(self.lib, clFinish(self.raw)) })
    }

    /// A user event in the queue's context, already set to the (negative) `status`: stands
    /// for a command that failed before it reached the device.
    pub fn failed_event(&self, status: i32) -> ClResult<Event> {
        let bytes = self.info(sys::CL_QUEUE_CONTEXT)?;
        let raw_context = decode_usize(&bytes) as cl_context;
        let mut err = sys::CL_SUCCESS;
        // SAFETY: the queue holds a reference to its context, so the handle is live.
        let raw = unsafe { cl_call!(self.lib, clCreateUserEvent(raw_context, &mut err)) };
        let event = Event::adopt(&self.lib, raw, err)?;
        event.set_user_status(status.min(-1))?;
        Ok(event)
    }

    pub(super) fn new_event(&self, raw: cl_event, status: cl_int) -> ClResult<Event> {
        check(status)?;
        Event::adopt(&self.lib, raw, status)
    }

    /// Starts a non-blocking write of `len` bytes of `data` to `buffer` at `offset`.
    pub fn write_buffer<B: HostBuffer>(
        &self,
        buffer: &Mem,
        offset: usize,
        mut data: B,
        len: usize,
        wait: &[&Event],
        waker: Option<Waker>,
    ) -> ClResult<InFlight<B>> {
        if len > data.capacity() {
            return Err(sys::CL_INVALID_VALUE);
        }
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: `data` holds `len` bytes and is moved into the returned InFlight, which keeps
        // it until the command completes; handles are live.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueWriteBuffer(
                    self.raw,
                    buffer.raw,
                    sys::CL_NON_BLOCKING,
                    offset,
                    len,
                    data.as_mut_ptr().cast(),
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        InFlight::start(self.new_event(event, status)?, data, waker)
    }

    /// Starts a non-blocking read of `len` bytes of `buffer` at `offset` into `data`.
    pub fn read_buffer<B: HostBuffer>(
        &self,
        buffer: &Mem,
        offset: usize,
        mut data: B,
        len: usize,
        wait: &[&Event],
        waker: Option<Waker>,
    ) -> ClResult<InFlight<B>> {
        if len > data.capacity() {
            return Err(sys::CL_INVALID_VALUE);
        }
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: as in write_buffer; the device writes at most `len` bytes into `data`.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueReadBuffer(
                    self.raw,
                    buffer.raw,
                    sys::CL_NON_BLOCKING,
                    offset,
                    len,
                    data.as_mut_ptr().cast(),
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        InFlight::start(self.new_event(event, status)?, data, waker)
    }

    /// Starts a non-blocking rectangular write (read when `read`) between `buffer` and a
    /// tightly packed host region in `data` (row pitch region[0], slice pitch
    /// region[0] * region[1]). `pitches` are the buffer's row and slice pitches.
    #[allow(clippy::too_many_arguments)]
    pub fn transfer_buffer_rect<B: HostBuffer>(
        &self,
        read: bool,
        buffer: &Mem,
        origin: [usize; 3],
        region: [usize; 3],
        pitches: [usize; 2],
        mut data: B,
        wait: &[&Event],
        waker: Option<Waker>,
    ) -> ClResult<InFlight<B>> {
        let host_row = region[0];
        let host_slice = region[0]
            .checked_mul(region[1])
            .ok_or(sys::CL_INVALID_VALUE)?;
        let needed = host_slice
            .checked_mul(region[2])
            .ok_or(sys::CL_INVALID_VALUE)?;
        if needed > data.capacity() {
            return Err(sys::CL_INVALID_VALUE);
        }
        let host_origin = [0usize; 3];
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        let ptr = data.as_mut_ptr().cast::<c_void>();
        // SAFETY: the host region (tight pitches) spans `needed` <= capacity bytes of `data`,
        // which the returned InFlight keeps until the command completes; arrays have 3 entries.
        let status = unsafe {
            if read {
                cl_call!(
                    self.lib,
                    clEnqueueReadBufferRect(
                        self.raw,
                        buffer.raw,
                        sys::CL_NON_BLOCKING,
                        origin.as_ptr(),
                        host_origin.as_ptr(),
                        region.as_ptr(),
                        pitches[0],
                        pitches[1],
                        host_row,
                        host_slice,
                        ptr,
                        n,
                        list_ptr(&list),
                        &mut event
                    )
                )
            } else {
                cl_call!(
                    self.lib,
                    clEnqueueWriteBufferRect(
                        self.raw,
                        buffer.raw,
                        sys::CL_NON_BLOCKING,
                        origin.as_ptr(),
                        host_origin.as_ptr(),
                        region.as_ptr(),
                        pitches[0],
                        pitches[1],
                        host_row,
                        host_slice,
                        ptr,
                        n,
                        list_ptr(&list),
                        &mut event
                    )
                )
            }
        };
        InFlight::start(self.new_event(event, status)?, data, waker)
    }

    /// Starts a non-blocking image write (read when `read`) between `image` and a tightly
    /// packed host region in `data`.
    #[allow(clippy::too_many_arguments)]
    pub fn transfer_image<B: HostBuffer>(
        &self,
        read: bool,
        image: &Mem,
        origin: [usize; 3],
        region: [usize; 3],
        mut data: B,
        wait: &[&Event],
        waker: Option<Waker>,
    ) -> ClResult<InFlight<B>> {
        let layout = image.image_layout()?;
        let row = region[0]
            .checked_mul(layout.element_size)
            .ok_or(sys::CL_INVALID_VALUE)?;
        let packed = row
            .checked_mul(region[1])
            .and_then(|v| v.checked_mul(region[2]))
            .ok_or(sys::CL_INVALID_VALUE)?;
        if packed > data.capacity() {
            return Err(sys::CL_INVALID_VALUE);
        }
        // 1D and 2D images take a zero slice pitch; a 1D array steps layers by rows.
        let slice = match layout.image_type {
            sys::CL_MEM_OBJECT_IMAGE1D_ARRAY => row,
            sys::CL_MEM_OBJECT_IMAGE2D_ARRAY | sys::CL_MEM_OBJECT_IMAGE3D => row * region[1],
            _ => 0,
        };
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        let ptr = data.as_mut_ptr().cast::<c_void>();
        // SAFETY: with these pitches the host region spans `packed` <= capacity bytes of
        // `data`, which the InFlight keeps until the command completes.
        let status = unsafe {
            if read {
                cl_call!(
                    self.lib,
                    clEnqueueReadImage(
                        self.raw,
                        image.raw,
                        sys::CL_NON_BLOCKING,
                        origin.as_ptr(),
                        region.as_ptr(),
                        row,
                        slice,
                        ptr,
                        n,
                        list_ptr(&list),
                        &mut event
                    )
                )
            } else {
                cl_call!(
                    self.lib,
                    clEnqueueWriteImage(
                        self.raw,
                        image.raw,
                        sys::CL_NON_BLOCKING,
                        origin.as_ptr(),
                        region.as_ptr(),
                        row,
                        slice,
                        ptr,
                        n,
                        list_ptr(&list),
                        &mut event
                    )
                )
            }
        };
        InFlight::start(self.new_event(event, status)?, data, waker)
    }

    pub fn copy_buffer(
        &self,
        src: &Mem,
        dst: &Mem,
        offsets: [u64; 3],
        wait: &[&Event],
    ) -> ClResult<Event> {
        let [src_offset, dst_offset, size] = host_sizes(offsets)?;
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: live handles; device-side copy only.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueCopyBuffer(
                    self.raw,
                    src.raw,
                    dst.raw,
                    src_offset,
                    dst_offset,
                    size,
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        self.new_event(event, status)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn copy_buffer_rect(
        &self,
        src: &Mem,
        dst: &Mem,
        src_origin: [u64; 3],
        dst_origin: [u64; 3],
        region: [u64; 3],
        pitches: [u64; 4],
        wait: &[&Event],
    ) -> ClResult<Event> {
        let (src_origin, dst_origin, region) = (
            host_sizes(src_origin)?,
            host_sizes(dst_origin)?,
            host_sizes(region)?,
        );
        let pitches = host_sizes(pitches)?;
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: live handles, 3-entry arrays; device-side copy only.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueCopyBufferRect(
                    self.raw,
                    src.raw,
                    dst.raw,
                    src_origin.as_ptr(),
                    dst_origin.as_ptr(),
                    region.as_ptr(),
                    pitches[0],
                    pitches[1],
                    pitches[2],
                    pitches[3],
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        self.new_event(event, status)
    }

    pub fn fill_buffer(
        &self,
        buffer: &Mem,
        pattern: &[u8],
        offset: u64,
        size: u64,
        wait: &[&Event],
    ) -> ClResult<Event> {
        let [offset, size] = host_sizes([offset, size])?;
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: `pattern` is `len` bytes, copied by the implementation at enqueue time.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueFillBuffer(
                    self.raw,
                    buffer.raw,
                    pattern.as_ptr().cast(),
                    pattern.len(),
                    offset,
                    size,
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        self.new_event(event, status)
    }

    pub fn copy_image(
        &self,
        src: &Mem,
        dst: &Mem,
        src_origin: [u64; 3],
        dst_origin: [u64; 3],
        region: [u64; 3],
        wait: &[&Event],
    ) -> ClResult<Event> {
        let (src_origin, dst_origin, region) = (
            host_sizes(src_origin)?,
            host_sizes(dst_origin)?,
            host_sizes(region)?,
        );
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: live handles, 3-entry arrays; device-side copy only.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueCopyImage(
                    self.raw,
                    src.raw,
                    dst.raw,
                    src_origin.as_ptr(),
                    dst_origin.as_ptr(),
                    region.as_ptr(),
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        self.new_event(event, status)
    }

    pub fn fill_image(
        &self,
        image: &Mem,
        color: &[u8; 16],
        origin: [u64; 3],
        region: [u64; 3],
        wait: &[&Event],
    ) -> ClResult<Event> {
        let (origin, region) = (host_sizes(origin)?, host_sizes(region)?);
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: the fill color is at most 16 bytes (a float4/int4/uint4), all readable.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueFillImage(
                    self.raw,
                    image.raw,
                    color.as_ptr().cast(),
                    origin.as_ptr(),
                    region.as_ptr(),
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        self.new_event(event, status)
    }

    pub fn copy_image_to_buffer(
        &self,
        src: &Mem,
        dst: &Mem,
        src_origin: [u64; 3],
        region: [u64; 3],
        dst_offset: u64,
        wait: &[&Event],
    ) -> ClResult<Event> {
        let (src_origin, region) = (host_sizes(src_origin)?, host_sizes(region)?);
        let dst_offset = host_size(dst_offset)?;
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: live handles, 3-entry arrays; device-side copy only.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueCopyImageToBuffer(
                    self.raw,
                    src.raw,
                    dst.raw,
                    src_origin.as_ptr(),
                    region.as_ptr(),
                    dst_offset,
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        self.new_event(event, status)
    }

    pub fn copy_buffer_to_image(
        &self,
        src: &Mem,
        dst: &Mem,
        src_offset: u64,
        dst_origin: [u64; 3],
        region: [u64; 3],
        wait: &[&Event],
    ) -> ClResult<Event> {
        let (dst_origin, region) = (host_sizes(dst_origin)?, host_sizes(region)?);
        let src_offset = host_size(src_offset)?;
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: live handles, 3-entry arrays; device-side copy only.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueCopyBufferToImage(
                    self.raw,
                    src.raw,
                    dst.raw,
                    src_offset,
                    dst_origin.as_ptr(),
                    region.as_ptr(),
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        self.new_event(event, status)
    }

    /// clEnqueueNDRangeKernel. Each given array must have `work_dim` (1..=3) entries.
    pub fn nd_range(
        &self,
        kernel: &Kernel,
        work_dim: u32,
        offset: Option<&[u64]>,
        global: &[u64],
        local: Option<&[u64]>,
        wait: &[&Event],
    ) -> ClResult<Event> {
        let dims = work_dim as usize;
        if !(1..=3).contains(&dims) {
            return Err(sys::CL_INVALID_WORK_DIMENSION);
        }
        let convert = |values: &[u64], error: i32| -> ClResult<Vec<usize>> {
            if values.len() != dims {
                return Err(error);
            }
            values.iter().map(|&v| host_size(v)).collect()
        };
        let global = convert(global, sys::CL_INVALID_GLOBAL_WORK_SIZE)?;
        let offset = offset
            .map(|o| convert(o, sys::CL_INVALID_GLOBAL_OFFSET))
            .transpose()?;
        let local = local
            .map(|l| convert(l, sys::CL_INVALID_WORK_GROUP_SIZE))
            .transpose()?;
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: every array has exactly `work_dim` entries (checked above); live handles.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueNDRangeKernel(
                    self.raw,
                    kernel.raw,
                    work_dim,
                    offset.as_ref().map_or(null(), |o| o.as_ptr()),
                    global.as_ptr(),
                    local.as_ref().map_or(null(), |l| l.as_ptr()),
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        self.new_event(event, status)
    }

    pub fn marker(&self, wait: &[&Event]) -> ClResult<Event> {
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: live handles.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueMarkerWithWaitList(self.raw, n, list_ptr(&list), &mut event)
            )
        };
        self.new_event(event, status)
    }

    pub fn barrier(&self, wait: &[&Event]) -> ClResult<Event> {
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: live handles.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueBarrierWithWaitList(self.raw, n, list_ptr(&list), &mut event)
            )
        };
        self.new_event(event, status)
    }

    pub fn migrate(&self, objects: &[&Mem], flags: u64, wait: &[&Event]) -> ClResult<Event> {
        let raw_objects: Vec<cl_mem> = objects.iter().map(|m| m.raw).collect();
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        // SAFETY: an array of `len` live mem handles.
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueMigrateMemObjects(
                    self.raw,
                    raw_objects.len() as cl_uint,
                    if raw_objects.is_empty() {
                        null()
                    } else {
                        raw_objects.as_ptr()
                    },
                    flags,
                    n,
                    list_ptr(&list),
                    &mut event
                )
            )
        };
        self.new_event(event, status)
    }
}

/// What the device behind a queue is, for choosing how bulk data reaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueDevice {
    /// The context's handle address: identifies the context (pinned staging is per context).
    pub context: usize,
    /// A CPU device: its buffers live in host memory, so mapping them costs no copy.
    pub cpu: bool,
}

impl Queue {
    /// The queue's context and whether its device is a CPU.
    pub fn device(&self) -> ClResult<QueueDevice> {
        let context = decode_usize(&self.info(sys::CL_QUEUE_CONTEXT)?);
        let raw_device = decode_usize(&self.info(sys::CL_QUEUE_DEVICE)?) as cl_device_id;
        let bytes = query_info(|size, value, size_ret| {
            // SAFETY: the queue holds a reference to its device, so the handle is live;
            // query_info passes a `size`-byte buffer or NULL.
            unsafe {
                cl_call!(
                    self.lib,
                    clGetDeviceInfo(raw_device, sys::CL_DEVICE_TYPE, size, value, size_ret)
                )
            }
        })
        .map_err(|e| e.0)?;
        let device_type = rgpu_cl_api::params::decode_unsigned(&bytes);
        Ok(QueueDevice {
            context,
            cpu: device_type & sys::CL_DEVICE_TYPE_CPU != 0,
        })
    }

    /// For a USE_HOST_PTR buffer: makes its host memory and the device agree on `len` bytes at
    /// `offset` once the commands before it and `wait` are done: the device's contents copied
    /// to the host memory, or (`to_device`) the host memory's to the device. A map and its
    /// unmap, neither waited for here; the unmap's event is the command's.
    pub fn sync_host_memory(
        &self,
        buffer: &Mem,
        offset: usize,
        len: usize,
        to_device: bool,
        wait: &[&Event],
    ) -> ClResult<Event> {
        let (ptr, mapped) = self.enqueue_map(buffer, to_device, offset, len, wait)?;
        let mut event = null_mut();
        // SAFETY: `ptr` was just returned by clEnqueueMapBuffer of `buffer`; the unmap waits
        // for the map (an out-of-order queue would not order them).
        let status = unsafe {
            cl_call!(
                self.lib,
                clEnqueueUnmapMemObject(self.raw, buffer.raw, ptr, 1, &mapped.raw, &mut event)
            )
        };
        self.new_event(event, status)
    }

    /// Enqueues a map of `len` bytes of `buffer` at `offset`, after the commands before it and
    /// `wait`: for writing the whole range when `write` (which spares the implementation
    /// reading it first), else for reading. Its address and event; not waited for.
    fn enqueue_map(
        &self,
        buffer: &Mem,
        write: bool,
        offset: usize,
        len: usize,
        wait: &[&Event],
    ) -> ClResult<(*mut c_void, Event)> {
        let flags = if write {
            sys::CL_MAP_WRITE_INVALIDATE_REGION
        } else {
            sys::CL_MAP_READ
        };
        let (n, list) = raw_events(wait);
        let mut event = null_mut();
        let mut status = sys::CL_SUCCESS;
        // SAFETY: live handles; the implementation checks the range against the buffer.
        let ptr = unsafe {
            cl_call!(
                self.lib,
                clEnqueueMapBuffer(
                    self.raw,
                    buffer.raw,
                    sys::CL_NON_BLOCKING,
                    flags,
                    offset,
                    len,
                    n,
                    list_ptr(&list),
                    &mut event,
                    &mut status
                )
            )
        };
        let event = self.new_event(event, status)?;
        if ptr.is_null() {
            return Err(sys::CL_MAP_FAILURE);
        }
        Ok((ptr, event))
    }

    /// Maps `len` bytes of `buffer` at `offset` (for writing the whole range when `write`,
    /// which spares the implementation reading it first; else for reading) once the commands
    /// before it and `wait` are done, and waits until the mapping is there. On a CPU device the
    /// mapping is the buffer's own memory, so data received into it or sent from it is never
    /// copied.
    pub fn map_buffer(
        &self,
        buffer: &Mem,
        write: bool,
        offset: usize,
        len: usize,
        wait: &[&Event],
    ) -> ClResult<Mapping> {
        let (ptr, event) = self.enqueue_map(buffer, write, offset, len, wait)?;
        let mapping = Mapping {
            queue: self.clone(),
            mem: buffer.clone(),
            ptr: ptr.cast(),
            len,
            unmapped: false,
        };
        self.flush()?;
        event.wait_fast();
        match event.status() {
            // Dropping the mapping unmaps it.
            Ok(status) if status < 0 => Err(status),
            Err(e) => Err(e),
            Ok(_) => Ok(mapping),
        }
    }
}
