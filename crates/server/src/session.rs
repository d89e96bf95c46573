//! One client connection: the handshake, the request loop, deferred errors, and the cleanup
//! that gives back everything the session created however it ends.
//!
//! Threads of a session: the request thread (this module's loop, which also receives write
//! data), the completion thread ([`crate::opencl::completion`]), and OpenCL's own callback threads.
//! They share the socket's write half through [`crate::writer::Writer`].

use std::sync::Arc;

use rgpu_cl_api::error_name;
use rgpu_protocol::opencl::{self, ClReply};
use rgpu_protocol::session::{self, SessionReply};
use rgpu_protocol::{decode_body, ClientMsg, FrameHeader, LaneKey, ServerMsg};
use rgpu_transport::{
    accept_preamble, random_lane_key, server_handshake, Applicant, FrameReader, ReadHalf, Route,
    Stream, TransportError,
};

use crate::lanes::{LaneHandles, Striped, StripedOut};
use crate::limits::Usage;
use crate::opencl::session::ClSession;
use crate::shared::Shared;
use crate::watch::{Patience, SessionWatch};
use crate::writer::Writer;
use rgpu_transport::shared_ring::SharedRegion;

/// Where the bulk bytes of a request come from, and how many are still to be read.
enum Incoming {
    /// After the request's frame on the session's connection.
    Inline { remaining: u64 },
    /// Dealt over the session's data lanes.
    Striped(Striped),
    /// In the session's shared-memory ring (a client on this host).
    InRing { remaining: u64 },
    /// In the client's shared host-memory segment `segment`, from `at` on.
    InSegment {
        segment: u64,
        at: *const u8,
        remaining: u64,
    },
}

impl Incoming {
    fn of(header: &FrameHeader) -> Incoming {
        match header.lanes {
            0 => Incoming::Inline {
                remaining: header.bulk_len,
            },
            rgpu_protocol::IN_RING => Incoming::InRing {
                remaining: header.bulk_len,
            },
            lanes => Incoming::Striped(Striped::new(header.bulk_len, lanes)),
        }
    }

    fn remaining(&self) -> u64 {
        match self {
            Incoming::Inline { remaining }
            | Incoming::InRing { remaining }
            | Incoming::InSegment { remaining, .. } => *remaining,
            Incoming::Striped(striped) => striped.remaining(),
        }
    }
}

const NO_LANES: &str = "a striped request on a session without data lanes";
/// The most shared host-memory segments a session maps at once.
const MAX_SEGMENTS: usize = 4096;

/// The most page-locked host memory one session may share (the server pins it at its first
/// copy, and its pages count against the worker): a quarter of this host's memory. Past it,
/// the client's page-locked allocations are its own memory again (copied through the ring).
fn max_shared_host_bytes() -> u64 {
    // SAFETY: sysconf only reads.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages.max(0) as u64).saturating_mul(page.max(0) as u64) / 4
}
const NO_RING: &str = "bulk in a shared-memory ring the session does not have";
/// How long the session waits for a ring's bytes (or room in it) from a client that is still
/// connected: as long as for a stalled socket write.
const RING_PATIENCE: std::time::Duration = std::time::Duration::from_secs(120);

/// Why a session's request loop stopped.
pub enum End {
    /// The client closed the connection between frames.
    Closed,
    /// The server is shutting down.
    Stopped,
    /// The client broke the protocol; the reason is logged.
    Protocol(String),
    /// The connection failed.
    Broken(String),
    /// The watchdog closed the session (and logged why): no request for the idle timeout, or
    /// no answer from the client for `client_timeout`.
    Watchdog,
}

impl End {
    pub(crate) fn from_transport(error: TransportError, stopping: bool) -> End {
        match error {
            _ if stopping => End::Stopped,
            TransportError::Closed => End::Closed,
            TransportError::Protocol(e) => End::Protocol(e.to_string()),
            TransportError::Io(e) => End::Broken(e.to_string()),
            TransportError::Auth(e) => End::Protocol(e),
        }
    }
}

/// A connection that passed the handshake as a new session (not as a data lane).
pub(crate) struct Admitted {
    pub stream: Stream,
    /// The client's self-description and address, for logs.
    pub client: String,
    pub peer: String,
    /// The key the session's data lanes present.
    pub lane_key: LaneKey,
}

/// Reads and answers a new connection's preamble (see `accept_preamble`); `None` (logged) when
/// the connection is refused or vanished.
pub(crate) fn preamble(stream: &mut Stream, shared: &Shared) -> Option<Route> {
    match accept_preamble(stream, &shared.security, shared.token.as_ref()) {
        Ok(route) => Some(route),
        Err(e) => {
            log_refusal(&stream.peer_description(), e);
            None
        }
    }
}

fn log_refusal(peer: &str, error: TransportError) {
    match error {
        TransportError::Closed => {
            log::debug!("{peer}: closed the connection during the handshake")
        }
        TransportError::Auth(why) => log::warn!("{peer}: refused: {why}"),
        e => log::warn!("{peer}: connection refused: {e}"),
    }
}

/// Runs the rest of the handshake on a connection whose preamble asked for `route` (TLS,
/// authentication); `admit` decides (see `Shared::admit`). A new session comes back admitted;
/// for a data lane (taken by `admit`) `None` comes back, as it does for a refused or vanished
/// client (logged here).
pub(crate) fn handshake(
    stream: Stream,
    route: &Route,
    shared: &Shared,
    id: u64,
    lane_key: LaneKey,
    admit: impl FnOnce(&Applicant, &Stream) -> Result<(), String>,
) -> Option<Admitted> {
    let peer = stream.peer_description();
    let hello = server_handshake(
        stream,
        route,
        &shared.security,
        shared.token.as_ref(),
        &shared.name,
        id,
        lane_key,
        admit,
    );
    match hello {
        Ok((stream, hello)) => match hello.lane {
            None => Some(Admitted {
                client: hello.name,
                peer: stream.peer_description(),
                stream,
                lane_key,
            }),
            Some(lane) => {
                // Its session's reader holds the connection now.
                log::debug!(
                    "session {}: data lane {} joined from {peer}",
                    lane.session,
                    lane.index
                );
                None
            }
        },
        Err(e) => {
            log_refusal(&peer, e);
            None
        }
    }
}

/// Runs a session on an accepted connection, in this process: handshake, requests, cleanup.
pub(crate) fn run(mut stream: Stream, shared: Arc<Shared>, id: u64) {
    shared.register(id, &stream);
    let route = if shared.stopping() {
        None
    } else {
        preamble(&mut stream, &shared)
    };
    let Some(route) = route else {
        stream.shutdown();
        shared.unregister(id);
        return;
    };
    // Open to lanes before the welcome: the client may open them as soon as it has it.
    let lane_key = random_lane_key();
    shared.lanes.open(id, lane_key);
    // Held until the session has ended.
    let mut slot = None;
    let admitted = handshake(stream, &route, &shared, id, lane_key, |lane, stream| {
        shared.admit(lane, stream, &mut slot, |attach, lane| {
            if attach.index == rgpu_protocol::fabric::LINK_LANE {
                shared.fabric.serve_link(attach, lane)
            } else {
                shared.lanes.join(attach, lane)
            }
        })
    });
    if let Some(admitted) = admitted {
        serve(admitted, &shared, id, || {
            if let Some(slot) = &mut slot {
                slot.ending();
            }
        });
    }
    shared.lanes.close(id);
    shared.fabric.forget_session(id);
    shared.unregister(id);
}

/// Serves an admitted session until it ends, then releases everything it created. Its data
/// lanes join through `shared.lanes` (opened for `id` by the caller). `client_gone` is told
/// when it has stopped serving, before what it held is released.
pub(crate) fn serve(admitted: Admitted, shared: &Arc<Shared>, id: u64, client_gone: impl FnOnce()) {
    let Admitted {
        stream,
        client,
        peer,
        lane_key,
    } = admitted;
    shared.register(id, &stream);
    log::info!("session {id}: {client} connected from {peer}");
    // Read directly, also in TLS: a read-ahead thread would let records be opened while the
    // session thread copies, but its hand-over costs every small request a thread wake-up
    // (measured on the H100: 4-byte reads 32 -> 54 us). Data lanes are read ahead. A Unix
    // socket's reads keep the descriptor of a shared-memory region the client attaches.
    let halves = stream
        .try_clone()
        .and_then(|r| Ok((ReadHalf::for_session(r), stream.try_clone()?)));
    let (read_half, write_half) = match halves {
        Ok(halves) => halves,
        Err(e) => {
            log::warn!("session {id}: cannot set up the connection: {e}");
            stream.shutdown();
            shared.unregister(id);
            return;
        }
    };
    let lanes = shared.lanes.open_or_get(id, lane_key);
    let watched = stream.try_clone();
    let mut session = Session::new(id, shared.clone(), stream, read_half, write_half);
    shared.register_writer(id, &session.writer);
    session.lanes = Some(LaneHandles::new(lanes));
    session.watch = match watched {
        Ok(watched) => Some(SessionWatch::start(
            id,
            Patience {
                idle: shared.limits.idle_timeout,
                client: shared.client_timeout,
            },
            watched,
            session.writer.clone(),
        )),
        Err(e) => {
            log::warn!("session {id}: no watchdog: {e}");
            None
        }
    };
    let end = session.serve();
    client_gone();
    if let Some(watch) = &session.watch {
        watch.end();
    }
    match &end {
        End::Closed | End::Watchdog => {}
        End::Stopped => log::debug!("session {id}: server shutting down"),
        End::Protocol(why) => log::warn!("session {id} ({client} at {peer}): {why}; closing it"),
        End::Broken(why) => log::warn!("session {id} ({client} at {peer}): connection lost: {why}"),
    }
    let released = session.close(matches!(end, End::Closed));
    shared.unregister(id);
    log::info!("session {id}: {client} disconnected; released {released} objects");
}

pub struct Session {
    pub(crate) id: u64,
    pub(crate) shared: Arc<Shared>,
    /// The session's memory and object counts against its quotas (OpenCL and CUDA together).
    pub(crate) usage: Arc<Usage>,
    stream: Stream,
    pub(crate) reader: FrameReader<ReadHalf>,
    pub(crate) writer: Arc<Writer>,
    /// The session's OpenCL objects and the threads and buffers that serve them.
    pub(crate) cl: ClSession,
    /// Handles on the session's data lanes (`None` only in tests of a bare session).
    pub(crate) lanes: Option<LaneHandles>,
    /// Over how many lanes the client takes large reads (`ReadLanes`; 0: none).
    read_lanes: u32,
    /// Whether each reply comes after a `Timing` frame (`TimeReplies`: the client traces).
    time_replies: bool,
    /// When the current request was taken off the connection.
    request_started: std::time::Instant,
    /// The current request's bulk bytes still to be read.
    bulk: Incoming,
    /// The receiving end of the shared-memory ring (`AttachShared`; its sending end is the
    /// writer's).
    ring: Option<rgpu_transport::shared_ring::RingConsumer>,
    /// The client's shared host-memory segments (`AttachHostMemory`), by the client's names.
    segments: std::collections::HashMap<u64, Arc<SharedRegion>>,
    /// Where the current request (a read) asked its data to go, in a segment
    /// (`INTO_SEGMENT`): the segment's name and the bytes.
    read_into: Option<(u64, *mut u8, usize)>,
    /// The session's CUDA objects, from its first CUDA request on.
    /// (Boxed: it is taken out and put back around every CUDA request.)
    pub(crate) cuda: Option<Box<crate::cuda::CudaSession>>,
    /// Closes the session when it stays idle too long (with `idle_timeout` set), and tells
    /// the client when a request takes long (crate::watch).
    watch: Option<Arc<SessionWatch>>,
}

impl Session {
    fn new(
        id: u64,
        shared: Arc<Shared>,
        stream: Stream,
        read_half: ReadHalf,
        write_half: Stream,
    ) -> Session {
        let writer = Arc::new(Writer::new(write_half));
        let usage = Usage::new(id, &shared.limits);
        crate::flight::watch_usage(&usage);
        if let Some(fd) = stream.socket_fd() {
            crate::flight::watch_socket(fd);
        }
        let cl = ClSession::new(id, shared.inventory.clone(), &writer, usage.clone());
        Session {
            id,
            shared,
            usage,
            stream,
            reader: FrameReader::new(read_half),
            writer,
            cl,
            lanes: None,
            read_lanes: 0,
            time_replies: false,
            request_started: std::time::Instant::now(),
            bulk: Incoming::Inline { remaining: 0 },
            ring: None,
            segments: Default::default(),
            read_into: None,
            cuda: None,
            watch: None,
        }
    }

    /// The request loop.
    fn serve(&mut self) -> End {
        loop {
            if let Some(watch) = &self.watch {
                watch.waiting();
            }
            if !self.reader.has_buffered() {
                if let Some(cuda) = self.cuda.as_mut() {
                    cuda.wake_launcher();
                }
            }
            let frame = self.reader.read_frame();
            if let Some(watch) = &self.watch {
                if watch.fired() {
                    return End::Watchdog;
                }
                watch.heard();
            }
            let (header, msg) = match frame {
                Ok((header, body)) => (header, decode_body::<ClientMsg>(body)),
                Err(e) => return End::from_transport(e, self.shared.stopping()),
            };
            let msg = match msg {
                Ok(msg) => msg,
                Err(e) => return End::Protocol(e.to_string()),
            };
            // A sign of life is not a request: the idle clock goes on.
            let request = !matches!(msg, ClientMsg::Alive);
            if let Some(watch) = self.watch.as_ref().filter(|_| request) {
                watch.working();
            }
            let mut header = header;
            self.read_into = None;
            self.bulk = match self.locate_bulk(&mut header) {
                Ok(bulk) => bulk,
                Err(end) => return end,
            };
            // Posted launches may still be on their way on the launch thread: everything
            // else is served after them, in the program's order.
            let launch = matches!(
                &msg,
                ClientMsg::Cu(rgpu_protocol::cuda::CuRequest::Launch { .. })
            );
            if let Some(cuda) = self.cuda.as_mut().filter(|_| !launch) {
                cuda.drain_launches();
            }
            self.request_started = std::time::Instant::now();
            let flight = crate::flight::begin(msg.name(), header.seq, header.bulk_len);
            crate::flight::crash_test(msg.name());
            let result = match msg {
                ClientMsg::Session(request) => {
                    session::serve::dispatch(self, header.seq, header.bulk_len, request)
                }
                ClientMsg::Authenticate { .. } => {
                    Err(End::Protocol("authentication after the handshake".into()))
                }
                ClientMsg::Cl(request) => {
                    opencl::serve::dispatch(self, header.seq, header.bulk_len, request)
                }
                ClientMsg::Cu(request) => self.handle_cuda(header.seq, header.bulk_len, request),
                ClientMsg::Alive if header.bulk_len == 0 => Ok(()),
                ClientMsg::Alive => Err(End::Protocol("a sign of life with bulk data".into())),
            };
            crate::flight::end(flight);
            if let Err(end) = result {
                return end;
            }
            // Every handler takes its request's bulk; what one left would be read as the next
            // frame.
            let left = self.bulk.remaining();
            if left > 0 {
                log::error!("session {}: a request left {left} bulk bytes", self.id);
                if let Err(end) = self.drop_bulk() {
                    return end;
                }
            }
        }
    }

    /// Where the bulk of the request whose header is `header` comes from. A request naming
    /// bytes in a shared segment has its span read here; `header.bulk_len` becomes the length
    /// of the bytes it names (a read's target: 0).
    fn locate_bulk(&mut self, header: &mut FrameHeader) -> Result<Incoming, End> {
        use rgpu_protocol::{SegmentSpan, INTO_SEGMENT, IN_SEGMENT};
        if header.lanes != IN_SEGMENT && header.lanes != INTO_SEGMENT {
            return Ok(Incoming::of(header));
        }
        if header.bulk_len != SegmentSpan::ENCODED_LEN as u64 {
            return Err(End::Protocol("a segment span of the wrong size".into()));
        }
        let mut raw = [0u8; SegmentSpan::ENCODED_LEN];
        self.reader
            .read_bulk(&mut raw)
            .map_err(|e| End::from_transport(e, self.shared.stopping()))?;
        let span = SegmentSpan::decode(&raw);
        let region = self
            .segments
            .get(&span.segment)
            .ok_or_else(|| End::Protocol(format!("no shared segment {}", span.segment)))?;
        let inside = span
            .offset
            .checked_add(span.len)
            .is_some_and(|end| end <= region.len() as u64);
        if !inside {
            return Err(End::Protocol("a span outside its shared segment".into()));
        }
        // SAFETY: the span was just checked to lie inside the mapping.
        let at = unsafe { region.base().add(span.offset as usize) };
        if header.lanes == IN_SEGMENT {
            header.bulk_len = span.len;
            crate::flight::shared_received(span.len);
            return Ok(Incoming::InSegment {
                segment: span.segment,
                at,
                remaining: span.len,
            });
        }
        header.bulk_len = 0;
        self.read_into = Some((span.segment, at, span.len as usize));
        Ok(Incoming::Inline { remaining: 0 })
    }

    /// The current request's whole bulk, `len` bytes, where it lies in a shared segment (the
    /// segment's name and its address here), taken: a device copies it in place.
    pub(crate) fn bulk_in_place(&mut self, len: u64) -> Option<(u64, *const u8)> {
        let Incoming::InSegment {
            segment,
            at,
            remaining,
        } = &mut self.bulk
        else {
            return None;
        };
        if *remaining != len {
            return None;
        }
        *remaining = 0;
        Some((*segment, *at))
    }

    /// The shared ring's mapping (base, length), when the current request's bulk is in it.
    pub(crate) fn bulk_ring_region(&self) -> Option<(*mut u8, usize)> {
        match self.bulk {
            Incoming::InRing { .. } => self.ring.as_ref().map(|ring| ring.region()),
            _ => None,
        }
    }

    /// The current request's next bulk bytes in the shared ring, up to `max`, left in place
    /// (one contiguous run, waited for): held until [`Session::release_ring_bulk`].
    pub(crate) fn take_ring_bulk(&mut self, max: u64) -> Result<(*const u8, usize), End> {
        let Incoming::InRing { remaining } = &mut self.bulk else {
            return Err(End::Protocol(NO_RING.into()));
        };
        let ring = self.ring.as_mut().ok_or(End::Protocol(NO_RING.into()))?;
        let still_there = || self.stream.peer_still_there();
        let max = max.min(*remaining) as usize;
        let (at, n) = ring
            .take(max, RING_PATIENCE, &still_there)
            .map_err(|e| End::Broken(format!("shared-memory ring: {e}")))?;
        *remaining -= n as u64;
        crate::flight::shared_received(n as u64);
        Ok((at, n))
    }

    /// Ring bytes taken in place and not given back yet.
    pub(crate) fn ring_bulk_held(&self) -> u64 {
        self.ring.as_ref().map_or(0, |ring| ring.held())
    }

    /// Gives back every ring byte held in place (the copies that read them are done).
    pub(crate) fn release_ring_bulk(&mut self) -> Result<(), End> {
        let Some(ring) = self.ring.as_mut() else {
            return Ok(());
        };
        ring.release(ring.held())
            .map_err(|e| End::Broken(format!("shared-memory ring: {e}")))
    }

    /// Where the current read asked its `len` bytes to go in a shared segment (its name and
    /// address here), if it did.
    pub(crate) fn read_in_place(&self, len: usize) -> Option<(u64, *mut u8)> {
        self.read_into
            .filter(|&(_, _, want)| want == len)
            .map(|(segment, at, _)| (segment, at))
    }

    /// A shared segment, to keep it mapped beyond the client's use of its name.
    pub(crate) fn segment_region(&self, name: u64) -> Option<Arc<SharedRegion>> {
        self.segments.get(&name).cloned()
    }

    /// A shared segment's mapping here (base, length), for a device to register.
    pub(crate) fn segment(&self, name: u64) -> Option<(*mut u8, usize)> {
        self.segments.get(&name).map(|r| (r.base(), r.len()))
    }

    /// When the current request began, if its reply is to come after a `Timing` frame (for
    /// replies another thread sends).
    pub(crate) fn reply_timed_from(&self) -> Option<std::time::Instant> {
        self.time_replies.then_some(self.request_started)
    }

    pub(crate) fn send(&self, msg: &ServerMsg, seq: u64, bulk: &[u8]) -> Result<(), End> {
        if self.time_replies
            && matches!(
                msg,
                ServerMsg::Cl(_) | ServerMsg::Cu(_) | ServerMsg::Session(_)
            )
        {
            let timing = crate::writer::timing_since(self.request_started);
            self.writer
                .send(&timing, seq, &[])
                .map_err(|e| End::from_transport(e, self.shared.stopping()))?;
        }
        self.writer
            .send(msg, seq, bulk)
            .map_err(|e| End::from_transport(e, self.shared.stopping()))
    }

    /// [`Writer::send_read`] from the request thread.
    pub(crate) fn send_read(
        &self,
        seq: u64,
        data: Option<(u64, &[u8])>,
        last: &ServerMsg,
    ) -> Result<(), End> {
        self.writer
            .send_read(seq, data, last)
            .map_err(|e| End::from_transport(e, self.shared.stopping()))
    }

    /// Starts the data of read `seq`, `len` bytes, striped over the data lanes if the client
    /// takes reads that way and this one is large enough: announces it and returns how it goes
    /// out ([`Session::deal_read`], then [`Session::finish_striped_read`]). `None`: the data
    /// follows `Data` frames on the connection as usual.
    pub(crate) fn start_striped_read(
        &mut self,
        seq: u64,
        len: u64,
    ) -> Result<Option<StripedOut>, End> {
        let count = self.read_lanes;
        if count == 0 || len < rgpu_protocol::STRIPE_MIN {
            return Ok(None);
        }
        let Some(lanes) = self.lanes.as_mut() else {
            return Ok(None);
        };
        if let Err(why) = lanes.senders(count) {
            log::warn!("session {}: reads go unstriped: {why}", self.id);
            self.read_lanes = 0;
            return Ok(None);
        }
        self.writer
            .send_striped(&ServerMsg::Data { offset: 0 }, seq, len, count)
            .map_err(|e| End::from_transport(e, self.shared.stopping()))?;
        Ok(Some(StripedOut::new(len, count)))
    }

    /// Hands the next `bytes` of a striped read to the lanes' sending threads; the countdown
    /// finishes once they are written.
    ///
    /// # Safety
    /// `bytes` must stay valid and unchanged until the returned countdown has finished.
    pub(crate) unsafe fn deal_read(
        &mut self,
        out: &mut StripedOut,
        bytes: &[u8],
    ) -> Result<Arc<rgpu_transport::Countdown>, End> {
        let lanes = self.lanes.as_mut().ok_or(End::Protocol(NO_LANES.into()))?;
        let senders = lanes.senders(out.count()).map_err(End::Broken)?;
        // SAFETY: passed on from the caller.
        unsafe { out.deal(senders, bytes) }.map_err(End::Broken)
    }

    /// Waits until a striped read's data is all written (what was not dealt goes as zeros).
    pub(crate) fn finish_striped_read(&mut self, out: StripedOut) -> Result<(), End> {
        let lanes = self.lanes.as_mut().ok_or(End::Protocol(NO_LANES.into()))?;
        let senders = lanes.senders(out.count()).map_err(End::Broken)?;
        out.finish(senders).map_err(End::Broken)
    }

    /// Reads the next `dst.len()` bytes of the current request's bulk.
    pub(crate) fn take_bulk(&mut self, dst: &mut [u8]) -> Result<(), End> {
        let lanes = &mut self.lanes;
        match &mut self.bulk {
            Incoming::Inline { remaining } => {
                if dst.len() as u64 > *remaining {
                    return Err(End::Protocol("a request read past its bulk".into()));
                }
                self.reader
                    .read_bulk(dst)
                    .map_err(|e| End::from_transport(e, self.shared.stopping()))?;
                *remaining -= dst.len() as u64;
                Ok(())
            }
            Incoming::Striped(striped) => {
                let lanes = lanes.as_mut().ok_or(End::Protocol(NO_LANES.into()))?;
                striped.read(lanes, dst).map_err(End::Broken)
            }
            Incoming::InRing { remaining } => {
                if dst.len() as u64 > *remaining {
                    return Err(End::Protocol("a request read past its bulk".into()));
                }
                *remaining -= dst.len() as u64;
                let len = dst.len();
                take_from_ring(&mut self.ring, &self.stream, Some(dst), len)
            }
            Incoming::InSegment { at, remaining, .. } => {
                if dst.len() as u64 > *remaining {
                    return Err(End::Protocol("a request read past its bulk".into()));
                }
                // SAFETY: [at, at + remaining) lies inside a segment this session maps.
                unsafe { std::ptr::copy_nonoverlapping(*at, dst.as_mut_ptr(), dst.len()) };
                // SAFETY: as above; at most `remaining` bytes on.
                *at = unsafe { at.add(dst.len()) };
                *remaining -= dst.len() as u64;
                Ok(())
            }
        }
    }

    /// Reads the request's bulk, `len` bytes of at most `max`, into `dst` (reused: no
    /// allocation once it has grown).
    pub(crate) fn take_bulk_into(
        &mut self,
        dst: &mut Vec<u8>,
        len: u64,
        max: u64,
    ) -> Result<(), End> {
        if len > max {
            return Err(End::Protocol(format!(
                "{len} bytes of bulk, at most {max} expected"
            )));
        }
        dst.resize(len as usize, 0);
        self.take_bulk(dst)
    }

    /// Reads and drops the next `len` bytes of the current request's bulk.
    pub(crate) fn skip_bulk(&mut self, len: u64) -> Result<(), End> {
        let lanes = &mut self.lanes;
        match &mut self.bulk {
            Incoming::Inline { remaining } => {
                let len = len.min(*remaining);
                *remaining -= len;
                self.reader
                    .skip_bulk(len)
                    .map_err(|e| End::from_transport(e, self.shared.stopping()))
            }
            Incoming::Striped(striped) => {
                let lanes = lanes.as_mut().ok_or(End::Protocol(NO_LANES.into()))?;
                striped.skip(lanes, len).map_err(End::Broken)
            }
            Incoming::InRing { remaining } => {
                let len = len.min(*remaining);
                *remaining -= len;
                take_from_ring(&mut self.ring, &self.stream, None, len as usize)
            }
            Incoming::InSegment { at, remaining, .. } => {
                let len = len.min(*remaining);
                // SAFETY: [at, at + remaining) lies inside a segment this session maps.
                *at = unsafe { at.add(len as usize) };
                *remaining -= len;
                Ok(())
            }
        }
    }

    /// Reads and drops the rest of the current request's bulk (a request that fails still
    /// consumes it).
    pub(crate) fn drop_bulk(&mut self) -> Result<(), End> {
        let left = self.bulk.remaining();
        self.skip_bulk(left)
    }

    pub(crate) fn reply(&self, seq: u64, reply: ClReply) -> Result<(), End> {
        self.send(&ServerMsg::Cl(reply), seq, &[])
    }

    /// Records the failure of a request that has no reply; the client hears of it at its next
    /// synchronizing request.
    pub(crate) fn defer(&mut self, what: &str, error: i32) {
        log::debug!(
            "session {}: {what} failed: {} ({error}); deferred",
            self.id,
            error_name(error)
        );
        crate::flight::failed("opencl", error.into());
        self.cl.deferred.get_or_insert(error);
    }

    /// Gives back everything the session created, once its in-flight work is done. Returns
    /// how many objects the client had left.
    fn close(mut self, clean: bool) -> usize {
        if !clean {
            // Nobody reads replies any more; failing sends fast lets the drain below finish.
            self.stream.shutdown();
        }
        self.cl.finish_work(self.id);
        self.stream.shutdown();
        let mut count = self.cl.handles.count();
        if let Some(mut cuda) = self.cuda.take() {
            count += cuda.close();
        }
        self.cl.release_all();
        self.remove_includes();
        count
    }
}

/// Takes `len` bytes of a request's bulk out of the shared-memory ring into `dst` (`None`:
/// drops them), waiting for the client to put them there.
fn take_from_ring(
    ring: &mut Option<rgpu_transport::shared_ring::RingConsumer>,
    stream: &Stream,
    dst: Option<&mut [u8]>,
    len: usize,
) -> Result<(), End> {
    let ring = ring.as_mut().ok_or(End::Protocol(NO_RING.into()))?;
    let still_there = || stream.peer_still_there();
    ring.read(dst, len, RING_PATIENCE, &still_there)
        .map_err(|e| End::Broken(format!("shared-memory ring: {e}")))?;
    crate::flight::shared_received(len as u64);
    Ok(())
}

/// What every OpenCL group's methods share (the groups are implemented in crate::opencl).
impl opencl::serve::Server for Session {
    type End = End;

    fn reply(&mut self, seq: u64, reply: ClReply) -> Result<(), End> {
        Session::reply(self, seq, reply)
    }

    fn defer(&mut self, message: &'static str, status: i32) {
        Session::defer(self, message, status);
    }

    fn unexpected_bulk(&mut self, message: &'static str, bulk_len: u64) -> End {
        End::Protocol(format!(
            "{bulk_len} bytes of bulk data with {message}, which takes none"
        ))
    }
}

/// The session's own messages.
impl session::serve::Server for Session {
    type End = End;

    fn reply(&mut self, seq: u64, reply: SessionReply) -> Result<(), End> {
        self.send(&ServerMsg::Session(reply), seq, &[])
    }

    fn defer(&mut self, message: &'static str, status: session::Status) {
        log::debug!("session {}: {message} failed: {status}", self.id);
    }

    fn unexpected_bulk(&mut self, message: &'static str, bulk_len: u64) -> End {
        End::Protocol(format!(
            "{bulk_len} bytes of bulk data with {message}, which takes none"
        ))
    }
}

impl session::serve::Control for Session {
    fn ping(&mut self) {}
}

impl session::serve::Tracing for Session {
    fn time_replies(&mut self, on: bool) -> Result<(), session::Status> {
        self.time_replies = on;
        Ok(())
    }

    fn get_counters(&mut self) -> Result<session::SessionCounters, session::Status> {
        // 1: not kept per session (sessions on threads of one process).
        crate::flight::session_stats()
            .map(|stats| stats.counters())
            .ok_or(1)
    }
}

impl session::serve::Operation for Session {
    fn move_sessions(&mut self, to: String, wait_ms: u32) -> Result<(u32, u32), session::Status> {
        // The server's operator: a process on this host of the listener's user, or root.
        let uid = self.stream.peer_uid();
        let operator = uid.is_some_and(|uid| uid == 0 || Some(uid) == self.shared.operator_uid);
        if !operator {
            log::warn!(
                "session {}: a move order from user {uid:?}, not the server's operator; refused",
                self.id
            );
            return Err(1);
        }
        if rgpu_transport::Endpoint::parse(&to).is_err() {
            return Err(2);
        }
        log::info!(
            "session {}: the operator moves every session to {to}",
            self.id
        );
        let wait = std::time::Duration::from_millis(u64::from(wait_ms));
        let (told, moved) = match self.shared.move_relay.get() {
            Some(relay) => relay(&to, wait).map_err(|e| {
                log::warn!("session {}: move order not passed on: {e}", self.id);
                3u32
            })?,
            None => self.shared.move_sessions(self.id, &to, wait),
        };
        log::info!(
            "session {}: {moved} of {told} sessions told to move to {to} have left",
            self.id
        );
        Ok((told, moved))
    }
}

impl session::serve::SameHost for Session {
    fn local_route(&mut self) -> Result<String, session::Status> {
        self.shared.local_socket.clone().ok_or(1)
    }
}

impl session::serve::Lanes for Session {
    fn read_lanes(&mut self, lanes: u32) -> Result<(), session::Status> {
        if lanes > rgpu_protocol::MAX_LANES {
            return Err(1);
        }
        self.read_lanes = lanes;
        Ok(())
    }

    fn attach_shared(&mut self, ring_len: u64) -> Result<(), session::Status> {
        // 1: no descriptor came with the request (not a Unix socket); 2: already attached;
        // 3: the region is not one rgpu makes.
        let fd = self.reader.get_mut().take_fd().ok_or(1u32)?;
        if self.ring.is_some() {
            return Err(2);
        }
        let region =
            rgpu_transport::shared_ring::SharedRegion::adopt(fd, ring_len).map_err(|e| {
                log::warn!("session {}: shared memory refused: {e}", self.id);
                3u32
            })?;
        let (to_client, from_client) = region.ends(false);
        self.ring = Some(from_client);
        self.writer.attach_ring(to_client);
        log::info!(
            "session {}: shared memory attached (two rings of {} MiB)",
            self.id,
            ring_len >> 20
        );
        Ok(())
    }

    fn attach_host_memory(&mut self, segment: u64, len: u64) -> Result<(), session::Status> {
        // 1: no descriptor came with the request; 2: the name is taken, or too many;
        // 3: the memory is not what rgpu makes.
        let fd = self.reader.get_mut().take_fd().ok_or(1u32)?;
        let shared: u64 = self.segments.values().map(|r| r.len() as u64).sum();
        if self.ring.is_none()
            || self.segments.contains_key(&segment)
            || self.segments.len() >= MAX_SEGMENTS
            || shared.saturating_add(len) > max_shared_host_bytes()
        {
            return Err(2);
        }
        let region = SharedRegion::adopt_plain(fd, len).map_err(|e| {
            log::warn!("session {}: shared host memory refused: {e}", self.id);
            3u32
        })?;
        self.segments.insert(segment, region);
        Ok(())
    }

    fn detach_host_memory(&mut self, segment: u64) -> Result<(), session::Status> {
        let region = self.segments.remove(&segment).ok_or(1u32)?;
        // A device still copying from or into it finishes first.
        if let Some(cuda) = self.cuda.as_mut() {
            cuda.forget_host_memory(region.base(), region.len());
        }
        Ok(())
    }
}
