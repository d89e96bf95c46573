//! Data lanes: extra connections of a session that carry the bytes of large transfers in
//! parallel. One TCP stream moves data only as fast as one core copies it into the socket;
//! a transfer striped over several lanes is copied by several client threads at once.
//!
//! A lane is an ordinary connection whose handshake names a session and presents the key that
//! session's welcome gave its client ([`rgpu_protocol::LaneAttach`]). It carries raw bytes
//! only: a striped request arrives on the session's own connection, and the session thread
//! then reads the request's bytes from the lanes in the order they were dealt
//! ([`rgpu_protocol::LANE_CHUNK`] bytes from each lane in turn). So requests keep one order,
//! and nothing but the session thread reads a lane.
//!
//! The other way, where the client asked for it (`ReadLanes`), a large read's data is dealt
//! the same way to a sending thread per lane ([`LaneSenders`]), announced by one `Data` frame
//! on the session's connection. With TLS each lane's thread seals its own records, so several
//! cores encrypt at once.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rgpu_protocol::{dealt, LaneAttach, LaneKey, LANE_CHUNK, MAX_LANES};
use rgpu_transport::{Countdown, ReadHalf, Stream};

/// How long a striped request waits for a lane that has not joined yet (its client opened it
/// before sending the request, so it is at most a handshake away).
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The lanes of one session.
pub(crate) struct SessionLanes {
    key: LaneKey,
    /// Joined lanes by index (the registry's handles, kept for shutdown).
    joined: Mutex<Vec<Option<Stream>>>,
    arrived: Condvar,
}

impl SessionLanes {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<Stream>>> {
        self.joined.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A reading handle on lane `index`, waiting for it to join.
    fn take(&self, index: usize) -> Result<Stream, String> {
        let deadline = Instant::now() + JOIN_TIMEOUT;
        let mut joined = self.lock();
        loop {
            if let Some(Some(stream)) = joined.get(index) {
                return stream
                    .try_clone()
                    .map_err(|e| format!("data lane {index}: {e}"));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("data lane {index} never joined"));
            }
            joined = self
                .arrived
                .wait_timeout(joined, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn shutdown(&self) {
        for stream in self.lock().iter().flatten() {
            stream.shutdown();
        }
    }
}

/// Every live session's lanes, by session id.
#[derive(Default)]
pub(crate) struct LaneRegistry {
    sessions: Mutex<HashMap<u64, Arc<SessionLanes>>>,
}

impl LaneRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<SessionLanes>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens session `id` to lanes that present `key`.
    pub fn open(&self, id: u64, key: LaneKey) -> Arc<SessionLanes> {
        let lanes = Arc::new(SessionLanes {
            key,
            joined: Mutex::new(Vec::new()),
            arrived: Condvar::new(),
        });
        self.lock().insert(id, lanes.clone());
        lanes
    }

    /// Session `id`'s lanes: the ones opened already, else opened now with `key`.
    pub fn open_or_get(&self, id: u64, key: LaneKey) -> Arc<SessionLanes> {
        if let Some(lanes) = self.lock().get(&id) {
            return lanes.clone();
        }
        self.open(id, key)
    }

    /// Closes session `id` to lanes and ends the ones it had.
    pub fn close(&self, id: u64) {
        if let Some(lanes) = self.lock().remove(&id) {
            lanes.shutdown();
        }
    }

    /// Makes `stream` lane `attach.index` of its session, if the session exists and the key
    /// is its own.
    pub fn join(&self, attach: &LaneAttach, stream: &Stream) -> Result<(), String> {
        let refused = || "not a data lane of a session on this server".to_string();
        let lanes = self
            .lock()
            .get(&attach.session)
            .cloned()
            .ok_or_else(refused)?;
        if !keys_match(&lanes.key, &attach.key) || attach.index >= MAX_LANES {
            return Err(refused());
        }
        let stream = stream.try_clone().map_err(|e| e.to_string())?;
        let index = attach.index as usize;
        let mut joined = lanes.lock();
        if joined.len() <= index {
            joined.resize_with(index + 1, || None);
        }
        if joined[index].is_some() {
            return Err(format!("data lane {index} has joined already"));
        }
        joined[index] = Some(stream);
        lanes.arrived.notify_all();
        Ok(())
    }

    /// Ends every lane (server shutdown).
    pub fn shutdown(&self) {
        for lanes in self.lock().values() {
            lanes.shutdown();
        }
    }
}

/// Compares keys in time independent of where they differ.
pub(crate) fn keys_match(a: &LaneKey, b: &LaneKey) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The bytes of one striped request: `len` bytes dealt over the first `count` lanes.
pub(crate) struct Striped {
    len: u64,
    count: usize,
    taken: u64,
}

impl Striped {
    pub fn new(len: u64, count: u32) -> Striped {
        Striped {
            len,
            count: count as usize,
            taken: 0,
        }
    }

    pub fn remaining(&self) -> u64 {
        self.len - self.taken
    }

    /// Reads the next `dst.len()` bytes of the request from the lanes it was dealt over.
    pub fn read(&mut self, readers: &mut LaneHandles, dst: &mut [u8]) -> Result<(), String> {
        if dst.len() as u64 > self.remaining() {
            return Err("a request read past its striped bulk".into());
        }
        let mut at = 0;
        while at < dst.len() {
            let chunk = self.taken / LANE_CHUNK;
            let lane = (chunk % self.count as u64) as usize;
            let left_in_chunk = (LANE_CHUNK - self.taken % LANE_CHUNK) as usize;
            let n = left_in_chunk.min(dst.len() - at);
            readers
                .lane(lane)?
                .read_exact(&mut dst[at..at + n])
                .map_err(|e| format!("data lane {lane}: {e}"))?;
            at += n;
            self.taken += n as u64;
        }
        crate::flight::lane_received(dst.len() as u64);
        Ok(())
    }

    /// Reads and drops the next `len` bytes of the request (at most what is left).
    pub fn skip(&mut self, readers: &mut LaneHandles, len: u64) -> Result<(), String> {
        let mut left = len.min(self.remaining());
        let mut scratch = vec![0u8; (LANE_CHUNK.min(left)) as usize];
        while left > 0 {
            let n = scratch.len().min(left as usize);
            self.read(readers, &mut scratch[..n])?;
            left -= n as u64;
        }
        Ok(())
    }
}

/// The session thread's handles on its lanes: reading handles taken as they are first needed,
/// sending threads started at the first striped read.
pub(crate) struct LaneHandles {
    lanes: Arc<SessionLanes>,
    readers: Vec<Option<ReadHalf>>,
    senders: Option<LaneSenders>,
}

impl LaneHandles {
    pub fn new(lanes: Arc<SessionLanes>) -> LaneHandles {
        LaneHandles {
            lanes,
            readers: Vec::new(),
            senders: None,
        }
    }

    /// Sending threads on the first `count` lanes (started if need be).
    pub fn senders(&mut self, count: u32) -> Result<&LaneSenders, String> {
        if self
            .senders
            .as_ref()
            .is_none_or(|s| s.lanes.len() < count as usize)
        {
            self.senders = Some(LaneSenders::start(&self.lanes, count)?);
        }
        Ok(self.senders.as_ref().expect("just started"))
    }

    fn lane(&mut self, index: usize) -> Result<&mut ReadHalf, String> {
        if self.readers.len() <= index {
            self.readers.resize_with(index + 1, || None);
        }
        if self.readers[index].is_none() {
            // Lanes are read ahead: the lanes of a session take their bytes from the socket
            // (and in TLS open their records) in parallel while the session thread copies.
            let reader = ReadHalf::ahead(self.lanes.take(index)?, &format!("rgpu-lane{index}"))
                .map_err(|e| format!("data lane {index}: {e}"))?;
            self.readers[index] = Some(reader);
        }
        Ok(self.readers[index].as_mut().expect("just taken"))
    }
}

/// Memory a sending thread writes out while its owner waits (see [`LaneSenders::send`]).
#[derive(Clone, Copy)]
struct Lent(*const u8, usize);
// SAFETY: sending threads only read the bytes, and only until the job's countdown finishes;
// their owner keeps them unchanged until then (`Staging` waits for it before reusing a slot).
unsafe impl Send for Lent {}

struct Outgoing {
    bytes: Lent,
    done: Arc<Countdown>,
}

/// A thread per lane writing what it is given to its lane, in order.
pub(crate) struct LaneSenders {
    lanes: Vec<mpsc::Sender<Outgoing>>,
}

impl LaneSenders {
    fn start(lanes: &SessionLanes, count: u32) -> Result<LaneSenders, String> {
        let mut senders = Vec::with_capacity(count as usize);
        for index in 0..count as usize {
            let mut stream = lanes.take(index)?;
            let (sender, inbox) = mpsc::channel::<Outgoing>();
            std::thread::Builder::new()
                .name(format!("rgpu-lane{index}-out"))
                .spawn(move || {
                    // Ends when the session drops its senders; a failed write fails each job
                    // after it at once (the stream is shut down).
                    while let Ok(job) = inbox.recv() {
                        let Lent(start, len) = job.bytes;
                        // SAFETY: see `Lent`: the owner keeps these bytes until `done` finishes.
                        let bytes = unsafe { std::slice::from_raw_parts(start, len) };
                        let result = stream.write_all(bytes).map_err(|e| {
                            stream.shutdown();
                            format!("data lane {index}: {e}")
                        });
                        job.done.finish(result);
                    }
                })
                .map_err(|e| format!("data lane {index}: {e}"))?;
            senders.push(sender);
        }
        Ok(LaneSenders { lanes: senders })
    }
}

/// The data of one read going out striped over the first `count` lanes: `len` bytes, dealt in
/// order.
pub(crate) struct StripedOut {
    count: u32,
    len: u64,
    dealt: u64,
    /// One countdown per dealt piece of memory, to learn of failures at the end.
    pieces: Vec<Arc<Countdown>>,
}

impl StripedOut {
    pub fn new(len: u64, count: u32) -> StripedOut {
        StripedOut {
            count,
            len,
            dealt: 0,
            pieces: Vec::new(),
        }
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// Hands the next `bytes` of the read to the lanes' threads. The returned countdown
    /// finishes when they are written: until then `bytes` must stay as they are (the caller
    /// lends them; that is why this is unsafe).
    ///
    /// # Safety
    /// `bytes` must stay valid and unchanged until the returned countdown has finished.
    pub unsafe fn deal(
        &mut self,
        senders: &LaneSenders,
        bytes: &[u8],
    ) -> Result<Arc<Countdown>, String> {
        if bytes.len() as u64 > self.len - self.dealt {
            return Err("a read dealt past its announced length".into());
        }
        let done = Arc::new(Countdown::new(0));
        for (lane, range) in dealt(self.dealt, bytes.len(), self.count) {
            done.add();
            let piece = &bytes[range];
            let job = Outgoing {
                bytes: Lent(piece.as_ptr(), piece.len()),
                done: done.clone(),
            };
            if let Err(mpsc::SendError(job)) = senders.lanes[lane].send(job) {
                job.done
                    .finish(Err(format!("data lane {lane} has stopped")));
            }
        }
        self.dealt += bytes.len() as u64;
        self.pieces.push(done.clone());
        Ok(done)
    }

    /// Deals zeros for whatever was announced and not dealt (a read that failed midway: the
    /// client still takes every announced byte), then waits until the lanes have written all
    /// of it. `Err` if a lane failed.
    pub fn finish(mut self, senders: &LaneSenders) -> Result<(), String> {
        let left = self.len - self.dealt;
        let zeros = vec![0u8; left.min(LANE_CHUNK) as usize];
        let mut padded = Ok(());
        while self.dealt < self.len && padded.is_ok() {
            let n = zeros.len().min((self.len - self.dealt) as usize);
            // SAFETY: `zeros` lives until every piece's countdown is waited for below.
            padded = unsafe { self.deal(senders, &zeros[..n]) }
                .and_then(|done| done.wait(None).map_err(|why| why.unwrap_or_default()));
        }
        for piece in &self.pieces {
            piece.wait(None).map_err(|why| why.unwrap_or_default())?;
        }
        padded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    /// Deals `data` over `count` socket pairs as a client would, and reads it back through a
    /// registry-joined session.
    #[test]
    fn striped_bytes_come_back_in_order() {
        let registry = LaneRegistry::default();
        let key = [5u8; 32];
        let session = registry.open(1, key);
        let count = 3;
        let data: Vec<u8> = (0..(LANE_CHUNK as usize * 4 + 777))
            .map(|i| (i % 251) as u8)
            .collect();
        let mut writers = Vec::new();
        for index in 0..count {
            let (ours, theirs) = UnixStream::pair().unwrap();
            let attach = LaneAttach {
                session: 1,
                key,
                index,
            };
            registry.join(&attach, &Stream::Unix(theirs)).unwrap();
            writers.push(ours);
        }
        let wrong = LaneAttach {
            session: 1,
            key: [6; 32],
            index: 0,
        };
        let (_, spare) = UnixStream::pair().unwrap();
        assert!(registry.join(&wrong, &Stream::Unix(spare)).is_err());

        let dealt = data.clone();
        let sender = std::thread::spawn(move || {
            for (i, chunk) in dealt.chunks(LANE_CHUNK as usize).enumerate() {
                writers[i % count as usize].write_all(chunk).unwrap();
            }
        });
        let mut readers = LaneHandles::new(session);
        let mut striped = Striped::new(data.len() as u64, count);
        let mut back = vec![0u8; data.len()];
        // Pieces that straddle the chunks, as the server's staging pieces may.
        let (first, rest) = back.split_at_mut(1_500_000);
        striped.read(&mut readers, first).unwrap();
        let (second, third) = rest.split_at_mut(100);
        striped.read(&mut readers, second).unwrap();
        striped.read(&mut readers, &mut third[..2_000_000]).unwrap();
        striped.skip(&mut readers, u64::MAX).unwrap();
        sender.join().unwrap();
        assert_eq!(back[..3_500_100], data[..3_500_100]);
        assert_eq!(striped.remaining(), 0);
        registry.close(1);
    }

    /// A read dealt to the lanes' sending threads arrives in order on the lanes; what a read
    /// that failed midway did not deal arrives as zeros.
    #[test]
    fn striped_reads_go_out_in_order_and_are_padded() {
        let registry = LaneRegistry::default();
        let key = [7u8; 32];
        let session = registry.open(2, key);
        let mut client_ends = Vec::new();
        for index in 0..2 {
            let (ours, theirs) = UnixStream::pair().unwrap();
            let attach = LaneAttach {
                session: 2,
                key,
                index,
            };
            registry.join(&attach, &Stream::Unix(theirs)).unwrap();
            client_ends.push(ours);
        }
        let len = 3 * LANE_CHUNK as usize + 999;
        let data: Vec<u8> = (0..len).map(|i| (i % 249) as u8 | 1).collect();
        let receiver = std::thread::spawn(move || {
            let mut back = vec![0u8; len];
            for (lane, range) in dealt(0, len, 2) {
                client_ends[lane].read_exact(&mut back[range]).unwrap();
            }
            back
        });
        let mut handles = LaneHandles::new(session);
        let mut out = StripedOut::new(len as u64, 2);
        let senders = handles.senders(2).unwrap();
        // Pieces that straddle the lane chunks; the last 1 MiB is never dealt.
        let dealt_len = len - LANE_CHUNK as usize;
        for piece in data[..dealt_len].chunks(700_000) {
            // SAFETY: `data` outlives the countdowns (waited for by finish below).
            unsafe { out.deal(senders, piece) }.unwrap();
        }
        out.finish(senders).unwrap();
        let back = receiver.join().unwrap();
        assert!(back[..dealt_len] == data[..dealt_len], "dealt bytes differ");
        assert!(
            back[dealt_len..].iter().all(|&b| b == 0),
            "padding is zeros"
        );
        registry.close(2);
    }
}
