//! The per-session staging pool: page-aligned host buffers that bulk data passes through on its
//! way between the socket and the device. Buffers are allocated on first use, up to a bound, and
//! then reused, so a long transfer costs no allocation per chunk.
//!
//! For devices other than CPUs the buffers are pinned host memory where the implementation
//! gives it (a CL_MEM_ALLOC_HOST_PTR buffer mapped once: NVIDIA pins those), so the device
//! copies run by DMA instead of through the driver's bounce buffers (on the H100 machine
//! pageable device-to-host copies run at ~5.6 GB/s, pinned ones at ~55). Pinned memory belongs
//! to one context; the pool keeps it for the context used last.
//!
//! A buffer goes back to its pool when dropped; the native layer only drops one once the device
//! command that uses it has completed.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::limits::Usage;
use crate::opencl::native::{HostBuffer, PinnedHost, Queue, QueueDevice};

/// Size of one chunk of a transfer, and of each pooled buffer. Small enough that the pool's
/// buffers stay in the CPU caches while they cycle between the socket and the device: on the
/// H100 machine 64 MiB reads through pinned staging moved ~3.3 GB/s with 4 MiB chunks and
/// ~3.8-4.4 GB/s with 1 MiB chunks (loopback TCP: ~4-5 GB/s).
pub const CHUNK_SIZE: usize = 1 << 20;
/// Buffers a session keeps at most (so at most 16 MiB of staging memory per session).
pub const POOL_BUFFERS: usize = 16;
/// How long a request waits for a pooled buffer before it allocates an extra one. A transfer
/// whose device copies wait on an event that only a later request of the same client can
/// complete (a user event) would otherwise wait forever for buffers that never come back.
const OVERFLOW_AFTER: Duration = Duration::from_millis(500);

const ALIGN: usize = 4096;

struct PoolState {
    free: Vec<Block>,
    /// Pooled buffers in existence (free or lent out).
    allocated: usize,
    /// For the pinned pool: the context its buffers belong to (0: none yet), and a context
    /// whose implementation gave no pinned memory (not asked again).
    context: usize,
    unsupported: usize,
}

impl PoolState {
    fn new() -> PoolState {
        PoolState {
            free: Vec::new(),
            allocated: 0,
            context: 0,
            unsupported: 0,
        }
    }
}

struct PoolInner {
    state: Mutex<PoolState>,
    pinned: Mutex<PoolState>,
    returned: Condvar,
    chunk_size: usize,
    max_buffers: usize,
    /// The session's user events not yet set, and its memory count (see
    /// [`StagingPool::for_session`]).
    held_back: Option<(Arc<AtomicUsize>, Arc<Usage>)>,
}

/// A session's pool. Cloning shares it.
#[derive(Clone)]
pub struct StagingPool {
    inner: Arc<PoolInner>,
}

/// Where a transfer's staging memory will be used, for choosing its kind.
pub struct Target<'a> {
    pub queue: &'a Queue,
    pub device: QueueDevice,
    /// Whether the request thread may wait for the queue's earlier work (mapping new pinned
    /// memory does): false while device work may wait for a later client request.
    pub may_block: bool,
}

impl StagingPool {
    /// A pool of its own (tests: sessions use [`StagingPool::for_session`]).
    #[cfg(test)]
    pub fn new(chunk_size: usize, max_buffers: usize) -> StagingPool {
        StagingPool::build(chunk_size, max_buffers, None)
    }

    /// A session's pool. While the session has user events not yet set (`pending_user_events`),
    /// buffers lent to transfers may stay held until a later request of the client sets them,
    /// so waiting for one to come back is pointless: a chunk then gets an extra buffer at once,
    /// counted in the session's memory (`usage`, its quota) until it is freed.
    pub fn for_session(
        chunk_size: usize,
        max_buffers: usize,
        pending_user_events: Arc<AtomicUsize>,
        usage: Arc<Usage>,
    ) -> StagingPool {
        StagingPool::build(chunk_size, max_buffers, Some((pending_user_events, usage)))
    }

    fn build(
        chunk_size: usize,
        max_buffers: usize,
        held_back: Option<(Arc<AtomicUsize>, Arc<Usage>)>,
    ) -> StagingPool {
        StagingPool {
            inner: Arc::new(PoolInner {
                state: Mutex::new(PoolState::new()),
                pinned: Mutex::new(PoolState::new()),
                returned: Condvar::new(),
                chunk_size: chunk_size.max(ALIGN),
                max_buffers: max_buffers.max(1),
                held_back,
            }),
        }
    }

    /// An extra buffer now, outside the pool, when transfers may be held back by user events
    /// and the session's memory quota has room for it.
    fn extra_if_held_back(&self) -> Option<StagingBuf> {
        let (pending, usage) = self.inner.held_back.as_ref()?;
        if pending.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let bytes = self.inner.chunk_size as u64;
        if !usage.charge_memory(bytes) {
            return None;
        }
        log::debug!("staging pool lent out while user events hold transfers: an extra buffer");
        Some(StagingBuf {
            block: Some(Block::new(self.inner.chunk_size)),
            pool: None,
            charged: Some((usage.clone(), bytes)),
        })
    }

    pub fn chunk_size(&self) -> usize {
        self.inner.chunk_size
    }

    /// A buffer of at least `len` bytes. Chunk-sized requests come from the pool and wait
    /// (briefly) for a buffer to come back when all are lent out; larger ones get a one-off
    /// allocation that is freed when dropped, or `None` when there is not enough memory.
    pub fn take(&self, len: usize) -> Option<StagingBuf> {
        if len > self.inner.chunk_size {
            return Some(StagingBuf {
                block: Some(Block::try_new(len)?),
                pool: None,
                charged: None,
            });
        }
        Some(self.take_pooled(false, None))
    }

    /// Like [`StagingPool::take`], for a transfer on `target`: pinned memory for devices other
    /// than CPUs where the implementation gives it.
    pub fn take_for(&self, len: usize, target: &Target<'_>) -> Option<StagingBuf> {
        if len > self.inner.chunk_size || target.device.cpu {
            return self.take(len);
        }
        {
            let mut pinned = lock(&self.inner.pinned);
            if pinned.unsupported == target.device.context {
                drop(pinned);
                return self.take(len);
            }
            if pinned.context != target.device.context {
                if !target.may_block {
                    drop(pinned);
                    return self.take(len);
                }
                // Buffers of the previous context are freed (lent ones when they return).
                let old = std::mem::take(&mut pinned.free);
                pinned.context = target.device.context;
                pinned.allocated = 0;
                drop(pinned);
                drop(old);
            }
        }
        Some(self.take_pooled(true, Some(target)))
    }

    fn take_pooled(&self, pinned: bool, target: Option<&Target<'_>>) -> StagingBuf {
        let mutex = if pinned {
            &self.inner.pinned
        } else {
            &self.inner.state
        };
        let mut state = lock(mutex);
        loop {
            if let Some(block) = state.free.pop() {
                return self.lend(block);
            }
            if state.allocated < self.inner.max_buffers {
                if pinned && !target.is_some_and(|t| t.may_block) {
                    // New pinned memory cannot be mapped now; pageable memory serves.
                    drop(state);
                    return self.take_pooled(false, None);
                }
                state.allocated += 1;
                let context = state.context;
                drop(state);
                let block = match target.filter(|_| pinned) {
                    Some(target) => match Block::pinned(target.queue, self.inner.chunk_size) {
                        Some(block) => block,
                        None => {
                            log::debug!("no pinned staging memory; using pageable memory");
                            let mut state = lock(mutex);
                            state.allocated -= 1;
                            state.unsupported = context;
                            drop(state);
                            return self.take_pooled(false, None);
                        }
                    },
                    None => Block::new(self.inner.chunk_size),
                };
                return self.lend(block);
            }
            if let Some(extra) = self.extra_if_held_back() {
                return extra;
            }
            let (next, timeout) = self
                .inner
                .returned
                .wait_timeout(state, OVERFLOW_AFTER)
                .unwrap_or_else(|e| e.into_inner());
            state = next;
            if timeout.timed_out() && state.free.is_empty() {
                log::debug!("staging pool exhausted; allocating an extra buffer");
                return StagingBuf {
                    block: Some(Block::new(self.inner.chunk_size)),
                    pool: None,
                    charged: None,
                };
            }
        }
    }

    fn lend(&self, block: Block) -> StagingBuf {
        StagingBuf {
            block: Some(block),
            pool: Some(self.inner.clone()),
            charged: None,
        }
    }

    /// Buffers currently allocated by the pool (free or lent out).
    #[cfg(test)]
    fn allocated(&self) -> usize {
        lock(&self.inner.state).allocated
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// A staging buffer lent by a pool (or a one-off allocation). Returns to its pool on drop.
pub struct StagingBuf {
    block: Option<Block>,
    pool: Option<Arc<PoolInner>>,
    /// Memory counted in the session's quota for this buffer, given back when it is freed.
    charged: Option<(Arc<Usage>, u64)>,
}

impl StagingBuf {
    pub fn capacity(&self) -> usize {
        self.block.as_ref().map_or(0, |b| b.len)
    }

    pub fn as_slice(&self) -> &[u8] {
        self.block.as_ref().map_or(&[], |b| b.as_slice())
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.block.as_mut().map_or(&mut [], |b| b.as_mut_slice())
    }

    /// Start of the memory, for native calls.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_slice().as_mut_ptr()
    }
}

impl HostBuffer for StagingBuf {
    fn capacity(&self) -> usize {
        StagingBuf::capacity(self)
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        StagingBuf::as_mut_ptr(self)
    }
}

impl Drop for StagingBuf {
    fn drop(&mut self) {
        if let Some((usage, bytes)) = self.charged.take() {
            usage.refund_memory(bytes);
        }
        if let (Some(block), Some(pool)) = (self.block.take(), self.pool.take()) {
            let mutex = match block.pinned {
                Some(_) => &pool.pinned,
                None => &pool.state,
            };
            let mut state = lock(mutex);
            if block.context != state.context {
                // Pinned memory of a context the pool no longer serves: freed.
                drop(state);
                drop(block);
                return;
            }
            state.free.push(block);
            drop(state);
            pool.returned.notify_all();
        }
    }
}

/// Page-aligned, zero-initialized heap memory, or pinned memory from the implementation.
struct Block {
    ptr: NonNull<u8>,
    len: usize,
    pinned: Option<PinnedHost>,
    /// The context of pinned memory (0 for heap memory).
    context: usize,
}

// SAFETY: a Block owns its memory exclusively, like a Box<[u8]>.
unsafe impl Send for Block {}
// SAFETY: shared access only reads (as_slice), like &[u8].
unsafe impl Sync for Block {}

impl Block {
    fn layout(len: usize) -> Option<Layout> {
        Layout::from_size_align(len.max(1), ALIGN).ok()
    }

    /// A pool-sized block; running out of memory for one is fatal, as for any allocation.
    fn new(len: usize) -> Block {
        Self::try_new(len).unwrap_or_else(|| {
            std::alloc::handle_alloc_error(
                Layout::from_size_align(len, ALIGN).unwrap_or(Layout::new::<u8>()),
            )
        })
    }

    /// A block of a size a client chose: `None` when it cannot be had.
    fn try_new(len: usize) -> Option<Block> {
        let layout = Self::layout(len)?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        NonNull::new(raw).map(|ptr| Block {
            ptr,
            len,
            pinned: None,
            context: 0,
        })
    }

    /// Pinned memory for transfers on `queue`, or `None` where the implementation gives none.
    fn pinned(queue: &Queue, len: usize) -> Option<Block> {
        let context = queue.device().ok()?.context;
        let host = PinnedHost::new(queue, len)
            .map_err(|e| log::debug!("no pinned staging memory: {}", rgpu_cl_api::error_name(e)))
            .ok()?;
        log::debug!(
            "pinned staging buffer of {len} bytes at {:p}",
            host.as_ptr()
        );
        if host.len() < len {
            return None;
        }
        let ptr = NonNull::new(host.as_ptr())?;
        Some(Block {
            ptr,
            len,
            pinned: Some(host),
            context,
        })
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` bytes owned by self: heap memory zeroed at
        // allocation, or host memory the implementation allocated and mapped, which lives as
        // long as `pinned`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if self.pinned.take().is_some() {
            // The mapping is undone and its buffer released by PinnedHost's drop.
            return;
        }
        if let Some(layout) = Self::layout(self.len) {
            // SAFETY: allocated in Block::try_new with this very layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_and_bounded() {
        let pool = StagingPool::new(8192, 2);
        let a = pool.take(100).unwrap();
        let b = pool.take(8192).unwrap();
        assert_eq!(a.capacity(), 8192);
        assert_eq!(a.as_slice().as_ptr() as usize % ALIGN, 0);
        let a_ptr = a.as_slice().as_ptr();
        drop(a);
        let c = pool.take(10).unwrap();
        assert_eq!(
            c.as_slice().as_ptr(),
            a_ptr,
            "a returned buffer is lent again"
        );
        assert_eq!(pool.allocated(), 2);
        drop((b, c));
        assert_eq!(pool.allocated(), 2);
    }

    #[test]
    fn exhausted_pool_overflows_instead_of_deadlocking() {
        let pool = StagingPool::new(4096, 1);
        let held = pool.take(1).unwrap();
        let extra = pool.take(1).unwrap();
        assert_eq!(extra.capacity(), 4096);
        assert_eq!(pool.allocated(), 1);
        drop((held, extra));
    }

    /// While user events hold transfers back, a chunk beyond the lent-out pool gets an extra
    /// buffer at once (no wait for buffers that may never come back), counted in the session's
    /// memory quota until it is freed; over the quota, the pool's usual wait applies.
    #[test]
    fn held_back_transfers_get_extra_buffers_within_the_quota() {
        let limits = crate::limits::Limits {
            session_memory: 8192,
            ..Default::default()
        };
        let usage = Usage::new(1, &limits);
        let pending = Arc::new(AtomicUsize::new(1));
        let pool = StagingPool::for_session(4096, 1, pending.clone(), usage.clone());
        let lent = pool.take(1).unwrap();
        let extra = pool.take(1).unwrap();
        assert!(extra.charged.is_some(), "the extra buffer is counted");
        let second = pool.take(1).unwrap();
        assert!(second.charged.is_some());
        // The quota (8192 bytes: two chunks) is full: the third waits, then overflows uncounted.
        let third = pool.take(1).unwrap();
        assert!(third.charged.is_none());
        drop((extra, second, third));
        assert!(
            usage.charge_memory(8192),
            "the extra buffers gave their memory back"
        );
        usage.refund_memory(8192);
        // Without held-back transfers, no extra buffer is made at once.
        pending.store(0, Ordering::SeqCst);
        drop(lent);
        let again = pool.take(1).unwrap();
        assert!(again.charged.is_none() && again.pool.is_some());
    }

    #[test]
    fn large_requests_get_their_own_buffer() {
        let pool = StagingPool::new(4096, 1);
        let mut big = pool.take(10_000).unwrap();
        assert!(big.capacity() >= 10_000);
        big.as_mut_slice()[9_999] = 7;
        assert_eq!(pool.allocated(), 0);
        assert!(
            pool.take(usize::MAX - 10).is_none(),
            "an impossible size is refused"
        );
    }
}
