//! Memory objects, samplers, mappings and pinned host memory.

use super::*;

/// What image transfers need to know about an image.
pub struct ImageLayout {
    pub element_size: usize,
    pub image_type: u32,
}

impl Mem {
    info_query! {
        info => clGetMemObjectInfo
    }

    info_query! {
        image_info => clGetImageInfo
    }

    pub fn image_layout(&self) -> ClResult<ImageLayout> {
        let element_size = decode_usize(&self.image_info(sys::CL_IMAGE_ELEMENT_SIZE)?);
        let image_type = decode_usize(&self.info(sys::CL_MEM_TYPE)?) as u32;
        if element_size == 0 {
            return Err(sys::CL_INVALID_MEM_OBJECT);
        }
        Ok(ImageLayout {
            element_size,
            image_type,
        })
    }

    pub fn create_sub_buffer(&self, flags: u64, origin: u64, size: u64) -> ClResult<Mem> {
        let region = cl_buffer_region {
            origin: host_size(origin)?,
            size: host_size(size)?,
        };
        let mut status = sys::CL_SUCCESS;
        // SAFETY: live buffer; the region struct is what CL_BUFFER_CREATE_TYPE_REGION takes.
        let raw = unsafe {
            cl_call!(
                self.lib,
                clCreateSubBuffer(
                    self.raw,
                    flags,
                    sys::CL_BUFFER_CREATE_TYPE_REGION,
                    (&region as *const cl_buffer_region).cast(),
                    &mut status
                )
            )
        };
        Mem::adopt(&self.lib, raw, status)
    }
}

/// Something kept alive until a memory object is destroyed.
type Keep = Box<dyn std::any::Any + Send>;

extern "C" fn drop_kept(_mem: cl_mem, user_data: *mut c_void) {
    // SAFETY: `user_data` is the `Box<Keep>` leaked by `Mem::keep_until_destroyed`, passed
    // back once, when the object is destroyed.
    drop(unsafe { Box::from_raw(user_data.cast::<Keep>()) });
}

impl Mem {
    /// Keeps `kept` until the implementation destroys the object (after its last release and
    /// every command that uses it), e.g. the host memory a USE_HOST_PTR buffer lies in.
    pub fn keep_until_destroyed(&self, kept: Keep) -> ClResult<()> {
        let user_data = Box::into_raw(Box::new(kept));
        // SAFETY: live object; the callback takes back the box, once.
        let status = unsafe {
            cl_call!(
                self.lib,
                clSetMemObjectDestructorCallback(self.raw, Some(drop_kept), user_data.cast())
            )
        };
        if status != sys::CL_SUCCESS {
            // SAFETY: not handed over: the callback was not set.
            drop(unsafe { Box::from_raw(user_data) });
        }
        check(status)
    }
}

impl Sampler {
    info_query! {
        info => clGetSamplerInfo
    }
}

/// A mapped range of a buffer, unmapped when dropped (or by [`Mapping::unmap`]).
pub struct Mapping {
    pub(super) queue: Queue,
    pub(super) mem: Mem,
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    pub(super) unmapped: bool,
}

impl Mapping {
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the map command completed, so `ptr` points to `len` bytes of host-accessible
        // memory that stay valid until the unmap, which needs `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Enqueues the unmap; its event completes once the device sees what was written.
    pub fn unmap(mut self) -> ClResult<Event> {
        self.unmapped = true;
        let mut event = null_mut();
        // SAFETY: `ptr` was returned by clEnqueueMapBuffer of `mem` and not unmapped yet.
        let status = unsafe {
            cl_call!(
                self.queue.lib,
                clEnqueueUnmapMemObject(
                    self.queue.raw,
                    self.mem.raw,
                    self.ptr.cast(),
                    0,
                    null(),
                    &mut event
                )
            )
        };
        self.queue.new_event(event, status)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if !self.unmapped {
            // SAFETY: as in unmap.
            unsafe {
                cl_call!(
                    self.queue.lib,
                    clEnqueueUnmapMemObject(
                        self.queue.raw,
                        self.mem.raw,
                        self.ptr.cast(),
                        0,
                        null(),
                        null_mut()
                    )
                )
            };
            let _ = self.queue.flush();
        }
    }
}

/// Host memory the implementation allocated for a buffer of its own (CL_MEM_ALLOC_HOST_PTR)
/// and mapped once for good: NVIDIA pins such memory, so device copies from and to it run
/// by DMA at full speed instead of through the driver's own bounce buffers.
pub struct PinnedHost {
    queue: Queue,
    mem: Mem,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned exclusively (like a Box<[u8]>); the handles are thread-safe.
unsafe impl Send for PinnedHost {}
// SAFETY: shared access only reads the memory.
unsafe impl Sync for PinnedHost {}

impl PinnedHost {
    /// `len` bytes of pinned host memory for transfers on `queue`'s device.
    pub fn new(queue: &Queue, len: usize) -> ClResult<PinnedHost> {
        let raw_context = decode_usize(&queue.info(sys::CL_QUEUE_CONTEXT)?) as cl_context;
        let mut status = sys::CL_SUCCESS;
        // SAFETY: the queue holds a reference to its context, so the handle is live.
        let raw = unsafe {
            cl_call!(
                queue.lib,
                clCreateBuffer(
                    raw_context,
                    sys::CL_MEM_READ_WRITE | sys::CL_MEM_ALLOC_HOST_PTR,
                    len,
                    null_mut(),
                    &mut status
                )
            )
        };
        let mem = Mem::adopt(&queue.lib, raw, status)?;
        // The mapping is made on the client's queue, but the buffer is private: nothing else
        // ever waits for or touches it.
        let mut mapping = queue.map_buffer(&mem, true, 0, len, &[])?;
        mapping.unmapped = true;
        Ok(PinnedHost {
            queue: queue.clone(),
            mem,
            ptr: mapping.ptr,
            len,
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        // SAFETY: `ptr` is the live mapping of `mem` made in new.
        unsafe {
            cl_call!(
                self.queue.lib,
                clEnqueueUnmapMemObject(
                    self.queue.raw,
                    self.mem.raw,
                    self.ptr.cast(),
                    0,
                    null(),
                    null_mut()
                )
            )
        };
        let _ = self.queue.flush();
    }
}
