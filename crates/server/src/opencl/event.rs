//! Events: user events, waits and status notifications.

use std::sync::atomic::Ordering;

use rgpu_cl_api::sys;
use rgpu_protocol::opencl::{serve, Answer, ClReply, Id};

use crate::opencl::completion::Job;
use crate::opencl::native::{ClResult, Event};
use crate::session::{End, Session};

impl serve::Events for Session {
    fn create_user_event(&mut self, id: Id, context: Id) -> Answer<()> {
        let created = (|| {
            self.cl.handles.events.check_free(id)?;
            let event = self.cl.handles.contexts.get(context)?.create_user_event()?;
            self.cl.user_events.push(event.clone());
            self.cl.pending_user_events.fetch_add(1, Ordering::SeqCst);
            self.cl.handles.events.insert(id, event)
        })();
        if let Err(e) = created {
            // Commands waiting on it fail as they would on a failed event.
            self.cl.fail_event(id, None, e);
        }
        created
    }

    fn set_user_event_status(&mut self, event: Id, status: i32) -> Answer<()> {
        self.cl.handles.events.get(event)?.set_user_status(status)?;
        // The implementation accepts one status per user event, so this counts each once.
        self.cl.pending_user_events.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }

    /// Replies (from the completion thread) once every event is complete. The request thread
    /// does not block: the event may be a user event that a later request sets.
    fn wait_for_events(&mut self, seq: u64, ids: Vec<Id>) -> Result<(), End> {
        if ids.is_empty() {
            return Session::reply(
                self,
                seq,
                ClReply::WaitForEvents(Err(sys::CL_INVALID_VALUE)),
            );
        }
        let events: ClResult<Vec<Event>> = ids
            .iter()
            .map(|&id| self.cl.handles.events.get(id).cloned())
            .collect();
        let events = match events {
            Ok(events) => events,
            Err(e) => return Session::reply(self, seq, ClReply::WaitForEvents(Err(e))),
        };
        // clWaitForEvents flushes implicitly; a callback-driven wait has to do it itself.
        for event in &events {
            event.flush_queue();
        }
        let status = self.cl.take_deferred().unwrap_or(sys::CL_SUCCESS);
        let timed_from = self.reply_timed_from();
        self.cl.completion().send(Job::Wait {
            seq,
            events,
            status,
            timed_from,
        });
        Ok(())
    }

    /// Registers a native callback that reports the event's status to the client.
    /// Implementations only call back for CL_SUBMITTED, CL_RUNNING and CL_COMPLETE.
    fn notify_event(&mut self, id: Id, status: i32) -> Answer<()> {
        let event = self.cl.handles.events.get(id)?;
        let callback_type = if status > sys::CL_COMPLETE {
            status.min(sys::CL_SUBMITTED)
        } else {
            sys::CL_COMPLETE
        };
        let sender = self.cl.completion().sender();
        event.on_status(
            callback_type,
            Box::new(move |actual| {
                let _ = sender.send(Job::Notify {
                    event: id,
                    status: actual,
                });
            }),
        )
    }
}

impl Session {
    /// The native events of a wait list.
    pub(crate) fn wait_list(&self, ids: &[Id]) -> ClResult<Vec<Event>> {
        ids.iter()
            .map(|&id| {
                self.cl
                    .handles
                    .events
                    .get(id)
                    .cloned()
                    .map_err(|_| sys::CL_INVALID_EVENT_WAIT_LIST)
            })
            .collect()
    }
}
