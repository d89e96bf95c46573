//! The host's copy of a managed allocation: one shared-memory file mapped twice. The program
//! sees it at the allocation's device address, with page protections that trap its accesses;
//! rgpu fills and reads it through a second, always-accessible mapping (the alias), so rgpu's
//! own code never faults on the program's view and no other thread ever sees a half-fetched
//! block.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub const PAGE: usize = 4096;

pub struct Mapping {
    /// The program's view: at the device address, protected.
    view: usize,
    /// Bytes of both mappings (the allocation's size rounded up to pages).
    len: usize,
    /// rgpu's view of the same pages, always readable and writable.
    alias: usize,
    _file: OwnedFd,
}

/// What the program's view of a block allows.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Access {
    None,
    Read,
    ReadWrite,
}

impl Mapping {
    /// Maps `len` bytes at exactly `address` (inaccessible) and their alias; fails when any
    /// page there is taken.
    pub fn new(address: u64, len: usize) -> io::Result<Mapping> {
        let len = len.max(1).div_ceil(PAGE) * PAGE;
        if !(address as usize).is_multiple_of(PAGE) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "managed memory at an address that is not page-aligned",
            ));
        }
        // SAFETY: a name and flags; the result is checked.
        let fd = unsafe { libc::memfd_create(c"rgpu-managed".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened here, owned from now on.
        let file = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sizes the file this function owns.
        if unsafe { libc::ftruncate(file.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let view = map(&file, address as usize, len, libc::PROT_NONE)?;
        if view != address as usize {
            // A kernel without MAP_FIXED_NOREPLACE took the address as a hint only.
            // SAFETY: the mapping just made, which nothing else knows of.
            unsafe { libc::munmap(view as *mut libc::c_void, len) };
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
        let alias = match map(&file, 0, len, libc::PROT_READ | libc::PROT_WRITE) {
            Ok(alias) => alias,
            Err(e) => {
                // SAFETY: as above.
                unsafe { libc::munmap(view as *mut libc::c_void, len) };
                return Err(e);
            }
        };
        // A forked child must not share (and change) the parent's copy: it gets neither view.
        for start in [view, alias] {
            // SAFETY: advice on mappings this function made.
            unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTFORK) };
        }
        Ok(Mapping {
            view,
            len,
            alias,
            _file: file,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// rgpu's pointer to byte `offset` of the copy.
    pub fn alias(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset <= self.len);
        (self.alias + offset) as *mut u8
    }

    /// Sets what the program's view of `offset..offset + len` allows (page-aligned offset;
    /// the length is rounded up to pages and clipped to the mapping).
    pub fn protect(&self, offset: usize, len: usize, access: Access) -> io::Result<()> {
        let len = len.div_ceil(PAGE) * PAGE;
        let len = len.min(self.len.saturating_sub(offset));
        let prot = match access {
            Access::None => libc::PROT_NONE,
            Access::Read => libc::PROT_READ,
            Access::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        };
        // SAFETY: pages of the program's view, which this mapping owns.
        let result =
            unsafe { libc::mprotect((self.view + offset) as *mut libc::c_void, len, prot) };
        if result == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl Mapping {
    /// The runs (offset, length) of pages in `offset..offset + len` that hold data: pages of
    /// the file never touched have none (they read as zeros).
    pub fn resident_runs(&self, offset: usize, len: usize) -> io::Result<Vec<(usize, usize)>> {
        let len = len.div_ceil(PAGE) * PAGE;
        let len = len.min(self.len.saturating_sub(offset));
        let mut resident = vec![0u8; len / PAGE];
        // SAFETY: page-aligned pages of the alias mapping, and one byte per page to fill.
        let result = unsafe {
            libc::mincore(
                (self.alias + offset) as *mut libc::c_void,
                len,
                resident.as_mut_ptr(),
            )
        };
        if result != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for (page, _) in resident.iter().enumerate().filter(|(_, r)| **r & 1 != 0) {
            let start = offset + page * PAGE;
            match runs.last_mut() {
                Some((run_start, run_len)) if *run_start + *run_len == start => *run_len += PAGE,
                _ => runs.push((start, PAGE)),
            }
        }
        Ok(runs)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        for start in [self.view, self.alias] {
            // SAFETY: the mappings this value made; nothing uses them after the drop.
            unsafe { libc::munmap(start as *mut libc::c_void, self.len) };
        }
    }
}

fn map(file: &OwnedFd, address: usize, len: usize, prot: libc::c_int) -> io::Result<usize> {
    let fixed = if address != 0 {
        libc::MAP_FIXED_NOREPLACE
    } else {
        0
    };
    // SAFETY: a shared mapping of a file this module owns, at a fixed address only when no
    // mapping is there (MAP_FIXED_NOREPLACE never replaces one).
    let start = unsafe {
        libc::mmap(
            address as *mut libc::c_void,
            len,
            prot,
            libc::MAP_SHARED | fixed,
            file.as_raw_fd(),
            0,
        )
    };
    if start == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(start as usize)
    }
}
