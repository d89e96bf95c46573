//! A process per session. The listening process authenticates each connection and then hands
//! its socket to a worker process of its own, which owns everything native the session does
//! (OpenCL and CUDA contexts, memory, kernels). A crash, an abort, a kernel that corrupts
//! memory or a sticky CUDA error ends that one process: its client sees the connection close,
//! and the listener and every other session carry on. Workers cannot read each other's memory
//! (separate address spaces; not dumpable, so not traceable by a process of the same user).
//!
//! Workers are the server's own executable started again (`rgpu server-worker`), talking with
//! the listener over a Unix socket pair (fd 3 in the worker) that carries [`ToWorker`]
//! messages and, with them, the sockets of the session and of its data lanes (SCM_RIGHTS).
//! A few are started ahead and wait, native libraries loaded, so a session does not pay for
//! the start. The listener notices a worker's end by its control socket closing, and logs how
//! it ended (exit status or signal). Closing the control socket tells a worker to stop.
//!
//! This file is the listener's side (the pool of workers); `process.rs` the worker's.

mod process;

pub use process::{run_worker, WorkerStop};

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};
use rgpu_protocol::LaneKey;
use rgpu_transport::{Applicant, Route, Stream, StreamKind};
use serde::{Deserialize, Serialize};

use crate::limits::Slot;
use crate::SessionSettings;

/// The worker's end of the control socket.
pub const CONTROL_FD: RawFd = 3;
/// Largest control message (they are small: settings, ids, names).
const MAX_CONTROL_MESSAGE: usize = 64 * 1024;
/// How long a session waits for a worker to be ready before it is refused.
const WORKER_START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long shutdown waits for workers to end their sessions before killing them.
const WORKER_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// How to start a worker: this program, with these arguments (`server-worker`).
#[derive(Clone, Debug)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Workers kept started ahead, waiting for a session.
    pub prestarted: usize,
    /// The user workers run as, when the listener runs as root and should not hand that to
    /// code that runs clients' requests.
    pub user: Option<WorkerUser>,
    /// More environment for the workers.
    pub env: Vec<(String, String)>,
}

/// A user to run workers as, resolved by name before any worker starts (the child of a fork
/// may only make system calls, not read the user database).
#[derive(Clone, Debug)]
pub struct WorkerUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (e.g. video and render, for the GPU device nodes).
    pub groups: Vec<u32>,
    pub home: PathBuf,
    /// A home the listener made for this run (a user not in the user database): the workers'
    /// caches go there too.
    pub dynamic_home: bool,
}

/// The lowest and highest uid of the range systemd gives dynamic users (none of them has an
/// entry in the user database).
const DYNAMIC_UIDS: std::ops::RangeInclusive<u32> = 61184..=65519;

impl WorkerUser {
    /// The user a root server runs its workers as when none is named: the package's `rgpu`
    /// where it exists, else the first uid of systemd's dynamic range that belongs to no
    /// user (the same on every server of this machine, so that their workers may copy between
    /// each other through CUDA IPC), with the groups that own GPU device nodes (`video`,
    /// `render`). A dynamic user has no home yet: the caller makes one (`dynamic_home`).
    pub fn unprivileged() -> Result<WorkerUser, String> {
        if let Ok(user) = WorkerUser::lookup("rgpu") {
            return Ok(user);
        }
        let uid = DYNAMIC_UIDS
            .clone()
            .find(|&uid| {
                matches!(
                    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)),
                    Ok(None)
                ) && matches!(
                    nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(uid)),
                    Ok(None)
                )
            })
            .ok_or("no free uid for the workers in 61184-65519")?;
        let groups = ["video", "render"]
            .iter()
            .filter_map(|name| nix::unistd::Group::from_name(name).ok().flatten())
            .map(|group| group.gid.as_raw())
            .collect();
        Ok(WorkerUser {
            name: format!("rgpu-worker-{uid}"),
            uid,
            gid: uid,
            groups,
            home: PathBuf::new(),
            dynamic_home: true,
        })
    }

    /// Looks `name` up in the user database.
    pub fn lookup(name: &str) -> Result<WorkerUser, String> {
        let user = nix::unistd::User::from_name(name)
            .map_err(|e| format!("looking up user {name}: {e}"))?
            .ok_or_else(|| format!("no user named {name}"))?;
        let c_name = std::ffi::CString::new(name).map_err(|_| format!("bad user name {name:?}"))?;
        let groups = nix::unistd::getgrouplist(&c_name, user.gid)
            .map_err(|e| format!("the groups of {name}: {e}"))?;
        Ok(WorkerUser {
            name: name.to_string(),
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            groups: groups.iter().map(|g| g.as_raw()).collect(),
            home: user.dir,
            dynamic_home: false,
        })
    }
}

/// Listener → worker.
#[derive(Debug, Serialize, Deserialize)]
enum ToWorker {
    /// First message: load the native libraries with these settings, then say `Ready`.
    Init(Box<SessionSettings>),
    /// A new connection, its preamble read: finish its handshake (TLS, authentication) and,
    /// once admitted, serve it as session `id`. Its socket comes with the message.
    Session {
        id: u64,
        kind: StreamKind,
        route: Route,
        lane_key: LaneKey,
    },
    /// Whether the session may start (the listener counts sessions against the limits).
    Admission(Result<(), String>),
    /// Before `Admission`: the session waits for exclusive use behind `ahead` applications
    /// (the worker tells its client).
    Queued { ahead: u32 },
    /// A connection that says it is a data lane of the session: its handshake proves it (the
    /// key). Its socket comes with it.
    Lane { route: Route, kind: StreamKind },
    /// The operator moves every session to the server at `to`: tell the client (`MoveTo`).
    MoveTo { to: String },
    /// The answer to `MoveSessions`: the sessions told, and those that ended within its wait.
    Told { count: u32, moved: u32 },
}

/// Worker → listener.
#[derive(Debug, Serialize, Deserialize)]
enum FromWorker {
    /// The native libraries are loaded; the worker waits for its session.
    Ready { devices: usize, cuda_devices: usize },
    /// The client authenticated: may its session start? (Answered by `Admission`.) Its
    /// application, and how long it waits for exclusive use.
    Authenticated { application: String, wait: Duration },
    /// The session started (the client's self-description, for the listener's logs).
    Serving { client: String },
    /// The handshake failed (logged by the worker): nothing ran for that client, and the
    /// worker waits for another session.
    Unused,
    /// The session stopped serving (its client gone, or closed): the worker is releasing
    /// what it held, and then ends.
    Ending,
    /// The session's totals so far (once a second, and before `Ending`), for the metrics.
    Stats(crate::metrics::WorkerStats),
    /// The session's client is the server's operator and moves every other session to `to`,
    /// waiting up to `wait` for them to end here (answered by `Told`).
    MoveSessions { to: String, wait: Duration },
}

/// One end of a control socket (SOCK_SEQPACKET: one message per send, fds attached).
struct Control {
    fd: OwnedFd,
}

impl Control {
    fn pair() -> Result<(Control, OwnedFd), String> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| format!("cannot make a control socket pair: {e}"))?;
        Ok((Control { fd: ours }, theirs))
    }

    fn send<T: Serialize>(&self, message: &T, fd: Option<&OwnedFd>) -> Result<(), String> {
        let bytes = postcard::to_stdvec(message).map_err(|e| e.to_string())?;
        let raw = fd.map(|fd| [fd.as_raw_fd()]);
        let rights = raw.as_ref().map(|raw| ControlMessage::ScmRights(raw));
        let cmsgs: &[ControlMessage] = match &rights {
            Some(rights) => std::slice::from_ref(rights),
            None => &[],
        };
        sendmsg::<()>(
            self.fd.as_raw_fd(),
            &[IoSlice::new(&bytes)],
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map(|_| ())
        .map_err(|e| format!("control socket: {e}"))
    }

    /// The next message and the socket that came with it; `Ok(None)` when the peer closed.
    fn recv<T: for<'de> Deserialize<'de>>(&self) -> Result<Option<(T, Option<OwnedFd>)>, String> {
        let mut buf = vec![0u8; MAX_CONTROL_MESSAGE];
        let mut space = nix::cmsg_space!([RawFd; 1]);
        let (len, fd) = {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let msg = loop {
                match recvmsg::<()>(
                    self.fd.as_raw_fd(),
                    &mut iov,
                    Some(&mut space),
                    MsgFlags::MSG_CMSG_CLOEXEC,
                ) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    other => break other.map_err(|e| format!("control socket: {e}"))?,
                }
            };
            let mut fd = None;
            for cmsg in msg.cmsgs().map_err(|e| format!("control socket: {e}"))? {
                if let ControlMessageOwned::ScmRights(fds) = cmsg {
                    for raw in fds {
                        // SAFETY: the kernel just gave this process the descriptor.
                        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                        if fd.is_none() {
                            fd = Some(owned);
                        }
                    }
                }
            }
            (msg.bytes, fd)
        };
        if len == 0 {
            return Ok(None);
        }
        let message = postcard::from_bytes(&buf[..len]).map_err(|e| e.to_string())?;
        Ok(Some((message, fd)))
    }
}

// ------------------------------------------------------------------------------ listener side

/// A started worker, ready for a session or serving one.
struct Worker {
    control: Arc<Control>,
    child: Child,
}

/// The listener's workers: those started ahead and those serving a session.
pub(crate) struct WorkerPool {
    command: WorkerCommand,
    settings: SessionSettings,
    expected: (usize, usize),
    ready: Mutex<Vec<Worker>>,
    ready_changed: Condvar,
    /// Workers being started right now, and sessions waiting for one: the pool starts a
    /// worker for each waiting session plus `prestarted` more.
    starting: Mutex<usize>,
    waiting: Mutex<usize>,
    /// Each live session's worker, so that its data lanes follow it.
    sessions: Mutex<HashMap<u64, Arc<Control>>>,
    /// Process ids of the workers serving sessions, to stop them at shutdown.
    live: Mutex<HashMap<u64, u32>>,
    /// Set at shutdown: no more workers are started.
    stopped: AtomicBool,
}

impl WorkerPool {
    /// `expected` is what the listener found: (OpenCL devices, CUDA devices). A worker must
    /// find the same, or its sessions would see other devices than the listener announced.
    pub fn new(
        command: WorkerCommand,
        settings: SessionSettings,
        expected: (usize, usize),
    ) -> Arc<WorkerPool> {
        Arc::new(WorkerPool {
            command,
            settings,
            expected,
            ready: Mutex::new(Vec::new()),
            ready_changed: Condvar::new(),
            starting: Mutex::new(0),
            waiting: Mutex::new(0),
            sessions: Mutex::new(HashMap::new()),
            live: Mutex::new(HashMap::new()),
            stopped: AtomicBool::new(false),
        })
    }

    /// Starts workers in the background until there are `prestarted` ready beyond those the
    /// waiting sessions will take.
    pub fn refill(self: &Arc<Self>) {
        if self.stopped.load(Ordering::SeqCst) {
            return;
        }
        let wanted = self.command.prestarted.max(1) + *lock(&self.waiting);
        let mut starting = lock(&self.starting);
        let have = lock(&self.ready).len() + *starting;
        for _ in have..wanted {
            *starting += 1;
            let pool = self.clone();
            let spawned = std::thread::Builder::new()
                .name("rgpu-worker-start".into())
                .spawn(move || {
                    match pool.start_worker() {
                        Ok(mut worker) if pool.stopped.load(Ordering::SeqCst) => {
                            drop(worker.control);
                            let _ = worker.child.wait();
                        }
                        Ok(worker) => lock(&pool.ready).push(worker),
                        Err(e) => log::error!("cannot start a session worker: {e}"),
                    }
                    *lock(&pool.starting) -= 1;
                    pool.ready_changed.notify_all();
                    // Started for a session that no longer waits (it took another): not kept.
                    pool.trim();
                });
            if spawned.is_err() {
                *starting -= 1;
            }
        }
    }

    fn start_worker(&self) -> Result<Worker, String> {
        let (control, theirs) = Control::pair()?;
        let mut command = Command::new(&self.command.program);
        command.args(&self.command.args);
        // Its own process group: a Ctrl-C at the terminal reaches the listener, which then
        // stops the workers in order.
        command.process_group(0);
        command.envs(self.command.env.iter().map(|(k, v)| (k, v)));
        if let Some(user) = &self.command.user {
            command
                .env("HOME", &user.home)
                .env("USER", &user.name)
                .env("LOGNAME", &user.name);
            if user.dynamic_home {
                // Kernel caches (PoCL's, CUDA's) go under the home the listener made.
                command.env("XDG_CACHE_HOME", &user.home);
            }
        }
        let user = self.command.user.clone();
        let their_fd = theirs.as_raw_fd();
        // SAFETY: only async-signal-safe calls (plain system calls) between fork and exec.
        unsafe {
            command.pre_exec(move || {
                if their_fd == CONTROL_FD {
                    // dup2 onto itself keeps close-on-exec: clear it instead.
                    let flags = libc::fcntl(CONTROL_FD, libc::F_GETFD);
                    libc::fcntl(CONTROL_FD, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
                } else if libc::dup2(their_fd, CONTROL_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(user) = &user {
                    // Groups first, while still privileged; the user last.
                    if libc::setgroups(user.groups.len(), user.groups.as_ptr()) != 0
                        || libc::setgid(user.gid) != 0
                        || libc::setuid(user.uid) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = command.spawn().map_err(|e| {
            format!(
                "cannot run {} {}: {e}",
                self.command.program.display(),
                self.command.args.join(" ")
            )
        })?;
        drop(theirs);
        let mut worker = Worker {
            control: Arc::new(control),
            child,
        };
        let init = worker
            .control
            .send(&ToWorker::Init(Box::new(self.settings.clone())), None)
            .and_then(|()| worker.control.recv::<FromWorker>());
        match init {
            Ok(Some((
                FromWorker::Ready {
                    devices,
                    cuda_devices,
                },
                _,
            ))) => {
                if (devices, cuda_devices) != self.expected {
                    drop(worker.control);
                    let _ = worker.child.wait();
                    return Err(format!(
                        "a session worker finds {devices} OpenCL and {cuda_devices} CUDA \
                         devices where the server found {} and {}: can its user{} use them \
                         (device nodes, groups, a writable cache directory)?",
                        self.expected.0,
                        self.expected.1,
                        self.command
                            .user
                            .as_ref()
                            .map(|u| format!(" ({})", u.name))
                            .unwrap_or_default()
                    ));
                }
                log::debug!("session worker {} ready", worker.child.id());
                Ok(worker)
            }
            Ok(_) | Err(_) => {
                let status = worker.child.wait().ok();
                Err(format!(
                    "the worker ended before it was ready ({})",
                    status.map_or("status unknown".into(), describe_exit)
                ))
            }
        }
    }

    /// A ready worker, waiting (bounded) for one to start if none is.
    fn take(self: &Arc<Self>) -> Option<Worker> {
        *lock(&self.waiting) += 1;
        let worker = self.wait_for_worker();
        *lock(&self.waiting) -= 1;
        self.refill();
        worker
    }

    fn wait_for_worker(self: &Arc<Self>) -> Option<Worker> {
        let deadline = Instant::now() + WORKER_START_TIMEOUT;
        loop {
            self.refill();
            let ready = lock(&self.ready);
            let left = deadline.saturating_duration_since(Instant::now());
            let (mut ready, _) = self
                .ready_changed
                // Woken when a start ends; a start that failed (logged) is tried again each
                // second rather than in a tight loop.
                .wait_timeout_while(ready, left.min(Duration::from_secs(1)), |ready| {
                    ready.is_empty()
                })
                .unwrap_or_else(|e| e.into_inner());
            if let Some(worker) = ready.pop() {
                return Some(worker);
            }
            if Instant::now() >= deadline {
                return None;
            }
        }
    }

    /// Sends a connection that says it is a data lane of `session` to that session's worker,
    /// whose handshake checks the claim; a session this listener does not know gets none.
    pub fn route_lane(&self, session: u64, route: Route, stream: Stream) {
        let control = lock(&self.sessions).get(&session).cloned();
        let Some(control) = control else {
            log::debug!(
                "{}: not a data lane of a session on this server",
                stream.peer_description()
            );
            stream.shutdown();
            return;
        };
        if let Err(e) = send_stream(&control, stream, |kind| ToWorker::Lane { route, kind }) {
            log::warn!("session {session}: data lane: {e}");
        }
    }

    /// Hands a new connection to a worker of its own, which runs its handshake and serves it;
    /// returns when that worker has ended, after logging how, or when the handshake failed
    /// and the worker came back to the pool. `admit` decides, once the client authenticated,
    /// whether its session may start (the server's quotas).
    pub fn serve(
        self: &Arc<Self>,
        stream: Stream,
        route: Route,
        admit: impl Fn(
            Option<std::net::IpAddr>,
            &str,
            Duration,
            &mut dyn FnMut(usize),
        ) -> Result<Slot, String>,
        id: u64,
    ) {
        let peer = stream.peer_description();
        let peer_ip = stream.peer_ip();
        let Some(worker) = self.take() else {
            log::error!("session {id} ({peer}): no session worker could start");
            stream.shutdown();
            return;
        };
        let pid = worker.child.id();
        let control = worker.control.clone();
        let lane_key = rgpu_transport::random_lane_key();
        // The worker holds the session's socket now; the listener keeps no copy, so the
        // client sees the connection close as soon as the worker ends, however it ends.
        let sent = send_stream(&control, stream, |kind| ToWorker::Session {
            id,
            kind,
            route,
            lane_key,
        });
        if let Err(e) = sent {
            log::error!("session {id}: cannot hand it to worker {pid}: {e}");
            drop(control);
            self.reap(worker, id, &peer, "");
            return;
        }
        lock(&self.live).insert(id, pid);
        lock(&self.sessions).insert(id, control.clone());
        // Held until the session's worker has ended.
        let mut slot = None;
        let mut client = String::new();
        let unused = loop {
            match control.recv::<FromWorker>() {
                Ok(Some((FromWorker::Authenticated { application, wait }, _))) => {
                    let mut queued = |ahead: usize| {
                        let _ = control.send(
                            &ToWorker::Queued {
                                ahead: ahead as u32,
                            },
                            None,
                        );
                    };
                    let admission =
                        admit(peer_ip, &application, wait, &mut queued).map(|s| slot = Some(s));
                    if control.send(&ToWorker::Admission(admission), None).is_err() {
                        break false;
                    }
                }
                Ok(Some((FromWorker::Serving { client: name }, _))) => {
                    crate::metrics::session_started(id, &name);
                    client = name;
                }
                Ok(Some((FromWorker::Stats(stats), _))) => crate::metrics::session_stats(id, stats),
                Ok(Some((FromWorker::Ending, _))) => {
                    if let Some(slot) = &mut slot {
                        slot.ending();
                    }
                }
                Ok(Some((FromWorker::Unused, _))) => break true,
                Ok(Some((FromWorker::MoveSessions { to, wait }, _))) => {
                    let told = self.tell_to_move(id, &to);
                    let moved = crate::shared::wait_until_ended(&told, wait, |session| {
                        !lock(&self.live).contains_key(&session)
                    });
                    let count = told.len() as u32;
                    let _ = control.send(&ToWorker::Told { count, moved }, None);
                }
                Ok(Some((other, _))) => {
                    log::warn!("session {id}: unexpected message from worker {pid}: {other:?}")
                }
                // The worker ended: its end of the control socket closed.
                Ok(None) | Err(_) => break false,
            }
        };
        lock(&self.live).remove(&id);
        self.close(id);
        drop(control);
        if unused && !self.stopped.load(Ordering::SeqCst) {
            log::debug!("session {id}: handshake failed; worker {pid} waits for another");
            lock(&self.ready).push(worker);
            self.ready_changed.notify_all();
        } else {
            let normally = self.reap(worker, id, &peer, &client);
            crate::metrics::session_ended(id, normally);
        }
        self.trim();
    }

    /// Stops ready workers beyond those the prestarted count and the waiting sessions need
    /// (workers given back by refused connections; a flood of them leaves no crowd behind).
    fn trim(&self) {
        let wanted = self.command.prestarted.max(1) + *lock(&self.waiting);
        let excess: Vec<Worker> = {
            let mut ready = lock(&self.ready);
            let keep = ready.len().min(wanted);
            ready.drain(keep..).collect()
        };
        for worker in excess {
            let Worker { control, mut child } = worker;
            drop(control);
            let _ = child.wait();
        }
    }

    /// Waits for a worker that is ending, and logs how it ended; returns whether it exited
    /// normally.
    fn reap(&self, worker: Worker, id: u64, peer: &str, client: &str) -> bool {
        let Worker { control, mut child } = worker;
        // Closing the control socket tells a worker that still waits to stop.
        drop(control);
        let pid = child.id();
        match child.wait() {
            Ok(status) if status.success() => {
                log::debug!("session {id}: worker {pid} exited");
                true
            }
            Ok(status) => {
                log::warn!(
                    "session {id} ({client} at {peer}) ended abnormally: its worker process {pid} {}; \
                     other sessions are not affected",
                    describe_exit(status)
                );
                false
            }
            Err(e) => {
                log::warn!("session {id}: cannot wait for worker {pid}: {e}");
                false
            }
        }
    }

    /// Forgets session `id` (its lanes are refused from now on).
    /// Tells every session's worker but `except`'s that its client is to move to `to`: the
    /// sessions told.
    fn tell_to_move(&self, except: u64, to: &str) -> Vec<u64> {
        let others: Vec<(u64, Arc<Control>)> = lock(&self.sessions)
            .iter()
            .filter(|(id, _)| **id != except)
            .map(|(id, control)| (*id, control.clone()))
            .collect();
        let mut told = Vec::new();
        for (id, control) in others {
            match control.send(&ToWorker::MoveTo { to: to.into() }, None) {
                Ok(()) => told.push(id),
                Err(e) => log::warn!("session {id}: cannot pass the move order on: {e}"),
            }
        }
        told
    }

    pub fn close(&self, id: u64) {
        lock(&self.sessions).remove(&id);
    }

    /// Stops every worker: closes the control sockets of the waiting ones, asks the serving
    /// ones to end their sessions (SIGTERM), and kills those still running after a while.
    pub fn shutdown(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let waiting: Vec<Worker> = lock(&self.ready).drain(..).collect();
        for mut worker in waiting {
            drop(worker.control);
            let _ = worker.child.wait();
        }
        let pids: Vec<u32> = lock(&self.live).values().copied().collect();
        for &pid in &pids {
            signal(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + WORKER_STOP_TIMEOUT;
        while !lock(&self.live).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        for &pid in lock(&self.live).values() {
            log::warn!("worker {pid} did not stop in time; killing it");
            signal(pid, libc::SIGKILL);
        }
    }
}

/// Sends `stream`'s socket with the message `message(kind)` makes.
fn send_stream(
    control: &Control,
    stream: Stream,
    message: impl FnOnce(StreamKind) -> ToWorker,
) -> Result<(), String> {
    let (kind, fd) = stream
        .into_fd()
        .map_err(|_| "a TLS connection cannot move to another process".to_string())?;
    control.send(&message(kind), Some(&fd))
}

fn signal(pid: u32, signal: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: plain system call; the pid is a child this process has not reaped yet.
        unsafe { libc::kill(pid, signal) };
    }
}

/// "exited with status 3", "was killed by signal 11 (SIGSEGV)".
fn describe_exit(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with status {code}");
    }
    match status.signal() {
        Some(sig) => {
            let name = nix::sys::signal::Signal::try_from(sig)
                .map(|s| s.as_str())
                .unwrap_or("?");
            let core = if status.core_dumped() {
                ", core dumped"
            } else {
                ""
            };
            format!("was killed by signal {sig} ({name}{core})")
        }
        None => "ended".to_string(),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
