//! Buffers moved between servers (crate::exports): a session's export of a buffer range, and
//! a pull of another server's export into a buffer.

use rgpu_protocol::opencl::{serve, Answer, Id};
use rgpu_protocol::{LaneKey, PeerExport};

use crate::session::Session;

/// The status a failed pull answers (the client falls back to moving the bytes itself).
const PULL_FAILED: i32 = rgpu_cl_api::sys::CL_OUT_OF_RESOURCES;

impl serve::Peers for Session {
    fn export_buffer(&mut self, queue: Id, buffer: Id, offset: u64, size: u64) -> Answer<LaneKey> {
        let queue = self.cl.handles.queues.get(queue)?.queue.clone();
        let mem = self.cl.handles.mems.get(buffer)?.mem.clone();
        // Readable once the queue's earlier work is done.
        queue.finish()?;
        let read = Box::new(move |at: u64, out: &mut [u8]| {
            queue
                .read_buffer_now(&mem, offset + at, out)
                .map_err(|status| format!("OpenCL error {status}"))
        });
        Ok(self.shared.exports.add(self.id, size, read, None))
    }

    fn unexport_buffer(&mut self, ticket: LaneKey) -> Answer<()> {
        self.shared.exports.remove(self.id, &ticket);
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
        crate::exports::pull(
            &from,
            size,
            self.shared.token.as_ref(),
            None,
            |at, bytes| {
                queue
                    .write_buffer_now(&mem, offset + at, bytes)
                    .map_err(|status| format!("OpenCL error {status}"))
            },
        )
        .map_err(|e| {
            log::warn!("session {}: pulling from {}: {e}", self.id, from.endpoint);
            PULL_FAILED
        })
    }
}
