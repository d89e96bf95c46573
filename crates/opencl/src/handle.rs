//! OpenCL handles: what the application holds is a pointer to a small [`Shell`] whose first
//! field is the ICD dispatch table (the ICD loader's contract); the object itself is a
//! [`Handle`] elsewhere.
//!
//! Every live handle is in a registry keyed by its shell's address, so a pointer from the
//! application is looked up before anything is dereferenced: a wrong-kind, released or garbage
//! handle gives the API's CL_INVALID_* error instead of a crash. The registry is also how
//! clSetKernelArg recognises a `cl_mem` or `cl_sampler` argument.
//!
//! A released handle's shell is not reused until [`QUARANTINE`] other shells were released
//! after it, so a stale handle the application uses again does not name a newer object (with
//! addresses reused at once, a released `cl_mem` used after 100 new allocations wrote into one
//! of them).
//!
//! A handle lives in an `Arc`: the application's reference count (clRetain*/clRelease*) is kept
//! separately in `app_refs`; when it reaches zero the handle leaves the registry, but objects
//! that refer to it (an event's queue, a sub-buffer's parent) keep the memory alive.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

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

pub struct Handle<T> {
    /// The address of its shell: the pointer the application holds.
    shell: usize,
    app_refs: AtomicU32,
    pub obj: T,
}

/// What an application's handle points to: the dispatch table the ICD loader reads.
#[repr(C)]
struct Shell {
    dispatch: *const _cl_icd_dispatch,
}

/// Released shells wait this long (in later releases) before they are used again.
const QUARANTINE: usize = 1 << 16;

/// Shells of released handles, oldest first.
fn retired() -> &'static Mutex<VecDeque<usize>> {
    static RETIRED: OnceLock<Mutex<VecDeque<usize>>> = OnceLock::new();
    RETIRED.get_or_init(|| Mutex::new(VecDeque::new()))
}

/// A shell for a new handle: one released long enough ago, or a new one (never freed: 8 bytes
/// each, and at most QUARANTINE of them idle).
fn new_shell() -> usize {
    let mut retired = retired().lock().unwrap_or_else(|e| e.into_inner());
    if retired.len() > QUARANTINE {
        if let Some(shell) = retired.pop_front() {
            return shell;
        }
    }
    drop(retired);
    Box::into_raw(Box::new(Shell {
        dispatch: &crate::generated_dispatch::DISPATCH,
    })) as usize
}

impl<T> std::ops::Deref for Handle<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.obj
    }
}

pub type Ref<T> = Arc<Handle<T>>;

/// Live handles: shell address -> (kind, the object's `Arc` pointer).
fn registry() -> &'static RwLock<HashMap<usize, (Kind, usize)>> {
    static REGISTRY: OnceLock<RwLock<HashMap<usize, (Kind, usize)>>> = OnceLock::new();
    REGISTRY.get_or_init(|| RwLock::new(HashMap::new()))
}

/// Creates a handle with an application reference count of one.
pub fn create<T: ClObject>(obj: T) -> Ref<T> {
    let shell = new_shell();
    let handle = Arc::new(Handle {
        shell,
        app_refs: AtomicU32::new(1),
        obj,
    });
    // The application's reference is one strong count of its own.
    let object = Arc::into_raw(Arc::clone(&handle)) as usize;
    registry()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(shell, (T::KIND, object));
    handle
}

/// The pointer the application sees.
pub fn raw<T>(handle: &Ref<T>) -> *mut c_void {
    handle.shell as *mut c_void
}

/// Looks up a handle from the application; `None` if it is not a live handle of this kind.
pub fn get<T: ClObject>(ptr: *const c_void) -> Option<Ref<T>> {
    let guard = registry().read().unwrap_or_else(|e| e.into_inner());
    let &(kind, object) = guard.get(&(ptr as usize))?;
    if kind != T::KIND {
        return None;
    }
    // SAFETY: the registry holds, for each live shell of kind T, the pointer `create` made
    // from an `Arc<Handle<T>>` whose application reference (one strong count) is still held,
    // so it is alive; the read lock keeps `release` from dropping that count meanwhile.
    unsafe {
        Arc::increment_strong_count(object as *const Handle<T>);
        Some(Arc::from_raw(object as *const Handle<T>))
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
    let removed = registry()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&(ptr as usize));
    handle.obj.on_last_release(ptr as *mut c_void);
    if let Some((_, object)) = removed {
        // SAFETY: drops the strong count taken for the application in `create`; it is no
        // longer reachable from the registry, so no one else can take it.
        unsafe { drop(Arc::from_raw(object as *const Handle<T>)) };
    }
    retired()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push_back(ptr as usize);
    0
}

/// The application's reference count (for the *_REFERENCE_COUNT queries).
pub fn app_refs<T>(handle: &Ref<T>) -> u32 {
    handle.app_refs.load(Ordering::Relaxed)
}

/// Every live handle of kind T (those the application holds a reference to).
pub fn live<T: ClObject>() -> Vec<Ref<T>> {
    let guard = registry().read().unwrap_or_else(|e| e.into_inner());
    guard
        .values()
        .filter(|(kind, _)| *kind == T::KIND)
        .map(|&(_, object)| {
            // SAFETY: as in `get`: a live registry entry of kind T, kept alive by the
            // application's strong count while the read lock is held.
            unsafe {
                Arc::increment_strong_count(object as *const Handle<T>);
                Arc::from_raw(object as *const Handle<T>)
            }
        })
        .collect()
}
