//! The server-to-server fabric: device memory of one server's session moved straight to
//! another server, never through a client (copies between GPUs of different servers, waits on
//! another server's events, MPI transfers: docs/mpi.md, docs/architecture.md "Fabric").
//!
//! A session *exports* a range under a ticket (random, 256 bits, chosen by its client so that
//! an export is posted without a round trip): the export says how to read the range and when
//! it is ready (the device work before it done). Another server's session *pulls* it over a
//! *link* (`rgpu_protocol::fabric`): a persistent connection to this session's worker,
//! authenticated like any connection (the cluster's token) and opened with a live ticket of
//! the session, then reused for every transfer; each pull names its ticket, and an export is
//! used up once all its bytes have been pulled. The pulling side is
//! `rgpu_transport::peer::Links` (one per process, [`Fabric::links`]).
//!
//! On one machine the puller may ask for the allocation's CUDA IPC handle instead of the bytes
//! and copy device to device; the handle goes only to a server that presented the ticket.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rgpu_protocol::fabric::{LinkReply, LinkRequest};
use rgpu_protocol::{LaneAttach, LaneKey};
use rgpu_transport::peer::{Links, PEER_TIMEOUT, WAITING_EVERY};
use rgpu_transport::{ClientSecurity, FrameReader, FrameWriter, Stream, TlsConnector, Token};

use crate::lanes::keys_match;

/// Bytes a source reads from its device at a time.
pub(crate) const CHUNK: usize = 2 << 20;
/// An export nobody pulled within this long is withdrawn (a stream held for it moves on, and
/// the pull, if it ever comes, is refused).
const EXPORT_LIFETIME: Duration = Duration::from_secs(120);

/// Sends bytes of an export to its puller, in order.
pub(crate) type Send<'a> = &'a mut dyn FnMut(&[u8]) -> Result<(), String>;

/// How to read an exported range. Dropping it ends whatever it holds (a held stream goes on).
pub(crate) trait Source: std::marker::Send + Sync {
    /// Whether the range may be read now (the device work before the export is done); `Err`:
    /// it never will be.
    fn ready(&self) -> Result<bool, String>;

    /// Sends bytes `[offset, offset + len)` of the range through `send`.
    fn read(&self, offset: u64, len: u64, send: Send) -> Result<(), String>;

    /// The CUDA IPC handle of the range's allocation and the range's offset in it.
    fn handle(&self) -> Option<(Vec<u8>, u64)> {
        None
    }

    /// Whether its bytes may be pulled: not those of a landing, a range another server
    /// writes (`LandRange`).
    fn readable(&self) -> bool {
        true
    }

    /// A landing whose pusher could not copy into it: starts pulling the pusher's export
    /// instead, in the background.
    fn pull_instead(&self) -> Result<(), String> {
        Err("not a landing".into())
    }
}

struct Export {
    session: u64,
    size: u64,
    source: Box<dyn Source>,
    /// Bytes not pulled yet.
    left: AtomicU64,
    /// Ended by the puller's [`LinkRequest::Delivered`] rather than by its last byte pulled
    /// (its stream waits until the bytes are on the puller's device).
    awaits_delivery: bool,
    made: Instant,
    /// A CUDA IPC share (`IpcShareMemory`, `IpcShareEvent`): its handle goes to every server
    /// that presents the ticket, it never expires, and it ends when its object does.
    lasting: bool,
    /// The byte ranges pulled (or being pulled) so far, and whether the IPC handle went out:
    /// each byte and the handle go out at most once, whatever became of the first attempt.
    taken: Mutex<Taken>,
}

#[derive(Default)]
struct Taken {
    ranges: Vec<(u64, u64)>,
    handle: bool,
}

impl Export {
    /// Claims bytes `[offset, offset + len)` for one pull: false if any was claimed before.
    fn claim_range(&self, offset: u64, len: u64) -> bool {
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        let end = offset.saturating_add(len);
        let overlaps = |&(at, n): &(u64, u64)| at < end && offset < at.saturating_add(n);
        if len > 0 && taken.ranges.iter().any(overlaps) {
            return false;
        }
        taken.ranges.push((offset, len));
        true
    }

    /// Whether nobody pulled it in its lifetime (a lasting share never expires).
    fn expired(&self) -> bool {
        !self.lasting && self.made.elapsed() >= EXPORT_LIFETIME
    }

    /// Claims the IPC handle for one puller: false if it went out before (a lasting share's
    /// goes out to each).
    fn claim_handle(&self) -> bool {
        if self.lasting {
            return true;
        }
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        !std::mem::replace(&mut taken.handle, true)
    }
}

/// The exports of the sessions this process serves, and its links to other servers.
#[derive(Default)]
pub(crate) struct Fabric {
    exports: Mutex<HashMap<LaneKey, Arc<Export>>>,
    /// Signalled when an export is added.
    added: Condvar,
    links: OnceLock<Result<Links, String>>,
    sweeping: AtomicBool,
    /// Threads that carry out background pulls, kept for the next one: a new thread's first
    /// driver call costs far more than a small transfer.
    workers: Mutex<Workers>,
    work_added: Condvar,
    /// Jobs that run one after another, by order (a stream): those not started yet. A key is
    /// here while a thread runs its jobs.
    in_order: Mutex<HashMap<Order, std::collections::VecDeque<Job>>>,
}

/// What orders jobs that must run one after another: a context and one of its streams.
pub(crate) type Order = (usize, usize);

/// A background pull.
pub(crate) type Job = Box<dyn FnOnce() + std::marker::Send>;

#[derive(Default)]
struct Workers {
    jobs: std::collections::VecDeque<Job>,
    idle: usize,
}

/// How long a pull thread with nothing to do waits for more before it ends.
const WORKER_IDLE: Duration = Duration::from_secs(60);

impl Fabric {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<LaneKey, Arc<Export>>> {
        self.exports.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This process's links to other servers (authenticated with `token`: a cluster's servers
    /// share one; TLS where the platform's trust allows it).
    pub fn links(&self, token: Option<&Token>) -> Result<&Links, String> {
        self.links
            .get_or_init(|| {
                let tls = TlsConnector::new(&ClientSecurity::default())?;
                Ok(Links::new(token.cloned(), tls, "rgpu server (fabric)"))
            })
            .as_ref()
            .map_err(|e| e.clone())
    }

    /// Runs `job` on a pull thread: an idle one, else a new one (never queued behind a busy
    /// one, since a pull may wait for another's stream).
    pub fn run(self: &Arc<Self>, job: Job) -> Result<(), String> {
        let mut workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        workers.jobs.push_back(job);
        if workers.idle >= workers.jobs.len() {
            self.work_added.notify_one();
            return Ok(());
        }
        drop(workers);
        let fabric = self.clone();
        let spawned = std::thread::Builder::new()
            .name("rgpu-fabric-pull".into())
            .spawn(move || fabric.work());
        if let Err(e) = spawned {
            // The job is dropped unrun (its gate opens): the pull fails.
            let mut workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
            workers.jobs.pop_back();
            return Err(format!("cannot start a pull thread: {e}"));
        }
        Ok(())
    }

    /// Runs `job` on a pull thread after the jobs given before with the same `order`, one at a
    /// time. A stream's pulls reach the device in its order anyway; a thread apiece, each
    /// waiting for the stream, would only crowd the CPUs (hundreds of queued copies, each
    /// thread spinning in the driver, woke at the scheduler's ticks: milliseconds per copy).
    pub fn run_in_order(self: &Arc<Self>, order: Order, job: Job) -> Result<(), String> {
        let mut waiting = self.in_order.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(queue) = waiting.get_mut(&order) {
            queue.push_back(job);
            return Ok(());
        }
        waiting.insert(order, Default::default());
        drop(waiting);
        let fabric = self.clone();
        self.run(Box::new(move || {
            job();
            fabric.run_rest_in_order(order);
        }))
        .inspect_err(|_| {
            // Those queued meanwhile are dropped unrun too (their streams go on).
            let mut waiting = self.in_order.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(dropped) = waiting.remove(&order) {
                log::warn!(
                    "{} queued pulls dropped with no thread to run them",
                    dropped.len()
                );
            }
        })
    }

    /// The jobs queued under `order`, in turn, until none is left.
    fn run_rest_in_order(&self, order: Order) {
        loop {
            let next = {
                let mut waiting = self.in_order.lock().unwrap_or_else(|e| e.into_inner());
                match waiting.get_mut(&order).and_then(|queue| queue.pop_front()) {
                    Some(job) => job,
                    None => {
                        waiting.remove(&order);
                        return;
                    }
                }
            };
            next();
        }
    }

    /// A pull thread: jobs until none comes for a while.
    fn work(&self) {
        let mut workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(job) = workers.jobs.pop_front() {
                drop(workers);
                job();
                workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
                continue;
            }
            workers.idle += 1;
            let (guard, timeout) = self
                .work_added
                .wait_timeout(workers, WORKER_IDLE)
                .unwrap_or_else(|e| e.into_inner());
            workers = guard;
            workers.idle -= 1;
            if timeout.timed_out() && workers.jobs.is_empty() {
                return;
            }
        }
    }

    /// Exports `size` bytes of `session`, read through `source`, under `ticket`; ended by the
    /// puller's word that it has them when `awaits_delivery`, else by its last byte pulled.
    pub fn add(
        self: &Arc<Self>,
        session: u64,
        ticket: LaneKey,
        size: u64,
        source: Box<dyn Source>,
        awaits_delivery: bool,
    ) -> Result<(), String> {
        log::debug!("session {session}: export of {size} bytes added");
        self.insert(ticket, session, size, source, awaits_delivery, false)?;
        self.sweep_later();
        Ok(())
    }

    /// Shares an object of `session` through its CUDA IPC handle (`source.handle()`) under
    /// `ticket`, with every server of this machine that presents the ticket, until
    /// [`Fabric::remove`] or the session's end.
    pub fn add_lasting(
        &self,
        session: u64,
        ticket: LaneKey,
        source: Box<dyn Source>,
    ) -> Result<(), String> {
        log::debug!("session {session}: an IPC share added");
        self.insert(ticket, session, 0, source, false, true)
    }

    fn insert(
        &self,
        ticket: LaneKey,
        session: u64,
        size: u64,
        source: Box<dyn Source>,
        awaits_delivery: bool,
        lasting: bool,
    ) -> Result<(), String> {
        let export = Arc::new(Export {
            session,
            size,
            source,
            left: AtomicU64::new(size),
            awaits_delivery,
            made: Instant::now(),
            lasting,
            taken: Mutex::default(),
        });
        {
            let mut exports = self.lock();
            if exports.contains_key(&ticket) {
                return Err("an export with this ticket exists".into());
            }
            exports.insert(ticket, export);
        }
        self.added.notify_all();
        Ok(())
    }

    /// Withdraws an export (nothing when it was used up already).
    pub fn remove(&self, session: u64, ticket: &LaneKey) {
        let mut exports = self.lock();
        if exports.get(ticket).is_some_and(|e| e.session == session) {
            exports.remove(ticket);
        }
    }

    /// Forgets the exports of a session that ended.
    pub fn forget_session(&self, session: u64) {
        self.lock().retain(|_, e| e.session != session);
    }

    /// Starts the thread that withdraws exports nobody pulled, if it is not running.
    fn sweep_later(self: &Arc<Self>) {
        if self.sweeping.swap(true, Ordering::SeqCst) {
            return;
        }
        let fabric = self.clone();
        let started = std::thread::Builder::new()
            .name("rgpu-fabric-sweep".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_secs(1));
                let mut exports = fabric.lock();
                exports.retain(|_, e| {
                    let keep = !e.expired();
                    if !keep {
                        log::warn!("session {}: an export nobody pulled expired", e.session);
                    }
                    keep
                });
                if exports.values().all(|e| e.lasting) {
                    fabric.sweeping.store(false, Ordering::SeqCst);
                    return;
                }
            });
        if started.is_err() {
            self.sweeping.store(false, Ordering::SeqCst);
        }
    }

    /// The export `ticket` names for `session`, waiting up to `wait` for it to be made (its
    /// client posts it at the same time as the pull goes to the other server).
    fn find(&self, session: u64, ticket: &LaneKey, wait: Duration) -> Option<Arc<Export>> {
        let deadline = Instant::now() + wait;
        let mut exports = self.lock();
        loop {
            let found = exports
                .iter()
                .find(|(t, e)| e.session == session && keys_match(t, ticket))
                .map(|(_, e)| e.clone());
            if found.is_some() {
                return found;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            exports = self
                .added
                .wait_timeout(exports, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Counts `len` bytes of the export as pulled; the export ends once all are.
    fn used(&self, ticket: &LaneKey, export: &Arc<Export>, len: u64) {
        let mut before = export.left.load(Ordering::SeqCst);
        loop {
            let after = before.saturating_sub(len);
            match export.left.compare_exchange_weak(
                before,
                after,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => break,
                Err(now) => before = now,
            }
        }
        if before <= len && !export.awaits_delivery {
            self.end(ticket, export);
        }
    }

    /// The puller has an export of `session` on its device: it ends (an export that ended
    /// already, not waiting for its delivery, is no matter).
    fn delivered(&self, session: u64, ticket: &LaneKey) {
        if let Some(export) = self.find(session, ticket, Duration::ZERO) {
            self.end(ticket, &export);
        }
    }

    /// A landing's pusher could not copy into it: its server pulls the bytes instead, and the
    /// landing ends.
    fn pull_instead(&self, session: u64, ticket: &LaneKey) {
        let Some(landing) = self.find(session, ticket, WAITING_EVERY) else {
            log::warn!("session {session}: no landing to pull into");
            return;
        };
        if let Err(e) = landing.source.pull_instead() {
            log::warn!("session {session}: pulling into a landing: {e}");
        }
        self.end(ticket, &landing);
    }

    /// Ends an export (its stream goes on, if it waits). A lasting share ends only when
    /// withdrawn ([`Fabric::remove`]).
    fn end(&self, ticket: &LaneKey, export: &Arc<Export>) {
        if export.lasting {
            return;
        }
        let mut exports = self.lock();
        if exports.get(ticket).is_some_and(|e| Arc::ptr_eq(e, export)) {
            exports.remove(ticket);
        }
    }

    /// A link's connection (`attach` came with its authenticated handshake, its key a live
    /// ticket of the session): serves its requests on a thread of its own until it closes.
    pub fn serve_link(
        self: &Arc<Self>,
        attach: &LaneAttach,
        stream: &Stream,
    ) -> Result<(), String> {
        // The ticket's export may be posted after the pull that opens the link, and its
        // session may be busy (its device queue full): waited for within the puller's patience.
        if self
            .find(attach.session, &attach.key, PEER_TIMEOUT / 2)
            .is_none()
        {
            return Err("no such export on this server".into());
        }
        let stream = stream.try_clone().map_err(|e| e.to_string())?;
        let (session, fabric) = (attach.session, self.clone());
        log::info!(
            "session {session}: fabric link opened from {}",
            stream.peer_description()
        );
        std::thread::Builder::new()
            .name("rgpu-fabric-link".into())
            .spawn(move || {
                if let Err(e) = fabric.link(session, &stream) {
                    log::debug!("session {session}: a fabric link ended: {e}");
                }
                stream.shutdown();
            })
            .map_err(|e| format!("cannot start a fabric link's thread: {e}"))?;
        Ok(())
    }

    /// Serves a link's requests, one after the other.
    fn link(&self, session: u64, stream: &Stream) -> Result<(), String> {
        let failed = |e: std::io::Error| e.to_string();
        // Idle links wait for their next request as long as the puller keeps them; a dead
        // puller is found by the connection's liveness checks.
        stream.set_read_timeout(None).map_err(failed)?;
        stream
            .set_write_timeout(Some(PEER_TIMEOUT))
            .and_then(|()| stream.set_liveness(PEER_TIMEOUT))
            .map_err(failed)?;
        let mut reader = FrameReader::new(stream.try_clone().map_err(failed)?);
        let mut writer = FrameWriter::new(stream.try_clone().map_err(failed)?);
        // An IPC handle maps the exporter's memory into whatever process opens it: it goes only
        // to a server's process (this server's user, or root) on this machine, never to a
        // client that presents the ticket itself.
        let may_map = may_map_handles(stream);
        loop {
            let request = match reader.read_message::<LinkRequest>() {
                Ok((_, request)) => request,
                Err(rgpu_transport::TransportError::Closed) => return Ok(()),
                Err(e) => return Err(e.to_string()),
            };
            log::debug!("session {session}: link request {request:?}");
            match request {
                LinkRequest::Pull {
                    ticket,
                    offset,
                    len,
                } => self.send_part(session, &ticket, offset, len, &mut writer)?,
                LinkRequest::Share { .. } | LinkRequest::Handle { .. } if !may_map => {
                    refuse(&mut writer, NOT_A_SERVER)?;
                }
                LinkRequest::Share { ticket } => {
                    if let Some(export) = self.share(session, &ticket, &mut writer)? {
                        // The puller answers as soon as its device copy is done: bounded.
                        stream
                            .set_read_timeout(Some(PEER_TIMEOUT))
                            .map_err(failed)?;
                        let answer = reader.read_message::<LinkRequest>();
                        stream.set_read_timeout(None).map_err(failed)?;
                        match answer {
                            // Copied device to device: delivered.
                            Ok((_, LinkRequest::Shared { copied: true })) => {
                                self.end(&ticket, &export)
                            }
                            Ok((_, LinkRequest::Shared { copied: false })) => {}
                            Ok((_, other)) => return Err(format!("{other:?} after a handle")),
                            Err(e) => return Err(e.to_string()),
                        }
                    }
                }
                LinkRequest::Handle { ticket } => {
                    let Some(export) = self.wanted_export(session, &ticket, &mut writer)? else {
                        continue;
                    };
                    let answer = match export.source.handle().filter(|_| export.claim_handle()) {
                        // Ready, and nothing waits for its end: the puller copies without a
                        // `Share` round trip, and the export is used up now.
                        Some((handle, offset))
                            if !export.awaits_delivery && export.source.ready() == Ok(true) =>
                        {
                            self.end(&ticket, &export);
                            LinkReply::HandleReady { handle, offset }
                        }
                        Some((handle, offset)) => LinkReply::Handle { handle, offset },
                        None => LinkReply::Refused {
                            reason: "no handle to share".into(),
                        },
                    };
                    // A puller asks for a batch's handles together: one write for the lot.
                    writer.queue(&answer, 0, &[]).map_err(|e| e.to_string())?;
                    if !reader.has_buffered() {
                        writer.flush().map_err(|e| e.to_string())?;
                    }
                }
                LinkRequest::Delivered { ticket } => self.delivered(session, &ticket),
                LinkRequest::PullInstead { ticket } => self.pull_instead(session, &ticket),
                LinkRequest::Shared { .. } => return Err("a Shared without a handle".into()),
            }
        }
    }

    /// The export a request names, waiting for it to be made and telling the puller every
    /// few seconds that it is still waiting; `Ok(None)`: refused (and the puller told why).
    fn wanted_export(
        &self,
        session: u64,
        ticket: &LaneKey,
        writer: &mut FrameWriter<Stream>,
    ) -> Result<Option<Arc<Export>>, String> {
        let mut waited = Duration::ZERO;
        loop {
            if let Some(export) = self.find(session, ticket, WAITING_EVERY) {
                return Ok(Some(export));
            }
            waited += WAITING_EVERY;
            if waited >= PEER_TIMEOUT {
                refuse(writer, "no such export on this server")?;
                return Ok(None);
            }
            reply(writer, &LinkReply::Waiting, &[])?;
        }
    }

    /// The export a request names once it is ready, telling the puller every few seconds
    /// that it is still waiting; `Ok(None)`: refused (and the puller told why).
    fn ready_export(
        &self,
        session: u64,
        ticket: &LaneKey,
        writer: &mut FrameWriter<Stream>,
    ) -> Result<Option<Arc<Export>>, String> {
        let Some(export) = self.wanted_export(session, ticket, writer)? else {
            return Ok(None);
        };
        if !export.source.readable() {
            refuse(writer, "this export's bytes cannot be pulled")?;
            return Ok(None);
        }
        let mut told = Instant::now();
        let started = Instant::now();
        loop {
            match export.source.ready() {
                Ok(true) => return Ok(Some(export)),
                Ok(false) => {}
                Err(e) => {
                    refuse(writer, &e)?;
                    return Ok(None);
                }
            }
            // Withdrawn (its session ended, or it expired) while its device work ran.
            if !self.lock().contains_key(ticket) {
                refuse(writer, "the export was withdrawn")?;
                return Ok(None);
            }
            if told.elapsed() >= WAITING_EVERY {
                log::debug!("session {session}: an export's device work is not done yet");
                reply(writer, &LinkReply::Waiting, &[])?;
                told = Instant::now();
            }
            // Device work usually ends within microseconds of the request: yield at first,
            // then poll every 50 us.
            if started.elapsed() < Duration::from_millis(2) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Answers a `Pull`: the range's bytes, streamed as they are read from the device.
    fn send_part(
        &self,
        session: u64,
        ticket: &LaneKey,
        offset: u64,
        len: u64,
        writer: &mut FrameWriter<Stream>,
    ) -> Result<(), String> {
        let Some(export) = self.ready_export(session, ticket, writer)? else {
            return Ok(());
        };
        if offset.checked_add(len).is_none_or(|end| end > export.size) {
            return refuse(writer, "a pull past the end of its export");
        }
        // One use: a second pull of these bytes (after an aborted one, say) gets nothing.
        if !export.claim_range(offset, len) {
            return refuse(writer, "these bytes of the export were pulled already");
        }
        // Read before the header goes out: a device error can still be a refusal.
        let mut sent = 0u64;
        let mut started = false;
        let mut send = |bytes: &[u8]| -> Result<(), String> {
            if !started {
                writer
                    .queue_header(&LinkReply::Bytes, 0, len)
                    .map_err(|e| e.to_string())?;
                started = true;
            }
            sent += bytes.len() as u64;
            writer.write_bulk(bytes).map_err(|e| e.to_string())
        };
        let read = if len == 0 {
            send(&[])
        } else {
            export.source.read(offset, len, &mut send)
        };
        match read {
            Ok(()) if sent == len => {}
            Ok(()) => return Err(format!("a source sent {sent} of {len} bytes")),
            // Nothing went out yet: the puller hears why, and the link goes on.
            Err(e) if !started => {
                log::warn!("session {session}: reading an export: {e}");
                return refuse(writer, &e);
            }
            Err(e) => return Err(format!("reading an export: {e}")),
        }
        writer.flush().map_err(|e| e.to_string())?;
        log::debug!("session {session}: sent {len} bytes of an export");
        self.used(ticket, &export, len);
        Ok(())
    }

    /// Answers a `Share`: the allocation's IPC handle, or a refusal when there is none.
    fn share(
        &self,
        session: u64,
        ticket: &LaneKey,
        writer: &mut FrameWriter<Stream>,
    ) -> Result<Option<Arc<Export>>, String> {
        let Some(export) = self.ready_export(session, ticket, writer)? else {
            return Ok(None);
        };
        // The puller mapped the allocation already (its `Handle` request): the answer says
        // the range is ready now, and carries no handle (it goes out once, to that request).
        match export.source.handle() {
            Some((_, offset)) => {
                let ready = LinkReply::Handle {
                    handle: Vec::new(),
                    offset,
                };
                reply(writer, &ready, &[])?;
                log::debug!("session {session}: an export shared by IPC is ready");
                Ok(Some(export))
            }
            None => {
                refuse(writer, "no handle to share")?;
                Ok(None)
            }
        }
    }
}

/// Why a puller that is not a server of this machine gets no IPC handle.
const NOT_A_SERVER: &str = "IPC handles go only to a server on this machine";

/// Whether the link's peer may map exports through their IPC handles: a process of this
/// server's user, or of root, on this machine (the servers of one machine run as one user;
/// clients usually do not, and one that does could read this server's memory anyway).
fn may_map_handles(stream: &Stream) -> bool {
    // SAFETY: a plain system call.
    let me = unsafe { libc::geteuid() };
    let peer = stream.peer_uid();
    let may = peer == Some(me) || peer == Some(0);
    if !may {
        log::debug!(
            "a fabric link from {} (uid {peer:?}) gets no IPC handles",
            stream.peer_description()
        );
    }
    may
}

fn reply(writer: &mut FrameWriter<Stream>, reply: &LinkReply, bulk: &[u8]) -> Result<(), String> {
    writer.send(reply, 0, bulk).map_err(|e| e.to_string())
}

fn refuse(writer: &mut FrameWriter<Stream>, reason: &str) -> Result<(), String> {
    let refused = LinkReply::Refused {
        reason: reason.to_string(),
    };
    reply(writer, &refused, &[])
}

/// Reads bytes `[offset, offset + len)` with `read` (offset, buffer) in chunks, one after the
/// other, sending each.
pub(crate) fn read_in_chunks(
    offset: u64,
    len: u64,
    send: Send,
    read: impl Fn(u64, &mut [u8]) -> Result<(), String>,
) -> Result<(), String> {
    let mut buffer = vec![0u8; (len as usize).min(CHUNK)];
    let mut at = 0u64;
    while at < len {
        let n = ((len - at) as usize).min(buffer.len());
        read(offset + at, &mut buffer[..n])?;
        send(&buffer[..n])?;
        at += n as u64;
    }
    Ok(())
}

/// A sink written through a plain function (OpenCL buffers), in chunks.
pub(crate) struct WriteBy<F>(pub F);

impl<F> rgpu_transport::peer::PullSink for WriteBy<F>
where
    F: Fn(u64, &[u8]) -> Result<(), String> + Sync,
{
    fn part(
        &self,
        offset: u64,
        len: u64,
        receive: rgpu_transport::peer::Receive,
    ) -> Result<(), String> {
        let mut buffer = vec![0u8; (len as usize).min(CHUNK)];
        let mut at = 0u64;
        while at < len {
            let n = ((len - at) as usize).min(buffer.len());
            receive(&mut buffer[..n])?;
            (self.0)(offset + at, &buffer[..n])?;
            at += n as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source of `len` bytes counting up from 0, ready once `ready` is set.
    struct Counting(Arc<AtomicBool>);

    impl Source for Counting {
        fn ready(&self) -> Result<bool, String> {
            Ok(self.0.load(Ordering::SeqCst))
        }

        fn read(&self, offset: u64, len: u64, send: Send) -> Result<(), String> {
            read_in_chunks(offset, len, send, |at, out| {
                for (i, byte) in out.iter_mut().enumerate() {
                    *byte = (at + i as u64) as u8;
                }
                Ok(())
            })
        }
    }

    fn source(ready: bool) -> Box<dyn Source> {
        Box::new(Counting(Arc::new(AtomicBool::new(ready))))
    }

    #[test]
    fn a_pull_finds_an_export_made_after_it_asked() {
        let fabric = Arc::new(Fabric::default());
        let ticket = [7u8; 32];
        let later = fabric.clone();
        let maker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            later.add(1, ticket, 10, source(true), false).unwrap();
        });
        assert!(fabric.find(1, &ticket, Duration::from_secs(5)).is_some());
        maker.join().unwrap();
        // Another session's ticket is not found, and waiting for it is bounded.
        assert!(fabric.find(2, &ticket, Duration::from_millis(50)).is_none());
    }

    #[test]
    fn an_export_ends_once_all_its_bytes_were_pulled_and_tickets_are_unique() {
        let fabric = Arc::new(Fabric::default());
        let ticket = [9u8; 32];
        fabric.add(1, ticket, 100, source(true), false).unwrap();
        assert!(fabric.add(1, ticket, 5, source(true), false).is_err());
        let export = fabric.find(1, &ticket, Duration::ZERO).unwrap();
        fabric.used(&ticket, &export, 60);
        assert!(fabric.find(1, &ticket, Duration::ZERO).is_some());
        fabric.used(&ticket, &export, 40);
        assert!(fabric.find(1, &ticket, Duration::ZERO).is_none());
        // Withdrawn and forgotten exports are gone; another session's stay.
        fabric.add(1, [1; 32], 1, source(true), false).unwrap();
        fabric.add(2, [2; 32], 1, source(true), false).unwrap();
        fabric.remove(2, &[1; 32]);
        assert!(fabric.find(1, &[1; 32], Duration::ZERO).is_some());
        fabric.forget_session(1);
        assert!(fabric.find(1, &[1; 32], Duration::ZERO).is_none());
        assert!(fabric.find(2, &[2; 32], Duration::ZERO).is_some());
    }

    #[test]
    fn an_export_its_stream_orders_ends_when_the_puller_has_it_on_its_device() {
        let fabric = Arc::new(Fabric::default());
        let ticket = [5u8; 32];
        fabric.add(1, ticket, 10, source(true), true).unwrap();
        let export = fabric.find(1, &ticket, Duration::ZERO).unwrap();
        // Every byte sent: still there, its stream still waits.
        fabric.used(&ticket, &export, 10);
        assert!(fabric.find(1, &ticket, Duration::ZERO).is_some());
        // Another session cannot end it; its puller can.
        fabric.delivered(2, &ticket);
        assert!(fabric.find(1, &ticket, Duration::ZERO).is_some());
        fabric.delivered(1, &ticket);
        assert!(fabric.find(1, &ticket, Duration::ZERO).is_none());
        // A delivery told of an export that ended already is no matter.
        fabric.delivered(1, &ticket);
    }

    /// A landing that counts the pulls it started.
    struct Landing(Arc<AtomicU64>);

    impl Source for Landing {
        fn ready(&self) -> Result<bool, String> {
            Ok(true)
        }

        fn read(&self, _: u64, _: u64, _: Send) -> Result<(), String> {
            Err("a landing is written, not read".into())
        }

        fn readable(&self) -> bool {
            false
        }

        fn pull_instead(&self) -> Result<(), String> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    /// A landing ends with its pusher's word: copied (nothing pulled), or pull instead (its
    /// pull starts, once); another session's word is no matter.
    #[test]
    fn a_landing_ends_when_pushed_or_pulls_instead() {
        let fabric = Arc::new(Fabric::default());
        let pulls = Arc::new(AtomicU64::new(0));
        let landing = || Box::new(Landing(pulls.clone()));
        let (pushed, refused) = ([3u8; 32], [4u8; 32]);
        fabric.add(1, pushed, 10, landing(), true).unwrap();
        fabric.add(1, refused, 10, landing(), true).unwrap();
        fabric.delivered(1, &pushed);
        assert!(fabric.find(1, &pushed, Duration::ZERO).is_none());
        fabric.pull_instead(2, &refused);
        assert_eq!(pulls.load(Ordering::SeqCst), 0);
        assert!(fabric.find(1, &refused, Duration::ZERO).is_some());
        fabric.pull_instead(1, &refused);
        assert_eq!(pulls.load(Ordering::SeqCst), 1);
        assert!(fabric.find(1, &refused, Duration::ZERO).is_none());
        fabric.pull_instead(1, &refused);
        assert_eq!(pulls.load(Ordering::SeqCst), 1);
    }

    /// An object shared by CUDA IPC: its handle only.
    struct Shared;

    impl Source for Shared {
        fn ready(&self) -> Result<bool, String> {
            Ok(true)
        }

        fn read(&self, _: u64, _: u64, _: Send) -> Result<(), String> {
            Err("shared by its handle".into())
        }

        fn handle(&self) -> Option<(Vec<u8>, u64)> {
            Some((vec![42; 64], 0))
        }

        fn readable(&self) -> bool {
            false
        }
    }

    /// A lasting share (CUDA IPC) over a real link: its handle goes to every request that
    /// presents the ticket (several processes open one allocation), its bytes to none; it
    /// never expires, nothing a puller says ends it, and it goes when withdrawn or with its
    /// session. Another session's ticket finds nothing.
    #[test]
    fn a_lasting_share_gives_its_handle_to_each_ticket_holder_until_withdrawn() {
        let fabric = Arc::new(Fabric::default());
        let ticket = [8u8; 32];
        fabric.add_lasting(1, ticket, Box::new(Shared)).unwrap();
        assert!(fabric.add_lasting(1, ticket, Box::new(Shared)).is_err());
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let link_end = Stream::from_fd(rgpu_transport::StreamKind::Unix, theirs.into());
        let server = fabric.clone();
        let serving = std::thread::spawn(move || server.link(1, &link_end));
        let ours = Stream::from_fd(rgpu_transport::StreamKind::Unix, ours.into());
        let mut writer = FrameWriter::new(ours.try_clone().unwrap());
        let mut reader = FrameReader::new(ours.try_clone().unwrap());
        let mut ask = |request: LinkRequest| {
            writer.send(&request, 0, &[]).unwrap();
            reader.read_message::<LinkReply>().unwrap().1
        };
        let handle = LinkReply::HandleReady {
            handle: vec![42; 64],
            offset: 0,
        };
        for _ in 0..3 {
            assert_eq!(ask(LinkRequest::Handle { ticket }), handle);
        }
        let pull = LinkRequest::Pull {
            ticket,
            offset: 0,
            len: 0,
        };
        assert!(matches!(ask(pull), LinkReply::Refused { .. }));
        fabric.delivered(1, &ticket);
        let export = fabric.find(1, &ticket, Duration::ZERO).unwrap();
        fabric.used(&ticket, &export, 1);
        assert!(!export.expired());
        assert_eq!(ask(LinkRequest::Handle { ticket }), handle);
        assert!(fabric.find(2, &ticket, Duration::ZERO).is_none());
        // The puller goes: the link ends.
        drop((writer, reader, ours));
        serving.join().unwrap().unwrap();

        fabric.remove(2, &ticket);
        assert!(fabric.find(1, &ticket, Duration::ZERO).is_some());
        fabric.remove(1, &ticket);
        assert!(fabric.find(1, &ticket, Duration::ZERO).is_none());
        fabric.add_lasting(1, ticket, Box::new(Shared)).unwrap();
        fabric.forget_session(1);
        assert!(fabric.find(1, &ticket, Duration::ZERO).is_none());
    }

    #[test]
    fn pull_jobs_reuse_idle_threads_and_never_wait_behind_a_busy_one() {
        let fabric = Arc::new(Fabric::default());
        let (tx, rx) = std::sync::mpsc::channel();
        // A job that blocks until the second one has run: they must run at once.
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        let first = tx.clone();
        fabric
            .run(Box::new(move || {
                blocked.recv().unwrap();
                first.send(1).unwrap();
            }))
            .unwrap();
        let second = tx.clone();
        fabric
            .run(Box::new(move || {
                second.send(2).unwrap();
                release.send(()).unwrap();
            }))
            .unwrap();
        let mut got = vec![rx.recv().unwrap(), rx.recv().unwrap()];
        got.sort();
        assert_eq!(got, vec![1, 2]);
        // Both threads are idle now: the next job takes one of them.
        std::thread::sleep(Duration::from_millis(50));
        let third = tx.clone();
        fabric
            .run(Box::new(move || third.send(3).unwrap()))
            .unwrap();
        assert_eq!(rx.recv().unwrap(), 3);
        assert!(fabric.workers.lock().unwrap().idle <= 2);
    }

    #[test]
    fn ordered_jobs_run_one_at_a_time_in_their_order_and_orders_run_side_by_side() {
        let fabric = Arc::new(Fabric::default());
        let (tx, rx) = std::sync::mpsc::channel();
        // Order 1's first job waits until order 2's job has run: orders do not wait for one
        // another.
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        let running = Arc::new(AtomicU64::new(0));
        let mut blocked = Some(blocked);
        for k in 0..20u64 {
            let (tx, running, blocked) = (tx.clone(), running.clone(), blocked.take());
            let job: Job = Box::new(move || {
                assert_eq!(running.fetch_add(1, Ordering::SeqCst), 0, "two at a time");
                if let Some(blocked) = blocked {
                    blocked.recv_timeout(Duration::from_secs(10)).unwrap();
                }
                running.fetch_sub(1, Ordering::SeqCst);
                tx.send(k).unwrap();
            });
            fabric.run_in_order((1, 1), job).unwrap();
        }
        fabric
            .run_in_order((1, 2), Box::new(move || release.send(()).unwrap()))
            .unwrap();
        let got: Vec<u64> = (0..20)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        assert_eq!(got, (0..20).collect::<Vec<_>>());
        // Every queue ran dry and is gone.
        std::thread::sleep(Duration::from_millis(50));
        assert!(fabric.in_order.lock().unwrap().is_empty());
    }
}
