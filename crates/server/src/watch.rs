//! A session's watchdog thread: it closes a session that has sent no request for the idle
//! timeout (when one is set), and while the session carries out a request that takes longer
//! than a second it tells the client so every second ([`ServerMsg::Working`]): the client's
//! liveness watchdog then knows the server alive though no reply comes (a long kernel's
//! `clFinish`), while a black-holing path or a hung server process sends nothing.

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
    ended: AtomicBool,
    /// Set when the watchdog closed the session for idling.
    fired: AtomicBool,
}

/// The bit of `since` that says the session thread carries out a request.
const BUSY: u64 = 1 << 63;

impl SessionWatch {
    /// Starts the watchdog of session `session`, whose connection is `stream` and whose
    /// replies go out through `writer`.
    pub fn start(
        session: u64,
        idle_timeout: Option<Duration>,
        stream: rgpu_transport::Stream,
        writer: Arc<Writer>,
    ) -> Arc<SessionWatch> {
        let watch = Arc::new(SessionWatch {
            start: Instant::now(),
            since: AtomicU64::new(0),
            ended: AtomicBool::new(false),
            fired: AtomicBool::new(false),
        });
        let watched = watch.clone();
        let tick = idle_timeout
            .map_or(WORKING_EVERY, |t| t / 4)
            .clamp(Duration::from_millis(50), Duration::from_millis(250));
        let spawned = std::thread::Builder::new()
            .name(format!("rgpu-watch{session}"))
            .spawn(move || {
                let mut told = 0u64;
                while !watched.ended.load(Ordering::Acquire) {
                    std::thread::sleep(tick);
                    let since = watched.since.load(Ordering::Acquire);
                    let now = watched.start.elapsed().as_millis() as u64;
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
                    let idle_for = idle_timeout.filter(|t| !busy && for_ms >= t.as_millis() as u64);
                    if let Some(timeout) = idle_for {
                        log::info!(
                            "session {session}: no request for {:.0} s (idle_timeout); closing it",
                            timeout.as_secs_f64()
                        );
                        watched.fired.store(true, Ordering::Release);
                        stream.shutdown();
                        return;
                    }
                }
            });
        if let Err(e) = spawned {
            log::warn!("session {session}: no watchdog: {e}");
        }
        watch
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// The session thread waits for the next request from now on.
    pub fn waiting(&self) {
        self.since.store(self.now(), Ordering::Release);
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
