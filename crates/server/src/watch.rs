//! A session's watchdog thread. It
//! - closes a session that has sent no request for the idle timeout (when one is set);
//! - tells the client every second while the session carries out a request that takes longer
//!   ([`ServerMsg::Working`]): the client's liveness watchdog then knows the server alive
//!   though no reply comes (a long kernel's `clFinish`), while a black-holing path or a hung
//!   server process sends nothing;
//! - asks a client that has been silent for a third of `client_timeout` for a sign of life
//!   ([`ServerMsg::Heartbeat`], answered by its library's watchdog thread, whatever the program
//!   does) and closes the session when none comes within `client_timeout`: a hung client, or a
//!   path that keeps TCP alive but delivers nothing, does not hold its session's devices and
//!   memory for ever. (A program stopped in a debugger for longer loses its session too.)

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rgpu_protocol::ServerMsg;

use crate::writer::Writer;

/// How often a session busy with one request says so.
pub(crate) const WORKING_EVERY: Duration = Duration::from_secs(1);

pub(crate) struct SessionWatch {
    start: Instant,
    /// Milliseconds since `start` when the session thread last began waiting for a request,
    /// or (with [`BUSY`] set) began carrying one out.
    since: AtomicU64,
    /// Milliseconds since `start` when the last frame came from the client.
    heard: AtomicU64,
    ended: AtomicBool,
    /// Set when the watchdog closed the session (and logged why).
    fired: AtomicBool,
}

/// How long a session waits for its client; what it asks and when it gives up.
#[derive(Clone, Copy)]
pub(crate) struct Patience {
    /// No request for this long closes the session.
    pub idle: Option<Duration>,
    /// A client silent for this long while asked for a sign of life is gone.
    pub client: Duration,
}

/// The bit of `since` that says the session thread carries out a request.
const BUSY: u64 = 1 << 63;

impl SessionWatch {
    /// Starts the watchdog of session `session`, whose connection is `stream` and whose
    /// replies go out through `writer`.
    pub fn start(
        session: u64,
        patience: Patience,
        stream: rgpu_transport::Stream,
        writer: Arc<Writer>,
    ) -> Arc<SessionWatch> {
        let watch = Arc::new(SessionWatch {
            start: Instant::now(),
            since: AtomicU64::new(0),
            heard: AtomicU64::new(0),
            ended: AtomicBool::new(false),
            fired: AtomicBool::new(false),
        });
        let watched = watch.clone();
        let tick = patience
            .idle
            .map_or(WORKING_EVERY, |t| t / 4)
            .min(patience.client / 8)
            .clamp(Duration::from_millis(50), Duration::from_millis(250));
        let client_ms = patience.client.as_millis() as u64;
        let spawned = std::thread::Builder::new()
            .name(format!("rgpu-watch{session}"))
            .spawn(move || {
                let (mut told, mut asked) = (0u64, 0u64);
                while !watched.ended.load(Ordering::Acquire) {
                    std::thread::sleep(tick);
                    let since = watched.since.load(Ordering::Acquire);
                    let now = watched.now();
                    let busy = since & BUSY != 0;
                    let for_ms = now.saturating_sub(since & !BUSY);
                    let every = WORKING_EVERY.as_millis() as u64;
                    if busy && for_ms >= every && now.saturating_sub(told) >= every {
                        // Never behind a reply that is being written (the client is hearing
                        // from the server then anyway).
                        if writer.try_send(&ServerMsg::Working, 0) {
                            told = now;
                        }
                    }
                    let close = |why: String| {
                        log::info!("session {session}: {why}; closing it");
                        watched.fired.store(true, Ordering::Release);
                        stream.shutdown();
                    };
                    let idle_for = patience
                        .idle
                        .filter(|t| !busy && for_ms >= t.as_millis() as u64);
                    if let Some(timeout) = idle_for {
                        close(format!(
                            "no request for {:.0} s (idle_timeout)",
                            timeout.as_secs_f64()
                        ));
                        return;
                    }
                    // The client owes nothing while the session works for it.
                    if busy {
                        continue;
                    }
                    let silent_from = (since & !BUSY).max(watched.heard.load(Ordering::Acquire));
                    if asked > silent_from && now.saturating_sub(asked) >= client_ms * 2 / 3 {
                        close(format!(
                            "the client has not answered for {:.0} s (client_timeout): it, or \
                             the path to it, has stopped delivering",
                            now.saturating_sub(silent_from) as f64 / 1000.0
                        ));
                        return;
                    }
                    if asked <= silent_from
                        && now.saturating_sub(silent_from) >= client_ms / 3
                        && writer.try_send(&ServerMsg::Heartbeat, 0)
                    {
                        asked = now;
                    }
                }
            });
        if let Err(e) = spawned {
            log::warn!("session {session}: no watchdog: {e}");
        }
        watch
    }

    /// Milliseconds since `start`, plus one (0 stays "never").
    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64 + 1
    }

    /// The session thread waits for the next request from now on (if it was carrying one
    /// out: a frame that was not a request leaves the wait's start where it was).
    pub fn waiting(&self) {
        let now = self.now();
        let _ = self
            .since
            .try_update(Ordering::AcqRel, Ordering::Acquire, |since| {
                (since & BUSY != 0).then_some(now)
            });
    }

    /// A frame came from the client.
    pub fn heard(&self) {
        self.heard.store(self.now(), Ordering::Release);
    }

    /// The session thread carries out a request from now on.
    pub fn working(&self) {
        self.since.store(self.now() | BUSY, Ordering::Release);
    }

    /// Whether the watchdog closed the session for idling.
    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }

    pub fn end(&self) {
        self.ended.store(true, Ordering::Release);
    }
}
