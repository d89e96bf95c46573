//! The accept loop: admission of each connection, to a session thread or a session worker;
//! the end of every session at shutdown.

use std::io::ErrorKind;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rgpu_transport::{Listener, Stream};

use crate::shared::Shared;
use crate::workers::WorkerPool;

/// How often the accept loop looks at the shutdown flag.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// The shortest time a write to a client may block (a client that stopped reading).
const MIN_WRITE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long shutdown waits for sessions to release their objects.
const SESSION_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts connections on `listeners` until the stop flag is set, one session thread each;
/// then ends the sessions and waits (bounded) for them to clean up.
pub(crate) fn accept_loop(listeners: &[Listener], shared: &Arc<Shared>) {
    let mut sessions: Vec<JoinHandle<()>> = Vec::new();
    while !shared.stopping() {
        let mut accepted = false;
        for listener in listeners {
            match listener.accept() {
                Ok(stream) => {
                    accepted = true;
                    if let Some(session) = start_session(stream, shared) {
                        sessions.push(session);
                    }
                    sessions.retain(|s| !s.is_finished());
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => accepted = true,
                Err(e) => {
                    log::warn!("accept failed: {e}");
                    std::thread::sleep(POLL_INTERVAL);
                }
            }
        }
        // Woken at once by a connection; every POLL_INTERVAL to look at the stop flag.
        if !accepted {
            Listener::wait_any(listeners, POLL_INTERVAL);
        }
    }
    log::info!(
        "shutting down: closing {} session(s)",
        shared.streams_lock().len()
    );
    shared.end_sessions();
    if let Some(workers) = &shared.workers {
        workers.shutdown();
    }
    let deadline = Instant::now() + SESSION_DRAIN_TIMEOUT;
    while sessions.iter().any(|s| !s.is_finished()) {
        if Instant::now() > deadline {
            log::warn!("some sessions did not finish cleaning up in time");
            return;
        }
        // Sessions that registered after end_sessions ran are ended here too.
        shared.end_sessions();
        std::thread::sleep(Duration::from_millis(20));
    }
    for session in sessions {
        let _ = session.join();
    }
    log::info!("server stopped");
}

/// Starts the thread that serves a new connection (through a worker where sessions have
/// their own processes); `None` if it was turned away.
fn start_session(stream: Stream, shared: &Arc<Shared>) -> Option<JoinHandle<()>> {
    if let Err(e) = bound_waits(&stream, shared.client_timeout) {
        log::warn!(
            "{}: cannot set up the connection: {e}",
            stream.peer_description()
        );
        return None;
    }
    // A worker per connection comes only within the caps on handshakes under way.
    let handshake = match &shared.workers {
        Some(_) => {
            let peer = stream.peer_description();
            match shared.handshakes.enter(stream.peer_ip(), &peer) {
                Some(slot) => Some(slot),
                None => {
                    stream.shutdown();
                    return None;
                }
            }
        }
        None => None,
    };
    let id = crate::shared::new_session_id();
    let session_shared = shared.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("rgpu-s{id}"))
        .spawn(move || match session_shared.workers.clone() {
            Some(workers) => serve_in_worker(stream, &session_shared, &workers, id, handshake),
            None => crate::session::run(stream, session_shared, id),
        });
    spawned
        .map_err(|e| log::error!("cannot start a session thread: {e}"))
        .ok()
}

/// Reads a connection's preamble here, then hands it to a worker process: a new session to a
/// worker of its own (which runs the rest of the handshake and, once admitted, serves it), a
/// data lane to its session's worker. Returns when the session's worker has ended (or was
/// given back to the pool, the handshake having failed).
///
/// `handshake` is this connection's place among the handshakes under way: given back once the
/// client has authenticated (its session asks for admission), or when a lane is handed to
/// its session's worker (whose own cap on joining lanes then rules), or at the end.
fn serve_in_worker(
    mut stream: Stream,
    shared: &Shared,
    workers: &Arc<WorkerPool>,
    id: u64,
    handshake: Option<crate::handshakes::Slot>,
) {
    shared.register(id, &stream);
    let route = if shared.stopping() {
        None
    } else {
        crate::session::preamble(&mut stream, shared)
    };
    // The worker owns the connection from here on; the listener keeps no handle on it.
    shared.unregister(id);
    let Some(route) = route else {
        stream.shutdown();
        return;
    };
    match route.lane_of {
        Some(session) => {
            workers.route_lane(session, route, stream);
            drop(handshake);
        }
        None => {
            let handshake = std::sync::Mutex::new(handshake);
            workers.serve(
                stream,
                route,
                |peer, application, wait, queued| {
                    // Asked only after the client authenticated: its place is given back.
                    drop(handshake.lock().unwrap_or_else(|e| e.into_inner()).take());
                    shared.admit_session(peer, application, wait, queued)
                },
                id,
            )
        }
    }
}

/// Bounds every wait on a client's connection (its fd keeps these settings in the session's
/// worker): a client that vanished is noticed within `client_timeout`, and a write to a client
/// that stopped reading fails after four times that (at least two minutes: a program stopped
/// in a debugger is not a dead one).
fn bound_waits(stream: &Stream, client_timeout: Duration) -> std::io::Result<()> {
    stream.set_liveness(client_timeout)?;
    stream.set_write_timeout(Some((client_timeout * 4).max(MIN_WRITE_TIMEOUT)))
}
