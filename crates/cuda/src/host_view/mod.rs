//! The host's view of managed memory (docs/managed-memory.md): the memory lives on the
//! server's device; the program sees a copy at the same address whose pages are fetched when
//! first touched and written back when the device is next given work.
//!
//! Each allocation is cut into blocks ([`blocks`]). A block the host has not touched since the
//! device last had work is inaccessible; touching it fetches it and makes it readable; writing
//! it makes it writable and dirty. Before any device work ([`hand_over`]), dirty blocks are
//! written back and every block becomes inaccessible again. That gives release consistency at
//! the points CUDA names for devices without concurrent managed access (the attribute rgpu
//! reports): host writes reach the device at its next work; device writes reach the host after
//! a synchronization, through a fresh fetch.

mod blocks;
mod faults;
mod mapping;

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use rgpu_cuda_api::sys::CUresult;

pub use blocks::Touch;
use blocks::{Blocks, FaultAction, Mapped, Run};
pub use mapping::PAGE;
use mapping::{Access, Mapping};

/// Where an allocation's device copy is: reads and writes of its bytes.
pub trait Backing: Send {
    /// Reads `len` device bytes at `address` into `into`.
    fn fetch(&self, address: u64, into: *mut u8, len: usize) -> Result<(), CUresult>;
    /// Writes each (address, bytes) to the device; returns once later device work, on any
    /// stream, sees them.
    fn write_back(&self, runs: &[(u64, &[u8])]) -> Result<(), CUresult>;
}

struct Allocation {
    /// Bytes of the device allocation (the mapping is rounded up to pages).
    size: usize,
    mapping: Mapping,
    blocks: Blocks,
    backing: Box<dyn Backing>,
}

impl Allocation {
    /// The byte range of a run of blocks, clipped to the allocation.
    fn bytes(&self, run: Run) -> (usize, usize) {
        let block = block_size();
        let start = run.first * block;
        let end = ((run.first + run.count) * block).min(self.size.max(1));
        (start, end.saturating_sub(start))
    }
}

static ALLOCATIONS: Mutex<BTreeMap<u64, Allocation>> = Mutex::new(BTreeMap::new());

/// Whether some allocation has blocks the host may touch (or fresh ones the device has not
/// had yet): only then does device work need [`hand_over`].
static HOST_HOLDS_BLOCKS: AtomicBool = AtomicBool::new(false);

fn allocations() -> MutexGuard<'static, BTreeMap<u64, Allocation>> {
    ALLOCATIONS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Bytes fetched or written back at once: a multiple of the page size (RGPU_MANAGED_BLOCK_KIB,
/// default 1 MiB). Larger blocks mean fewer round trips for sequential access and more bytes
/// moved for scattered access.
pub fn block_size() -> usize {
    static SIZE: OnceLock<usize> = OnceLock::new();
    *SIZE.get_or_init(|| {
        std::env::var("RGPU_MANAGED_BLOCK_KIB")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map(|kib| (kib * 1024).div_ceil(PAGE).max(1) * PAGE)
            .unwrap_or(1 << 20)
    })
}

/// Makes the host view of `size` bytes of managed memory at `address`: fails (leaving
/// nothing) when the address range is taken in this process.
pub fn register(address: u64, size: usize, backing: Box<dyn Backing>) -> io::Result<()> {
    faults::install(resolve_fault)?;
    let mapping = Mapping::new(address, size)?;
    // Fresh memory is the host's until the device first has work (blocks.rs).
    mapping.protect(0, mapping.len(), Access::ReadWrite)?;
    faults::cover(address as usize, mapping.len());
    let blocks = Blocks::new(mapping.len().div_ceil(block_size()));
    allocations().insert(
        address,
        Allocation {
            size,
            mapping,
            blocks,
            backing,
        },
    );
    HOST_HOLDS_BLOCKS.store(true, Ordering::Release);
    Ok(())
}

/// Drops the host view of the allocation at `address`; false when there is none.
pub fn unregister(address: u64) -> bool {
    allocations().remove(&address).is_some()
}

/// The managed allocation holding `address`: its start and size.
pub fn find(address: u64) -> Option<(u64, usize)> {
    let allocations = allocations();
    let (&start, allocation) = allocations.range(..=address).next_back()?;
    (address < start + allocation.mapping.len() as u64).then_some((start, allocation.size))
}

/// Gives every allocation to the device before device work: dirty blocks are written back,
/// and the host loses its view until it touches the memory again. Cheap when the host holds
/// nothing.
pub fn hand_over() {
    // A plain load first: the common case (nothing held) writes no shared cache line.
    if !HOST_HOLDS_BLOCKS.load(Ordering::Acquire)
        || !HOST_HOLDS_BLOCKS.swap(false, Ordering::AcqRel)
    {
        return;
    }
    let mut allocations = allocations();
    for (&start, allocation) in allocations.iter_mut() {
        let plan = allocation.blocks.hand_over();
        let mut ranges: Vec<(usize, usize)> = plan
            .write_back
            .iter()
            .map(|&run| allocation.bytes(run))
            .collect();
        for &run in &plan.fresh {
            let (offset, len) = allocation.bytes(run);
            match allocation.mapping.resident_runs(offset, len) {
                Ok(touched) => ranges.extend(touched),
                // Not knowing which pages the host touched: all of them go.
                Err(_) => ranges.push((offset, len)),
            }
        }
        let runs: Vec<(u64, &[u8])> = ranges
            .into_iter()
            .map(|(offset, len)| {
                let len = len.min(allocation.size.saturating_sub(offset));
                // SAFETY: bytes of the alias mapping, which lives as long as the allocation.
                let bytes =
                    unsafe { std::slice::from_raw_parts(allocation.mapping.alias(offset), len) };
                (start + offset as u64, bytes)
            })
            .filter(|(_, bytes)| !bytes.is_empty())
            .collect();
        // A failed write-back (its context or server gone) is the backing's to report, at the
        // program's next synchronization: the work asked for now may not even touch it.
        if !runs.is_empty() {
            if let Err(e) = allocation.backing.write_back(&runs) {
                log::error!("rgpu: writing managed memory back to the device failed: {e:?}");
            }
        }
        for &run in &plan.protect {
            let (offset, len) = allocation.bytes(run);
            if let Err(e) = allocation.mapping.protect(offset, len, Access::None) {
                log::error!("rgpu: protecting managed memory failed: {e}");
            }
        }
    }
}

/// The service thread's answer to a fault at `address`: false when it is not in a host view.
fn resolve_fault(address: usize, touch: Touch) -> bool {
    let mut allocations = allocations();
    let Some((&start, allocation)) = allocations.range_mut(..=address as u64).next_back() else {
        return false;
    };
    let offset = address - start as usize;
    if offset >= allocation.mapping.len() {
        return false;
    }
    let index = offset / block_size();
    let (block_start, len) = allocation.bytes(Run {
        first: index,
        count: 1,
    });
    let mapped = match allocation.blocks.fault(index, touch) {
        FaultAction::Retry => return true,
        FaultAction::Map(mapped) => mapped,
        FaultAction::Fetch(mapped) => {
            let into = allocation.mapping.alias(block_start);
            let device_address = start + block_start as u64;
            if let Err(e) = allocation.backing.fetch(device_address, into, len) {
                // The block keeps what the host had: the failure reaches the program at its
                // next synchronizing call (the backing records it).
                log::error!("rgpu: fetching managed memory from the device failed: {e:?}");
            }
            mapped
        }
    };
    let access = match mapped {
        Mapped::Readable => Access::Read,
        Mapped::Writable => Access::ReadWrite,
    };
    // The whole block, up to the end of the mapping (its last page may pass the allocation).
    let block_len = block_size().min(allocation.mapping.len() - block_start);
    if let Err(e) = allocation.mapping.protect(block_start, block_len, access) {
        log::error!("rgpu: mapping managed memory for the host failed: {e}");
        return false;
    }
    HOST_HOLDS_BLOCKS.store(true, Ordering::Release);
    true
}

#[cfg(test)]
mod tests;
