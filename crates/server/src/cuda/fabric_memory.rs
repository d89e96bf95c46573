//! Host memory the fabric's CUDA transfers use (crate::fabric, peers.rs): page-locked chunk
//! buffers, so device copies run at PCIe speed and overlap the network, and *gates*, words of
//! page-locked memory a stream waits on (`cuStreamWaitValue32`) until the fabric opens them,
//! which is how a transfer done by a background thread takes its place in a stream's order.
//!
//! Both are made once per process by a session's request thread, before any stream waits on a
//! gate: making page-locked memory may wait for the device, and a device waiting on a gate
//! would then wait for itself.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::{check, Status};
use rgpu_cuda_api::sys::*;

use super::Backend;
use crate::fabric::CHUNK;

/// Chunk buffers: two for each part of a transfer in flight (one filling while the other
/// drains).
const BUFFERS: usize = 32;
/// Gates: streams that may wait on the fabric at once.
const GATES: usize = 1024;
/// How long a transfer waits for a free chunk buffer.
const BUFFER_WAIT: Duration = Duration::from_secs(30);

/// The process's fabric memory.
pub(super) struct FabricMemory {
    free: Mutex<Vec<usize>>,
    returned: Condvar,
    gates: Gates,
}

// SAFETY: the addresses are page-locked host memory owned by this value for the process's
// life; the free list and the gate words are behind a lock or atomics.
unsafe impl Send for FabricMemory {}
// SAFETY: as above.
unsafe impl Sync for FabricMemory {}

impl FabricMemory {
    /// Makes the buffers and the gates (in the calling thread's current context; the memory
    /// serves every context, being portable).
    pub(super) fn new(backend: &Backend) -> Result<FabricMemory, Status> {
        let driver = &backend.driver;
        let flags = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP;
        let mut free = Vec::with_capacity(BUFFERS);
        for _ in 0..BUFFERS {
            let mut host = std::ptr::null_mut();
            // SAFETY: a local out-pointer; the memory is kept for the process's life.
            check(unsafe { cu_call!(driver, cuMemHostAlloc(&mut host, CHUNK, flags)) })?;
            free.push(host as usize);
        }
        let words = GATES * std::mem::size_of::<u32>();
        let mut host = std::ptr::null_mut();
        // SAFETY: as above; the words start zeroed below.
        check(unsafe { cu_call!(driver, cuMemHostAlloc(&mut host, words, flags)) })?;
        // SAFETY: `words` bytes just allocated.
        unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, words) };
        let mut device = 0;
        // SAFETY: mapped page-locked memory and a local out-value.
        check(unsafe { cu_call!(driver, cuMemHostGetDevicePointer_v2(&mut device, host, 0)) })?;
        Ok(FabricMemory {
            free: Mutex::new(free),
            returned: Condvar::new(),
            gates: Gates {
                words: host as usize,
                device,
                state: Mutex::new(GateState {
                    free: (0..GATES).rev().collect(),
                    targets: vec![0; GATES],
                }),
            },
        })
    }

    /// A chunk buffer, waiting for one to be given back when all are in use.
    pub(super) fn buffer(self: &Arc<Self>) -> Result<ChunkBuffer, String> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(address) = free.pop() {
                return Ok(ChunkBuffer {
                    address,
                    memory: self.clone(),
                });
            }
            let (guard, timeout) = self
                .returned
                .wait_timeout(free, BUFFER_WAIT)
                .unwrap_or_else(|e| e.into_inner());
            free = guard;
            if timeout.timed_out() && free.is_empty() {
                return Err("no fabric buffer came free".into());
            }
        }
    }

    /// A counter: a word of page-locked memory that the host and streams count up in
    /// step with a transfer (see [`Counter`]).
    pub(super) fn counter(self: &Arc<Self>) -> Result<Counter, Status> {
        let mut state = self.gates.state.lock().unwrap_or_else(|e| e.into_inner());
        let slot = state
            .free
            .pop()
            .ok_or(cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY as u32)?;
        Ok(Counter {
            slot,
            base: state.targets[slot],
            high: AtomicU32::new(0),
            memory: self.clone(),
        })
    }

    /// Makes `stream` wait until the returned gate is opened (or dropped).
    pub(super) fn hold(
        self: &Arc<Self>,
        backend: &Backend,
        stream: CUstream,
    ) -> Result<Gate, Status> {
        let counter = self.counter()?;
        counter.wait_on(backend, stream, 1)?;
        Ok(Gate { _counter: counter })
    }
}

/// A page-locked chunk buffer of [`CHUNK`] bytes, given back when dropped.
pub(super) struct ChunkBuffer {
    address: usize,
    memory: Arc<FabricMemory>,
}

impl ChunkBuffer {
    pub(super) fn ptr(&self) -> *mut u8 {
        self.address as *mut u8
    }

    /// The first `len` bytes (at most [`CHUNK`]).
    pub(super) fn bytes(&self, len: usize) -> &[u8] {
        // SAFETY: CHUNK bytes of page-locked memory this value holds alone.
        unsafe { std::slice::from_raw_parts(self.ptr(), len.min(CHUNK)) }
    }

    /// The first `len` bytes (at most [`CHUNK`]), writable.
    pub(super) fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), len.min(CHUNK)) }
    }
}

impl Drop for ChunkBuffer {
    fn drop(&mut self) {
        let memory = &self.memory;
        memory
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.address);
        memory.returned.notify_one();
    }
}

struct Gates {
    /// The words, in host memory.
    words: usize,
    /// The same words as the device addresses them.
    device: CUdeviceptr,
    state: Mutex<GateState>,
}

struct GateState {
    free: Vec<usize>,
    /// The value each slot's word holds once its last counter is done with it: the next
    /// counter of that slot counts on from there, so a value a stream waits for is never one
    /// the word already holds.
    targets: Vec<u32>,
}

/// A word of page-locked memory counting a transfer's progress, from 0. Either the host sets
/// it ([`Counter::set`]) and streams wait for values ([`Counter::wait_on`]): *landed* chunks
/// a stream may copy; or a stream writes it ([`Counter::write_on`]) and the host reads it
/// ([`Counter::reached`]): chunks a stream has copied. Dropped, it lets every stream wait
/// pass; a counter a stream may still write must be leaked instead ([`Counter::leak`]).
///
/// Only the host, a network or device work enqueued *before* a wait may be what moves a
/// counter a stream waits on: streams share the device's hardware queues, so a stream held
/// by a wait can hold back work enqueued after it on any other stream.
pub(super) struct Counter {
    slot: usize,
    base: u32,
    /// The highest value used (waited for or written).
    high: AtomicU32,
    memory: Arc<FabricMemory>,
}

impl Counter {
    fn word(&self) -> &AtomicU32 {
        let gates = &self.memory.gates;
        let word = (gates.words + self.slot * std::mem::size_of::<u32>()) as *const AtomicU32;
        // SAFETY: a word of the gates' page-locked memory, which lives as long as the process
        // and is only ever accessed atomically (or by the device).
        unsafe { &*word }
    }

    fn device_word(&self) -> CUdeviceptr {
        self.memory.gates.device + (self.slot * std::mem::size_of::<u32>()) as u64
    }

    /// The device address of the word and the word's value for `value`, noted as used.
    fn target(&self, value: u32) -> (CUdeviceptr, u32) {
        self.high.fetch_max(value, Ordering::SeqCst);
        (self.device_word(), self.base.wrapping_add(value))
    }

    /// Makes `stream` wait until the counter reaches `value`.
    pub(super) fn wait_on(
        &self,
        backend: &Backend,
        stream: CUstream,
        value: u32,
    ) -> Result<(), Status> {
        let (word, target) = self.target(value);
        let geq = CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        // SAFETY: a stream of the current context and a word of mapped page-locked memory.
        check(unsafe {
            cu_call!(
                backend.driver,
                cuStreamWaitValue32_v2(stream, word, target, geq)
            )
        })
    }

    /// Makes `stream` set the counter to `value` once its earlier work is done.
    pub(super) fn write_on(
        &self,
        backend: &Backend,
        stream: CUstream,
        value: u32,
    ) -> Result<(), Status> {
        let (word, target) = self.target(value);
        // SAFETY: as above.
        check(unsafe {
            cu_call!(
                backend.driver,
                cuStreamWriteValue32_v2(stream, word, target, 0)
            )
        })
    }

    /// Sets the counter to `value` from the host (streams waiting for it go on).
    pub(super) fn set(&self, value: u32) {
        self.high.fetch_max(value, Ordering::SeqCst);
        self.word()
            .store(self.base.wrapping_add(value), Ordering::Release);
    }

    /// Whether the counter has reached `value`.
    pub(super) fn reached(&self, value: u32) -> bool {
        let now = self.word().load(Ordering::Acquire).wrapping_sub(self.base);
        // Counts stay far below half the range: a smaller difference is a value not reached.
        now >= value && now < u32::MAX / 2
    }

    /// Gives up the counter without freeing its word, which a stream may still write.
    pub(super) fn leak(self) {
        std::mem::forget(self);
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        let high = self.high.load(Ordering::SeqCst);
        let last = self.base.wrapping_add(high);
        self.word().store(last, Ordering::Release);
        let mut state = self
            .memory
            .gates
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        state.targets[self.slot] = last;
        state.free.push(self.slot);
    }
}

/// A stream waits on this until it is dropped (its counter's drop lets the wait pass).
pub(super) struct Gate {
    _counter: Counter,
}
