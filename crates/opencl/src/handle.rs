//! OpenCL handles: what the application holds is a pointer to a [`Handle`], whose first field
//! is the ICD dispatch table (the ICD loader's contract).
//!
//! Every live handle is in a registry keyed by address and kind, so a pointer from the
//! application is looked up before it is ever dereferenced: a wrong-kind, released or garbage
//! handle gives the API's CL_INVALID_* error instead of a crash. The registry is also how
//! clSetKernelArg recognises a `cl_mem` or `cl_sampler` argument.
//!
//! A handle lives in an `Arc`: the application's reference count (clRetain*/clRelease*) is kept
//! separately in `app_refs`; when it reaches zero the handle leaves the registry, but objects
//! that refer to it (an event's queue, a sub-buffer's parent) keep the memory alive.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use opencl_sys::cl_icd::_cl_icd_dispatch;
use opencl_sys::cl_int;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Platform,
    Device,
    Context,
    Queue,
    Mem,
    Sampler,
    Program,
    Kernel,
    Event,
}

/// Implemented by every object type behind a handle.
pub trait ClObject: Send + Sync + Sized + 'static {
    const KIND: Kind;
    /// The error for a handle of this kind that is not valid.
    const INVALID: cl_int;
    /// Runs once, when the application's reference count reaches zero.
    fn on_last_release(&self, _handle: *mut c_void) {}
}

#[repr(C)]
pub struct Handle<T> {
    dispatch: *const _cl_icd_dispatch,
    app_refs: AtomicU32,
    pub obj: T,
}

// SAFETY: `dispatch` points to the immutable static dispatch table; the rest is Send + Sync.
unsafe impl<T: Send + Sync> Send for Handle<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Sync for Handle<T> {}

impl<T> std::ops::Deref for Handle<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.obj
    }
}

pub type Ref<T> = Arc<Handle<T>>;

fn registry() -> &'static RwLock<HashMap<usize, Kind>> {
    static REGISTRY: OnceLock<RwLock<HashMap<usize, Kind>>> = OnceLock::new();
    REGISTRY.get_or_init(|| RwLock::new(HashMap::new()))
}

/// Creates a handle with an application reference count of one.
pub fn create<T: ClObject>(obj: T) -> Ref<T> {
    let handle = Arc::new(Handle {
        dispatch: &crate::generated_dispatch::DISPATCH,
        app_refs: AtomicU32::new(1),
        obj,
    });
    // The application's reference is one strong count of its own.
    let raw = Arc::into_raw(Arc::clone(&handle));
    registry().write().unwrap().insert(raw as usize, T::KIND);
    handle
}

/// The pointer the application sees.
pub fn raw<T>(handle: &Ref<T>) -> *mut c_void {
    Arc::as_ptr(handle) as *mut c_void
}

/// Looks up a handle from the application; `None` if it is not a live handle of this kind.
pub fn get<T: ClObject>(ptr: *const c_void) -> Option<Ref<T>> {
    let guard = registry().read().unwrap();
    if guard.get(&(ptr as usize)) != Some(&T::KIND) {
        return None;
    }
    // SAFETY: the registry holds exactly the pointers made by `create` for kind T whose
    // application reference (one strong count) is still held, so the Arc is alive; the read
    // lock keeps `release` from dropping that count meanwhile.
    unsafe {
        Arc::increment_strong_count(ptr as *const Handle<T>);
        Some(Arc::from_raw(ptr as *const Handle<T>))
    }
}

/// Like [`get`], with the kind's CL_INVALID_* error.
pub fn lookup<T: ClObject>(ptr: *const c_void) -> Result<Ref<T>, cl_int> {
    get(ptr).ok_or(T::INVALID)
}

/// clRetain*.
pub fn retain<T: ClObject>(ptr: *const c_void) -> cl_int {
    match get::<T>(ptr) {
        Some(handle) => {
            handle.app_refs.fetch_add(1, Ordering::Relaxed);
            0
        }
        None => T::INVALID,
    }
}

/// clRelease*: at zero the handle leaves the registry and [`ClObject::on_last_release`] runs.
pub fn release<T: ClObject>(ptr: *const c_void) -> cl_int {
    let Some(handle) = get::<T>(ptr) else {
        return T::INVALID;
    };
    if handle.app_refs.fetch_sub(1, Ordering::AcqRel) != 1 {
        return 0;
    }
    registry().write().unwrap().remove(&(ptr as usize));
    handle.obj.on_last_release(ptr as *mut c_void);
    // SAFETY: drops the strong count taken for the application in `create`; it is no longer
    // reachable from the registry, so no one else can take it.
    unsafe { drop(Arc::from_raw(ptr as *const Handle<T>)) };
    0
}

/// The application's reference count (for the *_REFERENCE_COUNT queries).
pub fn app_refs<T>(handle: &Ref<T>) -> u32 {
    handle.app_refs.load(Ordering::Relaxed)
}
