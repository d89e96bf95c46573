//! Transfers between device memory and the fabric's page-locked chunk buffers *in a program's
//! stream* (peers.rs): the stream's copies are enqueued when the transfer is requested, each
//! behind a wait for its buffer, and a fabric thread moves the bytes between the buffers and
//! the network in step with the stream, through two [`Counter`]s per part.
//!
//! Why in the stream: a stream that waits on the fabric can hold back, on the device's shared
//! hardware queues, work enqueued after it on *any* stream of its context; if a fabric thread
//! copied on a stream of its own while a program's stream waited for that very copy, both
//! could wait forever. Here what a stream waits for is only the network and the host.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::{check, Status};
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::DevicePtr;
use rgpu_transport::peer::{Receive, PEER_TIMEOUT};

use super::fabric_memory::{ChunkBuffer, Counter, FabricMemory};
use super::Backend;
use crate::fabric::CHUNK;

/// Chunk buffers of each part: one is filled while the other is drained.
const RING: usize = 2;
/// How long a finished transfer waits for its stream to be done with its buffers (or counters)
/// before giving them back (past that, they are never given back: the stream may still use
/// them).
pub(super) const DRAIN_WAIT: Duration = Duration::from_secs(600);

/// Which way a ring moves bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Direction {
    /// From the network into device memory (a pull).
    ToDevice,
    /// From device memory to the network (an export).
    FromDevice,
}

/// A contiguous part of a transfer (one link's): chunk k goes through `ring[k % RING]`.
struct Part {
    offset: u64,
    len: u64,
    ring: Vec<Mutex<ChunkBuffer>>,
    /// Chunks the host side has done: landed from the network, or sent to it.
    host: Counter,
    /// Chunks the stream has done: copied to the device, or read from it.
    device: Counter,
}

impl Part {
    fn chunks(&self) -> usize {
        self.len.div_ceil(CHUNK as u64) as usize
    }

    /// Chunk `k`: its offset in the part and its length.
    fn chunk(&self, k: usize) -> (u64, usize) {
        let at = k as u64 * CHUNK as u64;
        (at, (self.len - at).min(CHUNK as u64) as usize)
    }
}

/// A transfer through chunk buffers in a stream's order.
pub(super) struct Ring {
    direction: Direction,
    parts: Vec<Part>,
}

/// Polls `done` until it holds, for at most `limit`.
pub(super) fn wait_until(limit: Duration, done: impl Fn() -> bool) -> bool {
    let started = Instant::now();
    while !done() {
        if started.elapsed() >= limit {
            return false;
        }
        if started.elapsed() < Duration::from_millis(1) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    true
}

impl Ring {
    /// The buffers and counters of a transfer cut into `plan`'s parts, nothing enqueued yet.
    pub(super) fn new(
        memory: &Arc<FabricMemory>,
        direction: Direction,
        plan: &[(u64, u64)],
    ) -> Result<Ring, Status> {
        let out_of_memory = |e: String| {
            log::warn!("a fabric transfer found no buffer: {e}");
            cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY as u32
        };
        let mut parts = Vec::with_capacity(plan.len());
        for &(offset, len) in plan {
            let chunks = len.div_ceil(CHUNK as u64) as usize;
            let ring = (0..chunks.min(RING))
                .map(|_| memory.buffer().map(Mutex::new))
                .collect::<Result<_, _>>()
                .map_err(out_of_memory)?;
            parts.push(Part {
                offset,
                len,
                ring,
                host: memory.counter()?,
                device: memory.counter()?,
            });
        }
        Ok(Ring { direction, parts })
    }

    /// Enqueues the stream's side on `stream` (of the current context), for device memory at
    /// `at`: per chunk, a wait for its buffer, the copy, and the count. Chunks of the parts
    /// alternate, so that every part moves at once.
    pub(super) fn enqueue(
        &self,
        backend: &Backend,
        stream: CUstream,
        at: DevicePtr,
    ) -> Result<(), Status> {
        let driver = &backend.driver;
        let most = self.parts.iter().map(Part::chunks).max().unwrap_or(0);
        for k in 0..most {
            for part in self.parts.iter().filter(|p| k < p.chunks()) {
                let (in_part, n) = part.chunk(k);
                let device = at + part.offset + in_part;
                let buffer = part.ring[k % RING]
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .ptr();
                match self.direction {
                    Direction::ToDevice => {
                        part.host.wait_on(backend, stream, k as u32 + 1)?;
                        // SAFETY: a page-locked buffer this ring holds until the stream is done
                        // with it (`device`), and a stream of the current context; the driver
                        // checks the device range.
                        check(unsafe {
                            cu_call!(
                                driver,
                                cuMemcpyHtoDAsync_v2(device, buffer.cast(), n, stream)
                            )
                        })?;
                    }
                    Direction::FromDevice => {
                        // The buffer's previous chunk must have been sent.
                        if k >= RING {
                            part.host.wait_on(backend, stream, (k - RING + 1) as u32)?;
                        }
                        // SAFETY: as above.
                        check(unsafe {
                            cu_call!(
                                driver,
                                cuMemcpyDtoHAsync_v2(buffer.cast(), device, n, stream)
                            )
                        })?;
                    }
                }
                part.device.write_on(backend, stream, k as u32 + 1)?;
            }
        }
        Ok(())
    }

    fn part(&self, offset: u64, len: u64) -> Result<&Part, String> {
        self.parts
            .iter()
            .find(|p| p.offset == offset && p.len == len)
            .ok_or_else(|| format!("bytes {offset}+{len} are not a part this transfer planned"))
    }

    /// Receives a part from the network, chunk after chunk, in step with the stream (which is
    /// past the program's earlier work: only the network can keep it).
    pub(super) fn receive(&self, offset: u64, len: u64, receive: Receive) -> Result<(), String> {
        let part = self.part(offset, len)?;
        for k in 0..part.chunks() {
            if k >= RING && !wait_until(PEER_TIMEOUT, || part.device.reached((k - RING + 1) as u32))
            {
                return Err("the pulling stream stopped copying".into());
            }
            let mut buffer = part.ring[k % RING]
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            receive(buffer.bytes_mut(part.chunk(k).1))?;
            part.host.set(k as u32 + 1);
        }
        Ok(())
    }

    /// Sends a part to the network as the stream reads it (the export is ready: the stream is
    /// past the program's earlier work).
    pub(super) fn send(
        &self,
        offset: u64,
        len: u64,
        send: crate::fabric::Send,
    ) -> Result<(), String> {
        let part = self.part(offset, len)?;
        for k in 0..part.chunks() {
            if !wait_until(PEER_TIMEOUT, || part.device.reached(k as u32 + 1)) {
                return Err("the exporting stream stopped reading".into());
            }
            let buffer = part.ring[k % RING]
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            send(buffer.bytes(part.chunk(k).1))?;
            part.host.set(k as u32 + 1);
        }
        Ok(())
    }

    /// Lets the stream past every wait (after a failure, with whatever the buffers hold) and
    /// waits until it is done with the buffers; whether it was in time (dropping a ring does
    /// this too).
    pub(super) fn finish(&mut self) -> bool {
        self.let_go();
        let parts = std::mem::take(&mut self.parts);
        let mut drained = true;
        for part in parts {
            let last = part.chunks() as u32;
            if wait_until(DRAIN_WAIT, || part.device.reached(last)) {
                continue;
            }
            // The stream may still use them.
            drained = false;
            part.device.leak();
            std::mem::forget(part.ring);
        }
        if !drained {
            log::warn!("a stream did not reach its fabric copies; their buffers are kept");
        }
        drained
    }
}

impl Ring {
    /// Lets the stream past every wait of the ring.
    pub(super) fn let_go(&self) {
        for part in &self.parts {
            part.host.set(part.chunks() as u32);
        }
    }

    /// Whether the stream is done with every buffer.
    pub(super) fn drained(&self) -> bool {
        self.parts
            .iter()
            .all(|part| part.device.reached(part.chunks() as u32))
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.finish();
    }
}
