//! Driver descriptors assembled from what a client sent, never held as Rust values: their enum
//! fields may hold any integer (the driver checks them), and some of those enums have no zero
//! value, so neither `mem::zeroed` nor reading the bytes as the struct is sound. The driver
//! only ever gets a pointer.

use std::mem::MaybeUninit;

use rgpu_cuda_api::native::{Status, INVALID_VALUE};

pub(super) struct Raw<T> {
    storage: MaybeUninit<T>,
}

impl<T> Raw<T> {
    /// All bytes zero.
    pub(super) fn zeroed() -> Raw<T> {
        Raw {
            storage: MaybeUninit::zeroed(),
        }
    }

    /// Exactly the struct's bytes, as the client sent them.
    pub(super) fn from_bytes(bytes: &[u8]) -> Result<Raw<T>, Status> {
        if bytes.len() != std::mem::size_of::<T>() {
            return Err(INVALID_VALUE);
        }
        let mut raw = Raw::<T>::zeroed();
        // SAFETY: exactly the storage's size, into storage this function owns.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                raw.storage.as_mut_ptr().cast::<u8>(),
                bytes.len(),
            )
        };
        Ok(raw)
    }

    pub(super) fn as_ptr(&self) -> *const T {
        self.storage.as_ptr()
    }

    /// For writing fields through (`addr_of_mut!((*p).field)`): never read as a `T`.
    pub(super) fn as_mut_ptr(&mut self) -> *mut T {
        self.storage.as_mut_ptr()
    }
}
