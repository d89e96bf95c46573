//! CUDA over the fabric (crate::fabric): a session's exports of device ranges and of event
//! completions, and pulls of other servers' exports into device memory, each in its stream's
//! order without the request thread waiting for the network.
//!
//! - An export records an event on its stream (the range is ready once the stream's earlier
//!   work is done); a *held* export also makes the stream wait on a gate until the range has
//!   been pulled, so later work on that stream cannot overwrite it first.
//! - A pull records an event on its stream and makes the stream wait on a gate; a thread of
//!   its own waits for the event, pulls the bytes (or copies through the exporter's IPC handle
//!   on one machine), and then opens the gate. A failure is kept for the session's next
//!   synchronizing request, as a posted request's is.
//!
//! Device copies of both sides go through page-locked chunk buffers on a stream of their own,
//! the device copy of one chunk overlapping the network transfer of the other.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::{check, Status};
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{serve, Answer, DevicePtr, ExportKeep, Id, RangePull};
use rgpu_protocol::{LaneKey, PeerExport};
use rgpu_transport::peer::{HandleAnswer, PullSink, Receive, PEER_TIMEOUT};

use super::fabric_memory::{ChunkBuffer, Counter, FabricMemory, Gate};
use super::fabric_ring::{wait_until, Direction, Ring, DRAIN_WAIT};
use super::session::Served;
use super::Backend;
use crate::fabric::{Source, CHUNK};
use rgpu_transport::peer::Links;

/// The status a failed pull reports (the MPI interposer then moves the bytes another way).
const PULL_FAILED: Status = cudaError_enum::CUDA_ERROR_UNKNOWN as u32;
const INVALID_VALUE: Status = cudaError_enum::CUDA_ERROR_INVALID_VALUE as u32;
/// IPC mappings kept open per process (an allocation's handle changes when it is remade).
const IPC_MAPPINGS: usize = 4096;

/// A session's context, for the fabric's threads (driver handles are valid on any thread).
#[derive(Clone)]
struct InContext {
    backend: Arc<Backend>,
    ctx: usize,
}

impl InContext {
    fn raw(&self) -> CUcontext {
        self.ctx as CUcontext
    }

    /// Makes the context current on this thread.
    fn enter(&self) -> Result<(), String> {
        // SAFETY: a context of the session; the driver checks it.
        check(unsafe { cu_call!(self.backend.driver, cuCtxSetCurrent(self.raw())) })
            .map_err(|s| format!("CUDA error {s} entering the context"))
    }

    /// A stream of its own that never waits for the program's (blocking) streams.
    fn stream(&self) -> Result<OwnStream, Status> {
        let mut stream = std::ptr::null_mut();
        let flags = CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: a local out-value, in the current context.
        check(unsafe { cu_call!(self.backend.driver, cuStreamCreate(&mut stream, flags)) })?;
        Ok(OwnStream(stream as usize, self.backend.clone()))
    }

    fn event(&self) -> Result<OwnEvent, Status> {
        let mut event = std::ptr::null_mut();
        let flags = CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: a local out-value, in the current context.
        check(unsafe { cu_call!(self.backend.driver, cuEventCreate(&mut event, flags)) })?;
        Ok(OwnEvent(event as usize, self.backend.clone()))
    }

    /// An event recorded on `stream` now.
    fn event_on(&self, stream: CUstream) -> Result<OwnEvent, Status> {
        let event = self.event()?;
        // SAFETY: an event just made and a stream of the current context.
        check(unsafe { cu_call!(self.backend.driver, cuEventRecord(event.raw(), stream)) })?;
        Ok(event)
    }
}

/// A stream of this thread for transfers in `at`'s context, with two events for its chunks:
/// made once per thread and context (the fabric's threads are kept), so that a small
/// transfer costs no stream or event creation. `body` gets them with the context current.
fn with_transfer_stream<T>(
    at: &InContext,
    body: impl FnOnce(&OwnStream, &[OwnEvent; 2]) -> Result<T, String>,
) -> Result<T, String> {
    type Kept = HashMap<usize, (OwnStream, [OwnEvent; 2])>;
    thread_local! {
        static KEPT: std::cell::RefCell<Kept> = std::cell::RefCell::new(HashMap::new());
    }
    at.enter()?;
    let cuda = |s: Status| format!("CUDA error {s}");
    let kept = KEPT.with(|kept| kept.borrow_mut().remove(&at.ctx));
    let (stream, events) = match kept {
        Some(kept) => kept,
        None => (
            at.stream().map_err(cuda)?,
            [at.event().map_err(cuda)?, at.event().map_err(cuda)?],
        ),
    };
    let result = body(&stream, &events);
    // Kept only after a success: a failed one may belong to a context that is gone.
    if result.is_ok() {
        KEPT.with(|kept| kept.borrow_mut().insert(at.ctx, (stream, events)));
    }
    result
}

struct OwnStream(usize, Arc<Backend>);

impl OwnStream {
    fn raw(&self) -> CUstream {
        self.0 as CUstream
    }
}

impl Drop for OwnStream {
    fn drop(&mut self) {
        // SAFETY: destroyed once, here; work still queued on it completes first.
        unsafe { cu_call!(self.1.driver, cuStreamDestroy_v2(self.raw())) };
    }
}

struct OwnEvent(usize, Arc<Backend>);

impl OwnEvent {
    fn raw(&self) -> CUevent {
        self.0 as CUevent
    }

    fn record(&self, stream: &OwnStream) -> Result<(), String> {
        // SAFETY: an event and a stream this code owns.
        check(unsafe { cu_call!(self.1.driver, cuEventRecord(self.raw(), stream.raw())) })
            .map_err(|s| format!("CUDA error {s}"))
    }

    fn synchronize(&self) -> Result<(), String> {
        // SAFETY: an event this value owns.
        check(unsafe { cu_call!(self.1.driver, cuEventSynchronize(self.raw())) })
            .map_err(|s| format!("CUDA error {s}"))
    }

    /// Whether the work before the event is done (a failed stream counts as done: the pull
    /// finds out).
    fn completed(&self) -> bool {
        // SAFETY: an event this value owns.
        let status = unsafe { cu_call!(self.1.driver, cuEventQuery(self.raw())) };
        status != cudaError_enum::CUDA_ERROR_NOT_READY as u32
    }
}

impl Drop for OwnEvent {
    fn drop(&mut self) {
        // SAFETY: destroyed once, here.
        unsafe { cu_call!(self.1.driver, cuEventDestroy_v2(self.raw())) };
    }
}

/// The process's fabric memory, made at the first use by a request thread (see
/// fabric_memory.rs for why there).
fn fabric_memory(backend: &Backend) -> Result<Arc<FabricMemory>, Status> {
    static MEMORY: OnceLock<Result<Arc<FabricMemory>, Status>> = OnceLock::new();
    MEMORY
        .get_or_init(|| FabricMemory::new(backend).map(Arc::new))
        .clone()
}

/// An exported device range (size 0: an event's completion).
struct DeviceRange {
    at: InContext,
    ptr: DevicePtr,
    /// Recorded where the export was made: the range is ready once it has completed.
    ready: OwnEvent,
    memory: Arc<FabricMemory>,
    /// The allocation's IPC handle and the range's offset in it, taken when the export is made:
    /// the driver may wait for the device while taking one, and the device may be waiting on
    /// this export's gate by the time a puller asks.
    shared: Option<(Vec<u8>, u64)>,
    /// Where the exporting stream itself reads the range, chunk by chunk, as it is sent.
    ring: Option<Ring>,
    /// Held until the range has been pulled or delivered (or the export ends): the stream
    /// waits on it.
    hold: Option<Gate>,
}

impl Drop for DeviceRange {
    fn drop(&mut self) {
        // The stream goes on first, before any driver call here: a request thread may be
        // blocked in the driver, its queue full of work behind this very gate, and a driver
        // call (destroying the `ready` event) could wait for that thread.
        drop(self.hold.take());
        let Some(ring) = self.ring.take() else {
            return;
        };
        ring.let_go();
        // Usually the stream has read every chunk by now; else it is waited for on a thread
        // of its own (whoever drops an export may hold the registry's lock).
        if !ring.drained() {
            let _ = std::thread::Builder::new()
                .name("rgpu-fabric-drain".into())
                .spawn(move || drop(ring));
        }
    }
}

impl Source for DeviceRange {
    fn ready(&self) -> Result<bool, String> {
        // SAFETY: an event this export owns.
        match unsafe { cu_call!(self.at.backend.driver, cuEventQuery(self.ready.raw())) } {
            0 => Ok(true),
            s if s == cudaError_enum::CUDA_ERROR_NOT_READY as u32 => Ok(false),
            s => Err(format!("the exporting stream failed: CUDA error {s}")),
        }
    }

    fn read(&self, offset: u64, len: u64, send: crate::fabric::Send) -> Result<(), String> {
        if let Some(ring) = &self.ring {
            return ring.send(offset, len, send);
        }
        with_transfer_stream(&self.at, |stream, events| {
            self.read_on(stream, events, offset, len, send)
        })
    }
    fn handle(&self) -> Option<(Vec<u8>, u64)> {
        self.shared.clone()
    }
}

/// A landing (`LandRange`): device memory another server on this machine copies into through
/// the allocation's IPC handle, or, should it not, that this server fills by pulling the other
/// server's export of the bytes.
struct LandingRange {
    shared: Option<(Vec<u8>, u64)>,
    /// The pull, started at most once.
    pull_instead: Mutex<Option<LandingPull>>,
}

type LandingPull = Box<dyn FnOnce() -> Result<(), String> + std::marker::Send>;

impl Source for LandingRange {
    fn ready(&self) -> Result<bool, String> {
        Ok(true)
    }

    fn read(&self, _: u64, _: u64, _: crate::fabric::Send) -> Result<(), String> {
        Err("a landing is written, not read".into())
    }

    fn handle(&self) -> Option<(Vec<u8>, u64)> {
        self.shared.clone()
    }

    fn readable(&self) -> bool {
        false
    }

    fn pull_instead(&self) -> Result<(), String> {
        let pull = self
            .pull_instead
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        pull.ok_or("the landing's pull started already")?()
    }
}

/// The IPC handle of the allocation holding `ptr` and `ptr`'s offset in it (`None` where the
/// driver gives none: memory it cannot share between processes, such as pool memory).
fn ipc_handle_of(driver: &rgpu_cuda_api::native::Driver, ptr: DevicePtr) -> Option<(Vec<u8>, u64)> {
    let (mut base, mut len) = (0u64, 0usize);
    // SAFETY: local out-values; the driver checks the address.
    check(unsafe { cu_call!(driver, cuMemGetAddressRange_v2(&mut base, &mut len, ptr)) }).ok()?;
    // SAFETY: plain bytes, valid zeroed.
    let mut handle: CUipcMemHandle = unsafe { std::mem::zeroed() };
    // SAFETY: a local out-struct and the allocation's base.
    check(unsafe { cu_call!(driver, cuIpcGetMemHandle(&mut handle, base)) }).ok()?;
    Some((handle.reserved.map(|b| b as u8).to_vec(), ptr - base))
}

impl DeviceRange {
    /// [`Source::read`] on a transfer stream: the device copy of chunk k+1 into one buffer
    /// overlaps the sending of chunk k from the other.
    fn read_on(
        &self,
        stream: &OwnStream,
        events: &[OwnEvent; 2],
        offset: u64,
        len: u64,
        send: crate::fabric::Send,
    ) -> Result<(), String> {
        let cuda = |s: Status| format!("CUDA error {s}");
        let chunks = len.div_ceil(CHUNK as u64) as usize;
        let mut slots: Vec<(ChunkBuffer, &OwnEvent)> = Vec::new();
        for event in events.iter().take(chunks.min(2)) {
            slots.push((self.memory.buffer()?, event));
        }
        let piece = |k: usize| {
            let at = k as u64 * CHUNK as u64;
            (at, (len - at).min(CHUNK as u64) as usize)
        };
        let issue = |k: usize, (buffer, done): &(ChunkBuffer, &OwnEvent)| {
            let (at, n) = piece(k);
            let src = self.ptr + offset + at;
            // SAFETY: a page-locked buffer of CHUNK bytes this transfer holds, and a stream of
            // the exporting context; the driver checks the device range.
            check(unsafe {
                cu_call!(
                    self.at.backend.driver,
                    cuMemcpyDtoHAsync_v2(buffer.ptr().cast(), src, n, stream.raw())
                )
            })
            .map_err(cuda)?;
            done.record(stream)
        };
        issue(0, &slots[0])?;
        for k in 0..chunks {
            // The other buffer was sent in the previous step: fill it while this one goes.
            if k + 1 < chunks {
                issue(k + 1, &slots[(k + 1) % 2])?;
            }
            let (buffer, done) = &slots[k % 2];
            done.synchronize()?;
            send(buffer.bytes(piece(k).1))?;
        }
        Ok(())
    }
}

/// A pull into device memory whose device copies are *in the pulling stream*, enqueued when
/// the pull is requested, each behind a wait for what it copies: the bytes landing in a
/// page-locked buffer, or (IPC) the export being ready (see fabric_ring.rs for why).
struct InStreamPull(Landing);

/// Where an [`InStreamPull`]'s bytes come from.
enum Landing {
    /// An event's completion (no bytes): the stream waits until the export is ready.
    Event(Gate),
    /// Bytes over the network, through chunk buffers.
    Staged(Ring),
    /// A device-to-device copy from the exporter's allocation, mapped in this context: the
    /// stream waits for `ready`, copies, and counts `done`.
    Mapped { ready: Counter, done: Counter },
    /// Finished.
    Done,
}

impl InStreamPull {
    /// A pull of an event's completion: `stream` waits until the pull has finished.
    fn event(memory: &Arc<FabricMemory>, at: &InContext, stream: CUstream) -> Result<Self, Status> {
        Ok(InStreamPull(Landing::Event(
            memory.hold(&at.backend, stream)?,
        )))
    }

    /// A pull of `size` bytes into `dst`, enqueued on `stream`: from the exporter's allocation
    /// mapped at `mapped`, else over the network in `plan`'s parts.
    fn enqueue(
        memory: &Arc<FabricMemory>,
        at: &InContext,
        stream: CUstream,
        dst: DevicePtr,
        size: u64,
        mapped: Option<DevicePtr>,
    ) -> (Self, Result<(), Status>) {
        let backend = &at.backend;
        let Some(src) = mapped else {
            let ring = match Ring::new(
                memory,
                Direction::ToDevice,
                &rgpu_transport::peer::plan(size),
            ) {
                Ok(ring) => ring,
                Err(s) => return (InStreamPull(Landing::Done), Err(s)),
            };
            let enqueued = ring.enqueue(backend, stream, dst);
            return (InStreamPull(Landing::Staged(ring)), enqueued);
        };
        let (ready, done) = match (memory.counter(), memory.counter()) {
            (Ok(ready), Ok(done)) => (ready, done),
            (Err(s), _) | (_, Err(s)) => return (InStreamPull(Landing::Done), Err(s)),
        };
        let enqueued = ready.wait_on(backend, stream, 1).and_then(|()| {
            // SAFETY: a stream of the current context; the driver checks both ranges.
            check(unsafe {
                cu_call!(
                    backend.driver,
                    cuMemcpyDtoDAsync_v2(dst, src, size as usize, stream)
                )
            })?;
            done.write_on(backend, stream, 1)
        });
        (InStreamPull(Landing::Mapped { ready, done }), enqueued)
    }

    /// Lets the stream go on past every wait (after a failure, with whatever the device holds)
    /// and waits until it is done with the pull's buffers: whether the stream got there.
    fn finish(&mut self) -> bool {
        match std::mem::replace(&mut self.0, Landing::Done) {
            Landing::Event(gate) => drop(gate),
            Landing::Staged(mut ring) => return ring.finish(),
            Landing::Mapped { ready, done } => {
                drop(ready);
                if !wait_until(DRAIN_WAIT, || done.reached(1)) {
                    // The stream may still write it.
                    done.leak();
                    return false;
                }
            }
            Landing::Done => {}
        }
        true
    }

    /// Lets a mapped pull's copy start (the export is ready).
    fn release(&self) {
        if let Landing::Mapped { ready, .. } = &self.0 {
            ready.set(1);
        }
    }

    /// Whether a released mapped pull's copy finished within the time the exporter waits for
    /// it (it may reuse its memory after hearing of it).
    fn copied(&self) -> bool {
        let Landing::Mapped { done, .. } = &self.0 else {
            return false;
        };
        let copied = wait_until(PEER_TIMEOUT, || done.reached(1));
        if !copied {
            log::warn!("an IPC copy did not finish in time");
        }
        copied
    }
}

impl Drop for InStreamPull {
    fn drop(&mut self) {
        self.finish();
    }
}

impl PullSink for InStreamPull {
    fn part(&self, offset: u64, len: u64, receive: Receive) -> Result<(), String> {
        match &self.0 {
            Landing::Staged(ring) => ring.receive(offset, len, receive),
            // An event: nothing to receive.
            Landing::Event(_) if len == 0 => Ok(()),
            _ => Err("this pull copies through an IPC handle only".into()),
        }
    }
}

/// The address where another process's allocation (named by its IPC handle) is mapped in
/// this context, mapping it the first time. Mappings stay open for later transfers (opening
/// one costs far more than a small copy) until the session ends; an allocation made anew has
/// a new handle, so a mapping never stands for another allocation.
fn ipc_mapping(at: &InContext, handle: &[u8]) -> Result<DevicePtr, String> {
    type Mappings = Mutex<HashMap<(usize, Vec<u8>), DevicePtr>>;
    static MAPPINGS: OnceLock<Mappings> = OnceLock::new();
    let mappings = MAPPINGS.get_or_init(Mappings::default);
    let key = (at.ctx, handle.to_vec());
    let mut held = mappings.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&base) = held.get(&key) {
        return Ok(base);
    }
    if held.len() >= IPC_MAPPINGS {
        // Closing a mapping may wait for the device, which may be waiting for this pull: no
        // mapping is closed before the session ends; past the limit, the bytes are pulled.
        return Err("too many IPC mappings open".into());
    }
    let raw: [u8; 64] = handle.try_into().map_err(|_| "not an IPC handle")?;
    let handle = CUipcMemHandle {
        reserved: raw.map(|b| b as std::ffi::c_char),
    };
    let mut base = 0u64;
    let lazy = CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
    let driver = &at.backend.driver;
    // SAFETY: a handle by value and a local out-value; the driver checks the handle.
    check(unsafe { cu_call!(driver, cuIpcOpenMemHandle_v2(&mut base, handle, lazy)) })
        .map_err(|s| format!("CUDA error {s} opening an IPC handle"))?;
    held.insert(key, base);
    Ok(base)
}

impl Served<'_> {
    /// The current context (entered for `ctx`), the fabric memory and the raw `stream`.
    fn fabric_setup(
        &mut self,
        ctx: Id,
        stream: Id,
    ) -> Result<(InContext, Arc<FabricMemory>, CUstream), Status> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx)?;
        let memory = fabric_memory(&cuda.backend)?;
        let at = InContext {
            backend: cuda.backend.clone(),
            ctx: cuda.current as usize,
        };
        Ok((at, memory, cuda.stream(stream)?))
    }

    fn add_export(
        &mut self,
        ticket: LaneKey,
        size: u64,
        source: Box<dyn Source>,
        awaits_delivery: bool,
    ) -> Answer<()> {
        let session = &self.session;
        session
            .shared
            .fabric
            .add(session.id, ticket, size, source, awaits_delivery)
            .map_err(|e| {
                log::warn!("session {}: {e}", session.id);
                INVALID_VALUE
            })
    }
}

/// Streams of the fabric's own, per context, for pulls that the exporter's stream orders:
/// nothing of the program's runs on them, and a pull takes one no other pull is using, so that
/// pulls from different streams or servers do not wait for one another (their order is the
/// exporters' own). At most [`OWN_STREAMS`] per context; past that, pulls share the least used.
type OwnStreams = Mutex<HashMap<usize, Vec<(OwnStream, Arc<AtomicUsize>)>>>;

/// The fabric's own streams per context.
const OWN_STREAMS: usize = 8;

/// A stream of the fabric's own in `at`'s context for one pull, and the lease that counts the
/// pull as its user until dropped.
fn own_stream(at: &InContext) -> Result<(CUstream, StreamLease), Status> {
    static STREAMS: OnceLock<OwnStreams> = OnceLock::new();
    let mut streams = STREAMS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let kept = streams.entry(at.ctx).or_default();
    let least = kept
        .iter()
        .min_by_key(|(_, users)| users.load(Ordering::SeqCst));
    let take = match least {
        Some((stream, users)) if users.load(Ordering::SeqCst) == 0 || kept.len() >= OWN_STREAMS => {
            Some((stream.raw(), users.clone()))
        }
        _ => None,
    };
    let (raw, users) = match take {
        Some(taken) => taken,
        None => {
            let stream = at.stream()?;
            let users = Arc::new(AtomicUsize::new(0));
            let raw = stream.raw();
            kept.push((stream, users.clone()));
            (raw, users)
        }
    };
    users.fetch_add(1, Ordering::SeqCst);
    Ok((raw, StreamLease(users)))
}

/// A pull's use of one of the fabric's own streams, ended when dropped (after the pull has
/// finished with it).
struct StreamLease(Arc<AtomicUsize>);

impl Drop for StreamLease {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl serve::Peers for Served<'_> {
    fn export_range(
        &mut self,
        ctx: Id,
        stream: Id,
        ptr: DevicePtr,
        size: u64,
        ticket: LaneKey,
        keep: ExportKeep,
    ) -> Answer<()> {
        let (at, memory, stream) = self.fabric_setup(ctx, stream)?;
        // Before any gate below: see `DeviceRange::shared`.
        let shared = (size > 0 && keep != ExportKeep::Staged)
            .then(|| ipc_handle_of(&at.backend.driver, ptr))
            .flatten();
        // A range to be copied through its handle that has none (pool memory) is staged.
        let keep = match keep {
            ExportKeep::Hold if shared.is_none() && size > 0 => ExportKeep::Staged,
            keep => keep,
        };
        let ready = at.event_on(stream)?;
        let ring = match keep {
            ExportKeep::Staged if size > 0 => {
                let plan = rgpu_transport::peer::plan(size);
                let mut ring = Ring::new(&memory, Direction::FromDevice, &plan)?;
                if let Err(s) = ring.enqueue(&at.backend, stream, ptr) {
                    // Let the stream past what was enqueued, off this thread (it may wait).
                    let _ = self.session.shared.fabric.run(Box::new(move || {
                        ring.finish();
                    }));
                    return Err(s);
                }
                Some(ring)
            }
            _ => None,
        };
        let awaits_delivery = keep != ExportKeep::Unguarded;
        let hold = match awaits_delivery {
            true => Some(memory.hold(&at.backend, stream)?),
            false => None,
        };
        let range = DeviceRange {
            at,
            ptr,
            ready,
            memory,
            shared,
            ring,
            hold,
        };
        self.add_export(ticket, size, Box::new(range), awaits_delivery)
    }

    fn export_event(&mut self, ctx: Id, event: Id, ticket: LaneKey) -> Answer<()> {
        let (at, memory, _) = self.fabric_setup(ctx, 0)?;
        let event = self.cuda.event(event)?;
        // The event as recorded now: a stream of ours waits for it, then records our own.
        let waiter = at.stream()?;
        // SAFETY: a stream we own and the session's event.
        check(unsafe { cu_call!(at.backend.driver, cuStreamWaitEvent(waiter.raw(), event, 0)) })?;
        let ready = at.event_on(waiter.raw())?;
        let range = DeviceRange {
            at,
            ptr: 0,
            ready,
            memory,
            shared: None,
            ring: None,
            hold: None,
        };
        self.add_export(ticket, 0, Box::new(range), false)
    }

    fn unexport(&mut self, ticket: LaneKey) -> Answer<()> {
        self.session.shared.fabric.remove(self.session.id, &ticket);
        Ok(())
    }

    fn pull_range(
        &mut self,
        ctx: Id,
        stream: Option<Id>,
        dst: DevicePtr,
        size: u64,
        from: PeerExport,
        ipc: bool,
    ) -> Answer<()> {
        let pull = RangePull {
            stream,
            dst,
            size,
            from,
            ipc,
        };
        self.pull(ctx, pull, None)
    }

    fn land_range(
        &mut self,
        ctx: Id,
        dst: DevicePtr,
        size: u64,
        ticket: LaneKey,
        from: PeerExport,
        ipc: bool,
    ) -> Answer<()> {
        let (at, memory, _) = self.fabric_setup(ctx, 0)?;
        let shared = (size > 0)
            .then(|| ipc_handle_of(&at.backend.driver, dst))
            .flatten();
        let puller = self.puller();
        let pull = RangePull {
            stream: None,
            dst,
            size,
            from,
            ipc,
        };
        let pull_instead: LandingPull = Box::new(move || {
            at.enter()?;
            puller
                .start(&at, &memory, None, pull, None)
                .map_err(|s| format!("CUDA error {s} starting the pull"))
        });
        let landing = LandingRange {
            shared,
            pull_instead: Mutex::new(Some(pull_instead)),
        };
        // Ended by the pusher's word: copied (`Delivered`), or pull instead.
        self.add_export(ticket, size, Box::new(landing), true)
    }

    fn push_range(
        &mut self,
        ctx: Id,
        stream: Id,
        src: DevicePtr,
        size: u64,
        to: PeerExport,
        ticket: LaneKey,
    ) -> Answer<()> {
        let (at, _, raw_stream) = self.fabric_setup(ctx, stream)?;
        let links = self.links()?;
        let pushed = push_by_ipc(&at, raw_stream, src, size, links, &to);
        let id = self.session.id;
        let shared = self.session.shared.clone();
        let tell: crate::fabric::Job = match pushed {
            // The landing ends: told in the background, as nothing waits for it.
            Ok(()) => Box::new(move || {
                if let Err(e) = fabric_links(&shared).and_then(|links| links.delivered(&to)) {
                    log::debug!("session {id}: telling of a push: {e}");
                }
            }),
            Err(e) => {
                // As a copy the destination pulls: the range exported under the pusher's
                // ticket, held on the stream until the bytes have landed.
                log::debug!("session {id}: no IPC push ({e}); the destination pulls");
                self.export_range(ctx, stream, src, size, ticket, ExportKeep::Hold)?;
                Box::new(move || {
                    let told = fabric_links(&shared).and_then(|links| links.pull_instead(&to));
                    if let Err(e) = told {
                        log::warn!("session {id}: the destination of a copy: {e}");
                    }
                })
            }
        };
        self.session.shared.fabric.run(tell).map_err(|e| {
            log::warn!("session {id}: {e}");
            PULL_FAILED
        })
    }

    fn pull_ranges(&mut self, ctx: Id, pulls: Vec<RangePull>) -> Answer<()> {
        // The IPC handles first, all together: each exporter answers its lot in one round trip.
        let wanted: Vec<&PeerExport> = pulls
            .iter()
            .filter(|p| p.ipc && p.size > 0)
            .map(|p| &p.from)
            .collect();
        let mut handles = match wanted.is_empty() {
            true => Vec::new(),
            false => self.links()?.handles(&wanted),
        }
        .into_iter();
        let mut first_failure = Ok(());
        for pull in pulls {
            let handle = (pull.ipc && pull.size > 0)
                .then(|| handles.next().unwrap_or_else(|| Err("no answer".into())));
            let pulled = self.pull(ctx, pull, Some(handle));
            if first_failure.is_ok() {
                first_failure = pulled;
            }
        }
        first_failure
    }
}

/// Copies `size` bytes at `src` into the landing `to` through its allocation's IPC handle
/// (mapped in `at`'s context, current here), in `stream`'s order.
fn push_by_ipc(
    at: &InContext,
    stream: CUstream,
    src: DevicePtr,
    size: u64,
    links: &Links,
    to: &PeerExport,
) -> Result<(), String> {
    let answer = links.handles(&[to]).pop();
    let landing = answer
        .unwrap_or_else(|| Err("no answer".into()))?
        .ok_or("the destination has no IPC handle to share")?;
    let dst = ipc_mapping(at, &landing.handle)? + landing.offset;
    // SAFETY: a stream of the current context; the driver checks both ranges.
    check(unsafe {
        cu_call!(
            at.backend.driver,
            cuMemcpyDtoDAsync_v2(dst, src, size as usize, stream)
        )
    })
    .map_err(|s| format!("CUDA error {s} copying"))
}

/// How long an IPC pull keeps its exporter waiting, with the copy ready to go, for the earlier
/// work of its stream (the exporter waits at most `PEER_TIMEOUT` for the copy's end). A stream
/// busy for longer lets the exporter go, and asks again once its work is done.
const EARLY_SHARE: Duration = Duration::from_secs(5);

/// This process's links to other servers.
pub(super) fn fabric_links(shared: &crate::shared::Shared) -> Result<&Links, String> {
    shared.fabric.links(shared.token.as_ref())
}

/// What a pull needs of its session, on any thread: a landing's pull starts on a fabric link's
/// thread.
struct Puller {
    session: u64,
    shared: Arc<crate::shared::Shared>,
    /// Where a failure waits for the session's next synchronizing request.
    failure: Arc<Mutex<Option<Status>>>,
}

impl Served<'_> {
    fn puller(&self) -> Puller {
        Puller {
            session: self.session.id,
            shared: self.session.shared.clone(),
            failure: self.cuda.fabric_failure.clone(),
        }
    }

    /// This process's links to other servers.
    fn links(&self) -> Result<&Links, Status> {
        fabric_links(&self.session.shared).map_err(|e| {
            log::warn!("session {}: {e}", self.session.id);
            PULL_FAILED
        })
    }

    /// Fills `pull.dst` with another server's export, in its stream's order, pulled in the
    /// background (see `serve::Peers::pull_range`). `handle`: the exporter's answer about the
    /// allocation's IPC handle, where the caller asked already (`Some(None)`: the pull does
    /// not copy by IPC); else it is asked for here when the pull is by IPC.
    fn pull(
        &mut self,
        ctx: Id,
        pull: RangePull,
        handle: Option<Option<HandleAnswer>>,
    ) -> Answer<()> {
        let (at, memory, program_stream) = self.fabric_setup(ctx, pull.stream.unwrap_or(0))?;
        let program_stream = pull.stream.map(|_| program_stream);
        self.puller()
            .start(&at, &memory, program_stream, pull, handle)
    }
}

impl Puller {
    fn links(&self) -> Result<&Links, String> {
        fabric_links(&self.shared)
    }

    /// Starts a pull into `at`'s context (current on this thread) in `program_stream`'s order
    /// (`None`: on a stream of the fabric's own; `pull.stream` is not looked at): see
    /// `Served::pull`.
    fn start(
        self,
        at: &InContext,
        memory: &Arc<FabricMemory>,
        program_stream: Option<CUstream>,
        pull: RangePull,
        handle: Option<Option<HandleAnswer>>,
    ) -> Answer<()> {
        let RangePull {
            dst,
            size,
            from,
            ipc,
            ..
        } = pull;
        let (stream, lease) = match program_stream {
            Some(stream) => (stream, None),
            None => {
                let (stream, lease) = own_stream(at)?;
                (stream, Some(lease))
            }
        };
        let id = self.session;
        let links = self.links().map_err(|e| {
            log::warn!("session {id}: {e}");
            PULL_FAILED
        })?;
        let earlier = at.event_on(stream)?;
        // On one machine: the exporter's allocation, mapped now so that the copy can take its
        // place in the stream (the handle costs one round trip to the exporter, unless the
        // caller asked for it with others; the mapping is kept).
        let handle = match handle {
            Some(given) => given,
            None => (ipc && size > 0).then(|| {
                links
                    .handles(&[&from])
                    .pop()
                    .unwrap_or_else(|| Err("no answer".into()))
            }),
        };
        // With whether the export was ready (and used up) when its handle came.
        let mapped = match handle {
            Some(Ok(Some(shared))) => ipc_mapping(at, &shared.handle)
                .map(|base| (base + shared.offset, shared.ready))
                .map_err(|e| log::debug!("session {id}: no IPC copy ({e})"))
                .ok(),
            Some(Ok(None)) | None => None,
            Some(Err(e)) => {
                log::debug!("session {id}: no IPC handle ({e})");
                None
            }
        };
        let (pull, enqueued) = match size {
            0 => (InStreamPull::event(memory, at, stream)?, Ok(())),
            _ => InStreamPull::enqueue(memory, at, stream, dst, size, mapped.map(|m| m.0)),
        };
        let enqueued =
            enqueued.map_err(|s| format!("CUDA error {s} ordering the pull in its stream"));
        let order = (at.ctx, stream as usize);
        let fabric = self.shared.fabric.clone();
        let work = PullWork {
            puller: self,
            from,
            size,
            pull,
            lease,
            order,
        };
        let job: crate::fabric::Job = match mapped {
            Some((_, true)) => {
                // Nothing to ask the exporter: the stream may copy as soon as it gets there.
                work.pull.release();
                Box::new(move || work.copy_ready(enqueued))
            }
            Some((_, false)) => Box::new(move || work.share(enqueued, earlier)),
            None => Box::new(move || work.transfer(enqueued, earlier)),
        };
        // One after another with the stream's other pulls, as the device runs them.
        fabric.run_in_order(order, job).map_err(|e| {
            log::warn!("session {id}: {e}");
            PULL_FAILED
        })
    }
}

/// A pull's background work, after its request has ordered it in its stream.
struct PullWork {
    puller: Puller,
    from: PeerExport,
    size: u64,
    pull: InStreamPull,
    /// The fabric's own stream the pull runs on, if it is one.
    lease: Option<StreamLease>,
    order: crate::fabric::Order,
}

impl PullWork {
    fn links(&self) -> Result<&Links, String> {
        self.puller.links()
    }

    /// Pulls the bytes over the network (or, for a pull of an event, waits for it), after the
    /// stream's earlier work.
    fn transfer(mut self, enqueued: Result<(), String>, earlier: OwnEvent) {
        let (id, size) = (self.puller.session, self.size);
        let pulled = enqueued
            .and_then(|()| {
                log::debug!("session {id}: pull of {size} bytes waits for its stream");
                earlier.synchronize()
            })
            .and_then(|()| {
                log::debug!(
                    "session {id}: pulling {size} bytes from {}",
                    self.from.endpoint
                );
                self.links()?.pull(&self.from, size, &self.pull)
            });
        let on_device = self.finish();
        log::debug!("session {id}: pull of {size} bytes ended: {pulled:?}");
        match pulled {
            // An exporting stream may wait for this.
            Ok(()) if on_device && size > 0 => self.tell_delivered(),
            Ok(()) => {}
            Err(e) => self.failed(e),
        }
    }

    /// Copies through the exporter's allocation, mapped in this context: once the exporter
    /// says its range is ready *and* the stream's earlier work is done, the stream may copy
    /// (its wait opens). The copy's end is then waited for, and told to the exporter, by a job
    /// of its own, so that the stream's next pull asks for its export meanwhile: a stream of
    /// back-to-back copies goes from one to the next without a round trip between them.
    fn share(mut self, enqueued: Result<(), String>, earlier: OwnEvent) {
        let id = self.puller.session;
        let asked = enqueued.and_then(|()| {
            let links = self.links()?;
            let Some((sharing, _)) = links.share(&self.from)? else {
                return Err("the exporter would not share it".into());
            };
            if wait_until(EARLY_SHARE, || earlier.completed()) {
                return Ok(sharing);
            }
            // Its stream is still busy: let the exporter go until it is done.
            sharing.end(links, false)?;
            earlier.synchronize()?;
            match links.share(&self.from)? {
                Some((sharing, _)) => Ok(sharing),
                None => Err("the exporter would not share it".into()),
            }
        });
        let sharing = match asked {
            Ok(sharing) => sharing,
            Err(e) => {
                self.finish();
                return self.failed(e);
            }
        };
        self.pull.release();
        let fabric = self.puller.shared.fabric.clone();
        let end_order = (self.order.0, !self.order.1);
        let ended = fabric.run_in_order(
            end_order,
            Box::new(move || {
                let copied = self.pull.copied();
                let told = self
                    .links()
                    .and_then(|links| sharing.end(links, copied));
                let on_device = self.finish();
                log::debug!(
                    "session {id}: IPC copy of {} bytes ended (copied {copied}, on the device {on_device}): {told:?}",
                    self.size
                );
                if !copied {
                    self.failed("the IPC copy did not finish in time".into());
                }
            }),
        );
        if let Err(e) = ended {
            log::warn!("session {id}: {e}");
        }
    }

    /// Copies through the exporter's allocation, mapped in this context, of an export that was
    /// ready (and used up) when its handle came: the stream copies as soon as it gets there
    /// (its wait is open); this waits for the copy's end to give the stream back.
    fn copy_ready(mut self, enqueued: Result<(), String>) {
        if let Err(e) = enqueued {
            self.finish();
            return self.failed(e);
        }
        let copied = self.pull.copied();
        self.finish();
        if !copied {
            self.failed("the IPC copy did not finish in time".into());
        }
    }

    /// Lets the stream go on past the pull (with whatever its device memory holds after a
    /// failure) and gives its stream back: whether the stream reached the pull's copies.
    fn finish(&mut self) -> bool {
        let on_device = self.pull.finish();
        // Another pull may take the stream, if it was one of ours; not if the stream never
        // got to the pull's copies (they may still run).
        match self.lease.take() {
            Some(lease) if on_device => drop(lease),
            Some(lease) => std::mem::forget(lease),
            None => {}
        }
        on_device
    }

    /// Tells the exporter the bytes are on this device.
    fn tell_delivered(&self) {
        if let Err(e) = self.links().and_then(|links| links.delivered(&self.from)) {
            log::debug!(
                "session {}: telling of a delivery: {e}",
                self.puller.session
            );
        }
    }

    /// Reports a failed pull: an exporting stream held for it goes on (rather than when the
    /// export expires), and the session's next synchronizing request reports the failure.
    fn failed(&self, e: String) {
        log::warn!(
            "session {}: pulling from {}: {e}",
            self.puller.session,
            self.from.endpoint
        );
        if self.size > 0 {
            let _ = self.links().and_then(|links| links.delivered(&self.from));
        }
        self.puller
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(PULL_FAILED);
    }
}
