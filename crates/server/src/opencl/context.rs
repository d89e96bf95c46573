//! Contexts and queues.

use rgpu_cl_api::sys;
use rgpu_protocol::opencl::{serve, Answer, ClReply, Id};

use super::answer;
use crate::opencl::completion::Job;
use crate::opencl::handles::QueueEntry;
use crate::session::{End, Session};

impl serve::Contexts for Session {
    fn create_context(&mut self, id: Id, devices: Vec<Id>, properties: Vec<u64>) -> Answer<()> {
        self.cl.handles.contexts.check_free(id)?;
        let Some(&first) = devices.first() else {
            return Err(sys::CL_INVALID_VALUE);
        };
        let platform_id = self
            .cl
            .device(first)
            .ok_or(sys::CL_INVALID_DEVICE)?
            .platform;
        // One context spans one platform.
        if devices
            .iter()
            .any(|&d| self.cl.device(d).is_none_or(|d| d.platform != platform_id))
        {
            return Err(sys::CL_INVALID_DEVICE);
        }
        let inventory = self.cl.inventory.clone();
        let platform = inventory
            .platform(platform_id)
            .ok_or(sys::CL_INVALID_PLATFORM)?;
        let natives = self.native_devices(&devices)?;
        let context = self
            .cl
            .library()?
            .create_context(platform.native, &natives, &properties)?;
        self.cl.handles.contexts.insert(id, context)
    }

    fn create_queue(
        &mut self,
        id: Id,
        context: Id,
        device: Id,
        properties: Vec<u64>,
    ) -> Answer<()> {
        self.cl.handles.queues.check_free(id)?;
        rgpu_cl_api::validate::queue_properties(&properties)?;
        let served = self.cl.device(device).ok_or(sys::CL_INVALID_DEVICE)?;
        let with_properties = self
            .cl
            .inventory
            .platform(served.platform)
            .is_some_and(|p| p.major_version >= 2);
        let queue = self.cl.handles.contexts.get(context)?.create_queue(
            served.native,
            &properties,
            with_properties,
        )?;
        let out_of_order = queue.is_out_of_order();
        self.cl.handles.queues.insert(
            id,
            QueueEntry {
                queue,
                out_of_order,
            },
        )
    }

    fn flush(&mut self, queue: Id) -> Answer<()> {
        self.cl.handles.queues.get(queue)?.queue.flush()
    }

    /// `Finish`: replies once every command enqueued so far on the queue is complete, with
    /// the deferred error if there is one. A marker stands for the queue's work, so the
    /// request thread stays free to take requests (a user event another client thread sets
    /// may be what the queue waits for).
    fn finish(&mut self, seq: u64, queue: Id) -> Result<(), End> {
        if !self.cl.device_may_wait_for_client() {
            // Nothing queued can be waiting for a later request: finish right here, which is
            // as fast as native clFinish.
            let finished = self.cl.handles.queues.get(queue).and_then(|q| {
                let marker = q.queue.marker(&[])?;
                q.queue.flush()?;
                marker.wait_fast();
                Ok(())
            });
            let status = match finished {
                Ok(()) => self.cl.take_deferred().unwrap_or(sys::CL_SUCCESS),
                Err(e) => e,
            };
            if let Some(events) = self.cl.unreported.take_final() {
                self.send(&events, 0, &[])?;
            }
            return Session::reply(self, seq, ClReply::Finish(answer(status)));
        }
        let marker = self.cl.handles.queues.get(queue).and_then(|q| {
            let marker = q.queue.marker(&[])?;
            q.queue.flush()?;
            Ok(marker)
        });
        match marker {
            Err(e) => Session::reply(self, seq, ClReply::Finish(Err(e))),
            Ok(marker) => {
                let status = self.cl.take_deferred().unwrap_or(sys::CL_SUCCESS);
                let timed_from = self.reply_timed_from();
                self.cl.completion().send(Job::Finish {
                    seq,
                    marker,
                    status,
                    timed_from,
                });
                Ok(())
            }
        }
    }
}
