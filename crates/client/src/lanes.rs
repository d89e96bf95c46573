//! Data lanes: extra connections of a session over which large transfers are striped. One TCP
//! stream moves data only as fast as one core copies it into or out of the socket (on a 16-core
//! H100 host: 3.1 GB/s from a 64 MiB buffer, 5.4 GB/s over four lanes into one reading thread),
//! so each lane has threads that copy its share of a transfer while the others copy theirs: a
//! sending thread for writes and a receiving thread for reads (separate, so that a write
//! waiting for the server never holds up a read the server is sending).
//!
//! Chunk `i` of a transfer ([`LANE_CHUNK`] bytes) goes over lane `i % lanes`, as raw bytes; the
//! server's session thread reads or writes them in that order (see the server's `lanes`
//! module).

use std::io::{Read, Write};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use rgpu_protocol::{LaneAttach, LaneKey, LANE_CHUNK};
use rgpu_transport::{client_handshake, Endpoint, Stream, Token};

use crate::ClientError;

/// The caller's memory, lent to lane threads while the caller waits for them: the bytes to
/// send, or where received bytes go (null: nowhere, they are dropped).
#[derive(Clone, Copy)]
struct Bytes(*mut u8, usize);
// SAFETY: lane threads touch the memory only while the caller that lent it waits for every
// lane to be done with it (`Lanes::send`, `Lanes::receive`).
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
    sends: mpsc::Sender<Job>,
    receives: mpsc::Sender<Job>,
    _threads: [JoinHandle<()>; 2],
}

/// The data lanes of one connection.
pub(crate) struct Lanes {
    lanes: Vec<Lane>,
    /// One striped write at a time, so that writes use the lanes in the order their requests
    /// left.
    turn: Mutex<()>,
    /// How long a transfer may take.
    timeout: Duration,
}

impl Lanes {
    /// Opens `count` lanes to `endpoint` joining session `session` with `key`.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        endpoint: &Endpoint,
        token: Option<&Token>,
        connect_timeout: Duration,
        timeout: Duration,
        client_name: &str,
        session: u64,
        key: LaneKey,
        count: usize,
    ) -> Result<Lanes, ClientError> {
        let mut lanes = Vec::with_capacity(count);
        for index in 0..count {
            let mut stream = Stream::connect(endpoint, connect_timeout)
                .map_err(|e| ClientError::Connect(format!("{endpoint}: data lane: {e}")))?;
            let attach = LaneAttach {
                session,
                key,
                index: index as u32,
            };
            client_handshake(&mut stream, token, client_name, Some(attach))
                .map_err(|e| ClientError::Connect(format!("{endpoint}: data lane: {e}")))?;
            let spawn = |name: String, work: fn(Stream, mpsc::Receiver<Job>)| {
                let stream = stream.try_clone().map_err(ClientError::io)?;
                let (jobs, inbox) = mpsc::channel();
                let thread = std::thread::Builder::new()
                    .name(name)
                    .spawn(move || work(stream, inbox))
                    .map_err(ClientError::io)?;
                Ok::<_, ClientError>((jobs, thread))
            };
            let (sends, sender) = spawn(format!("rgpu-lane{index}-out {endpoint}"), send_loop)?;
            let (receives, receiver) =
                spawn(format!("rgpu-lane{index}-in {endpoint}"), receive_loop)?;
            lanes.push(Lane {
                stream,
                sends,
                receives,
                _threads: [sender, receiver],
            });
        }
        Ok(Lanes {
            lanes,
            turn: Mutex::new(()),
            timeout,
        })
    }

    pub fn count(&self) -> usize {
        self.lanes.len()
    }

    /// Takes the lanes for one striped write; its request must leave while the turn is held.
    pub fn turn(&self) -> MutexGuard<'_, ()> {
        self.turn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `data` striped over every lane and waits until all of it is in the sockets (the
    /// caller may then reuse it). Needs the turn.
    pub fn send(&self, _turn: &MutexGuard<'_, ()>, data: &[u8]) -> Result<(), String> {
        let bytes = Bytes(data.as_ptr().cast_mut(), data.len());
        self.deal(bytes, |lane| &lane.sends)
    }

    /// Receives `len` bytes striped over every lane into `dst` (null: drops them) and waits
    /// for all of them. Only the connection's reader thread receives, one transfer at a time.
    pub fn receive(&self, dst: *mut u8, len: usize) -> Result<(), String> {
        self.deal(Bytes(dst, len), |lane| &lane.receives)
    }

    /// Gives each lane's thread (chosen by `queue`) its share of `bytes`, and waits.
    fn deal(
        &self,
        bytes: Bytes,
        queue: impl Fn(&Lane) -> &mpsc::Sender<Job>,
    ) -> Result<(), String> {
        let count = self.lanes.len();
        let done = Arc::new(Countdown {
            state: Mutex::new((count, None)),
            zero: Condvar::new(),
        });
        for (lane, target) in self.lanes.iter().enumerate() {
            let job = Job {
                bytes,
                lane,
                count,
                done: done.clone(),
            };
            if queue(target).send(job).is_err() {
                done.finish(Err(format!("data lane {lane} has stopped")));
            }
        }
        match done.wait(Some(self.timeout)) {
            Ok(()) => Ok(()),
            Err(Some(why)) => Err(why),
            Err(None) => {
                // The lanes must let go of the caller's memory before it returns: end them, so
                // their transfers fail at once, and wait for that.
                self.shutdown();
                let _ = done.wait(None);
                Err(format!(
                    "data lanes did not finish within {:?}",
                    self.timeout
                ))
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

/// The chunks of lane `lane` among `count` in `len` bytes: (offset, length) pairs.
fn chunks_of(lane: usize, count: usize, len: usize) -> impl Iterator<Item = (usize, usize)> {
    let chunk = LANE_CHUNK as usize;
    (lane * chunk..len)
        .step_by(chunk * count)
        .map(move |at| (at, chunk.min(len - at)))
}

fn send_loop(mut stream: Stream, inbox: mpsc::Receiver<Job>) {
    while let Ok(job) = inbox.recv() {
        let Bytes(start, len) = job.bytes;
        // SAFETY: the caller lent `len` readable bytes at `start` and waits until this job is
        // done.
        let data = unsafe { std::slice::from_raw_parts(start.cast_const(), len) };
        let result = chunks_of(job.lane, job.count, len)
            .try_for_each(|(at, n)| stream.write_all(&data[at..at + n]))
            .map_err(|e| format!("data lane {}: {e}", job.lane));
        job.done.finish(result);
    }
}

fn receive_loop(mut stream: Stream, inbox: mpsc::Receiver<Job>) {
    let mut scratch = Vec::new();
    while let Ok(job) = inbox.recv() {
        let Bytes(start, len) = job.bytes;
        let result = chunks_of(job.lane, job.count, len)
            .try_for_each(|(at, n)| {
                let into = if start.is_null() {
                    scratch.resize(n, 0);
                    &mut scratch[..n]
                } else {
                    // SAFETY: the caller lent `len` writable bytes at `start` and waits until
                    // this job is done; each lane writes only its own chunks.
                    unsafe { std::slice::from_raw_parts_mut(start.add(at), n) }
                };
                stream.read_exact(into)
            })
            .map_err(|e| format!("data lane {}: {e}", job.lane));
        job.done.finish(result);
    }
}

#[cfg(test)]
mod tests {
    use super::chunks_of;

    #[test]
    fn lanes_take_every_chunk_once() {
        let chunk = rgpu_protocol::LANE_CHUNK as usize;
        let len = chunk * 5 + 10;
        let mut seen: Vec<(usize, usize)> =
            (0..3).flat_map(|lane| chunks_of(lane, 3, len)).collect();
        seen.sort();
        let expected: Vec<(usize, usize)> = (0..6)
            .map(|i| (i * chunk, chunk.min(len - i * chunk)))
            .collect();
        assert_eq!(seen, expected);
        assert_eq!(chunks_of(0, 2, chunk).collect::<Vec<_>>(), [(0, chunk)]);
        assert_eq!(chunks_of(1, 2, chunk).count(), 0);
    }
}
