//! Data lanes: extra connections of a session over which large transfers are striped. One TCP
//! stream moves data only as fast as one core copies it into the socket (on a 16-core H100
//! host: 3.1 GB/s from a 64 MiB buffer, 5.4 GB/s over four lanes into one reading thread), so
//! each lane has a thread that copies its share of a transfer at the same time as the others.
//!
//! Chunk `i` of a transfer ([`LANE_CHUNK`] bytes) goes over lane `i % lanes`, as raw bytes; the
//! server's session thread reads them back in that order (see the server's `lanes` module).

use std::io::Write;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use rgpu_protocol::{LaneAttach, LaneKey, LANE_CHUNK};
use rgpu_transport::{client_handshake, Endpoint, Stream};

use crate::ClientConfig;

use crate::ClientError;

/// The caller's bytes, read by lane threads while the caller waits for them.
#[derive(Clone, Copy)]
struct Bytes(*const u8, usize);
// SAFETY: lane threads only read the bytes, and only while the caller that lent them waits
// for every lane to be done with them (`Lanes::send`).
unsafe impl Send for Bytes {}

struct Job {
    bytes: Bytes,
    lane: usize,
    count: usize,
    done: Arc<Countdown>,
}

/// Lanes still busy with a transfer, and the first failure among them.
struct Countdown {
    state: Mutex<(usize, Option<String>)>,
    zero: Condvar,
}

impl Countdown {
    fn finish(&self, result: Result<(), String>) {
        let mut state = self.state.lock().unwrap();
        state.0 -= 1;
        if let Err(why) = result {
            state.1.get_or_insert(why);
        }
        if state.0 == 0 {
            self.zero.notify_all();
        }
    }

    /// Waits for every lane (up to `timeout`, `None`: forever); `Err(None)` on timeout.
    fn wait(&self, timeout: Option<Duration>) -> Result<(), Option<String>> {
        let mut state = self.state.lock().unwrap();
        while state.0 > 0 {
            match timeout {
                None => state = self.zero.wait(state).unwrap(),
                Some(timeout) => {
                    let (next, waited) = self.zero.wait_timeout(state, timeout).unwrap();
                    state = next;
                    if waited.timed_out() && state.0 > 0 {
                        return Err(None);
                    }
                }
            }
        }
        state.1.take().map_or(Ok(()), |why| Err(Some(why)))
    }
}

struct Lane {
    stream: Stream,
    jobs: mpsc::Sender<Job>,
    _thread: JoinHandle<()>,
}

/// The data lanes of one connection.
pub(crate) struct Lanes {
    lanes: Vec<Lane>,
    /// One striped transfer at a time, so that transfers use the lanes in the order their
    /// requests left.
    turn: Mutex<()>,
}

impl Lanes {
    /// Opens `count` lanes to `endpoint` joining session `session` with `key`.
    pub fn open(
        endpoint: &Endpoint,
        config: &ClientConfig,
        client_name: &str,
        session: u64,
        key: LaneKey,
        count: usize,
    ) -> Result<Lanes, ClientError> {
        let mut lanes = Vec::with_capacity(count);
        for index in 0..count {
            let stream = Stream::connect(endpoint, config.connect_timeout)
                .map_err(|e| ClientError::Connect(format!("{endpoint}: data lane: {e}")))?;
            crate::bound_waits(&stream, crate::reply_timeout_from_env())
                .map_err(|e| ClientError::Connect(format!("{endpoint}: data lane: {e}")))?;
            let attach = LaneAttach {
                session,
                key,
                index: index as u32,
            };
            let (stream, _) = client_handshake(
                stream,
                &config.tls,
                endpoint,
                config.token.as_ref(),
                client_name,
                Some(attach),
            )
            .map_err(|e| ClientError::Connect(format!("{endpoint}: data lane: {e}")))?;
            let writer = stream.try_clone().map_err(ClientError::io)?;
            let (jobs, inbox) = mpsc::channel();
            let thread = std::thread::Builder::new()
                .name(format!("rgpu-lane{index} {endpoint}"))
                .spawn(move || lane_loop(writer, inbox))
                .map_err(ClientError::io)?;
            lanes.push(Lane {
                stream,
                jobs,
                _thread: thread,
            });
        }
        Ok(Lanes {
            lanes,
            turn: Mutex::new(()),
        })
    }

    pub fn count(&self) -> usize {
        self.lanes.len()
    }

    /// Takes the lanes for one transfer; its request must leave while the turn is held.
    pub fn turn(&self) -> MutexGuard<'_, ()> {
        self.turn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `data` striped over every lane and waits until all of it is in the sockets (the
    /// caller may then reuse it). Needs the turn.
    pub fn send(
        &self,
        _turn: &MutexGuard<'_, ()>,
        data: &[u8],
        timeout: Duration,
    ) -> Result<(), String> {
        let count = self.lanes.len();
        let done = Arc::new(Countdown {
            state: Mutex::new((count, None)),
            zero: Condvar::new(),
        });
        let bytes = Bytes(data.as_ptr(), data.len());
        for (lane, target) in self.lanes.iter().enumerate() {
            let job = Job {
                bytes,
                lane,
                count,
                done: done.clone(),
            };
            if target.jobs.send(job).is_err() {
                done.finish(Err(format!("data lane {lane} has stopped")));
            }
        }
        match done.wait(Some(timeout)) {
            Ok(()) => Ok(()),
            Err(Some(why)) => Err(why),
            Err(None) => {
                // The lanes must let go of the caller's bytes before it returns: end them, so
                // their writes fail at once, and wait for that.
                self.shutdown();
                let _ = done.wait(None);
                Err(format!("data lanes did not drain within {timeout:?}"))
            }
        }
    }

    pub fn shutdown(&self) {
        for lane in &self.lanes {
            lane.stream.shutdown();
        }
    }
}

impl Drop for Lanes {
    fn drop(&mut self) {
        // The threads end when their job channels close (the senders go with `lanes`).
        self.shutdown();
    }
}

fn lane_loop(mut stream: Stream, inbox: mpsc::Receiver<Job>) {
    while let Ok(job) = inbox.recv() {
        let Bytes(start, len) = job.bytes;
        // SAFETY: the caller lent `len` bytes at `start` and waits until this job is done.
        let data = unsafe { std::slice::from_raw_parts(start, len) };
        let chunk = LANE_CHUNK as usize;
        let result = data
            .chunks(chunk)
            .skip(job.lane)
            .step_by(job.count)
            .try_for_each(|piece| stream.write_all(piece))
            .map_err(|e| format!("data lane {}: {e}", job.lane));
        job.done.finish(result);
    }
}
