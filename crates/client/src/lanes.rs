//! Data lanes: extra connections of a session over which large transfers are striped. One TCP
//! stream moves data only as fast as one core copies it into the socket (on a 16-core H100
//! host: 3.1 GB/s from a 64 MiB buffer, 5.4 GB/s over four lanes into one reading thread), so
//! each lane has a thread that copies its share of a transfer at the same time as the others.
//!
//! Chunk `i` of a transfer ([`LANE_CHUNK`](rgpu_protocol::LANE_CHUNK) bytes) goes over lane `i % lanes`, as raw bytes; the
//! server's session thread reads them back in that order (see the server's `lanes` module).
//! Large reads come back the same way where the session asked for it (`ReadLanes`): each lane
//! also has a receiving thread, so that with TLS several cores open the records.

use std::io::{Read, Write};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use rgpu_protocol::{dealt, LaneAttach, LaneKey};
use rgpu_transport::{client_handshake, Countdown, Endpoint, Stream};

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

/// Where a lane's receiving thread puts its share of a striped read (null: nowhere, the
/// bytes are dropped).
#[derive(Clone, Copy)]
struct Destination(*mut u8, usize);
// SAFETY: each receiving thread writes only its own lane's pieces, and only while the reader
// thread that lent the memory waits for every lane to be done (`Lanes::receive`).
unsafe impl Send for Destination {}

struct Receipt {
    destination: Destination,
    lane: usize,
    count: u32,
    done: Arc<Countdown>,
}

struct Lane {
    stream: Stream,
    jobs: mpsc::Sender<Job>,
    receipts: mpsc::Sender<Receipt>,
    _threads: [JoinHandle<()>; 2],
}

impl Lane {
    /// Starts the sending and the receiving thread of lane `index` (of `peer`) on `stream`.
    fn start(stream: Stream, index: usize, peer: &str) -> Result<Lane, ClientError> {
        let writer = stream.try_clone().map_err(ClientError::io)?;
        let reader = stream.try_clone().map_err(ClientError::io)?;
        let (jobs, inbox) = mpsc::channel();
        let (receipts, receipt_inbox) = mpsc::channel();
        let sending = std::thread::Builder::new()
            .name(format!("rgpu-lane{index} {peer}"))
            .spawn(move || lane_loop(writer, inbox))
            .map_err(ClientError::io)?;
        let receiving = std::thread::Builder::new()
            .name(format!("rgpu-lane{index}-in {peer}"))
            .spawn(move || receive_loop(reader, receipt_inbox))
            .map_err(ClientError::io)?;
        Ok(Lane {
            stream,
            jobs,
            receipts,
            _threads: [sending, receiving],
        })
    }
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
            lanes.push(Lane::start(stream, index, &endpoint.to_string())?);
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
        let done = Arc::new(Countdown::new(count));
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
        self.wait_for(&done, timeout)
    }

    /// Takes the `len` bytes of a striped read that the server deals over the first `count`
    /// lanes into `dst` (null: drops them), and waits until all are in. The reader thread
    /// calls this when the read's announcement arrives, so reads keep the order of their
    /// frames. Fails, ending the lanes, if they do not deliver within `timeout`.
    pub fn receive(
        &self,
        dst: *mut u8,
        len: usize,
        count: u32,
        timeout: Duration,
    ) -> Result<(), String> {
        if count as usize > self.lanes.len() {
            return Err(format!(
                "a read striped over {count} lanes; this connection has {}",
                self.lanes.len()
            ));
        }
        let done = Arc::new(Countdown::new(count as usize));
        for (lane, target) in self.lanes.iter().take(count as usize).enumerate() {
            let receipt = Receipt {
                destination: Destination(dst, len),
                lane,
                count,
                done: done.clone(),
            };
            if target.receipts.send(receipt).is_err() {
                done.finish(Err(format!("data lane {lane} has stopped")));
            }
        }
        self.wait_for(&done, timeout)
    }

    /// Waits for a striped transfer's lanes; on timeout ends them (so that they let go of the
    /// caller's memory at once) before returning.
    fn wait_for(&self, done: &Countdown, timeout: Duration) -> Result<(), String> {
        match done.wait(Some(timeout)) {
            Ok(()) => Ok(()),
            Err(Some(why)) => Err(why),
            Err(None) => {
                self.shutdown();
                let _ = done.wait(None);
                Err(format!("data lanes did not finish within {timeout:?}"))
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
        // The threads end when their job channels close (the senders go with `lanes`), or at
        // once if blocked on the socket.
        self.shutdown();
    }
}

fn lane_loop(mut stream: Stream, inbox: mpsc::Receiver<Job>) {
    while let Ok(job) = inbox.recv() {
        let Bytes(start, len) = job.bytes;
        // SAFETY: the caller lent `len` bytes at `start` and waits until this job is done.
        let data = unsafe { std::slice::from_raw_parts(start, len) };
        let result = dealt(0, len, job.count as u32)
            .filter(|(lane, _)| *lane == job.lane)
            .try_for_each(|(_, range)| stream.write_all(&data[range]))
            .map_err(|e| format!("data lane {}: {e}", job.lane));
        job.done.finish(result);
    }
}

fn receive_loop(mut stream: Stream, inbox: mpsc::Receiver<Receipt>) {
    let mut scratch = Vec::new();
    while let Ok(receipt) = inbox.recv() {
        let Destination(start, len) = receipt.destination;
        let result = dealt(0, len, receipt.count)
            .filter(|(lane, _)| *lane == receipt.lane)
            .try_for_each(|(_, range)| {
                let piece = if start.is_null() {
                    scratch.resize(range.len(), 0);
                    &mut scratch[..]
                } else {
                    // SAFETY: the reader thread lent `len` writable bytes at `start` and waits
                    // until every lane is done; this lane writes only its own pieces.
                    unsafe { std::slice::from_raw_parts_mut(start.add(range.start), range.len()) }
                };
                stream.read_exact(piece)
            })
            .map_err(|e| format!("data lane {}: {e}", receipt.lane));
        receipt.done.finish(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// Lanes over socket pairs; the other ends, as the server's.
    fn lanes(count: usize) -> (Lanes, Vec<UnixStream>) {
        let mut ours = Vec::new();
        let mut theirs = Vec::new();
        for index in 0..count {
            let (a, b) = UnixStream::pair().unwrap();
            ours.push(Lane::start(Stream::Unix(a), index, "test").unwrap());
            theirs.push(b);
        }
        let lanes = Lanes {
            lanes: ours,
            turn: Mutex::new(()),
        };
        (lanes, theirs)
    }

    /// Deals `data` over the first `count` of `ends` as a server would.
    fn deal(mut ends: Vec<UnixStream>, data: Vec<u8>, count: u32) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            for (lane, range) in dealt(0, data.len(), count) {
                ends[lane].write_all(&data[range]).unwrap();
            }
        })
    }

    #[test]
    fn striped_reads_land_in_place_or_are_dropped() {
        let (lanes, ends) = lanes(4);
        let len = 5 * (1 << 20) + 12_345;
        let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
        // Over three of the four lanes, then the same again into nowhere: the lanes stay in
        // step (the next read's bytes are its own).
        let mut second = data.clone();
        second.reverse();
        let mut both = data.clone();
        both.extend_from_slice(&second);
        let ends_again: Vec<UnixStream> = ends.iter().map(|e| e.try_clone().unwrap()).collect();
        let sender = deal(ends, data.clone(), 3);
        let mut back = vec![0u8; len];
        let timeout = Duration::from_secs(30);
        lanes.receive(back.as_mut_ptr(), len, 3, timeout).unwrap();
        sender.join().unwrap();
        assert!(back == data, "striped read bytes differ");

        let sender = deal(ends_again, second.clone(), 3);
        lanes
            .receive(std::ptr::null_mut(), len, 3, timeout)
            .unwrap();
        sender.join().unwrap();

        assert!(
            lanes.receive(back.as_mut_ptr(), len, 5, timeout).is_err(),
            "more lanes than open"
        );
    }

    #[test]
    fn a_silent_lane_fails_the_read_in_time() {
        let (lanes, _ends) = lanes(2);
        let mut back = vec![0u8; 3 << 20];
        let failed = lanes.receive(back.as_mut_ptr(), back.len(), 2, Duration::from_millis(200));
        assert!(failed.unwrap_err().contains("did not finish"));
    }
}
