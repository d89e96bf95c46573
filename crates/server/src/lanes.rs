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

use std::collections::HashMap;
use std::io::Read;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rgpu_protocol::{LaneAttach, LaneKey, LANE_CHUNK, MAX_LANES};
use rgpu_transport::{ReadHalf, Stream};

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
    pub fn read(&mut self, readers: &mut LaneReaders, dst: &mut [u8]) -> Result<(), String> {
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
        Ok(())
    }

    /// Reads and drops the next `len` bytes of the request (at most what is left).
    pub fn skip(&mut self, readers: &mut LaneReaders, len: u64) -> Result<(), String> {
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

/// The session thread's reading handles on its lanes, taken as they are first needed.
pub(crate) struct LaneReaders {
    lanes: Arc<SessionLanes>,
    readers: Vec<Option<ReadHalf>>,
}

impl LaneReaders {
    pub fn new(lanes: Arc<SessionLanes>) -> LaneReaders {
        LaneReaders {
            lanes,
            readers: Vec::new(),
        }
    }

    fn lane(&mut self, index: usize) -> Result<&mut ReadHalf, String> {
        if self.readers.len() <= index {
            self.readers.resize_with(index + 1, || None);
        }
        if self.readers[index].is_none() {
            // A TLS lane is read ahead: the lanes of a session open their records in
            // parallel while the session thread copies.
            let reader = ReadHalf::of(self.lanes.take(index)?, &format!("rgpu-lane{index}"))
                .map_err(|e| format!("data lane {index}: {e}"))?;
            self.readers[index] = Some(reader);
        }
        Ok(self.readers[index].as_mut().expect("just taken"))
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
        let mut readers = LaneReaders::new(session);
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
}
