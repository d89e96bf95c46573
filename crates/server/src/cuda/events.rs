//! Events.

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::{check, Status};
use rgpu_protocol::cuda::{serve, Answer, Id};

use super::owned;
use super::session::{code, Served};

impl serve::Events for Served<'_> {
    fn create_event(&mut self, id: Id, ctx: Id, flags: u32) -> Answer<()> {
        let cuda = &mut *self.cuda;
        let made = cuda.create_in(ctx, |cuda, raw| {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe { cu_call!(cuda.backend.driver, cuEventCreate(raw, flags)) })
        });
        made.map(|raw| {
            cuda.events
                .insert(id, owned::Event::new(raw, cuda.current, &cuda.backend));
        })
    }

    fn destroy_event(&mut self, id: Id) -> Answer<()> {
        self.unshare(super::ipc::SharedObject::Event(id));
        self.cuda.record_generations.remove(&id);
        self.cuda.unreported_records.remove(&id);
        let taken = self.cuda.events.remove(&id);
        self.cuda.destroy(taken)
    }

    fn record_event(&mut self, ctx: Id, event: Id, stream: Id, flags: u32) -> Answer<()> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx).and_then(|()| {
            let (stream, event) = (cuda.stream(stream)?, cuda.event(event)?);
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe {
                cu_call!(
                    cuda.backend.driver,
                    cuEventRecordWithFlags(event, stream, flags)
                )
            })
        })?;
        cuda.recorded(event);
        Ok(())
    }

    fn ctx_record_event(&mut self, ctx: Id, event: Id) -> Answer<()> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx).and_then(|()| {
            let event = cuda.event(event)?;
            // SAFETY: the session's current context and one of its events.
            check(unsafe { cu_call!(cuda.backend.driver, cuCtxRecordEvent(cuda.current, event)) })
        })?;
        cuda.recorded(event);
        Ok(())
    }

    fn ctx_wait_event(&mut self, ctx: Id, event: Id) -> Answer<()> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx).and_then(|()| {
            let event = cuda.event(event)?;
            // SAFETY: as above.
            check(unsafe { cu_call!(cuda.backend.driver, cuCtxWaitEvent(cuda.current, event)) })
        })
    }

    fn event_synchronize(&mut self, event: Id) -> Status {
        let cuda = &mut *self.cuda;
        let status = cuda.event(event).and_then(|event| {
            // SAFETY: an event of this session.
            check(unsafe { cu_call!(cuda.backend.driver, cuEventSynchronize(event)) })
        });
        cuda.sync_status(code(status))
    }

    fn event_query(&mut self, event: Id) -> Status {
        let cuda = &*self.cuda;
        let status = cuda
            .event(event)
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            .and_then(|event| check(unsafe { cu_call!(cuda.backend.driver, cuEventQuery(event)) }));
        code(status)
    }

    fn event_elapsed_time(&mut self, start: Id, end: Id) -> Answer<f32> {
        let cuda = &*self.cuda;
        let mut milliseconds = 0f32;
        let status = cuda.event(start).and_then(|start| {
            let end = cuda.event(end)?;
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe {
                cu_call!(
                    cuda.backend.driver,
                    cuEventElapsedTime_v2(&mut milliseconds, start, end)
                )
            })
        });
        status.map(|()| milliseconds)
    }
}
