//! Streams.

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::{check, Status};
use rgpu_protocol::cuda::{serve, Answer, Id};

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
