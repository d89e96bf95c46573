//! The socket's write half of a session, shared by its threads (the request thread, the
//! completion thread, OpenCL's callback threads).

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rgpu_protocol::{ServerMsg, IN_RING, RING_MIN};
use rgpu_transport::shared_ring::RingProducer;
use rgpu_transport::{FrameWriter, Stream, TransportError};

/// How long a read's data waits for room in the shared ring (the client's reader thread takes
/// it as the frames arrive): as long as a stalled socket write.
const RING_PATIENCE: Duration = Duration::from_secs(120);

/// What the session's threads write through, under one lock so that frames and the ring's
/// bytes keep one order.
struct Out {
    frames: FrameWriter<Stream>,
    /// The sending end of the session's shared-memory ring, once the client attached one.
    ring: Option<RingProducer>,
}

impl Out {
    /// Queues a read's data frame: its bytes into the ring where there is one and they are
    /// many (then the frame is flushed: the client takes ring bytes as frames arrive), else
    /// after the frame.
    fn queue_data(&mut self, seq: u64, offset: u64, data: &[u8]) -> Result<(), TransportError> {
        crate::flight::sent(data.len() as u64);
        let Some(ring) = self.ring.as_mut().filter(|_| data.len() as u64 >= RING_MIN) else {
            return self.frames.queue(&ServerMsg::Data { offset }, seq, data);
        };
        // Pieces of half the ring: the client frees one while the next goes in.
        let piece = (ring.capacity() / 2).max(1);
        for (i, part) in data.chunks(piece).enumerate() {
            let still_there = || self.frames.get_ref().peer_still_there();
            ring.write(part, RING_PATIENCE, &still_there)?;
            crate::flight::shared_sent(part.len() as u64);
            let msg = ServerMsg::Data {
                offset: offset + (i * piece) as u64,
            };
            self.frames
                .queue_striped(&msg, seq, part.len() as u64, IN_RING)?;
            self.frames.flush()?;
        }
        Ok(())
    }
}

/// The socket's write half, shared by the threads of a session.
pub struct Writer {
    inner: Mutex<Out>,
    /// Set once the client attached a shared-memory ring (a fact asked per large transfer).
    ring_attached: std::sync::atomic::AtomicBool,
}

impl Writer {
    pub fn new(write_half: Stream) -> Writer {
        Writer {
            inner: Mutex::new(Out {
                frames: FrameWriter::new(write_half),
                ring: None,
            }),
            ring_attached: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Out> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// From now on large read data goes through the shared-memory ring.
    pub fn attach_ring(&self, ring: RingProducer) {
        self.lock().ring = Some(ring);
        self.ring_attached
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// The shared-memory ring for a read's data, where the client attached one: held (with
    /// the socket) until dropped, so that frames and ring bytes keep one order.
    pub fn ring_sender(&self) -> Option<RingSender<'_>> {
        let out = self.lock();
        out.ring.is_some().then_some(RingSender { out })
    }

    /// Whether the client attached a shared-memory ring.
    pub fn has_ring(&self) -> bool {
        self.ring_attached
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Sends one frame (and its bulk) and flushes it.
    pub fn send(&self, msg: &ServerMsg, seq: u64, bulk: &[u8]) -> Result<(), TransportError> {
        let mut out = self.lock();
        if let ServerMsg::Data { offset } = msg {
            out.queue_data(seq, *offset, bulk)?;
            return out.frames.flush();
        }
        crate::flight::sent(bulk.len() as u64);
        count_reply(msg);
        out.frames.send(msg, seq, bulk)
    }

    /// Sends one frame without bulk unless another thread is writing (false then, or when the
    /// write failed: the request thread sees that failure itself).
    pub fn try_send(&self, msg: &ServerMsg, seq: u64) -> bool {
        let mut out = match self.inner.try_lock() {
            Ok(out) => out,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        out.frames.send(msg, seq, &[]).is_ok()
    }

    /// Sends a frame whose `bulk_len` bytes go striped over `lanes` data lanes (not with it).
    pub fn send_striped(
        &self,
        msg: &ServerMsg,
        seq: u64,
        bulk_len: u64,
        lanes: u32,
    ) -> Result<(), TransportError> {
        let mut out = self.lock();
        crate::flight::sent(bulk_len);
        crate::flight::lane_sent(bulk_len);
        out.frames.queue_striped(msg, seq, bulk_len, lanes)?;
        out.frames.flush()
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
        let mut out = self.lock();
        if let Some((offset, data)) = data {
            out.queue_data(seq, offset, data)?;
        }
        count_reply(last);
        out.frames.send(last, seq, &[])
    }
}

/// A read's data written straight into the shared-memory ring (by a device's DMA): room is
/// reserved, filled, then published with its `Data` frame.
pub struct RingSender<'a> {
    out: MutexGuard<'a, Out>,
}

impl RingSender<'_> {
    fn ring(&mut self) -> &mut RingProducer {
        self.out.ring.as_mut().expect("a ring sender has a ring")
    }

    /// The mapping the ring lies in (base address, length), for a device to register.
    pub fn region(&mut self) -> (*mut u8, usize) {
        self.ring().region()
    }

    /// Room for up to `max` bytes, one contiguous run: waiting for the client to take earlier
    /// bytes when `wait`, else possibly 0 bytes.
    pub fn reserve(&mut self, max: usize, wait: bool) -> Result<(*mut u8, usize), TransportError> {
        let deadline = wait.then(|| std::time::Instant::now() + RING_PATIENCE);
        let Out { frames, ring } = &mut *self.out;
        let ring = ring.as_mut().expect("a ring sender has a ring");
        let still_there = || frames.get_ref().peer_still_there();
        Ok(ring.reserve(max, deadline, &still_there)?)
    }

    /// Gives back the room reserved and not published (a copy into it failed).
    pub fn cancel_reserved(&mut self) {
        self.ring().cancel_reserved();
    }

    /// The next `n` reserved bytes are read `seq`'s data at `offset`: tells the client.
    pub fn publish(&mut self, seq: u64, offset: u64, n: usize) -> Result<(), TransportError> {
        self.ring().publish(n)?;
        crate::flight::sent(n as u64);
        crate::flight::shared_sent(n as u64);
        let frames = &mut self.out.frames;
        frames.queue_striped(&ServerMsg::Data { offset }, seq, n as u64, IN_RING)?;
        frames.flush()
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
