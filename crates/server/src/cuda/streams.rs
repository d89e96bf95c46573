//! Streams.

use rgpu_cuda_api::native::{check, Status, INVALID_VALUE};
use rgpu_cuda_api::sys::CUstreamAttrValue;
use rgpu_cuda_api::{cu_call, cu_call_raw};
use rgpu_protocol::cuda::{serve, Answer, Id, LaunchAttribute};

use super::owned;
use super::session::{code, Served};

impl serve::Streams for Served<'_> {
    fn create_stream(&mut self, id: Id, ctx: Id, flags: u32, priority: i32) -> Answer<()> {
        let cuda = &mut *self.cuda;
        let made = cuda.create_in(ctx, |cuda, raw| {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe {
                cu_call!(
                    cuda.backend.driver,
                    cuStreamCreateWithPriority(raw, flags, priority)
                )
            })
        });
        made.map(|raw| {
            cuda.streams
                .insert(id, owned::Stream::new(raw, cuda.current, &cuda.backend));
        })
    }

    fn stream_set_attribute(
        &mut self,
        ctx: Id,
        stream: Id,
        attribute: LaunchAttribute,
    ) -> Answer<()> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx)?;
        let stream = cuda.stream(stream)?;
        let value = attribute_value(&attribute)?;
        let (id, value) = (attribute.id, &value as *const CUstreamAttrValue);
        // SAFETY: a live stream and a local value; the attribute is the client's integer.
        check(unsafe {
            cu_call_raw!(
                cuda.backend.driver,
                cuStreamSetAttribute(
                    stream: rgpu_cuda_api::sys::CUstream,
                    id: u32,
                    value: *const CUstreamAttrValue,
                )
            )
        })
    }

    fn stream_get_attribute(&mut self, ctx: Id, stream: Id, id: u32) -> Answer<Vec<u8>> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx)?;
        let stream = cuda.stream(stream)?;
        // SAFETY: plain data, valid zeroed.
        let mut value: CUstreamAttrValue = unsafe { std::mem::zeroed() };
        let out = &mut value as *mut CUstreamAttrValue;
        // SAFETY: a live stream and a local out-value.
        check(unsafe {
            cu_call_raw!(
                cuda.backend.driver,
                cuStreamGetAttribute(
                    stream: rgpu_cuda_api::sys::CUstream,
                    id: u32,
                    out: *mut CUstreamAttrValue,
                )
            )
        })?;
        Ok(attribute_bytes(&value))
    }

    fn destroy_stream(&mut self, id: Id) -> Answer<()> {
        let taken = self.cuda.streams.remove(&id);
        self.cuda.destroy(taken)
    }

    fn stream_synchronize(&mut self, ctx: Id, stream: Id) -> Status {
        let cuda = &mut *self.cuda;
        let status = cuda.enter(ctx).and_then(|()| {
            let stream = cuda.stream(stream)?;
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe { cu_call!(cuda.backend.driver, cuStreamSynchronize(stream)) })
        });
        cuda.sync_status(code(status))
    }

    fn stream_query(&mut self, ctx: Id, stream: Id) -> Status {
        let cuda = &mut *self.cuda;
        let status = cuda.enter(ctx).and_then(|()| {
            let stream = cuda.stream(stream)?;
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe { cu_call!(cuda.backend.driver, cuStreamQuery(stream)) })
        });
        cuda.sync_status(code(status))
    }

    fn stream_wait_event(&mut self, ctx: Id, stream: Id, event: Id, flags: u32) -> Answer<()> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx).and_then(|()| {
            let (stream, event) = (cuda.stream(stream)?, cuda.event(event)?);
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe { cu_call!(cuda.backend.driver, cuStreamWaitEvent(stream, event, flags)) })
        })
    }
}

/// An attribute's value union (of streams, kernel nodes and launches alike) from its wire
/// bytes.
pub(super) fn attribute_value(attribute: &LaunchAttribute) -> Result<CUstreamAttrValue, Status> {
    // SAFETY: plain data, valid zeroed.
    let mut value: CUstreamAttrValue = unsafe { std::mem::zeroed() };
    if attribute.value.len() > std::mem::size_of::<CUstreamAttrValue>() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: at most the union's size, checked above.
    unsafe {
        std::ptr::copy_nonoverlapping(
            attribute.value.as_ptr(),
            (&mut value as *mut CUstreamAttrValue).cast::<u8>(),
            attribute.value.len(),
        )
    };
    Ok(value)
}

/// The wire bytes of an attribute's value union.
pub(super) fn attribute_bytes(value: &CUstreamAttrValue) -> Vec<u8> {
    // SAFETY: the union's bytes.
    unsafe {
        std::slice::from_raw_parts(
            (value as *const CUstreamAttrValue).cast::<u8>(),
            std::mem::size_of::<CUstreamAttrValue>(),
        )
    }
    .to_vec()
}
