//! Pinned host buffers through which a session's copies between the socket and GPU memory are
//! pipelined: while one chunk crosses PCIe, the next crosses the network.
//!
//! Each slot is guarded by an event recorded after the copy that uses it; a slot is reused only
//! when its event has completed, and when the data lanes' threads that were lent its buffer
//! (a striped read) have written it out. The buffers are allocated in the context of the first copy
//! (portable, so every context can use them) and freed before that context is destroyed.

use std::collections::HashMap;
use std::ptr::null_mut;
use std::sync::Arc;

use rgpu_transport::Countdown;

use rgpu_cuda_api::sys::*;

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::{check, Driver, Status};

pub const CHUNK: usize = 1 << 20;
pub const SLOTS: usize = 16;

struct Slot {
    host: *mut u8,
    /// The event of the last copy through this slot, and its context.
    guard: Option<(CUcontext, CUevent)>,
    /// Lane threads writing the buffer out (a striped read); their failures are the read's.
    lent: Option<Arc<Countdown>>,
}

#[derive(Default)]
pub struct Staging {
    slots: Vec<Slot>,
    /// The context the buffers were allocated in.
    owner: Option<CUcontext>,
    /// Completed events, per context, ready to guard the next copy.
    spare_events: HashMap<usize, Vec<CUevent>>,
    next: usize,
}

impl Staging {
    /// The index of the slot to use next (round robin), its buffers allocated if need be in
    /// the current context `ctx`.
    pub fn next_slot(&mut self, driver: &Driver, ctx: CUcontext) -> Result<usize, Status> {
        if self.slots.is_empty() {
            for _ in 0..SLOTS {
                let mut host = null_mut();
                let flags = CU_MEMHOSTALLOC_PORTABLE;
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                let status = unsafe { cu_call!(driver, cuMemHostAlloc(&mut host, CHUNK, flags)) };
                if let Err(status) = check(status) {
                    self.free(driver);
                    return Err(status);
                }
                self.slots.push(Slot {
                    host: host.cast(),
                    guard: None,
                    lent: None,
                });
            }
            self.owner = Some(ctx);
        }
        let index = self.next;
        self.next = (self.next + 1) % self.slots.len();
        Ok(index)
    }

    /// Whether the slot `next_slot` gives next can take a copy without waiting for data lanes
    /// still writing it out (its last copy, if any, was waited for when it was lent).
    pub fn next_is_free(&self) -> bool {
        self.slots
            .get(self.next)
            .and_then(|slot| slot.lent.as_ref())
            .is_none_or(|lent| lent.is_done())
    }

    /// Waits until the slot's last copy is done and lends its buffer.
    pub fn buffer(&mut self, driver: &Driver, index: usize) -> Result<&mut [u8], Status> {
        self.wait(driver, index)?;
        // SAFETY: the buffer is CHUNK bytes of pinned host memory owned by this pool, and no
        // copy uses it any more (its guard event completed).
        Ok(unsafe { std::slice::from_raw_parts_mut(self.slots[index].host, CHUNK) })
    }

    /// Records on `stream` (of context `ctx`) the event that guards the slot's buffer.
    pub fn guard(
        &mut self,
        driver: &Driver,
        index: usize,
        ctx: CUcontext,
        stream: CUstream,
    ) -> Result<(), Status> {
        let event = match self
            .spare_events
            .get_mut(&(ctx as usize))
            .and_then(Vec::pop)
        {
            Some(event) => event,
            None => {
                let mut event = null_mut();
                let flags = CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                check(unsafe { cu_call!(driver, cuEventCreate(&mut event, flags)) })?;
                event
            }
        };
        // SAFETY: this session's live handles and local buffers; the driver checks addresses.
        let status = unsafe { cu_call!(driver, cuEventRecord(event, stream)) };
        self.slots[index].guard = Some((ctx, event));
        check(status)
    }

    /// The slot's buffer is being written out by lane threads until `done` finishes.
    pub fn lend(&mut self, index: usize, done: Arc<Countdown>) {
        self.slots[index].lent = Some(done);
    }

    fn wait(&mut self, driver: &Driver, index: usize) -> Result<(), Status> {
        if let Some(lent) = self.slots[index].lent.take() {
            // Failures are reported by the read that lent the buffer.
            let _ = lent.wait(None);
        }
        if let Some((ctx, event)) = self.slots[index].guard.take() {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            let status = unsafe { cu_call!(driver, cuEventSynchronize(event)) };
            self.spare_events
                .entry(ctx as usize)
                .or_default()
                .push(event);
            check(status)?;
        }
        Ok(())
    }

    /// Called before `ctx` is destroyed: its events go, and so do the buffers if it owns them.
    pub fn forget_context(&mut self, driver: &Driver, ctx: CUcontext) {
        for index in 0..self.slots.len() {
            if matches!(self.slots[index].guard, Some((c, _)) if c == ctx) {
                let _ = self.wait(driver, index);
            }
        }
        if let Some(events) = self.spare_events.remove(&(ctx as usize)) {
            for event in events {
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                unsafe { cu_call!(driver, cuEventDestroy_v2(event)) };
            }
        }
        if self.owner == Some(ctx) {
            self.free(driver);
        }
    }

    /// Frees the buffers (the owning context must still exist).
    pub fn free(&mut self, driver: &Driver) {
        for index in 0..self.slots.len() {
            let _ = self.wait(driver, index);
        }
        for slot in self.slots.drain(..) {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            unsafe { cu_call!(driver, cuMemFreeHost(slot.host.cast())) };
        }
        self.owner = None;
        self.next = 0;
    }
}
