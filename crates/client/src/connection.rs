//! One authenticated session with one server, shared by every thread of the program (through
//! the [`Connection`](crate::Connection) that holds it, and that may move to another session).
//!
//! Requests without a reply are only queued in the write buffer ([`Connection::post`]) and go
//! out in one system call with the next request that waits ([`Connection::call`]) or at
//! [`Connection::flush`]. A reader thread matches replies to waiting callers by seq, streams read
//! data straight into its destination, and forwards event notifications.
//!
//! A watchdog thread checks that the server answers: once the client has sent something or
//! waits for something, a frame from the server must come within the liveness time
//! (`RGPU_LIVENESS_TIMEOUT`); after a third of it the watchdog asks (a `Ping`), and a server
//! busy with a long request says so every second (`ServerMsg::Working`). A path that keeps TCP
//! alive but delivers nothing, or a hung server process, then breaks the connection: every
//! call fails with the API's error instead of "succeeding" into the void or waiting forever.
//! The same thread answers the server's `Heartbeat` (it asks a client that has been silent):
//! the server closes the session of a client that stops answering.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rgpu_protocol::opencl::Id;
use rgpu_protocol::session::SessionClient;
use rgpu_protocol::{
    decode_body, ClientMsg, FrameHeader, LaneKey, ServerMsg, IN_RING, MAX_LANES, RING_MIN,
    STRIPE_MIN,
};
use rgpu_transport::shared_ring::{RingConsumer, RingProducer, SharedRegion};
use rgpu_transport::{
    client_handshake, Endpoint, FrameReader, FrameWriter, Introduction, ReadHalf, Stream,
    TransportError,
};

use crate::lanes::Lanes;
use crate::wait::Handoff;
use crate::ClientConfig;
use crate::ClientError;

/// Where the data of a read goes, and what happens when the read ends.
pub struct ReadSink {
    /// Start of the destination; `len` bytes must stay writable until `done` has run.
    pub dst: SendPtr,
    pub len: usize,
    /// Called once, on the reader thread, with the read's final status (or the failure).
    pub done: Box<dyn FnOnce(Result<i32, ClientError>) + Send>,
}

/// A raw destination pointer handed to the reader thread. The front end guarantees the memory
/// outlives the read (the OpenCL contract for a host pointer of a pending read).
#[derive(Clone, Copy, Debug)]
pub struct SendPtr(pub *mut u8);
// SAFETY: the pointer is only written by the reader thread while the read is pending, and the
// owner does not touch the memory until the read's completion (OpenCL read semantics).
unsafe impl Send for SendPtr {}

enum Pending {
    Waiter(Arc<Slot>),
    Read(ReadSink),
}

type Slot = Handoff<Result<ServerMsg, ClientError>>;

type EventListener = Box<dyn Fn(Id, i32) + Send + Sync>;
/// What the client library does when the server asks it to move (`MoveTo`); called on the
/// reader thread, so it must only hand the move to a thread of its own.
type MoveListener = Box<dyn Fn(String) + Send + Sync>;

struct Shared {
    pending: Mutex<HashMap<u64, Pending>>,
    /// Why the connection can no longer be used, once it cannot.
    broken: Mutex<Option<String>>,
    event_listener: OnceLock<EventListener>,
    move_listener: OnceLock<MoveListener>,
    /// The data lanes, once asked for (`None` inside: none could be opened).
    lanes: OnceLock<Option<Lanes>>,
    /// How long a striped read's lanes may take to deliver it.
    reply_timeout: Duration,
    /// What the liveness watchdog counts from (all its times are milliseconds since, plus 1).
    epoch: Instant,
    /// Since when the client has been owed a frame (it sent something, or waits for a reply)
    /// with none heard since; 0: nothing owed.
    owed_since: AtomicU64,
    /// When the watchdog last asked the server for a sign of life.
    pinged_at: AtomicU64,
    /// The server asked for a sign of life (`Heartbeat`) and the watchdog has yet to answer;
    /// the reader thread wakes the watchdog with `heartbeat_asked`.
    heartbeat_owed: Mutex<bool>,
    heartbeat_asked: Condvar,
    /// The server's time on requests whose replies are still to be taken (`Timing` frames,
    /// asked for when tracing), by seq.
    server_times: Mutex<HashMap<u64, u32>>,
    /// CUDA events the server said completed, with the synchronization they came before
    /// (`CuEventsDone`), by that request's seq, until its waiter takes its reply.
    done_records: Mutex<HashMap<u64, Vec<(Id, u64)>>>,
    /// The receiving end of the shared-memory ring (a server on this host), read by the
    /// reader thread for data frames that say their bytes are in it.
    ring_in: OnceLock<Mutex<RingConsumer>>,
}

thread_local! {
    /// The `CuEventsDone` that came with this thread's latest reply ([`take_done_records`]).
    static DONE_RECORDS: std::cell::RefCell<Vec<(Id, u64)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The CUDA events (id, record generation) the server said completed before the reply this
/// thread took last (empty unless that reply was a successful synchronization that had some).
pub fn take_done_records() -> Vec<(Id, u64)> {
    // (Calls made while the process exits, after this thread's locals are gone, learn nothing.)
    DONE_RECORDS
        .try_with(|d| std::mem::take(&mut *d.borrow_mut()))
        .unwrap_or_default()
}

impl Shared {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Something went to the server (or is awaited from it): a frame is owed from now on,
    /// unless one already was.
    fn owe(&self) {
        let now = self.now();
        let _ = self
            .owed_since
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire);
    }

    /// A frame came from the server.
    fn heard(&self) {
        self.owed_since.store(0, Ordering::Release);
    }

    fn lanes(&self) -> Option<&Lanes> {
        self.lanes.get().and_then(Option::as_ref)
    }

    fn break_with(&self, why: String) {
        {
            let mut broken = self.broken.lock().unwrap();
            if broken.is_none() {
                *broken = Some(why.clone());
            }
        }
        let drained: Vec<Pending> = self
            .pending
            .lock()
            .unwrap()
            .drain()
            .map(|(_, p)| p)
            .collect();
        for pending in drained {
            let err = ClientError::Broken(why.clone());
            match pending {
                Pending::Waiter(slot) => slot.fill(Err(err)),
                Pending::Read(sink) => (sink.done)(Err(err)),
            }
        }
    }

    fn check(&self) -> Result<(), ClientError> {
        // In a forked child the connection is the parent's; the lock may even be held by a
        // parent thread that does not exist here.
        if rgpu_transport::fork::forked() {
            return Err(ClientError::Broken(rgpu_transport::fork::FORKED.into()));
        }
        match &*self.broken.lock().unwrap() {
            Some(why) => Err(ClientError::Broken(why.clone())),
            None => Ok(()),
        }
    }
}

/// A session with a server: its socket, reader thread, lanes and shared memory.
pub struct ServerSession {
    /// The server as the program named it (what keys it everywhere).
    endpoint: Endpoint,
    /// Where the connection and its lanes go: `endpoint`, or its same-host socket.
    route: Endpoint,
    server_name: String,
    session_id: u64,
    writer: Mutex<FrameWriter<Stream>>,
    shared: Arc<Shared>,
    next_seq: AtomicU64,
    next_id: AtomicU64,
    control: Stream,
    reply_timeout: Duration,
    _reader: JoinHandle<()>,
    /// Set once background flushing is on ([`Connection::flush_in_background`]).
    flush_signal: OnceLock<Arc<FlushSignal>>,
    /// What opening data lanes later takes.
    /// How lanes connect: as the connection did.
    config: ClientConfig,
    client_name: String,
    lane_key: LaneKey,
    /// Whether the server was asked to stripe large reads over the lanes (`ReadLanes`), once
    /// decided: at the first large read.
    striped_reads: OnceLock<bool>,
    /// The sending end of the shared-memory ring, once attached (locked after `writer`, so
    /// that frames and ring bytes keep one order).
    ring_out: OnceLock<Mutex<RingProducer>>,
    /// Page-locked host memory shared with the server (`share_host_memory`), by start address:
    /// (its name on the wire, the mapping).
    segments: Mutex<std::collections::BTreeMap<usize, (u64, Arc<SharedRegion>)>>,
    next_segment: AtomicU64,
}

/// Wakes the flusher thread when posted requests wait in the write buffer.
#[derive(Default)]
struct FlushSignal {
    dirty: Mutex<bool>,
    wake: Condvar,
}

impl ServerSession {
    /// Connects, checks the protocol version and authenticates.
    /// (`config.servers` is not used: `endpoint` is the server.) A TCP server on this host
    /// is asked for its same-host socket, and the session taken there instead, where shared
    /// memory works (`RGPU_SAME_HOST=off` or `RGPU_SHARED_MEMORY=off`: not).
    pub fn connect(
        endpoint: &Endpoint,
        config: &ClientConfig,
    ) -> Result<Arc<ServerSession>, ClientError> {
        let connection = ServerSession::open(endpoint, endpoint, config)?;
        let Some(route) = connection.same_host_route() else {
            return Ok(connection);
        };
        match ServerSession::open(endpoint, &route, config) {
            Ok(local) => {
                log::debug!("{endpoint} is on this host: the session goes through {route}");
                Ok(local)
            }
            Err(e) => {
                log::debug!("{endpoint}: its same-host socket {route} failed ({e}); TCP it is");
                Ok(connection)
            }
        }
    }

    /// The server's same-host socket, where this is a TCP connection to a server on this
    /// host (its address is ours: the kernel's choice for a local destination) that has one,
    /// and the connection would use shared memory there (not under an emulated link either,
    /// whose point is the network).
    fn same_host_route(&self) -> Option<Endpoint> {
        let on_this_host = match (self.control.local_ip(), self.control.peer_ip()) {
            (Some(ours), Some(theirs)) => ours == theirs || theirs.is_loopback(),
            _ => false,
        };
        if self.route.is_unix()
            || !on_this_host
            || !crate::same_host_from_env()
            || crate::shared_ring_from_env().is_none()
            || rgpu_transport::link::from_env().is_some()
        {
            return None;
        }
        let Ok(Ok(name)) = self.session().local_route() else {
            return None;
        };
        let route = Endpoint::parse(&format!("unix:{name}")).ok()?;
        route.is_unix().then_some(route)
    }

    /// Connects to `route` (the server `endpoint`, or its same-host socket).
    fn open(
        endpoint: &Endpoint,
        route: &Endpoint,
        config: &ClientConfig,
    ) -> Result<Arc<ServerSession>, ClientError> {
        let reply_timeout = config.reply_timeout;
        let stream = Stream::connect(route, config.connect_timeout)
            .map_err(|e| ClientError::Connect(format!("{endpoint}: {e}")))?;
        crate::bound_waits(&stream, reply_timeout)
            .map_err(|e| ClientError::Connect(format!("{endpoint}: {e}")))?;
        let client_name = client_name();
        let (stream, welcome) = client_handshake(
            stream,
            &config.tls,
            route,
            config.token.as_ref(),
            Introduction {
                name: &client_name,
                application: &crate::application_from_env(),
                wait: crate::exclusive_wait_from_env(),
            },
            None,
        )
        .map_err(|e| match e {
            TransportError::Auth(why) => ClientError::Connect(format!("{endpoint}: {why}")),
            other => ClientError::Connect(format!("{endpoint}: {other}")),
        })?;
        let shared = Arc::new(Shared {
            pending: Mutex::new(HashMap::new()),
            broken: Mutex::new(None),
            event_listener: OnceLock::new(),
            move_listener: OnceLock::new(),
            lanes: OnceLock::new(),
            reply_timeout,
            epoch: Instant::now(),
            owed_since: AtomicU64::new(0),
            pinged_at: AtomicU64::new(0),
            heartbeat_owed: Mutex::new(false),
            heartbeat_asked: Condvar::new(),
            server_times: Mutex::new(HashMap::new()),
            done_records: Mutex::new(HashMap::new()),
            ring_in: OnceLock::new(),
        });
        // Read directly by the reader thread, also in TLS (no read-ahead thread: small replies
        // must not wait for a thread hand-over).
        let reader_stream = ReadHalf::Direct(stream.try_clone().map_err(ClientError::io)?);
        let writer_stream = stream.try_clone().map_err(ClientError::io)?;
        let reader_shared = Arc::clone(&shared);
        let name = format!("rgpu-reader {endpoint}");
        let reader = std::thread::Builder::new()
            .name(name)
            .spawn({
                let endpoint = endpoint.clone();
                move || reader_loop(FrameReader::new(reader_stream), reader_shared, endpoint)
            })
            .map_err(ClientError::io)?;
        log::debug!(
            "connected to {} ({endpoint}), session {}",
            welcome.server_name,
            welcome.session_id
        );
        let connection = Arc::new(ServerSession {
            endpoint: endpoint.clone(),
            route: route.clone(),
            server_name: welcome.server_name,
            session_id: welcome.session_id,
            writer: Mutex::new(FrameWriter::new(writer_stream)),
            shared,
            next_seq: AtomicU64::new(1),
            next_id: AtomicU64::new(1),
            control: stream,
            reply_timeout,
            _reader: reader,
            flush_signal: OnceLock::new(),
            config: config.clone(),
            client_name,
            lane_key: welcome.lane_key,
            striped_reads: OnceLock::new(),
            ring_out: OnceLock::new(),
            segments: Mutex::new(Default::default()),
            next_segment: AtomicU64::new(1),
        });
        if let (true, Some(ring_len)) = (route.is_unix(), crate::shared_ring_from_env()) {
            connection.attach_shared(ring_len);
        }
        let watched = Arc::downgrade(&connection);
        let spawned = std::thread::Builder::new()
            .name(format!("rgpu-alive {endpoint}"))
            // At least 3 s: a busy server says so every second.
            .spawn(move || {
                liveness_loop(
                    watched,
                    crate::liveness_timeout_from_env().max(MIN_LIVENESS),
                )
            });
        if let Err(e) = spawned {
            log::warn!("{endpoint}: no liveness watchdog: {e}");
        }
        if crate::trace::tracing_to_file() {
            // The call trace records the server's time on each waited request.
            let _ = connection.session().time_replies(true);
            crate::trace::session_opened(&connection);
        }
        Ok(connection)
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    pub fn server_name(&self) -> &str {
        &self.server_name
    }

    pub fn session_id(&self) -> u64 {
        self.session_id
    }

    /// A fresh id for an object this client creates on the server.
    pub fn new_id(&self) -> Id {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The id [`ServerSession::new_id`] gives next.
    pub fn peek_next_id(&self) -> Id {
        self.next_id.load(Ordering::Relaxed)
    }

    /// Gives ids from `next` on (or from where they are, if further).
    pub fn continue_ids_from(&self, next: Id) {
        self.next_id.fetch_max(next, Ordering::Relaxed);
    }

    /// Installs the function that receives `EventStatus` notifications (once per connection).
    pub fn set_event_listener(&self, listener: impl Fn(Id, i32) + Send + Sync + 'static) {
        let _ = self.shared.event_listener.set(Box::new(listener));
    }

    /// Installs what runs when the server asks the client to move (once per session).
    pub fn set_move_listener(&self, listener: impl Fn(String) + Send + Sync + 'static) {
        let _ = self.shared.move_listener.set(Box::new(listener));
    }

    fn next_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Queues a request that has no reply; it leaves with the next flush. Bulk of
    /// [`STRIPE_MIN`] bytes or more goes striped over the data lanes (opened at the first such
    /// request; `RGPU_LANES`), the request and everything before it leaving first.
    pub fn post(&self, msg: &ClientMsg, bulk: &[u8]) -> Result<(), ClientError> {
        debug_assert!(!msg.expects_reply(), "post() of a request with a reply");
        crate::trace::posted(bulk.len());
        self.shared.check()?;
        if bulk.len() as u64 >= RING_MIN && self.has_ring() {
            let seq = self.next_seq();
            return self.send_in_ring(msg, seq, bulk);
        }
        if bulk.len() as u64 >= STRIPE_MIN && self.lanes_for_bulk() > 0 {
            return self.post_striped(msg, bulk);
        }
        self.shared.check()?;
        let seq = self.next_seq();
        let mut writer = self.writer.lock().unwrap();
        writer.queue(msg, seq, bulk).map_err(|e| self.fail(e))?;
        drop(writer);
        self.shared.owe();
        self.wake_flusher();
        Ok(())
    }

    /// Tells the flusher thread (when there is one) that posted requests wait.
    fn wake_flusher(&self) {
        if let Some(signal) = self.flush_signal.get() {
            let mut dirty = signal.dirty.lock().unwrap();
            if !*dirty {
                *dirty = true;
                signal.wake.notify_one();
            }
        }
    }

    /// From now on posted requests leave without waiting for the next call: a flusher thread
    /// sends whatever is buffered as soon as it wakes, so the device starts on posted work
    /// while the program keeps posting, and the posts that pile up meanwhile share one write.
    pub fn flush_in_background(self: &Arc<Self>) {
        let signal = Arc::new(FlushSignal::default());
        if self.flush_signal.set(signal.clone()).is_err() {
            return;
        }
        let connection = Arc::downgrade(self);
        let name = format!("rgpu-flusher {}", self.endpoint);
        let spawned = std::thread::Builder::new()
            .name(name)
            .spawn(move || flusher_loop(connection, signal));
        if let Err(e) = spawned {
            log::warn!("no background flushing: {e}");
        }
    }

    /// Sends everything queued.
    pub fn flush(&self) -> Result<(), ClientError> {
        self.shared.check()?;
        let mut writer = self.writer.lock().unwrap();
        writer.flush().map_err(|e| self.fail(e))
    }

    /// Sends a request (and everything queued before it) and waits for its reply.
    pub fn call(&self, msg: &ClientMsg, bulk: &[u8]) -> Result<ServerMsg, ClientError> {
        self.round_trip(msg, bulk.len(), |seq| self.send_now(msg, seq, bulk))
    }

    /// One request the caller waits for: sent by `send` (given its seq; `sent` bytes of bulk
    /// for the trace), then its reply.
    fn round_trip(
        &self,
        msg: &ClientMsg,
        sent: usize,
        send: impl FnOnce(u64) -> Result<(), ClientError>,
    ) -> Result<ServerMsg, ClientError> {
        self.shared.check()?;
        crate::trace::sent(sent);
        let (seq, slot) = self.expect_reply();
        if let Err(e) = send(seq) {
            self.shared.pending.lock().unwrap().remove(&seq);
            return Err(e);
        }
        if !log::log_enabled!(log::Level::Trace) {
            return self.wait(seq, &slot);
        }
        // RGPU_LOG=rgpu_client=trace: every round trip the program waits for, how long, and
        // on which of its threads (the training thread's waits cost, a watchdog's may not).
        let start = std::time::Instant::now();
        let reply = self.wait(seq, &slot);
        let thread = std::thread::current().id();
        log::trace!("round trip {} {:?} {thread:?}", msg.name(), start.elapsed());
        reply
    }

    /// Sends a read request (OpenCL or CUDA); its data will stream into `sink` and `sink.done`
    /// runs at its end with the request's final status.
    pub fn start_read(&self, req: &ClientMsg, sink: ReadSink) -> Result<(), ClientError> {
        let len = sink.len;
        self.start_read_with(sink, len, |seq| self.send_now(req, seq, &[]))
    }

    /// Registers `sink` for a read that `send` requests (given its seq; `len` bytes expected
    /// over the connection, 0 when they come through shared memory); a failure to send ends
    /// the sink at once.
    fn start_read_with(
        &self,
        sink: ReadSink,
        len: usize,
        send: impl FnOnce(u64) -> Result<(), ClientError>,
    ) -> Result<(), ClientError> {
        if let Err(e) = self.shared.check() {
            (sink.done)(Err(e.clone()));
            return Err(e);
        }
        crate::trace::reading(len);
        if len as u64 >= STRIPE_MIN {
            self.ask_for_striped_reads();
        }
        let seq = self.next_seq();
        self.shared
            .pending
            .lock()
            .unwrap()
            .insert(seq, Pending::Read(sink));
        if let Err(e) = send(seq) {
            if let Some(Pending::Read(sink)) = self.shared.pending.lock().unwrap().remove(&seq) {
                (sink.done)(Err(e.clone()));
            }
            return Err(e);
        }
        Ok(())
    }

    /// At the first large read: opens the lanes and asks the server to stripe large reads over
    /// them, where `RGPU_STRIPED_READS` says so (a posted request, so it leaves with the read).
    fn ask_for_striped_reads(&self) {
        self.striped_reads.get_or_init(|| {
            // Reads through the shared ring need no lanes.
            if !crate::striped_reads_from_env() || self.has_ring() {
                return false;
            }
            let lanes = self.lanes_for_bulk();
            lanes > 0 && self.session().read_lanes(lanes as u32).is_ok()
        });
    }

    /// The number of data lanes for striped transfers. The first call opens `want` of them
    /// (posting large bulk opens `RGPU_LANES`); if that fails, or `want` is 0, there are none,
    /// and all bulk follows its request on the connection.
    pub fn open_lanes(&self, want: usize) -> usize {
        self.lanes_opened_with(|| want)
    }

    /// The data lanes for large bulk: `RGPU_LANES` of them, opened at the first use.
    fn lanes_for_bulk(&self) -> usize {
        self.lanes_opened_with(crate::lanes_from_env)
    }

    fn lanes_opened_with(&self, want: impl FnOnce() -> usize) -> usize {
        let lanes = self.shared.lanes.get_or_init(|| {
            let want = want();
            if want == 0 {
                return None;
            }
            let opened = Lanes::open(
                &self.route,
                &self.config,
                &self.client_name,
                self.session_id,
                self.lane_key,
                want.min(MAX_LANES as usize),
            );
            match opened {
                Ok(lanes) => {
                    log::debug!("{} data lanes to {}", lanes.count(), self.endpoint);
                    Some(lanes)
                }
                Err(e) => {
                    log::warn!("rgpu: no data lanes ({e}); large transfers use one connection");
                    None
                }
            }
        });
        lanes.as_ref().map_or(0, Lanes::count)
    }

    /// Queues a request whose bulk `data` goes striped over the data lanes and returns once
    /// all of it is in the sockets. The request and everything queued before it leave first.
    fn post_striped(&self, msg: &ClientMsg, data: &[u8]) -> Result<(), ClientError> {
        let Some(lanes) = self.shared.lanes() else {
            return Err(ClientError::Protocol(
                "a striped transfer without data lanes".into(),
            ));
        };
        self.shared.check()?;
        let turn = lanes.turn();
        let seq = self.next_seq();
        {
            let mut writer = self.writer.lock().unwrap();
            let count = lanes.count() as u32;
            writer
                .queue_striped(msg, seq, data.len() as u64, count)
                .and_then(|()| writer.flush())
                .map_err(|e| self.fail(e))?;
        }
        lanes
            .send(&turn, data, self.reply_timeout)
            .map_err(|why| self.break_off(why))
    }

    /// Round trip time of an empty request.
    pub fn ping(&self) -> Result<Duration, ClientError> {
        let start = Instant::now();
        self.session().ping()?;
        Ok(start.elapsed())
    }

    /// Whether large bulk goes through a shared-memory ring.
    fn has_ring(&self) -> bool {
        self.ring_out.get().is_some()
    }

    /// Attaches a shared-memory region to the session (the server is on this host): its
    /// descriptor goes with the `AttachShared` frame. Without it (refused, or it cannot be
    /// made) all bytes keep crossing the socket.
    fn attach_shared(&self, ring_len: u64) {
        let attached = SharedRegion::create(ring_len)
            .map_err(|e| e.to_string())
            .and_then(|region| {
                let (out, back) = region.ends(true);
                let _ = self.shared.ring_in.set(Mutex::new(back));
                let request =
                    ClientMsg::Session(rgpu_protocol::session::SessionRequest::AttachShared {
                        ring_len,
                    });
                let (seq, slot) = self.expect_reply();
                let sent = self.send_with_fd(&request, seq, region.raw_fd());
                if let Err(e) = sent {
                    self.shared.pending.lock().unwrap().remove(&seq);
                    return Err(e.to_string());
                }
                match self.wait(seq, &slot) {
                    Ok(ServerMsg::Session(rgpu_protocol::session::SessionReply::AttachShared(
                        Ok(()),
                    ))) => {
                        let _ = self.ring_out.set(Mutex::new(out));
                        Ok(())
                    }
                    Ok(other) => Err(format!("refused ({other:?})")),
                    Err(e) => Err(e.to_string()),
                }
            });
        match attached {
            Ok(()) => log::debug!("{}: bulk data through shared memory", self.endpoint),
            Err(why) => log::debug!("{}: no shared memory: {why}", self.endpoint),
        }
    }

    /// `len` bytes of host memory shared with the server (which is on this host: the
    /// connection has shared-memory rings), for the program's page-locked allocations: copies
    /// from and into it run in place on the server ([`Connection::post_in_place`],
    /// [`Connection::start_read_in_place`]). `None`: no shared memory here, or it failed.
    pub fn share_host_memory(&self, len: usize) -> Option<*mut u8> {
        if !self.has_ring() {
            return None;
        }
        let len = len.max(1).next_multiple_of(4096);
        let region = SharedRegion::create_plain(len)
            .map_err(|e| log::debug!("no shared host memory: {e}"))
            .ok()?;
        let segment = self.next_segment.fetch_add(1, Ordering::Relaxed);
        let request =
            ClientMsg::Session(rgpu_protocol::session::SessionRequest::AttachHostMemory {
                segment,
                len: len as u64,
            });
        let (seq, slot) = self.expect_reply();
        if self.send_with_fd(&request, seq, region.raw_fd()).is_err() {
            self.shared.pending.lock().unwrap().remove(&seq);
            return None;
        }
        match self.wait(seq, &slot) {
            Ok(ServerMsg::Session(rgpu_protocol::session::SessionReply::AttachHostMemory(Ok(
                (),
            )))) => {}
            other => {
                log::debug!("shared host memory refused: {other:?}");
                return None;
            }
        }
        let base = region.base();
        self.segments
            .lock()
            .unwrap()
            .insert(base as usize, (segment, region));
        Some(base)
    }

    /// Whether any host memory is shared with the server now.
    pub fn shares_host_memory(&self) -> bool {
        !self.segments.lock().unwrap().is_empty()
    }

    /// Lets go of memory from [`Connection::share_host_memory`] (false: not from there).
    pub fn unshare_host_memory(&self, base: *mut u8) -> bool {
        let Some((segment, _region)) = self.segments.lock().unwrap().remove(&(base as usize))
        else {
            return false;
        };
        let request =
            ClientMsg::Session(rgpu_protocol::session::SessionRequest::DetachHostMemory {
                segment,
            });
        let _ = self.post(&request, &[]);
        true
    }

    /// Where `[at, at + len)` lies in shared host memory, if it does.
    fn span_of(&self, at: *const u8, len: usize) -> Option<rgpu_protocol::SegmentSpan> {
        let at = at as usize;
        let segments = self.segments.lock().unwrap();
        let (&base, (segment, region)) = segments.range(..=at).next_back()?;
        let offset = at - base;
        (offset + len <= region.len()).then_some(rgpu_protocol::SegmentSpan {
            segment: *segment,
            offset: offset as u64,
            len: len as u64,
        })
    }

    /// Posts a request whose bulk the server may take in place when it lies in shared host
    /// memory (an asynchronous copy from page-locked memory: the program leaves it alone until
    /// it synchronizes); otherwise as [`Connection::post`] does.
    pub fn post_in_place(&self, msg: &ClientMsg, bulk: &[u8]) -> Result<(), ClientError> {
        let Some(span) = self.span_of(bulk.as_ptr(), bulk.len()) else {
            return self.post(msg, bulk);
        };
        crate::trace::posted(0);
        self.shared.check()?;
        let seq = self.next_seq();
        self.send_span(msg, seq, rgpu_protocol::IN_SEGMENT, span, false)
    }

    /// Sends a request whose bulk lies in shared host memory as the span it names (the server
    /// takes the bytes, or the memory itself, in place) and waits for its reply; bulk elsewhere
    /// goes as [`Connection::call`] sends it.
    pub fn call_in_place(&self, msg: &ClientMsg, bulk: &[u8]) -> Result<ServerMsg, ClientError> {
        let Some(span) = self.span_of(bulk.as_ptr(), bulk.len()) else {
            return self.call(msg, bulk);
        };
        let how = rgpu_protocol::IN_SEGMENT;
        self.round_trip(msg, 0, |seq| self.send_span(msg, seq, how, span, true))
    }

    /// Starts a read whose data the server may put in place when `sink` lies in shared host
    /// memory (an asynchronous copy into page-locked memory); otherwise as
    /// [`Connection::start_read`] does.
    pub fn start_read_in_place(&self, req: &ClientMsg, sink: ReadSink) -> Result<(), ClientError> {
        let Some(span) = self.span_of(sink.dst.0, sink.len) else {
            return self.start_read(req, sink);
        };
        let how = rgpu_protocol::INTO_SEGMENT;
        self.start_read_with(sink, 0, |seq| self.send_span(req, seq, how, span, true))
    }

    /// Queues `msg` with the span of shared host memory it names (`how`: IN_SEGMENT or
    /// INTO_SEGMENT), flushed when `now`.
    fn send_span(
        &self,
        msg: &ClientMsg,
        seq: u64,
        how: u32,
        span: rgpu_protocol::SegmentSpan,
        now: bool,
    ) -> Result<(), ClientError> {
        self.shared.owe();
        let mut writer = self.writer.lock().unwrap();
        let record = span.encode();
        writer
            .queue_striped(msg, seq, record.len() as u64, how)
            .and_then(|()| writer.write_bulk(&record))
            .and_then(|()| if now { writer.flush() } else { Ok(()) })
            .map_err(|e| self.fail(e))?;
        drop(writer);
        if !now {
            self.wake_flusher();
        }
        Ok(())
    }

    /// Sends `msg` (no bulk) with descriptor `fd` attached, after everything queued.
    fn send_with_fd(
        &self,
        msg: &ClientMsg,
        seq: u64,
        fd: std::os::fd::RawFd,
    ) -> Result<(), ClientError> {
        self.shared.owe();
        let mut writer = self.writer.lock().unwrap();
        writer.flush().map_err(|e| self.fail(e))?;
        let mut frame = Vec::new();
        rgpu_protocol::encode_frame(msg, seq, 0, &mut frame)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let socket = writer
            .get_ref()
            .raw_fd()
            .ok_or_else(|| ClientError::Protocol("no socket to pass a descriptor on".into()))?;
        rgpu_transport::shared_ring::send_with_fd(socket, &frame, fd)
            .map_err(|e| self.fail(e.into()))
    }

    /// Sends a request whose bulk goes through the shared-memory ring: the frame first (the
    /// server takes the bytes as they come), then the bytes, copied in as the server frees room.
    fn send_in_ring(&self, msg: &ClientMsg, seq: u64, bulk: &[u8]) -> Result<(), ClientError> {
        self.shared.owe();
        let mut writer = self.writer.lock().unwrap();
        let Some(ring) = self.ring_out.get() else {
            return Err(ClientError::Protocol("no shared-memory ring".into()));
        };
        let mut ring = ring.lock().unwrap();
        writer
            .queue_striped(msg, seq, bulk.len() as u64, IN_RING)
            .and_then(|()| writer.flush())
            .map_err(|e| self.fail(e))?;
        let still_there = || {
            self.shared
                .check()
                .map_err(|e| std::io::Error::other(e.to_string()))
        };
        ring.write(bulk, self.reply_timeout, &still_there)
            .map_err(|e| self.break_off(format!("shared-memory ring: {e}")))
    }

    fn send_now(&self, msg: &ClientMsg, seq: u64, bulk: &[u8]) -> Result<(), ClientError> {
        if bulk.len() as u64 >= RING_MIN && self.has_ring() {
            return self.send_in_ring(msg, seq, bulk);
        }
        self.shared.owe();
        let mut writer = self.writer.lock().unwrap();
        writer
            .queue(msg, seq, bulk)
            .and_then(|()| writer.flush())
            .map_err(|e| self.fail(e))
    }

    fn wait(&self, seq: u64, slot: &Slot) -> Result<ServerMsg, ClientError> {
        let reply = slot.wait(self.reply_timeout);
        let done = self.shared.done_records.lock().unwrap().remove(&seq);
        let _ = DONE_RECORDS.try_with(|d| *d.borrow_mut() = done.unwrap_or_default());
        if crate::trace::tracing_to_file() {
            if let Some(us) = self.shared.server_times.lock().unwrap().remove(&seq) {
                crate::trace::served(us);
            }
        }
        reply.unwrap_or_else(|| {
            self.shared.pending.lock().unwrap().remove(&seq);
            Err(ClientError::Timeout(format!(
                "no reply from {} within {:?}",
                self.endpoint, self.reply_timeout
            )))
        })
    }

    /// A new request's seq, and the slot its reply will fill (registered now, before the
    /// request can leave).
    fn expect_reply(&self) -> (u64, Arc<Slot>) {
        let seq = self.next_seq();
        let slot = Arc::new(Slot::default());
        self.shared
            .pending
            .lock()
            .unwrap()
            .insert(seq, Pending::Waiter(Arc::clone(&slot)));
        (seq, slot)
    }

    /// Asks the server for a sign of life without waiting for it (the reply only counts as a
    /// frame heard). Not while another thread is writing: that write may be what is stuck, and
    /// the watchdog must stay free to give the connection up.
    fn ping_in_background(&self) {
        let Ok(mut writer) = self.writer.try_lock() else {
            return;
        };
        let (seq, _nobody_waits) = self.expect_reply();
        let ping = ClientMsg::Session(rgpu_protocol::session::SessionRequest::Ping {});
        let sent = writer.queue(&ping, seq, &[]).and_then(|()| writer.flush());
        drop(writer);
        if let Err(e) = sent {
            self.fail(e);
        }
    }

    /// Tells the server the library is alive (`Alive`, its `Heartbeat`'s answer); false when
    /// another thread holds the writer (which may be stuck: the watchdog never waits for it).
    fn answer_heartbeat(&self) -> bool {
        let Ok(mut writer) = self.writer.try_lock() else {
            return false;
        };
        let sent = writer
            .queue(&ClientMsg::Alive, 0, &[])
            .and_then(|()| writer.flush());
        drop(writer);
        if let Err(e) = sent {
            self.fail(e);
        }
        true
    }

    /// A failed write makes the connection unusable: the stream position is unknown.
    fn fail(&self, e: TransportError) -> ClientError {
        self.break_off(e.to_string())
    }

    fn break_off(&self, why: String) -> ClientError {
        let why = format!("lost connection to {}: {why}", self.endpoint);
        self.control.shutdown();
        if let Some(lanes) = self.shared.lanes() {
            lanes.shutdown();
        }
        self.shared.break_with(why.clone());
        ClientError::Broken(why)
    }

    /// Whether the connection still works.
    pub fn is_alive(&self) -> bool {
        self.shared.check().is_ok()
    }
}

impl Drop for ServerSession {
    fn drop(&mut self) {
        // A forked child's copy: what is buffered is the parent's to send (and the streams
        // refuse anyway); its locks may be held by parent threads that do not exist here.
        if rgpu_transport::fork::forked() {
            return;
        }
        if let Ok(mut writer) = self.writer.lock() {
            let _ = writer.flush();
        }
        // The reader thread sees the shutdown and ends; it is not joined because the last
        // reference may be dropped on that very thread.
        self.control.shutdown();
    }
}

fn flusher_loop(connection: Weak<ServerSession>, signal: Arc<FlushSignal>) {
    loop {
        {
            let mut dirty = signal.dirty.lock().unwrap();
            while !*dirty {
                // Wakes now and then to notice a connection that went away.
                let (guard, _) = signal
                    .wake
                    .wait_timeout(dirty, Duration::from_secs(1))
                    .unwrap();
                dirty = guard;
                if connection.strong_count() == 0 {
                    return;
                }
            }
            *dirty = false;
        }
        let Some(connection) = connection.upgrade() else {
            return;
        };
        if connection.flush().is_err() {
            return;
        }
    }
}

/// The shortest liveness time the watchdog keeps (a server busy with a request says so every
/// second, crate rgpu-server's `watch::WORKING_EVERY`).
const MIN_LIVENESS: Duration = Duration::from_secs(3);

/// The connection's liveness watchdog (see the module's documentation); ends with the
/// connection.
fn liveness_loop(connection: Weak<ServerSession>, liveness: Duration) {
    let tick = (liveness / 8).clamp(Duration::from_millis(50), Duration::from_millis(500));
    let limit = liveness.as_millis() as u64;
    let Some(shared) = connection.upgrade().map(|c| c.shared.clone()) else {
        return;
    };
    loop {
        let heartbeat_owed = {
            let owed = shared.heartbeat_owed.lock().unwrap();
            let (mut owed, _) = shared
                .heartbeat_asked
                .wait_timeout_while(owed, tick, |owed| !*owed)
                .unwrap();
            std::mem::take(&mut *owed)
        };
        let Some(connection) = connection.upgrade() else {
            return;
        };
        if rgpu_transport::fork::forked() || shared.check().is_err() {
            return;
        }
        if heartbeat_owed && !connection.answer_heartbeat() {
            // Another thread is writing: answered at the next tick.
            *shared.heartbeat_owed.lock().unwrap() = true;
        }
        // A caller waiting for a reply is owed one.
        if !shared.pending.lock().unwrap().is_empty() {
            shared.owe();
        }
        let owed = shared.owed_since.load(Ordering::Acquire);
        if owed == 0 {
            continue;
        }
        let silent = shared.now().saturating_sub(owed);
        if silent >= limit {
            connection.break_off(format!(
                "no answer for {:.0} s (RGPU_LIVENESS_TIMEOUT): the server, or the path to it, \
                 has stopped delivering",
                liveness.as_secs_f64()
            ));
            return;
        }
        if silent >= limit / 3 && shared.pinged_at.load(Ordering::Acquire) < owed {
            shared.pinged_at.store(shared.now(), Ordering::Release);
            connection.ping_in_background();
        }
    }
}

fn client_name() -> String {
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "unknown".into());
    format!("{exe}[{}]", std::process::id())
}

fn reader_loop(mut reader: FrameReader<ReadHalf>, shared: Arc<Shared>, endpoint: Endpoint) {
    let why = loop {
        if let Err(e) = read_one(&mut reader, &shared) {
            break match e {
                TransportError::Closed => format!("server {endpoint} closed the connection"),
                TransportError::Io(e) if e.kind() == std::io::ErrorKind::TimedOut => format!(
                    "lost server {endpoint}: no answer for {:.0} s (RGPU_LIVENESS_TIMEOUT): the \
                     network or the server's host is down",
                    crate::liveness_timeout_from_env().as_secs_f64()
                ),
                other => format!("lost server {endpoint}: {other}"),
            };
        }
    };
    log::debug!("reader stops: {why}");
    reader.get_ref().shutdown();
    shared.break_with(why);
}

fn read_one(reader: &mut FrameReader<ReadHalf>, shared: &Shared) -> Result<(), TransportError> {
    let (header, body) = reader.read_frame()?;
    shared.heard();
    let msg: ServerMsg = decode_body(body)?;
    let seq = header.seq;
    match msg {
        // A sign of life and nothing more.
        ServerMsg::Working => reader.skip_bulk(header.bulk_len)?,
        // Answered by the watchdog thread: this one must not wait for the writer.
        ServerMsg::Heartbeat => {
            reader.skip_bulk(header.bulk_len)?;
            *shared.heartbeat_owed.lock().unwrap() = true;
            shared.heartbeat_asked.notify_one();
        }
        ServerMsg::Data { offset } => {
            let target = match shared.pending.lock().unwrap().get(&seq) {
                Some(Pending::Read(sink)) => Some((sink.dst, sink.len)),
                _ => None,
            };
            // Where the data goes: inside the pending read's destination, or nowhere (a read
            // whose caller gave up, after a timeout).
            let chunk = match target {
                Some((dst, len)) => {
                    let end = offset.checked_add(header.bulk_len);
                    if end.is_none_or(|end| end > len as u64) {
                        return Err(malformed(format!(
                            "read data at {offset}+{} exceeds the {len}-byte destination",
                            header.bulk_len
                        )));
                    }
                    // SAFETY: [dst, dst+len) is writable while the read is pending (ReadSink
                    // contract) and the range was just checked to lie inside it.
                    Some(unsafe {
                        std::slice::from_raw_parts_mut(
                            dst.0.add(offset as usize),
                            header.bulk_len as usize,
                        )
                    })
                }
                None => None,
            };
            if header.lanes == IN_RING {
                receive_from_ring(shared, &header, chunk)?;
            } else if header.lanes > 0 {
                receive_striped(shared, &header, chunk)?;
            } else if let Some(chunk) = chunk {
                reader.read_bulk(chunk)?;
            } else {
                reader.skip_bulk(header.bulk_len)?;
            }
        }
        // Comes before the reply of the same seq: kept for the thread that waits for it.
        ServerMsg::Timing { server_us } => {
            reader.skip_bulk(header.bulk_len)?;
            if matches!(
                shared.pending.lock().unwrap().get(&seq),
                Some(Pending::Waiter(_))
            ) {
                shared.server_times.lock().unwrap().insert(seq, server_us);
            }
        }
        ServerMsg::EventStatus { event, status } => {
            reader.skip_bulk(header.bulk_len)?;
            if let Some(listener) = shared.event_listener.get() {
                listener(event, status);
            }
        }
        // Comes before the reply of the same seq: kept for the thread that waits for it.
        ServerMsg::CuEventsDone {
            events,
            generations,
        } => {
            reader.skip_bulk(header.bulk_len)?;
            if matches!(
                shared.pending.lock().unwrap().get(&seq),
                Some(Pending::Waiter(_))
            ) {
                let done = events.into_iter().zip(generations).collect();
                shared.done_records.lock().unwrap().insert(seq, done);
            }
        }
        ServerMsg::EventsFinal { events, statuses } => {
            reader.skip_bulk(header.bulk_len)?;
            if let Some(listener) = shared.event_listener.get() {
                for (event, status) in events.into_iter().zip(statuses) {
                    listener(event, status);
                }
            }
        }
        ServerMsg::MoveTo { endpoint } => {
            reader.skip_bulk(header.bulk_len)?;
            match shared.move_listener.get() {
                Some(listener) => listener(endpoint),
                None => log::warn!(
                    "rgpu: the server asks this program to move to {endpoint}; this library's \
                     sessions cannot move yet (docs/migration.md)"
                ),
            }
        }
        ServerMsg::Fatal { message } => {
            return Err(TransportError::Auth(format!(
                "server ended the session: {message}"
            )));
        }
        reply => {
            reader.skip_bulk(header.bulk_len)?;
            let pending = shared.pending.lock().unwrap().remove(&seq);
            match pending {
                Some(Pending::Waiter(slot)) => slot.fill(Ok(reply)),
                Some(Pending::Read(sink)) => {
                    let status = match reply {
                        ServerMsg::ReadDone { status } => Ok(status),
                        other => Err(ClientError::Protocol(format!(
                            "unexpected end of read: {other:?}"
                        ))),
                    };
                    (sink.done)(status);
                }
                None => log::debug!("reply for unknown request {seq} dropped"),
            }
        }
    }
    Ok(())
}

fn malformed(why: impl Into<String>) -> TransportError {
    TransportError::Protocol(rgpu_protocol::ProtocolError::Malformed(why.into()))
}

/// A frame's bulk length as a length of memory here.
fn bulk_len(header: &FrameHeader) -> Result<usize, TransportError> {
    usize::try_from(header.bulk_len).map_err(|e| malformed(e.to_string()))
}

/// Takes a read's data that the server put in the shared-memory ring into `chunk` (`None`:
/// drops it). The bytes are there before their frame is sent.
fn receive_from_ring(
    shared: &Shared,
    header: &FrameHeader,
    chunk: Option<&mut [u8]>,
) -> Result<(), TransportError> {
    let ring = shared
        .ring_in
        .get()
        .ok_or_else(|| malformed("read data in a shared ring this client never made"))?;
    let len = bulk_len(header)?;
    let nothing_else = || Ok(());
    ring.lock()
        .unwrap()
        .read(chunk, len, shared.reply_timeout, &nothing_else)
        .map_err(TransportError::Io)
}

/// Takes a read's data that the server announced striped over the data lanes (`header`) into
/// `chunk` (`None`: drops it), before the next frame is read.
fn receive_striped(
    shared: &Shared,
    header: &FrameHeader,
    chunk: Option<&mut [u8]>,
) -> Result<(), TransportError> {
    let lanes = shared
        .lanes()
        .ok_or_else(|| malformed("read data striped over data lanes this client never opened"))?;
    let len = bulk_len(header)?;
    let dst = chunk.map_or(std::ptr::null_mut(), |chunk| chunk.as_mut_ptr());
    lanes
        .receive(dst, len, header.lanes, shared.reply_timeout)
        .map_err(|why| TransportError::Io(std::io::Error::other(why)))
}
