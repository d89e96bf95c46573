//! Buffers moved between servers over the fabric (crate::fabric): a session's export of a
//! buffer range, and a pull of another server's export into a buffer; and waits on another
//! server's events (an event exported as no bytes, awaited by a user event).

use rgpu_protocol::opencl::{serve, Answer, Id};
use rgpu_protocol::{LaneKey, PeerExport};

use crate::fabric::{read_in_chunks, Source, WriteBy};
use crate::opencl::native::{Event, Mem, Queue};
use crate::session::Session;

/// The status a failed pull answers (the client falls back to moving the bytes itself).
const PULL_FAILED: i32 = rgpu_cl_api::sys::CL_OUT_OF_RESOURCES;

impl serve::Peers for Session {
    fn export_buffer(
        &mut self,
        queue: Id,
        buffer: Id,
        offset: u64,
        size: u64,
        ticket: LaneKey,
    ) -> Answer<()> {
        let queue = self.cl.handles.queues.get(queue)?.queue.clone();
        let mem = self.cl.handles.mems.get(buffer)?.mem.clone();
        // Readable once the queue's earlier commands are done: a marker says when.
        let ready = queue.marker(&[])?;
        queue.flush()?;
        let source = BufferRange {
            queue,
            mem,
            offset,
            ready,
        };
        let fabric = &self.shared.fabric;
        fabric
            .add(self.id, ticket, size, Box::new(source), false)
            .map_err(|e| {
                log::warn!("session {}: {e}", self.id);
                rgpu_cl_api::sys::CL_INVALID_VALUE
            })
    }

    fn export_event(&mut self, event: Id, ticket: LaneKey) -> Answer<()> {
        let event = self.cl.handles.events.get(event)?.clone();
        // Its command must reach the device for it to complete.
        event.flush_queue();
        self.shared
            .fabric
            .add(self.id, ticket, 0, Box::new(EventDone(event)), false)
            .map_err(|e| {
                log::warn!("session {}: {e}", self.id);
                rgpu_cl_api::sys::CL_INVALID_VALUE
            })
    }

    fn await_export(&mut self, event: Id, from: PeerExport) -> Answer<()> {
        let event = self.cl.handles.events.get(event)?.clone();
        let pending = self.cl.pending_user_events.clone();
        let shared = self.shared.clone();
        let id = self.id;
        let job = Box::new(move || {
            // An export of no bytes: pulled once the other server's event has completed.
            let nothing = WriteBy(|_: u64, _: &[u8]| Ok(()));
            let pulled = shared
                .fabric
                .links(shared.token.as_ref())
                .and_then(|links| links.pull(&from, 0, &nothing));
            let status = match pulled {
                Ok(()) => rgpu_cl_api::sys::CL_COMPLETE,
                Err(e) => {
                    log::warn!("session {id}: waiting on {}'s event: {e}", from.endpoint);
                    rgpu_cl_api::sys::CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST
                }
            };
            if event.set_user_status(status).is_ok() {
                pending.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        self.shared.fabric.run(job).map_err(|e| {
            log::warn!("session {}: {e}", self.id);
            PULL_FAILED
        })
    }

    fn unexport_buffer(&mut self, ticket: LaneKey) -> Answer<()> {
        self.shared.fabric.remove(self.id, &ticket);
        Ok(())
    }

    fn pull_buffer(
        &mut self,
        queue: Id,
        buffer: Id,
        offset: u64,
        size: u64,
        from: PeerExport,
    ) -> Answer<()> {
        let queue = self.cl.handles.queues.get(queue)?.queue.clone();
        let mem = self.cl.handles.mems.get(buffer)?.mem.clone();
        let write = WriteBy(|at: u64, bytes: &[u8]| {
            queue
                .write_buffer_now(&mem, offset + at, bytes)
                .map_err(|status| format!("OpenCL error {status}"))
        });
        let shared = &self.shared;
        shared
            .fabric
            .links(shared.token.as_ref())
            .and_then(|links| links.pull(&from, size, &write))
            .map_err(|e| {
                log::warn!("session {}: pulling from {}: {e}", self.id, from.endpoint);
                PULL_FAILED
            })
    }
}

/// An exported event: no bytes, ready once the event has completed.
struct EventDone(Event);

impl Source for EventDone {
    fn ready(&self) -> Result<bool, String> {
        match self.0.status() {
            Ok(0) => Ok(true),
            Ok(status) if status > 0 => Ok(false),
            Ok(status) | Err(status) => Err(format!("the exported event failed: {status}")),
        }
    }

    fn read(&self, _offset: u64, _len: u64, _send: crate::fabric::Send) -> Result<(), String> {
        Err("an event has no bytes".into())
    }
}

/// An exported buffer range, ready once the marker enqueued after the queue's earlier
/// commands has completed.
struct BufferRange {
    queue: Queue,
    mem: Mem,
    offset: u64,
    ready: Event,
}

impl Source for BufferRange {
    fn ready(&self) -> Result<bool, String> {
        match self.ready.status() {
            Ok(0) => Ok(true),
            Ok(status) if status > 0 => Ok(false),
            Ok(status) | Err(status) => Err(format!("the exporting queue failed: {status}")),
        }
    }

    fn read(&self, offset: u64, len: u64, send: crate::fabric::Send) -> Result<(), String> {
        read_in_chunks(offset, len, send, |at, out| {
            self.queue
                .read_buffer_now(&self.mem, self.offset + at, out)
                .map_err(|status| format!("OpenCL error {status}"))
        })
    }
}
