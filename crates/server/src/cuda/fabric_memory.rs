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

/// Chunk buffers: two for each transfer in flight (one filling while the other drains).
const BUFFERS: usize = 24;
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

    /// Makes `stream` wait until the returned gate is opened (or dropped).
    pub(super) fn hold(
        self: &Arc<Self>,
        backend: &Backend,
        stream: CUstream,
    ) -> Result<Gate, Status> {
        let gates = &self.gates;
        let (slot, target) = {
            let mut state = gates.state.lock().unwrap_or_else(|e| e.into_inner());
            let slot = state
                .free
                .pop()
                .ok_or(cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY as u32)?;
            state.targets[slot] = state.targets[slot].wrapping_add(1).max(1);
            (slot, state.targets[slot])
        };
        let address = gates.device + (slot * std::mem::size_of::<u32>()) as u64;
        let geq = CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        // SAFETY: a stream of the current context and a word of mapped page-locked memory.
        let waited = check(unsafe {
            cu_call!(
                backend.driver,
                cuStreamWaitValue32_v2(stream, address, target, geq)
            )
        });
        let gate = Gate {
            slot,
            target,
            memory: self.clone(),
        };
        waited.map(|()| gate)
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
    /// The value each slot's last gate opens at. Values only grow, so a stream that reaches
    /// an older wait on a reused slot after its gate opened passes it.
    targets: Vec<u32>,
}

/// A stream waits on this until it is opened; dropping it opens it.
pub(super) struct Gate {
    slot: usize,
    target: u32,
    memory: Arc<FabricMemory>,
}

impl Drop for Gate {
    fn drop(&mut self) {
        let gates = &self.memory.gates;
        let word = (gates.words + self.slot * std::mem::size_of::<u32>()) as *const AtomicU32;
        // SAFETY: a word of the gates' page-locked memory, which lives as long as the process;
        // the device only reads it.
        unsafe { (*word).store(self.target, Ordering::Release) };
        gates
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .free
            .push(self.slot);
    }
}
