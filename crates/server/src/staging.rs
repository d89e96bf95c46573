//! The per-session staging pool: page-aligned host buffers that bulk data passes through on its
//! way between the socket and the device. Buffers are allocated on first use, up to a bound, and
//! then reused, so a long transfer costs no allocation per chunk.
//!
//! A buffer goes back to its pool when dropped; the native layer only drops one once the device
//! command that uses it has completed.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Size of one chunk of a transfer, and of each pooled buffer.
pub const CHUNK_SIZE: usize = 4 << 20;
/// Buffers a session keeps at most (so at most 64 MiB of staging memory per session).
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
}

struct PoolInner {
    state: Mutex<PoolState>,
    returned: Condvar,
    chunk_size: usize,
    max_buffers: usize,
}

/// A session's pool. Cloning shares it.
#[derive(Clone)]
pub struct StagingPool {
    inner: Arc<PoolInner>,
}

impl StagingPool {
    pub fn new(chunk_size: usize, max_buffers: usize) -> StagingPool {
        StagingPool {
            inner: Arc::new(PoolInner {
                state: Mutex::new(PoolState {
                    free: Vec::new(),
                    allocated: 0,
                }),
                returned: Condvar::new(),
                chunk_size: chunk_size.max(ALIGN),
                max_buffers: max_buffers.max(1),
            }),
        }
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
            });
        }
        Some(self.take_pooled())
    }

    fn take_pooled(&self) -> StagingBuf {
        let mut state = lock(&self.inner.state);
        loop {
            if let Some(block) = state.free.pop() {
                return self.lend(block);
            }
            if state.allocated < self.inner.max_buffers {
                state.allocated += 1;
                drop(state);
                return self.lend(Block::new(self.inner.chunk_size));
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
                };
            }
        }
    }

    fn lend(&self, block: Block) -> StagingBuf {
        StagingBuf {
            block: Some(block),
            pool: Some(self.inner.clone()),
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

impl Drop for StagingBuf {
    fn drop(&mut self) {
        if let (Some(block), Some(pool)) = (self.block.take(), self.pool.take()) {
            let mut state = lock(&pool.state);
            state.free.push(block);
            drop(state);
            pool.returned.notify_one();
        }
    }
}

/// Page-aligned, zero-initialized heap memory.
struct Block {
    ptr: NonNull<u8>,
    len: usize,
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
        NonNull::new(raw).map(|ptr| Block { ptr, len })
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialized (zeroed at allocation) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
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
