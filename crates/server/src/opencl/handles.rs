//! A session's object tables: one map per object kind from the client's id to the native
//! object. A client can only ever name what its own session created.

use std::collections::HashMap;
use std::sync::Arc;

use rgpu_cl_api::sys;
use rgpu_protocol::opencl::{Id, ObjKind};

use crate::limits::Usage;
use crate::opencl::native::{ClResult, Context, Event, Kernel, Mem, Program, Queue, Sampler};

/// One kind's table. `missing` is the OpenCL error for an id that is not in it. Every entry
/// counts against the session's object quota.
pub struct Table<T> {
    entries: HashMap<Id, T>,
    missing: i32,
    usage: Arc<Usage>,
}

impl<T> Table<T> {
    fn new(missing: i32, usage: &Arc<Usage>) -> Table<T> {
        Table {
            entries: HashMap::new(),
            missing,
            usage: usage.clone(),
        }
    }

    pub fn get(&self, id: Id) -> ClResult<&T> {
        self.entries.get(&id).ok_or(self.missing)
    }

    pub fn get_mut(&mut self, id: Id) -> ClResult<&mut T> {
        self.entries.get_mut(&id).ok_or(self.missing)
    }

    /// Checks that a client-chosen id can name a new object (non-zero, not in use) and that
    /// the session's object quota has room for it.
    pub fn check_free(&self, id: Id) -> ClResult<()> {
        if id == 0 || self.entries.contains_key(&id) {
            Err(sys::CL_INVALID_VALUE)
        } else if !self.usage.has_room_for_object() {
            Err(sys::CL_OUT_OF_HOST_MEMORY)
        } else {
            Ok(())
        }
    }

    pub fn insert(&mut self, id: Id, value: T) -> ClResult<()> {
        self.check_free(id)?;
        self.entries.insert(id, value);
        self.usage.add_objects(1);
        Ok(())
    }

    pub fn remove(&mut self, id: Id) -> ClResult<T> {
        let value = self.entries.remove(&id).ok_or(self.missing)?;
        self.usage.remove_objects(1);
        Ok(value)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Id, &T)> {
        self.entries.iter()
    }

    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.entries.values()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Removes and drops (releases) every entry.
    fn clear(&mut self) {
        self.usage.remove_objects(self.entries.len());
        self.entries.clear();
    }
}

pub struct QueueEntry {
    pub queue: Queue,
    /// Chunked transfers need a marker to stand for all their chunks on such a queue.
    pub out_of_order: bool,
}

pub struct MemEntry {
    pub mem: Mem,
    /// A sub-buffer or an image made from another mem object: released before the others.
    pub derived: bool,
    /// Bytes counted against the session's memory quota (given back at release).
    pub charged: u64,
}

/// How a kernel argument may be set (from clGetKernelArgInfo); guards the server against a
/// client that passes plain bytes where the implementation expects an object handle.
pub use rgpu_protocol::opencl::ArgKind as ArgClass;

pub struct KernelEntry {
    pub kernel: Kernel,
    /// What each argument takes (refined by probing where the implementation gives no info).
    pub arg_classes: Vec<ArgClass>,
}

pub struct Handles {
    pub contexts: Table<Context>,
    pub queues: Table<QueueEntry>,
    pub mems: Table<MemEntry>,
    pub samplers: Table<Sampler>,
    pub programs: Table<Program>,
    pub kernels: Table<KernelEntry>,
    pub events: Table<Event>,
    /// The session's memory and object counts (shared with its CUDA state).
    pub usage: Arc<Usage>,
}

impl Handles {
    pub fn new(usage: Arc<Usage>) -> Handles {
        Handles {
            contexts: Table::new(sys::CL_INVALID_CONTEXT, &usage),
            queues: Table::new(sys::CL_INVALID_COMMAND_QUEUE, &usage),
            mems: Table::new(sys::CL_INVALID_MEM_OBJECT, &usage),
            samplers: Table::new(sys::CL_INVALID_SAMPLER, &usage),
            programs: Table::new(sys::CL_INVALID_PROGRAM, &usage),
            kernels: Table::new(sys::CL_INVALID_KERNEL, &usage),
            events: Table::new(sys::CL_INVALID_EVENT, &usage),
            usage,
        }
    }

    /// Counts `bytes` of a new buffer or image against the memory quota; the caller gives
    /// them back if the creation then fails.
    pub fn charge_memory(&self, bytes: u64) -> ClResult<()> {
        if self.usage.charge_memory(bytes) {
            Ok(())
        } else {
            Err(sys::CL_OUT_OF_RESOURCES)
        }
    }

    /// Drops the client's reference to an object.
    pub fn release(&mut self, kind: ObjKind, id: Id) -> ClResult<()> {
        match kind {
            ObjKind::Context => self.contexts.remove(id).map(drop),
            ObjKind::Queue => self.queues.remove(id).map(drop),
            ObjKind::Mem => self
                .mems
                .remove(id)
                .map(|entry| self.usage.refund_memory(entry.charged)),
            ObjKind::Sampler => self.samplers.remove(id).map(drop),
            ObjKind::Program => self.programs.remove(id).map(drop),
            ObjKind::Kernel => self.kernels.remove(id).map(drop),
            ObjKind::Event => self.events.remove(id).map(drop),
        }
    }

    pub fn count(&self) -> usize {
        self.contexts.len()
            + self.queues.len()
            + self.mems.len()
            + self.samplers.len()
            + self.programs.len()
            + self.kernels.len()
            + self.events.len()
    }

    /// Releases everything, dependents before what they depend on.
    pub fn release_all(&mut self) {
        self.kernels.clear();
        self.programs.clear();
        self.events.clear();
        self.mems.entries.retain(|_, entry| !entry.derived);
        self.mems.clear();
        self.samplers.clear();
        self.queues.clear();
        self.contexts.clear();
    }
}
