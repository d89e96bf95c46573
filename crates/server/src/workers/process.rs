//! The worker's side: a session worker process waits for sessions from the listener, runs
//! each one's handshake and serves it.

use super::*;
use crate::shared::Shared;

/// Stops a worker's session from another thread (a signal handler's).
#[derive(Clone)]
pub struct WorkerStop {
    shared: Arc<Mutex<Option<Arc<Shared>>>>,
}

impl WorkerStop {
    pub fn stop(&self) {
        match lock(&self.shared).as_ref() {
            Some(shared) => shared.stop_sessions(),
            // Not serving yet: nothing to release.
            None => std::process::exit(0),
        }
    }
}

/// A worker process: set up by the listener over [`CONTROL_FD`], serves one session, returns
/// when it has ended. `on_start` gets a handle that stops it (for a signal thread).
pub fn run_worker(on_start: impl FnOnce(WorkerStop)) -> Result<(), String> {
    // Not dumpable: other processes of the same user (other sessions' workers) cannot attach
    // to it or read its memory through /proc.
    // SAFETY: prctl with plain integer arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    // SAFETY: the listener put the control socket at this descriptor for this process alone.
    let control = Control {
        // SAFETY: the listener put the control socket at this descriptor for this process alone.
        fd: unsafe { OwnedFd::from_raw_fd(CONTROL_FD) },
    };
    let stop = WorkerStop {
        shared: Arc::new(Mutex::new(None)),
    };
    on_start(stop.clone());
    let Some((ToWorker::Init(settings), _)) = control.recv()? else {
        return Err("the listener sent no settings".into());
    };
    let shared = Arc::new(crate::load_shared(*settings, false));
    // After the settings' files are read (their paths may be relative to the server's
    // directory): from now on relative paths lead nowhere of the server's.
    crate::private_dir::enter()?;
    control.send(
        &FromWorker::Ready {
            devices: shared.inventory.devices.len(),
            cuda_devices: shared
                .cuda
                .as_ref()
                .map_or(0, |c| c.inventory.devices.len()),
        },
        None,
    )?;
    let control = Arc::new(control);
    // Sessions whose handshake fails leave the worker as it was: it waits for the next.
    let (id, admitted, early_lanes) = loop {
        let Some((id, route, lane_key, stream)) = next_session(&control)? else {
            // The listener stopped before it had a session for this worker.
            crate::private_dir::remove();
            return Ok(());
        };
        shared.lanes.open(id, lane_key);
        let mut early_lanes = Vec::new();
        let admitted = crate::session::handshake(
            stream,
            &route,
            &shared,
            id,
            lane_key,
            |applicant, stream| {
                if applicant.lane.is_some() {
                    return Err("not a data lane of a session on this server".into());
                }
                ask_admission(&control, applicant, stream, &mut early_lanes)
            },
        );
        match admitted {
            Some(admitted) => break (id, admitted, early_lanes),
            None => {
                shared.lanes.close(id);
                control.send(&FromWorker::Unused, None)?;
            }
        }
    };
    control.send(
        &FromWorker::Serving {
            client: admitted.client.clone(),
        },
        None,
    )?;
    *lock(&stop.shared) = Some(shared.clone());
    crate::flight::install(id);
    // Data lanes arrive on the control socket for as long as the session lives, each
    // authenticated on a thread of its own; the socket's closing means the listener is gone or
    // stopping.
    let lanes_shared = shared.clone();
    let ending = control.clone();
    // An operator's move order goes to the listener, which has every session's worker tell
    // its client; its answer (the sessions told) comes back through the control thread.
    let (told_tx, told_rx) = std::sync::mpsc::channel::<(u32, u32)>();
    let relay_control = control.clone();
    let told_rx = Mutex::new(told_rx);
    let _ = shared
        .move_relay
        .set(Box::new(move |to: &str, wait: Duration| {
            let order = FromWorker::MoveSessions {
                to: to.into(),
                wait,
            };
            relay_control.send(&order, None)?;
            let told = told_rx.lock().unwrap_or_else(|e| e.into_inner());
            told.recv_timeout(wait + MOVE_ORDER_TIMEOUT)
                .map_err(|_| "the listener did not answer".to_string())
        }));
    std::thread::Builder::new()
        .name("rgpu-control".into())
        .spawn(move || {
            let joining = Arc::new(AtomicUsize::new(0));
            for (route, lane) in early_lanes {
                join_lane(&lanes_shared, &joining, id, route, lane);
            }
            loop {
                match control.recv::<ToWorker>() {
                    Ok(Some((ToWorker::Lane { route, kind }, Some(fd)))) => {
                        let lane = Stream::from_fd(kind, fd);
                        join_lane(&lanes_shared, &joining, id, route, lane);
                    }
                    Ok(Some((ToWorker::MoveTo { to }, _))) => {
                        lanes_shared.tell_to_move(0, &to);
                    }
                    Ok(Some((ToWorker::Told { count, moved }, _))) => {
                        let _ = told_tx.send((count, moved));
                    }
                    Ok(Some((other, _))) => {
                        log::warn!("session worker: unexpected control message {other:?}")
                    }
                    Ok(None) | Err(_) => break,
                }
            }
            lanes_shared.stop_sessions();
        })
        .map_err(|e| format!("cannot start the control thread: {e}"))?;
    // The session's totals for the listener's metrics, once a second while it is served.
    let reporting = ending.clone();
    let _ = std::thread::Builder::new()
        .name("rgpu-stats".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_secs(1));
            if reporting
                .send(&FromWorker::Stats(crate::flight::stats()), None)
                .is_err()
            {
                return;
            }
        });
    crate::session::serve(admitted, &shared, id, || {
        let _ = ending.send(&FromWorker::Stats(crate::flight::stats()), None);
        let _ = ending.send(&FromWorker::Ending, None);
    });
    shared.lanes.close(id);
    crate::private_dir::remove();
    Ok(())
}

/// The next connection to serve, from the listener; `None` when the listener closed the
/// control socket first.
fn next_session(control: &Control) -> Result<Option<(u64, Route, LaneKey, Stream)>, String> {
    match control.recv()? {
        None => Ok(None),
        Some((
            ToWorker::Session {
                id,
                kind,
                route,
                lane_key,
            },
            Some(fd),
        )) => Ok(Some((id, route, lane_key, Stream::from_fd(kind, fd)))),
        Some((ToWorker::Session { .. }, None)) => Err("a session came without its socket".into()),
        Some((other, _)) => Err(format!("unexpected control message {other:?}")),
    }
}

/// Asks the listener whether an authenticated session may start, telling the client while it
/// waits for exclusive use. Lanes that come meanwhile (claims only: no session here has a key
/// yet) wait in `early_lanes`.
fn ask_admission(
    control: &Control,
    applicant: &Applicant,
    stream: &Stream,
    early_lanes: &mut Vec<(Route, Stream)>,
) -> Result<(), String> {
    let asking = FromWorker::Authenticated {
        application: applicant.application.clone(),
        wait: applicant.wait,
    };
    control.send(&asking, None)?;
    loop {
        match control.recv::<ToWorker>()? {
            Some((ToWorker::Admission(decision), _)) => return decision,
            Some((ToWorker::Queued { ahead }, _)) => {
                // A client that went away is found when its welcome is sent.
                let _ = rgpu_transport::tell_queued(stream, ahead);
            }
            Some((ToWorker::Lane { route, kind }, Some(fd))) => {
                early_lanes.push((route, Stream::from_fd(kind, fd)))
            }
            // Not serving yet: it stays (the order was for the sessions under way).
            Some((ToWorker::MoveTo { .. }, _)) => {}
            Some((other, _)) => log::warn!("session worker: unexpected control message {other:?}"),
            None => return Err("the server is stopping".into()),
        }
    }
}

/// How long an operator's move order waits for the listener to have passed it on.
const MOVE_ORDER_TIMEOUT: Duration = Duration::from_secs(10);

/// Most data-lane handshakes a worker runs at once: a session has at most MAX_LANES lanes; more
/// claims at once are not its client's.
const MAX_JOINING_LANES: usize = 2 * rgpu_protocol::MAX_LANES as usize;

/// Runs a data lane's handshake (TLS, token, the session's key) on a thread of its own; the
/// lane joins session `id` if it proves it belongs.
fn join_lane(
    shared: &Arc<Shared>,
    joining: &Arc<AtomicUsize>,
    id: u64,
    route: Route,
    lane: Stream,
) {
    if joining.fetch_add(1, Ordering::SeqCst) >= MAX_JOINING_LANES {
        joining.fetch_sub(1, Ordering::SeqCst);
        log::warn!(
            "session {id}: {}: too many data lanes joining at once; refused",
            lane.peer_description()
        );
        return;
    }
    let shared = shared.clone();
    let joining_now = joining.clone();
    let spawned = std::thread::Builder::new()
        .name("rgpu-lane-join".into())
        .spawn(move || {
            // A lane's welcome carries no key of its own.
            crate::session::handshake(lane, &route, &shared, id, [0; 32], |applicant, stream| {
                match &applicant.lane {
                    Some(attach) if route.lane_of == Some(attach.session) => {
                        if attach.index == rgpu_protocol::fabric::LINK_LANE {
                            shared.fabric.serve_link(attach, stream)
                        } else {
                            shared.lanes.join(attach, stream)
                        }
                    }
                    _ => Err("not a data lane of a session on this server".into()),
                }
            });
            joining_now.fetch_sub(1, Ordering::SeqCst);
        });
    if spawned.is_err() {
        joining.fetch_sub(1, Ordering::SeqCst);
    }
}
