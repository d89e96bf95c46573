//! A session's completion thread: sends what the device finishes while the request thread goes
//! on reading requests.
//!
//! It is driven by event callbacks, not by blocking waits: each watched native event wakes the
//! thread when it completes, and the thread then sends whatever is ready. So a read that waits
//! on a user event never holds up another read's data, a `WaitForEvents` on a user event never
//! holds up the request thread (which must stay free to receive the `SetUserEventStatus` that
//! ends the wait), and the implementation's callback threads never block on the socket.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::TryRecvError;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use rgpu_cl_api::sys;
use rgpu_protocol::opencl::{Answer, ClReply, Id};
use rgpu_protocol::ServerMsg;

use crate::opencl::answer;
use crate::opencl::native::{Event, InFlight, Waker};
use crate::opencl::session::Unreported;
use crate::opencl::staging::StagingBuf;
use crate::writer::Writer;
use std::time::Instant;

pub enum Job {
    /// A chunk of the read with this seq, `len` bytes at `offset` of the read's data.
    ReadChunk {
        seq: u64,
        offset: u64,
        len: usize,
        transfer: InFlight<StagingBuf>,
    },
    /// No more chunks for the read; `status` is its final status if every chunk succeeds
    /// (CL_SUCCESS, an enqueue error, or a deferred error).
    ReadEnd { seq: u64, status: i32 },
    /// Reply to the `WaitForEvents` with this seq once all `events` are complete:
    /// `status` if none failed (CL_SUCCESS or a deferred error).
    Wait {
        seq: u64,
        events: Vec<Event>,
        status: i32,
        /// When the request began, if its reply is to come after a `Timing` frame.
        timed_from: Option<Instant>,
    },
    /// Reply `status` to the `Finish` with this seq once `marker` (enqueued after
    /// everything the queue holds) is complete; failed commands do not make `Finish` fail.
    Finish {
        seq: u64,
        marker: Event,
        status: i32,
        /// As for `Wait`.
        timed_from: Option<Instant>,
    },
    /// Send `EventStatus` (from a `NotifyEvent` callback).
    Notify { event: Id, status: i32 },
    /// A watched event completed.
    Wake,
    /// Finish what is pending, then stop.
    Shutdown,
}

/// The handle the request thread keeps.
pub struct Completion {
    tx: Sender<Job>,
    thread: Option<JoinHandle<()>>,
}

impl Completion {
    pub fn start(
        session_id: u64,
        writer: Arc<Writer>,
        pending_user_events: Arc<AtomicUsize>,
        unreported: Unreported,
    ) -> Completion {
        let (tx, rx) = mpsc::channel();
        let waker_tx = tx.clone();
        let thread = std::thread::Builder::new()
            .name(format!("rgpu-s{session_id}-completion"))
            .spawn(move || run(rx, waker_tx, writer, pending_user_events, unreported))
            .map_err(|e| log::error!("cannot start a completion thread: {e}"))
            .ok();
        Completion { tx, thread }
    }

    pub fn send(&self, job: Job) {
        // Fails only after the thread is gone (session ending); nothing is left to send then.
        let _ = self.tx.send(job);
    }

    /// Wakes the completion thread when called (for native event callbacks).
    pub fn waker(&self) -> Waker {
        waker(self.tx.clone())
    }

    /// A sender for callbacks that report to the client (NotifyEvent).
    pub fn sender(&self) -> Sender<Job> {
        self.tx.clone()
    }

    /// Lets pending work finish (every watched event must complete) and joins the thread.
    pub fn shutdown(mut self) {
        let _ = self.tx.send(Job::Shutdown);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn waker(tx: Sender<Job>) -> Waker {
    Arc::new(move || {
        let _ = tx.send(Job::Wake);
    })
}

struct ReadTask {
    seq: u64,
    chunks: VecDeque<(u64, usize, InFlight<StagingBuf>)>,
    end: Option<i32>,
    failed: Option<i32>,
}

struct WaitTask {
    seq: u64,
    /// The reply of the request waiting (`Finish` or `WaitForEvents`), from its outcome.
    reply: fn(Answer<()>) -> ClReply,
    slots: Vec<Arc<Mutex<Option<i32>>>>,
    status: i32,
    ignore_failures: bool,
    /// Kept until the reply (also for their final status).
    events: Vec<Event>,
    timed_from: Option<Instant>,
}

struct State {
    writer: Arc<Writer>,
    waker: Waker,
    reads: Vec<ReadTask>,
    waits: Vec<WaitTask>,
    /// Stop sending once the connection failed; keep draining so buffers come back.
    broken: bool,
    pending_user_events: Arc<AtomicUsize>,
    /// Told before each wait's reply (see [`Unreported`]).
    unreported: Unreported,
}

fn run(
    rx: Receiver<Job>,
    tx: Sender<Job>,
    writer: Arc<Writer>,
    pending_user_events: Arc<AtomicUsize>,
    unreported: Unreported,
) {
    let mut state = State {
        writer,
        waker: waker(tx),
        reads: Vec::new(),
        waits: Vec::new(),
        broken: false,
        pending_user_events,
        unreported,
    };
    let mut shutting_down = false;
    loop {
        let job = match state.blocking_target() {
            // Nothing can wait on the client: wait for the device directly, which answers
            // far sooner than completion callbacks are delivered (PoCL: ~100 us later).
            Some(event) => {
                event.wait_fast();
                match rx.try_recv() {
                    Ok(job) => Some(job),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => break,
                }
            }
            None => match rx.recv() {
                Ok(job) => Some(job),
                Err(_) => break,
            },
        };
        if let Some(job) = job {
            shutting_down |= state.apply(job);
        }
        while let Ok(job) = rx.try_recv() {
            shutting_down |= state.apply(job);
        }
        state.progress();
        if shutting_down && state.reads.is_empty() && state.waits.is_empty() {
            break;
        }
    }
}

impl State {
    /// Takes in a job; true for Shutdown.
    fn apply(&mut self, job: Job) -> bool {
        match job {
            Job::ReadChunk {
                seq,
                offset,
                len,
                transfer,
            } => self
                .read_task(seq)
                .chunks
                .push_back((offset, len, transfer)),
            Job::ReadEnd { seq, status } => self.read_task(seq).end = Some(status),
            Job::Wait {
                seq,
                events,
                status,
                timed_from,
            } => {
                let slots = events.iter().map(|e| self.watch(e)).collect();
                self.waits.push(WaitTask {
                    seq,
                    reply: ClReply::WaitForEvents,
                    slots,
                    status,
                    ignore_failures: false,
                    events,
                    timed_from,
                });
            }
            Job::Finish {
                seq,
                marker,
                status,
                timed_from,
            } => {
                let slots = vec![self.watch(&marker)];
                self.waits.push(WaitTask {
                    seq,
                    reply: ClReply::Finish,
                    slots,
                    status,
                    ignore_failures: true,
                    events: vec![marker],
                    timed_from,
                });
            }
            Job::Notify { event, status } => {
                self.send(&ServerMsg::EventStatus { event, status }, 0, &[]);
            }
            Job::Wake => {}
            Job::Shutdown => return true,
        }
        false
    }

    /// The first event pending work waits for, when blocking on it cannot deadlock: no user
    /// event is outstanding, so no device work can be waiting for a later client request.
    fn blocking_target(&self) -> Option<Event> {
        if self.pending_user_events.load(Ordering::SeqCst) != 0 {
            return None;
        }
        let head_chunk = self
            .reads
            .iter()
            .filter_map(|r| r.chunks.front())
            .map(|(_, _, transfer)| transfer.event())
            .next();
        let waited = || {
            self.waits.iter().flat_map(|w| {
                w.slots
                    .iter()
                    .zip(&w.events)
                    .filter(|(slot, _)| slot.lock().unwrap_or_else(|e| e.into_inner()).is_none())
                    .map(|(_, event)| event)
            })
        };
        head_chunk
            .or_else(|| waited().next())
            .filter(|event| event.status().is_ok_and(|s| s > sys::CL_COMPLETE))
            .cloned()
    }

    fn read_task(&mut self, seq: u64) -> &mut ReadTask {
        if let Some(i) = self.reads.iter().position(|t| t.seq == seq) {
            return &mut self.reads[i];
        }
        self.reads.push(ReadTask {
            seq,
            chunks: VecDeque::new(),
            end: None,
            failed: None,
        });
        self.reads.last_mut().expect("just pushed")
    }

    /// A slot that the event's completion callback fills with its status.
    fn watch(&self, event: &Event) -> Arc<Mutex<Option<i32>>> {
        let slot = Arc::new(Mutex::new(None));
        let filled = slot.clone();
        let waker = self.waker.clone();
        let registered = event.on_status(
            sys::CL_COMPLETE,
            Box::new(move |status| {
                *filled.lock().unwrap_or_else(|e| e.into_inner()) = Some(status);
                waker();
            }),
        );
        if let Err(e) = registered {
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
        }
        slot
    }

    fn progress(&mut self) {
        let mut i = 0;
        while i < self.reads.len() {
            if self.progress_read(i) {
                self.reads.remove(i);
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.waits.len() {
            let task = &self.waits[i];
            // A slot is filled by the completion callback; the event's own status may say so
            // sooner.
            let statuses: Option<Vec<i32>> = task
                .slots
                .iter()
                .zip(&task.events)
                .map(|(s, event)| {
                    s.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .or_else(|| event.status().ok().filter(|&st| st <= sys::CL_COMPLETE))
                })
                .collect();
            if let Some(mut statuses) = statuses {
                // Some implementations call back with CL_COMPLETE for a failed event; its
                // recorded status tells.
                for (status, event) in statuses.iter_mut().zip(&task.events) {
                    if let Ok(native) = event.status() {
                        *status = (*status).min(native);
                    }
                }
                let status = if task.status != sys::CL_SUCCESS {
                    task.status
                } else if !task.ignore_failures && statuses.iter().any(|&s| s < 0) {
                    sys::CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST
                } else {
                    sys::CL_SUCCESS
                };
                let (seq, reply, timed_from) = (task.seq, task.reply, task.timed_from);
                self.waits.remove(i);
                if let Some(events) = self.unreported.take_final() {
                    self.send(&events, 0, &[]);
                }
                if let Some(start) = timed_from {
                    self.send(&crate::writer::timing_since(start), seq, &[]);
                }
                self.send(&ServerMsg::Cl(reply(answer(status))), seq, &[]);
            } else {
                i += 1;
            }
        }
    }

    /// Sends the completed chunks at the head of read `i`, and its final status once all are
    /// done; true when the read is finished.
    fn progress_read(&mut self, i: usize) -> bool {
        loop {
            let task = &mut self.reads[i];
            let Some((offset, len, transfer)) = task.chunks.front() else {
                break;
            };
            let Some((status, buf)) = transfer.take_if_complete() else {
                return false;
            };
            let (offset, len, seq) = (*offset, *len, task.seq);
            let failed = task.failed;
            task.chunks.pop_front();
            if status != sys::CL_COMPLETE {
                self.reads[i].failed.get_or_insert(status);
            } else if failed.is_none() {
                if let Some(buf) = buf {
                    let data = &buf.as_slice()[..len.min(buf.capacity())];
                    self.send(&ServerMsg::Data { offset }, seq, data);
                }
            }
        }
        let task = &self.reads[i];
        let Some(end) = task.end else {
            return false;
        };
        // An execution failure of a chunk says more than the enqueue or deferred status.
        let status = task.failed.unwrap_or(end);
        let seq = task.seq;
        self.send(&ServerMsg::ReadDone { status }, seq, &[]);
        true
    }

    fn send(&mut self, msg: &ServerMsg, seq: u64, bulk: &[u8]) {
        if self.broken {
            return;
        }
        if let Err(e) = self.writer.send(msg, seq, bulk) {
            log::debug!("completion thread: cannot send: {e}");
            self.broken = true;
        }
    }
}
