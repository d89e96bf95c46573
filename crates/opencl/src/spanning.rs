//! One context over devices of several servers, as VirtualCL gives one machine's view of a
//! cluster: the context, its buffers, programs and kernels have a *replica* on each server a
//! queue of the context runs on, made at its first use there; a buffer's contents move between
//! servers on demand, server to server over the fabric (`ExportBuffer` on a server where they
//! are current, `PullBuffer` on the queue that needs them, in that queue's order); a command
//! waiting on an event of another server waits on a user event of its own server, which that
//! server completes when the other's event completes (`ExportEvent`/`AwaitExport`).
//!
//! Contexts of one server take none of these paths (`mem_on` returns the buffer's own id).
//! Images, sub-buffers and samplers stay on the server of the context's first device.

use std::sync::{Arc, Mutex, Weak};

use opencl_sys::*;
use rgpu_client::{Connection, OpenClClient};
use rgpu_protocol::opencl::{Id, KernelArg, KernelFacts, ObjKind, WorkGroupLimits};

use crate::handle::{Handle, Ref};
use crate::objects::{
    release_remote, Context, Device, Event, Kernel, Mem, MemKind, Program, Queue,
};
use crate::util::Outcome;

/// A server's part of a context over several servers.
pub struct Part {
    pub conn: Arc<Connection>,
    /// The context on that server.
    pub id: Id,
    pub devices: Vec<Ref<Device>>,
}

/// The parts of a context over devices of several servers; the first is the context's own
/// (`Context::conn`, `Context::id`).
pub struct Spanning {
    pub parts: Vec<Part>,
    /// A queue per server for exports of contents no command made (see `transfer_queue`).
    transfer_queues: Mutex<Vec<(Arc<Connection>, Id)>>,
}

fn same(a: &Arc<Connection>, b: &Arc<Connection>) -> bool {
    Arc::ptr_eq(a, b)
}

/// Makes a context on each server of `devices` (grouped by server, in the order of their first
/// device): the first server's (connection, id) and the parts.
pub fn create_parts(
    devices: &[Ref<Device>],
    properties: &[u64],
) -> Result<(Arc<Connection>, Id, Option<Spanning>), cl_int> {
    let mut groups: Vec<(Arc<rgpu_client::ServerLink>, Vec<Ref<Device>>)> = Vec::new();
    for device in devices {
        match groups
            .iter_mut()
            .find(|(l, _)| Arc::ptr_eq(l, &device.link))
        {
            Some((_, list)) => list.push(device.clone()),
            None => groups.push((device.link.clone(), vec![device.clone()])),
        }
    }
    let mut parts: Vec<Part> = Vec::with_capacity(groups.len());
    for (link, devices) in groups {
        // A new session if the server's was lost and it is back.
        let conn = link.connection();
        let id = conn.new_id();
        let made = conn
            .opencl()
            .create_context(
                id,
                devices.iter().map(|d| d.id).collect(),
                properties.to_vec(),
            )
            .outcome();
        if let Err(code) = made {
            for part in &parts {
                release_remote(&part.conn, ObjKind::Context, part.id);
            }
            return Err(code);
        }
        parts.push(Part { conn, id, devices });
    }
    let (conn, id) = (parts[0].conn.clone(), parts[0].id);
    let spanning = (parts.len() > 1).then(|| Spanning {
        parts,
        transfer_queues: Mutex::new(Vec::new()),
    });
    Ok((conn, id, spanning))
}

impl Spanning {
    /// The part of the server `device` is on.
    pub fn part_of(&self, device: &Ref<Device>) -> Option<&Part> {
        self.parts
            .iter()
            .find(|p| p.devices.iter().any(|d| Arc::ptr_eq(d, device)))
    }

    fn part_on(&self, conn: &Arc<Connection>) -> Result<&Part, cl_int> {
        self.parts
            .iter()
            .find(|p| same(&p.conn, conn))
            .ok_or(CL_INVALID_CONTEXT)
    }

    /// Releases the other servers' contexts (the first is the context's own) and the
    /// transfer queues.
    pub fn release(&self) {
        let queues = std::mem::take(
            &mut *self
                .transfer_queues
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for (conn, id) in queues {
            release_remote(&conn, ObjKind::Queue, id);
        }
        for part in self.parts.iter().skip(1) {
            release_remote(&part.conn, ObjKind::Context, part.id);
        }
    }
}

/// The (connection, id) of a queue's context on its device's server.
pub fn queue_context(context: &Context, device: &Ref<Device>) -> (Arc<Connection>, Id) {
    match context.spanning.as_ref().and_then(|s| s.part_of(device)) {
        Some(part) => (part.conn.clone(), part.id),
        None => (context.conn.clone(), context.id),
    }
}

/// Objects of other servers standing for one object: (server, id) pairs.
#[derive(Default)]
pub struct Replicas(Mutex<Vec<(Arc<Connection>, Id)>>);

impl Replicas {
    fn get(&self, conn: &Arc<Connection>) -> Option<Id> {
        let list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        list.iter().find(|(c, _)| same(c, conn)).map(|(_, id)| *id)
    }

    fn add(&self, conn: &Arc<Connection>, id: Id) {
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        list.push((conn.clone(), id));
    }

    /// Releases every replica (the object itself is released by its owner).
    pub fn release(&self, kind: ObjKind) {
        let list = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        for (conn, id) in list {
            release_remote(&conn, kind, id);
        }
    }
}

/// A server where a buffer's contents are current, with the queue after whose earlier commands
/// they are (None: since the buffer was made).
type Current = (Arc<Connection>, Option<Weak<Handle<Queue>>>);

/// Where a buffer's contents are current, and its replicas.
#[derive(Default)]
pub struct Residence {
    replicas: Replicas,
    /// Empty: on the buffer's own server only, as made.
    current: Mutex<Vec<Current>>,
}

impl Residence {
    pub fn release(&self) {
        self.replicas.release(ObjKind::Mem);
    }
}

/// How a command uses a buffer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Access {
    /// Reads it, or writes part of it: its contents must be current on the queue's server.
    Read,
    /// Reads and may write it (a kernel argument not read-only).
    ReadWrite,
    /// Writes all of it: nothing need move.
    Overwrite,
}

/// The id of `mem` on `queue`'s server for a command that uses it as `access` says, making the
/// buffer there and moving its contents there first when needed.
pub fn mem_on(mem: &Ref<Mem>, queue: &Ref<Queue>, access: Access) -> Result<Id, cl_int> {
    let context = &mem.context;
    let Some(spanning) = context.spanning.as_ref() else {
        return Ok(mem.id);
    };
    let target = &queue.conn;
    let plain_buffer = matches!(mem.kind, MemKind::Buffer { parent: None });
    if !same(target, &mem.conn) && !plain_buffer {
        log::warn!(
            "rgpu: images and sub-buffers stay on the server of their context's first device"
        );
        return Err(CL_INVALID_OPERATION);
    }
    if let MemKind::Buffer {
        parent: Some((parent, _)),
    } = &mem.kind
    {
        // A sub-buffer is part of its parent's bytes: the parent's contents come here first
        // (all of them, even for a write of the whole sub-buffer).
        let access = match access {
            Access::Overwrite => Access::ReadWrite,
            access => access,
        };
        mem_on(parent, queue, access)?;
        return Ok(mem.id);
    }
    let id = replica_of(mem, spanning, target)?;
    let residence = &mem.residence;
    let mut current = residence.current.lock().unwrap_or_else(|e| e.into_inner());
    if current.is_empty() {
        current.push((mem.conn.clone(), None));
    }
    let here = current.iter().any(|(c, _)| same(c, target));
    if !here && access != Access::Overwrite {
        // From where a queue made the contents, if any (its later commands are ordered).
        let (from, after) = current
            .iter()
            .find(|(_, q)| q.as_ref().is_some_and(|q| q.strong_count() > 0))
            .unwrap_or(&current[0])
            .clone();
        move_contents(
            mem,
            spanning,
            &from,
            after.and_then(|q| q.upgrade()),
            queue,
            id,
        )?;
        current.push((target.clone(), Some(Arc::downgrade(queue))));
    }
    if access != Access::Read {
        // Written here: current here only, after this queue's commands.
        current.clear();
        current.push((target.clone(), Some(Arc::downgrade(queue))));
    }
    Ok(id)
}

/// The buffer's id on `conn`'s server, made there at its first use.
fn replica_of(mem: &Mem, spanning: &Spanning, conn: &Arc<Connection>) -> Result<Id, cl_int> {
    if same(conn, &mem.conn) {
        return Ok(mem.id);
    }
    if let Some(id) = mem.residence.replicas.get(conn) {
        return Ok(id);
    }
    let part = spanning.part_on(conn)?;
    let id = conn.new_id();
    // The contents come from where they are current; host-pointer flags were for the first.
    let host_flags = CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR | CL_MEM_ALLOC_HOST_PTR;
    let flags = mem.flags & !host_flags;
    conn.opencl()
        .create_buffer(
            id,
            part.id,
            flags,
            mem.size as u64,
            mem.properties.clone(),
            &[],
        )
        .outcome()?;
    mem.residence.replicas.add(conn, id);
    Ok(id)
}

/// Moves a buffer's contents from `from` (current there after `after`'s earlier commands) to
/// `queue`'s server, into its replica `id`, in `queue`'s order: server to server.
fn move_contents(
    mem: &Ref<Mem>,
    spanning: &Spanning,
    from: &Arc<Connection>,
    after: Option<Ref<Queue>>,
    queue: &Ref<Queue>,
    id: Id,
) -> Result<(), cl_int> {
    let source_id = replica_of(mem, spanning, from)?;
    // The export waits for the commands that made the contents; a queue of that server made
    // for the purpose when they came with the buffer.
    let export_queue = match after {
        Some(q) if same(&q.conn, from) => q.id,
        _ => transfer_queue(spanning, from)?,
    };
    let ticket = rgpu_client::new_ticket();
    let record = rgpu_client::ExportRecord::new(from, ticket).ok_or(CL_INVALID_VALUE)?;
    let export = record.export().ok_or(CL_INVALID_VALUE)?;
    from.opencl()
        .export_buffer(export_queue, source_id, 0, mem.size as u64, ticket)
        .outcome()?;
    from.flush().map_err(|_| CL_OUT_OF_RESOURCES)?;
    log::debug!(
        "rgpu: moving a buffer of {} bytes between servers",
        mem.size
    );
    let pulled = queue
        .conn
        .opencl()
        .pull_buffer(queue.id, id, 0, mem.size as u64, export)
        .outcome();
    if pulled.is_err() {
        // Not left for the exporter to expire.
        let _ = from.opencl().unexport_buffer(ticket);
    }
    pulled
}

/// A queue of `conn`'s server in the context, for exports of contents no command made.
fn transfer_queue(spanning: &Spanning, conn: &Arc<Connection>) -> Result<Id, cl_int> {
    let part = spanning.part_on(conn)?;
    let mut queues = spanning
        .transfer_queues
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some((_, id)) = queues.iter().find(|(c, _)| same(c, conn)) {
        return Ok(*id);
    }
    let device = part.devices.first().ok_or(CL_INVALID_CONTEXT)?;
    let id = conn.new_id();
    conn.opencl()
        .create_queue(id, part.id, device.id, vec![0])
        .outcome()?;
    queues.push((conn.clone(), id));
    Ok(id)
}

/// The program's id on `conn`'s server: made from its source (or IL) at its first use there,
/// and built with the options of its last build.
pub fn program_on(program: &Program, conn: &Arc<Connection>) -> Result<Id, cl_int> {
    if same(conn, &program.conn) {
        return Ok(program.id);
    }
    if let Some(id) = program.replicas.get(conn) {
        return Ok(id);
    }
    let spanning = program
        .context
        .spanning
        .as_ref()
        .ok_or(CL_INVALID_CONTEXT)?;
    let part = spanning.part_on(conn)?;
    let id = conn.new_id();
    let server = conn.opencl();
    match (&program.source, &program.il) {
        (Some(source), _) => server.create_program_with_source(
            id,
            part.id,
            crate::includes::localize_absolute(source).0.into_owned(),
        ),
        (None, Some(il)) => server.create_program_with_il(id, part.id, il.clone()),
        _ => {
            log::warn!("rgpu: a program made from binaries stays on its first server");
            return Err(CL_INVALID_OPERATION);
        }
    }
    .outcome()?;
    program.replicas.add(conn, id);
    let options = program
        .options
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some(options) = options {
        let devices: Vec<Id> = part
            .devices
            .iter()
            .filter(|d| program.devices.iter().any(|p| Arc::ptr_eq(p, d)))
            .map(|d| d.id)
            .collect();
        let includes = crate::includes::collect(&options);
        let built = server
            .build_program(id, devices, options, includes)
            .outcome();
        if let Err(code) = built {
            log::warn!("rgpu: building a program on another server: {code}");
            return Err(CL_BUILD_PROGRAM_FAILURE);
        }
    }
    Ok(id)
}

/// clBuildProgram in a context over several servers: the program on its own server for the
/// devices there (or all of them, when only other servers' devices were named: its kernels are
/// made there), and a replica on each other server with named devices (made, or built again).
pub fn build(
    program: &Program,
    spanning: &Spanning,
    devices: &[Ref<Device>],
    options: &str,
) -> cl_int {
    let mut status = CL_SUCCESS;
    for (index, part) in spanning.parts.iter().enumerate() {
        let named: Vec<Id> = devices
            .iter()
            .filter(|d| part.devices.iter().any(|p| Arc::ptr_eq(p, d)))
            .map(|d| d.id)
            .collect();
        let server = part.conn.opencl();
        let includes = crate::includes::collect(options);
        let built = match index {
            0 => {
                let named = match named.is_empty() {
                    true => part.devices.iter().map(|d| d.id).collect(),
                    false => named,
                };
                server
                    .build_program(program.id, named, options.to_string(), includes)
                    .outcome()
            }
            _ if named.is_empty() => continue,
            _ => match program.replicas.get(&part.conn) {
                Some(id) => server
                    .build_program(id, named, options.to_string(), includes)
                    .outcome(),
                // Made and built with the options just recorded.
                None => program_on(program, &part.conn).map(|_| ()),
            },
        };
        if let Err(code) = built {
            status = code;
        }
    }
    status
}

/// A kernel's replica on another server: its id and work-group limits there.
pub struct KernelReplica {
    pub id: Id,
    pub limits: Vec<WorkGroupLimits>,
}

/// The kernel's replica on `conn`'s server, made at its first use there.
pub fn kernel_on(kernel: &Kernel, conn: &Arc<Connection>) -> Result<Arc<KernelReplica>, cl_int> {
    {
        let replicas = kernel.replicas.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, replica)) = replicas.iter().find(|(c, _)| same(c, conn)) {
            return Ok(replica.clone());
        }
    }
    let program = program_on(&kernel.program, conn)?;
    let id = conn.new_id();
    let KernelFacts { limits, .. } = conn
        .opencl()
        .create_kernel(id, program, kernel.name.clone())
        .outcome()?;
    let replica = Arc::new(KernelReplica { id, limits });
    kernel
        .replicas
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((conn.clone(), replica.clone()));
    Ok(replica)
}

/// Releases a kernel's replicas.
pub fn release_kernel_replicas(kernel: &Kernel) {
    let list = std::mem::take(&mut *kernel.replicas.lock().unwrap_or_else(|e| e.into_inner()));
    for (conn, replica) in list {
        release_remote(&conn, ObjKind::Kernel, replica.id);
    }
}

/// A launch's arguments on `queue`'s server: every argument, buffers moved there first (and
/// counted as written there unless the buffer is read-only).
pub fn launch_args(kernel: &Kernel, queue: &Ref<Queue>) -> Result<Vec<(u32, KernelArg)>, cl_int> {
    let values = kernel
        .args
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values
        .clone();
    let mems = kernel
        .mem_args
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let mut args = Vec::with_capacity(values.len());
    for (index, value) in values.into_iter().enumerate() {
        let value = value.ok_or(CL_INVALID_KERNEL_ARGS)?;
        let value = match (value, mems.get(&(index as u32))) {
            (KernelArg::Mem(id), Some(mem)) if id != 0 => {
                let mem = mem.upgrade().ok_or(CL_INVALID_MEM_OBJECT)?;
                let access = if mem.flags & CL_MEM_READ_ONLY != 0 {
                    Access::Read
                } else {
                    Access::ReadWrite
                };
                KernelArg::Mem(mem_on(&mem, queue, access)?)
            }
            (KernelArg::Sampler(_), _) if !same(&queue.conn, &kernel.conn) => {
                log::warn!("rgpu: samplers stay on the server of their context's first device");
                return Err(CL_INVALID_OPERATION);
            }
            (value, _) => value,
        };
        args.push((index as u32, value));
    }
    Ok(args)
}

/// A user event of a server standing in for an event of another server in a command's wait
/// list: released once the command has been sent (the server keeps what it waits on).
pub struct Bridge {
    conn: Arc<Connection>,
    id: Id,
}

impl Drop for Bridge {
    fn drop(&mut self) {
        release_remote(&self.conn, ObjKind::Event, self.id);
    }
}

/// The wait list of a command on `queue`: the ids of its events on the queue's server, and for
/// each event of another server a user event of this server that this server completes when
/// that one does: the other server exports the event (`ExportEvent`), this one awaits the
/// export over the fabric (`AwaitExport`), as PoCL-R resolves such waits between servers.
pub fn wait_list(
    queue: &Ref<Queue>,
    events: Vec<Ref<Event>>,
) -> Result<(Vec<Id>, Vec<Bridge>), cl_int> {
    let mut ids = Vec::with_capacity(events.len());
    let mut bridges = Vec::new();
    let (conn, context) = queue_context(&queue.context, &queue.device);
    for event in events {
        if same(&event.conn, &queue.conn) {
            ids.push(event.id);
            continue;
        }
        if event.is_final() {
            if event.known_status() != CL_COMPLETE {
                return Err(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
            }
            continue;
        }
        let ticket = rgpu_client::new_ticket();
        let record = rgpu_client::ExportRecord::new(&event.conn, ticket).ok_or(CL_INVALID_VALUE)?;
        let export = record.export().ok_or(CL_INVALID_VALUE)?;
        let sent = event
            .conn
            .opencl()
            .export_event(event.id, ticket)
            .and_then(|()| event.conn.flush());
        sent.map_err(|_| CL_OUT_OF_RESOURCES)?;
        let id = conn.new_id();
        let server = conn.opencl();
        server
            .create_user_event(id, context)
            .and_then(|()| server.await_export(id, export))
            .map_err(|_| CL_OUT_OF_RESOURCES)?;
        ids.push(id);
        bridges.push(Bridge {
            conn: conn.clone(),
            id,
        });
    }
    Ok((ids, bridges))
}
