//! Host views over a device stand-in (bytes in this process): real mappings, real faults
//! through the real handler and service thread, several threads at once.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use super::*;

/// The device copy of one allocation, and what was asked of it.
#[derive(Default)]
struct Device {
    bytes: Mutex<Vec<u8>>,
    fetches: AtomicUsize,
    write_backs: AtomicUsize,
    written: AtomicUsize,
}

struct Stand(Arc<Device>, u64);

impl Backing for Stand {
    fn fetch(&self, address: u64, into: *mut u8, len: usize) -> Result<(), CUresult> {
        self.0.fetches.fetch_add(1, Ordering::SeqCst);
        let bytes = self.0.bytes.lock().unwrap();
        let offset = (address - self.1) as usize;
        // SAFETY: `into` holds `len` bytes (the alias of one block).
        unsafe { std::ptr::copy_nonoverlapping(bytes[offset..].as_ptr(), into, len) };
        Ok(())
    }

    fn write_back(&self, runs: &[(u64, &[u8])]) -> Result<(), CUresult> {
        self.0.write_backs.fetch_add(1, Ordering::SeqCst);
        let mut bytes = self.0.bytes.lock().unwrap();
        for &(address, data) in runs {
            self.0.written.fetch_add(data.len(), Ordering::SeqCst);
            let offset = (address - self.1) as usize;
            bytes[offset..offset + data.len()].copy_from_slice(data);
        }
        Ok(())
    }
}

/// An address range free in this process (mapped and unmapped again).
fn free_address(len: usize) -> u64 {
    // SAFETY: an anonymous mapping made only to learn a free address, unmapped at once.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        libc::munmap(p, len);
        p as u64
    }
}

/// A managed allocation of `size` bytes: at a free address (other threads of the test may take
/// one between the probe and the mapping, as another server's allocation may: tried again).
fn managed(size: usize) -> (u64, Arc<Device>) {
    let device = Arc::new(Device::default());
    *device.bytes.lock().unwrap() = vec![0; size];
    for _ in 0..16 {
        let address = free_address(size.div_ceil(PAGE) * PAGE);
        if register(address, size, Box::new(Stand(device.clone(), address))).is_ok() {
            return (address, device);
        }
    }
    panic!("no free address range");
}

#[test]
fn host_writes_reach_the_device_and_device_writes_reach_the_host() {
    let block = block_size();
    let size = 3 * block + 100;
    let (address, device) = managed(size);
    let host = address as *mut u8;
    // SAFETY: the host view of `size` bytes.
    unsafe {
        // Fresh memory: readable without a fetch, and zero.
        assert_eq!(*host.add(5), 0);
        for i in 0..size {
            *host.add(i) = (i % 251) as u8;
        }
    }
    assert_eq!(device.fetches.load(Ordering::SeqCst), 0);
    hand_over();
    assert!(device.write_backs.load(Ordering::SeqCst) >= 1);
    {
        let bytes = device.bytes.lock().unwrap();
        assert!((0..size).all(|i| bytes[i] == (i % 251) as u8));
    }
    // The device changes it; the host sees the change on its next touch.
    device.bytes.lock().unwrap()[2 * block + 7] = 0xAB;
    // SAFETY: as above.
    unsafe {
        assert_eq!(*host.add(2 * block + 7), 0xAB);
        assert_eq!(
            *host.add(size - 1),
            ((size - 1) % 251) as u8,
            "the partial last block"
        );
    }
    assert_eq!(
        device.fetches.load(Ordering::SeqCst),
        2,
        "one fetch per block touched"
    );
    // A read leaves nothing to write back; a write does.
    let before = device.write_backs.load(Ordering::SeqCst);
    hand_over();
    assert_eq!(device.write_backs.load(Ordering::SeqCst), before);
    // SAFETY: as above.
    unsafe { *host.add(block) = 9 };
    hand_over();
    assert_eq!(device.bytes.lock().unwrap()[block], 9);
    assert!(unregister(address));
    assert_eq!(find(address), None);
}

#[test]
fn fresh_memory_takes_system_calls_and_only_touched_pages_go_to_the_device() {
    let size = 64 * PAGE;
    let (address, device) = managed(size);
    let target = address as usize + 10 * PAGE + 3;
    let mut ends = [0; 2];
    // SAFETY: a pipe, written and read into the host view (fresh: writable like any memory).
    unsafe {
        assert_eq!(libc::pipe(ends.as_mut_ptr()), 0);
        assert_eq!(libc::write(ends[1], b"hello".as_ptr().cast(), 5), 5);
        assert_eq!(libc::read(ends[0], target as *mut libc::c_void, 5), 5);
        libc::close(ends[0]);
        libc::close(ends[1]);
    }
    hand_over();
    let offset = target - address as usize;
    assert_eq!(&device.bytes.lock().unwrap()[offset..offset + 5], b"hello");
    assert_eq!(
        device.written.load(Ordering::SeqCst),
        PAGE,
        "only the page touched"
    );
    unregister(address);
}

#[test]
fn many_threads_fault_on_one_allocation_at_once() {
    let block = block_size();
    let size = 8 * block;
    let (address, device) = managed(size);
    {
        let mut bytes = device.bytes.lock().unwrap();
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i / block) as u8 + 1;
        }
    }
    hand_over();
    std::thread::scope(|scope| {
        for t in 0..8 {
            scope.spawn(move || {
                for i in 0..size / 4096 {
                    let index = (i * 7 + t * 13) % (size / 4096);
                    let offset = index * 4096;
                    // SAFETY: inside the host view.
                    let value = unsafe { *((address as usize + offset) as *const u8) };
                    assert_eq!(value, (offset / block) as u8 + 1);
                }
            });
        }
    });
    assert!(
        device.fetches.load(Ordering::SeqCst) <= 8,
        "each block fetched once"
    );
    assert_eq!(find(address + 5), Some((address, size)));
    unregister(address);
}

#[test]
fn a_fault_outside_managed_memory_still_ends_the_process() {
    let (address, _device) = managed(PAGE);
    // SAFETY: a child that only touches memory and exits; the parent waits for it.
    unsafe {
        let child = libc::fork();
        if child == 0 {
            let null = std::ptr::null_mut::<u8>().wrapping_add(16);
            std::ptr::write_volatile(null, 1);
            libc::_exit(0);
        }
        let mut status = 0;
        libc::waitpid(child, &mut status, 0);
        assert!(libc::WIFSIGNALED(status), "status {status:#x}");
        assert_eq!(libc::WTERMSIG(status), libc::SIGSEGV);
    }
    unregister(address);
}
