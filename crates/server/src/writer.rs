//! The socket's write half of a session, shared by its threads (the request thread, the
//! completion thread, OpenCL's callback threads).

use std::sync::Mutex;

use rgpu_protocol::ServerMsg;
use rgpu_transport::{FrameWriter, Stream, TransportError};

/// The socket's write half, shared by the threads of a session.
pub struct Writer {
    inner: Mutex<FrameWriter<Stream>>,
}

impl Writer {
    pub fn new(write_half: Stream) -> Writer {
        Writer {
            inner: Mutex::new(FrameWriter::new(write_half)),
        }
    }

    /// Sends one frame (and its bulk) and flushes it.
    pub fn send(&self, msg: &ServerMsg, seq: u64, bulk: &[u8]) -> Result<(), TransportError> {
        let mut writer = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        crate::flight::sent(bulk.len() as u64);
        count_reply(msg);
        writer.send(msg, seq, bulk)
    }

    /// Sends one frame without bulk unless another thread is writing (false then, or when the
    /// write failed: the request thread sees that failure itself).
    pub fn try_send(&self, msg: &ServerMsg, seq: u64) -> bool {
        let mut writer = match self.inner.try_lock() {
            Ok(writer) => writer,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        writer.send(msg, seq, &[]).is_ok()
    }

    /// Sends a frame whose `bulk_len` bytes go striped over `lanes` data lanes (not with it).
    pub fn send_striped(
        &self,
        msg: &ServerMsg,
        seq: u64,
        bulk_len: u64,
        lanes: u32,
    ) -> Result<(), TransportError> {
        let mut writer = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        crate::flight::sent(bulk_len);
        crate::flight::lane_sent(bulk_len);
        writer.queue_striped(msg, seq, bulk_len, lanes)?;
        writer.flush()
    }

    /// Sends a read's last data (`(offset, bytes)`) and its final reply in one write (small
    /// synchronous reads are latency-bound: one system call and one wake-up of the client, not
    /// two).
    pub fn send_read(
        &self,
        seq: u64,
        data: Option<(u64, &[u8])>,
        last: &ServerMsg,
    ) -> Result<(), TransportError> {
        let mut writer = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((offset, data)) = data {
            crate::flight::sent(data.len() as u64);
            writer.queue(&ServerMsg::Data { offset }, seq, data)?;
        }
        count_reply(last);
        writer.send(last, seq, &[])
    }
}

/// Counts `msg` among the session's replies if it answers a request (the end of a read
/// included; not its data, nor signs of life), and among its errors if it reports a failure.
fn count_reply(msg: &ServerMsg) {
    let failure = match msg {
        ServerMsg::Cl(reply) => ("opencl", reply.failure()),
        ServerMsg::Cu(reply) => ("cuda", reply.failure()),
        ServerMsg::Session(reply) => ("session", reply.failure()),
        ServerMsg::ReadDone { status } => ("read", rgpu_protocol::table::failure_of(*status)),
        _ => return,
    };
    crate::flight::replied();
    if let (api, Some(code)) = failure {
        crate::flight::failed(api, code);
    }
}

/// The `Timing` frame that precedes a reply when the client asked for them (`TimeReplies`):
/// the server's time on the request since `started`.
pub(crate) fn timing_since(started: std::time::Instant) -> rgpu_protocol::ServerMsg {
    rgpu_protocol::ServerMsg::Timing {
        server_us: u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX),
    }
}
