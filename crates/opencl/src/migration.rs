//! Live migration of the program's OpenCL sessions from one server to another
//! (docs/migration.md).
//!
//! With the library's gate closed (no call of the program inside it) and the session's queues
//! drained, a new session on the target is given every live object of the old one under the
//! same ids: the client chose them, so every handle the program holds stays valid. Devices
//! keep the old server's ids too: the new session aliases each to a served device of the same
//! name (`AliasDevices`). Buffer contents go server to server over the fabric, as a context
//! over several servers moves them (spanning.rs). Finished commands' events become user events
//! with the same final status, their profiling times kept in the client. Then the connection
//! takes the new session, and the old one ends.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use opencl_sys::*;
use rgpu_client::{ClientConfig, Connection, Endpoint, ExportRecord, OpenClClient, ServerLink};
use rgpu_protocol::opencl::{Id, InfoQuery, KernelArg, ObjKind};

use crate::handle::{self, Ref};
use crate::objects::{
    release_remote, Completion, Context, Device, Event, Kernel, Mem, MemKind, Program, Queue,
    Sampler,
};
use crate::runtime::device_identity;
use crate::util::Outcome;

/// How long a move waits for the program's calls in progress to return.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a move waits for a queue's reads to arrive.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(600);

/// What a move did, for the caller's log.
#[derive(Debug, Default)]
pub struct Moved {
    pub sessions: usize,
    pub objects: usize,
    pub bytes: u64,
}

/// Moves every session the program has with server `from` to server `to`.
pub fn migrate(from: &str, to: &str) -> Result<Moved, String> {
    let from = Endpoint::parse(from).map_err(|e| format!("{from}: {e}"))?;
    let to = Endpoint::parse(to).map_err(|e| format!("{to}: {e}"))?;
    let rt = crate::runtime::runtime().ok_or("no rgpu platform (RGPU_SERVERS is not set)")?;
    let mut links: Vec<Arc<ServerLink>> = Vec::new();
    for device in &rt.platform.devices {
        if device.link.endpoint() == from && !links.iter().any(|l| Arc::ptr_eq(l, &device.link)) {
            links.push(device.link.clone());
        }
    }
    if links.is_empty() {
        return Err(format!("the program has no session with {from}"));
    }
    let _closed = crate::boundary::close_gate(QUIESCE_TIMEOUT).ok_or_else(|| {
        format!(
            "the program's OpenCL calls did not all return within {} s (or another move is \
             under way): nothing moved",
            QUIESCE_TIMEOUT.as_secs()
        )
    })?;
    let config = ClientConfig::from_env()?;
    let mut moved = Moved::default();
    for link in links {
        let devices: Vec<Ref<Device>> = rt
            .platform
            .devices
            .iter()
            .filter(|d| Arc::ptr_eq(&d.link, &link))
            .cloned()
            .collect();
        let (objects, bytes) = move_session(&link.current(), &devices, &to, &config)?;
        link.moved_to(&to);
        moved.sessions += 1;
        moved.objects += objects;
        moved.bytes += bytes;
    }
    log::info!(
        "rgpu: moved {} session(s) from {from} to {to}: {} objects, {} bytes of buffers",
        moved.sessions,
        moved.objects,
        moved.bytes
    );
    Ok(moved)
}

/// The live objects of one session, in the order they are made again.
struct Objects {
    contexts: Vec<Ref<Context>>,
    queues: Vec<Ref<Queue>>,
    /// Buffers before their sub-buffers.
    mems: Vec<Ref<Mem>>,
    samplers: Vec<Ref<Sampler>>,
    programs: Vec<Ref<Program>>,
    kernels: Vec<Ref<Kernel>>,
    events: Vec<Ref<Event>>,
    /// Objects the program released that others still use (a released context of a live
    /// queue): made again, then released again once their users are.
    released: Vec<(ObjKind, Id)>,
}

/// Adds `object` once (by identity); whether it was new.
fn add_once<T>(list: &mut Vec<Ref<T>>, object: &Ref<T>) -> bool {
    let new = !list.iter().any(|o| Arc::ptr_eq(o, object));
    if new {
        list.push(object.clone());
    }
    new
}

impl Objects {
    fn of(conn: &Arc<Connection>) -> Objects {
        let mine = |c: &Arc<Connection>| Arc::ptr_eq(c, conn);
        let queues: Vec<Ref<Queue>> = handle::live::<Queue>();
        let queues: Vec<_> = queues.into_iter().filter(|q| mine(&q.conn)).collect();
        let samplers: Vec<Ref<Sampler>> = handle::live::<Sampler>();
        let samplers: Vec<_> = samplers.into_iter().filter(|s| mine(&s.conn)).collect();
        let kernels: Vec<Ref<Kernel>> = handle::live::<Kernel>();
        let kernels: Vec<_> = kernels.into_iter().filter(|k| mine(&k.conn)).collect();
        let events: Vec<Ref<Event>> = handle::live::<Event>();
        let events: Vec<_> = events.into_iter().filter(|e| mine(&e.conn)).collect();
        let programs: Vec<Ref<Program>> = handle::live::<Program>();
        let mut programs: Vec<_> = programs.into_iter().filter(|p| mine(&p.conn)).collect();
        let mems: Vec<Ref<Mem>> = handle::live::<Mem>();
        let mut mems: Vec<_> = mems.into_iter().filter(|m| mine(&m.conn)).collect();
        let contexts: Vec<Ref<Context>> = handle::live::<Context>();
        let mut contexts: Vec<_> = contexts.into_iter().filter(|c| mine(&c.conn)).collect();
        let mut released = Vec::new();
        for kernel in &kernels {
            if add_once(&mut programs, &kernel.program) {
                released.push((ObjKind::Program, kernel.program.id));
            }
        }
        for mem in mems.clone() {
            if let MemKind::Buffer {
                parent: Some((parent, _)),
            } = &mem.kind
            {
                if add_once(&mut mems, parent) {
                    released.push((ObjKind::Mem, parent.id));
                }
            }
        }
        // Parents (made first) before sub-buffers.
        mems.sort_by_key(|m| !matches!(m.kind, MemKind::Buffer { parent: None }));
        let used: Vec<Ref<Context>> = (queues.iter().map(|q| q.context.clone()))
            .chain(mems.iter().map(|m| m.context.clone()))
            .chain(samplers.iter().map(|s| s.context.clone()))
            .chain(programs.iter().map(|p| p.context.clone()))
            .chain(events.iter().map(|e| e.context.clone()))
            .collect();
        for context in used {
            if add_once(&mut contexts, &context) {
                released.push((ObjKind::Context, context.id));
            }
        }
        Objects {
            contexts,
            queues,
            mems,
            samplers,
            programs,
            kernels,
            events,
            released,
        }
    }

    fn count(&self) -> usize {
        self.contexts.len()
            + self.queues.len()
            + self.mems.len()
            + self.samplers.len()
            + self.programs.len()
            + self.kernels.len()
            + self.events.len()
    }

    /// Why the session cannot move (what this version does not carry), if anything.
    fn refusal(&self, conn: &Connection) -> Option<String> {
        if conn.shares_host_memory() {
            return Some("host memory shared with the server's host (ALLOC_HOST_PTR buffers of a client on that host) stays there".into());
        }
        if self.contexts.iter().any(|c| c.spanning.is_some()) {
            return Some("a context over devices of several servers".into());
        }
        if self.mems.iter().any(|m| m.image().is_some()) {
            return Some("images (their contents do not travel server to server yet)".into());
        }
        if self
            .events
            .iter()
            .any(|e| e.command_type == CL_COMMAND_USER && !e.is_final())
        {
            return Some("a user event is not set yet (commands may wait on it)".into());
        }
        None
    }
}

/// Moves one session (`old`, whose server serves `devices`) to `to`: the number of objects
/// and of buffer bytes moved.
fn move_session(
    old: &Arc<Connection>,
    devices: &[Ref<Device>],
    to: &Endpoint,
    config: &ClientConfig,
) -> Result<(usize, u64), String> {
    let objects = Objects::of(old);
    if let Some(why) = objects.refusal(old) {
        return Err(format!("cannot move this session: {why}"));
    }
    let binaries = binaries_of(&objects)?;
    drain(old, &objects)?;
    let new = Connection::connect(to, config).map_err(|e| e.to_string())?;
    alias_devices(&new, devices)?;
    let failed = |what: &str, code: cl_int| format!("making {what} again on {to}: error {code}");
    replay(&objects, &binaries, &new).map_err(|(what, code)| failed(&what, code))?;
    let bytes = move_contents(&objects, old, &new).map_err(|(what, code)| failed(&what, code))?;
    for &(kind, id) in &objects.released {
        release_remote(&new, kind, id);
    }
    new.flush().map_err(|e| e.to_string())?;
    new.continue_ids_of(old);
    // From here on every call goes to the new session; the old one ends with its last user.
    old.take_session_of(&new);
    Ok((objects.count(), bytes))
}

/// Waits until the session's work is done and the client knows every event's end.
fn drain(conn: &Connection, objects: &Objects) -> Result<(), String> {
    for queue in &objects.queues {
        conn.opencl()
            .finish(queue.id)
            .outcome()
            .map_err(|code| format!("finishing queue {}: error {code}", queue.id))?;
        if !queue.pending_reads.wait_idle(DRAIN_TIMEOUT) {
            return Err(format!("queue {}'s reads did not arrive", queue.id));
        }
    }
    for event in &objects.events {
        if event.completion == Completion::Remote && !event.is_final() {
            let status = crate::api::event::current_status(event)
                .map_err(|code| format!("event {}: error {code}", event.id))?;
            if status > CL_COMPLETE {
                return Err(format!("event {} has not ended", event.id));
            }
        }
        keep_profiling(event);
    }
    Ok(())
}

/// Keeps a finished command's profiling times in the client: its event becomes a user event
/// on the new server, which has none.
fn keep_profiling(event: &Ref<Event>) {
    let profiled = event
        .queue
        .as_ref()
        .is_some_and(|q| q.properties & CL_QUEUE_PROFILING_ENABLE != 0);
    if !profiled || event.command_type == CL_COMMAND_USER {
        return;
    }
    for param in [
        CL_PROFILING_COMMAND_QUEUED,
        CL_PROFILING_COMMAND_SUBMIT,
        CL_PROFILING_COMMAND_START,
        CL_PROFILING_COMMAND_END,
        CL_PROFILING_COMMAND_COMPLETE,
    ] {
        if event.state.lock().unwrap().profiling.contains_key(&param) {
            continue;
        }
        let asked = event
            .conn
            .opencl()
            .get_info(InfoQuery::EventProfiling(event.id), param)
            .outcome();
        if let Ok(value) = asked {
            event.state.lock().unwrap().profiling.insert(param, value);
        }
    }
}

/// Has the new session take the old server's device ids, each for a served device of the
/// same name (in order, each used once).
fn alias_devices(new: &Connection, devices: &[Ref<Device>]) -> Result<(), String> {
    let served = new
        .opencl()
        .get_inventory()
        .map_err(|e| e.to_string())?
        .devices;
    let mut taken: Vec<Id> = Vec::new();
    let mut aliases = Vec::with_capacity(devices.len());
    for device in devices {
        // As a server restart is checked: the same name (the id being this server's own).
        let name = device
            .info
            .get(&CL_DEVICE_NAME)
            .cloned()
            .unwrap_or_default();
        let Some(target) = served
            .iter()
            .find(|d| !taken.contains(&d.id) && device_identity(d).1 == name)
        else {
            let name = String::from_utf8_lossy(&name);
            return Err(format!(
                "the target serves no (further) device named {:?}",
                name.trim_end_matches('\0')
            ));
        };
        taken.push(target.id);
        aliases.push((device.id, target.id));
    }
    new.opencl()
        .alias_devices(aliases)
        .outcome()
        .map_err(|code| format!("the target refused the device ids: error {code}"))
}

/// A failed step: what was being made, and the server's status.
type Failed = (String, cl_int);

fn step<T>(what: impl Fn() -> String, result: Result<T, cl_int>) -> Result<T, Failed> {
    result.map_err(|code| (what(), code))
}

/// The binaries of the programs made from neither source nor IL (from binaries, or linked), to
/// make them again from those; by program id.
fn binaries_of(o: &Objects) -> Result<HashMap<Id, Vec<Vec<u8>>>, String> {
    let mut all = HashMap::new();
    for p in o
        .programs
        .iter()
        .filter(|p| p.source.is_none() && p.il.is_none())
    {
        let binaries = crate::api::program::binaries_of(p)
            .map_err(|code| format!("program {}'s binaries: error {code}", p.id))?;
        if binaries.iter().any(Vec::is_empty) {
            return Err(format!(
                "cannot move this session: program {} has no binary for one of its devices \
                 (built-in kernels, or not built for it)",
                p.id
            ));
        }
        all.insert(p.id, binaries);
    }
    Ok(all)
}

/// Makes every object again in the new session, under its id.
fn replay(
    o: &Objects,
    binaries: &HashMap<Id, Vec<Vec<u8>>>,
    new: &Connection,
) -> Result<(), Failed> {
    let server = new.opencl();
    for c in &o.contexts {
        let properties = step(
            || "a context's properties".into(),
            crate::api::context::server_properties(&c.properties),
        )?;
        let devices = c.devices.iter().map(|d| d.id).collect();
        step(
            || format!("context {}", c.id),
            server.create_context(c.id, devices, properties).outcome(),
        )?;
    }
    for q in &o.queues {
        let properties = crate::api::queue::wire_properties(q.properties, &q.properties_array);
        step(
            || format!("queue {}", q.id),
            server
                .create_queue(q.id, q.context.id, q.device.id, properties)
                .outcome(),
        )?;
    }
    // The contents come from the old server; host-pointer flags were for the first making.
    let host_flags = CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR | CL_MEM_ALLOC_HOST_PTR;
    for m in &o.mems {
        let flags = m.flags & !host_flags;
        let made = match &m.kind {
            MemKind::Buffer {
                parent: Some((parent, origin)),
            } => server.create_sub_buffer(m.id, parent.id, flags, *origin as u64, m.size as u64),
            _ => server.create_buffer(
                m.id,
                m.context.id,
                flags,
                m.size as u64,
                m.properties.clone(),
                &[],
            ),
        };
        step(|| format!("buffer {}", m.id), made.outcome())?;
    }
    for s in &o.samplers {
        step(
            || format!("sampler {}", s.id),
            server
                .create_sampler(s.id, s.context.id, s.wire_properties.clone())
                .outcome(),
        )?;
    }
    for p in &o.programs {
        replay_program(p, binaries.get(&p.id), new)?;
    }
    for k in &o.kernels {
        step(
            || format!("kernel {}", k.name),
            server
                .create_kernel(k.id, k.program.id, k.name.clone())
                .outcome(),
        )?;
        let args: Vec<(u32, KernelArg)> = k
            .args
            .lock()
            .unwrap()
            .values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.clone().map(|v| (i as u32, v)))
            .collect();
        if !args.is_empty() {
            step(
                || format!("kernel {}'s arguments", k.name),
                server.set_kernel_args(k.id, args).outcome(),
            )?;
        }
    }
    for e in &o.events {
        let status = e.known_status();
        step(
            || format!("event {}", e.id),
            server
                .create_user_event(e.id, e.context.id)
                .and_then(|()| server.set_user_event_status(e.id, status))
                .outcome(),
        )?;
    }
    Ok(())
}

/// A program made again from its source or IL, and built with its last build's options; or
/// from its binaries, and built (an executable again, as the program was).
fn replay_program(
    p: &Program,
    binaries: Option<&Vec<Vec<u8>>>,
    new: &Connection,
) -> Result<(), Failed> {
    let server = new.opencl();
    let what = || format!("program {}", p.id);
    let made = match (&p.source, &p.il, binaries) {
        (Some(source), _, _) => server.create_program_with_source(
            p.id,
            p.context.id,
            crate::includes::localize_absolute(source).0.into_owned(),
        ),
        (None, Some(il), _) => server.create_program_with_il(p.id, p.context.id, il.clone()),
        (None, None, Some(binaries)) => {
            let devices = p.devices.iter().map(|d| d.id).collect();
            let made = server
                .create_program_with_binary(p.id, p.context.id, devices, binaries.clone())
                .map_err(crate::util::client_error);
            match made {
                Ok(status) if status.status == CL_SUCCESS => Ok(Ok(())),
                Ok(status) => Ok(Err(status.status)),
                Err(code) => return Err((what(), code)),
            }
        }
        (None, None, None) => return Err((what(), CL_INVALID_PROGRAM)),
    };
    step(what, made.outcome())?;
    let mut options = p.options.lock().unwrap().clone();
    if binaries.is_some() {
        options.get_or_insert_with(String::new);
    }
    if let Some(options) = options {
        let devices = p.devices.iter().map(|d| d.id).collect();
        let includes = crate::includes::collect(&options);
        step(
            || format!("program {}'s build", p.id),
            server
                .build_program(p.id, devices, options, includes)
                .outcome(),
        )?;
    }
    Ok(())
}

/// Copies every buffer's contents from the old server to the new one, server to server, in
/// a transfer queue of its context on each: the bytes moved. The transfer queues go whatever
/// happened (the old server's would otherwise stay until its session ends).
fn move_contents(o: &Objects, old: &Connection, new: &Connection) -> Result<u64, Failed> {
    let mut queues: HashMap<Id, Id> = HashMap::new();
    let copied = copy_buffers(o, old, new, &mut queues);
    let finished = queues.values().try_for_each(|&queue| {
        step(
            || "the transfers".into(),
            new.opencl().finish(queue).outcome(),
        )
    });
    for &queue in queues.values() {
        release_remote(new, ObjKind::Queue, queue);
        release_remote(old, ObjKind::Queue, queue);
    }
    let bytes = copied?;
    finished?;
    Ok(bytes)
}

fn copy_buffers(
    o: &Objects,
    old: &Connection,
    new: &Connection,
    queues: &mut HashMap<Id, Id>,
) -> Result<u64, Failed> {
    let mut bytes = 0u64;
    for m in &o.mems {
        if !matches!(m.kind, MemKind::Buffer { parent: None }) || m.size == 0 {
            continue;
        }
        let context = &m.context;
        let queue = match queues.get(&context.id) {
            Some(&queue) => queue,
            None => {
                let device = context.devices.first().map_or(0, |d| d.id);
                let queue = old.new_id();
                for conn in [old, new] {
                    step(
                        || "a transfer queue".into(),
                        conn.opencl()
                            .create_queue(queue, context.id, device, vec![0])
                            .outcome(),
                    )?;
                    queues.insert(context.id, queue);
                }
                queue
            }
        };
        let ticket = rgpu_client::new_ticket();
        let what = || format!("buffer {}'s contents", m.id);
        let export = ExportRecord::new(old, ticket)
            .and_then(|record| record.export())
            .ok_or((what(), CL_INVALID_VALUE))?;
        let exported = old
            .opencl()
            .export_buffer(queue, m.id, 0, m.size as u64, ticket)
            .and_then(|()| old.flush());
        step(what, exported.map_err(|_| CL_OUT_OF_RESOURCES))?;
        let pulled = new
            .opencl()
            .pull_buffer(queue, m.id, 0, m.size as u64, export)
            .outcome();
        if pulled.is_err() {
            // Not left for the exporter to expire.
            let _ = old.opencl().unexport_buffer(ticket);
        }
        step(what, pulled)?;
        bytes += m.size as u64;
    }
    Ok(bytes)
}
