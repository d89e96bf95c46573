//! The handles the program holds (`CUcontext`, `CUstream`, `CUevent`, modules, functions,
//! graphs): values this library hands out and looks up, never addresses it dereferences.
//!
//! Each kind of object has a [`Registry`] from handle value to the object. A call looks its
//! handles up there before anything else, and gets the object as an `Arc`, so a handle that is
//! stale, of another kind or made up gives `None` (the call's INVALID_HANDLE error), and an
//! object that another thread destroys meanwhile stays alive until the calls using it return.
//! Handle values are never reused (a 64-bit counter), so a stale handle cannot name a newer
//! object either.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// The next handle value. Values start high and step by 16, so they never collide with the
/// special stream handles (1, 2) and look like aligned addresses to code that checks.
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(0x7267_7000_0000);

/// A new handle value, unique in the process.
pub fn new_handle() -> usize {
    NEXT_HANDLE.fetch_add(16, Ordering::Relaxed)
}

/// Handle values are unique counters: multiplying by an odd constant spreads them enough.
#[derive(Default)]
pub struct HandleHasher(u64);

impl Hasher for HandleHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_usize(&mut self, value: usize) {
        self.0 = (value as u64 >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type Table<T> = HashMap<usize, Arc<T>, BuildHasherDefault<HandleHasher>>;

/// The live objects of one kind, by handle.
pub struct Registry<T> {
    table: RwLock<Table<T>>,
}

impl<T> Registry<T> {
    pub const fn new() -> Registry<T> {
        Registry {
            table: RwLock::new(HashMap::with_hasher(BuildHasherDefault::new())),
        }
    }

    /// Makes `object` reachable through `handle` (a [`new_handle`] value).
    pub fn insert(&self, handle: usize, object: Arc<T>) {
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        table.insert(handle, object);
    }

    /// The live object behind `handle`.
    pub fn get(&self, handle: usize) -> Option<Arc<T>> {
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        table.get(&handle).cloned()
    }

    /// Takes the object out: its handle is dead from now on (calls already holding the object
    /// finish with it).
    pub fn remove(&self, handle: usize) -> Option<Arc<T>> {
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        table.remove(&handle)
    }

    /// A live object `matches` takes (a walk over all of them: for the rare queries that
    /// name an object by its server's id).
    pub fn find(&self, matches: impl Fn(&T) -> bool) -> Option<Arc<T>> {
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        table.values().find(|object| matches(object)).cloned()
    }
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Registry::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn stale_foreign_and_made_up_handles_are_unknown() {
        let numbers = Registry::<u32>::new();
        let names = Registry::<&str>::new();
        let (one, two) = (new_handle(), new_handle());
        numbers.insert(one, Arc::new(1));
        names.insert(two, Arc::new("two"));
        assert_eq!(numbers.get(one).as_deref(), Some(&1));
        assert!(numbers.get(two).is_none(), "a handle of another kind");
        assert!(numbers.get(0x1234).is_none(), "a made-up handle");
        assert_eq!(numbers.remove(one).as_deref(), Some(&1));
        assert!(numbers.get(one).is_none(), "a destroyed handle");
        // A new object never gets the value of a dead handle.
        let three = new_handle();
        numbers.insert(three, Arc::new(3));
        assert!(numbers.get(one).is_none());
    }

    /// One thread destroys an object while others use it: users see it whole or not at all.
    #[test]
    fn concurrent_destroy_and_use() {
        struct Object {
            payload: Vec<u64>,
        }
        let registry = Arc::new(Registry::<Object>::new());
        for round in 0..200 {
            let handle = new_handle();
            let object = Object {
                payload: vec![round; 64],
            };
            registry.insert(handle, Arc::new(object));
            let stop = Arc::new(AtomicBool::new(false));
            let users: Vec<_> = (0..4)
                .map(|_| {
                    let (registry, stop) = (registry.clone(), stop.clone());
                    std::thread::spawn(move || {
                        let mut gone = false;
                        while !stop.load(Ordering::Relaxed) {
                            match registry.get(handle) {
                                Some(object) => {
                                    assert!(!gone, "a destroyed handle came back");
                                    assert!(object.payload.iter().all(|&v| v == round));
                                }
                                None => gone = true,
                            }
                        }
                    })
                })
                .collect();
            std::thread::yield_now();
            assert!(registry.remove(handle).is_some());
            stop.store(true, Ordering::Relaxed);
            for user in users {
                user.join().unwrap();
            }
        }
    }
}
