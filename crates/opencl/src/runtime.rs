//! Process-wide state: the connections to the servers of `RGPU_SERVERS`, the one `rgpu`
//! platform with every server's devices, and the thread that runs application callbacks.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock};

use opencl_sys::*;
use rgpu_client::OpenClClient;
use rgpu_client::{ClientConfig, Connection, DeviceKind, DeviceSelection, ServerLink};
use rgpu_protocol::opencl::{DeviceDesc, Id};

use crate::handle::{self, Ref};
use crate::objects::{Device, Event, Platform};

use rgpu_cl_api::{CL_DEVICE_RGPU_SERVER, RGPU_DEVICE_EXTENSION};

/// An event held without keeping it.
type WeakEvent = std::sync::Weak<crate::handle::Handle<Event>>;

pub struct Runtime {
    pub platform: Ref<Platform>,
    /// Events whose completion the application wants to hear about, by connection and id.
    /// Held strongly: a callback must run even if the application released the event.
    notified_events: Mutex<HashMap<(usize, Id), Ref<Event>>>,
    /// Events of commands the server completes, while their final status is not known: the
    /// server tells it before answering a `clFinish` or `clWaitForEvents` that implies it, so
    /// that later queries of the event need no round trip. Held weakly (an event the
    /// application released needs no status).
    command_events: Mutex<HashMap<(usize, Id), WeakEvent>>,
    callbacks: Mutex<Sender<Box<dyn FnOnce() + Send>>>,
}

static RUNTIME: OnceLock<Option<Runtime>> = OnceLock::new();

/// The runtime, connecting to the servers on first use. None when no servers are configured
/// (the ICD then lists no platform, so installing it never disturbs other programs).
pub fn runtime() -> Option<&'static Runtime> {
    RUNTIME.get_or_init(init).as_ref()
}

fn init() -> Option<Runtime> {
    rgpu_client::init_logging();
    let config = match ClientConfig::from_env() {
        Ok(config) => config,
        Err(e) => {
            log::error!("rgpu: {e}");
            return None;
        }
    };
    if config.servers.is_empty() {
        log::debug!("RGPU_SERVERS is not set: the rgpu platform is not offered");
        return None;
    }
    let selection = match DeviceSelection::from_env() {
        Ok(selection) => selection,
        Err(e) => {
            log::error!("rgpu: {e}");
            return None;
        }
    };
    // (server, its address, the device), every server's devices in order.
    let mut found = Vec::new();
    for (endpoint, result) in config.servers.iter().zip(config.connect_all()) {
        match result.and_then(|conn| inventory_devices(&conn).map(|d| (conn, d))) {
            Ok((conn, descs)) => {
                install_event_listener(&conn);
                install_move_listener(&conn);
                let known: Vec<(Id, Vec<u8>)> = descs.iter().map(device_identity).collect();
                let link = ServerLink::new(endpoint, &config, conn, move |fresh| {
                    let devices = inventory_devices(fresh).map_err(|e| e.to_string())?;
                    if devices.iter().map(device_identity).collect::<Vec<_>>() != known {
                        return Err("it serves other devices than before".into());
                    }
                    install_event_listener(fresh);
                    install_move_listener(fresh);
                    Ok(())
                });
                for desc in descs {
                    found.push((link.clone(), endpoint.to_string(), desc));
                }
            }
            Err(e) => log::error!("rgpu: server {endpoint} is not available: {e}"),
        }
    }
    let chosen = match selection.choose(found, |(_, _, desc)| describe(desc)) {
        Ok(chosen) => chosen,
        Err(e) => {
            log::error!("rgpu: {e}");
            Vec::new()
        }
    };
    if selection.is_active() {
        log::info!(
            "rgpu: {} OpenCL devices selected ({selection:?})",
            chosen.len()
        );
    }
    let devices = chosen
        .into_iter()
        .map(|(link, server, desc)| make_device(&link, server, desc))
        .collect();
    let (sender, receiver) = channel::<Box<dyn FnOnce() + Send>>();
    std::thread::Builder::new()
        .name("rgpu-callbacks".into())
        .spawn(move || {
            for job in receiver {
                job();
            }
        })
        .ok()?;
    Some(Runtime {
        platform: handle::create(Platform { devices }),
        notified_events: Mutex::new(HashMap::new()),
        command_events: Mutex::new(HashMap::new()),
        callbacks: Mutex::new(sender),
    })
}

fn inventory_devices(conn: &Arc<Connection>) -> Result<Vec<DeviceDesc>, rgpu_client::ClientError> {
    Ok(conn.opencl().get_inventory()?.devices)
}

/// Size of one `cl_name_version`: a version and a 64-byte name.
const NAME_VERSION_SIZE: usize = 4 + CL_NAME_VERSION_MAX_NAME_SIZE;

/// Whether an extension of the server's device is offered through rgpu: interop with the
/// client's graphics APIs cannot work across machines.
fn offered(extension: &str) -> bool {
    !["gl_sharing", "d3d", "dx9", "egl"]
        .iter()
        .any(|api| extension.contains(api))
}

/// A device as the application sees it: the server's info, with the facts that differ for a
/// remote device adjusted.
/// A device's name and kind, for the environment's device selection.
fn describe(desc: &DeviceDesc) -> (String, DeviceKind) {
    let value = |param| desc.info.iter().find(|(p, _)| *p == param).map(|(_, v)| v);
    let name = value(CL_DEVICE_NAME)
        .map(|v| {
            String::from_utf8_lossy(v)
                .trim_end_matches('\0')
                .to_string()
        })
        .unwrap_or_default();
    let bits = value(CL_DEVICE_TYPE)
        .and_then(|v| v.get(..8))
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
    let kind = if bits & CL_DEVICE_TYPE_GPU != 0 {
        DeviceKind::Gpu
    } else if bits & CL_DEVICE_TYPE_CPU != 0 {
        DeviceKind::Cpu
    } else if bits & CL_DEVICE_TYPE_ACCELERATOR != 0 {
        DeviceKind::Accelerator
    } else {
        DeviceKind::Other
    };
    (name, kind)
}

fn make_device(link: &Arc<ServerLink>, server: String, desc: DeviceDesc) -> Ref<Device> {
    let mut info: HashMap<u32, Vec<u8>> = desc.info.into_iter().collect();
    let device_type = info
        .get(&CL_DEVICE_TYPE)
        .and_then(|v| v.get(..8))
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        .unwrap_or(CL_DEVICE_TYPE_DEFAULT);
    if let Some(ext) = info.get(&CL_DEVICE_EXTENSIONS) {
        let text = String::from_utf8_lossy(ext)
            .trim_end_matches('\0')
            .to_string();
        let kept: Vec<&str> = text.split_whitespace().filter(|e| offered(e)).collect();
        let joined = format!("{} {RGPU_DEVICE_EXTENSION}", kept.join(" "));
        info.insert(
            CL_DEVICE_EXTENSIONS,
            crate::util::string_bytes(joined.trim()),
        );
    }
    // The same list with versions (OpenCL 3.0): the same extensions, and rgpu's.
    if let Some(entries) = info.get(&CL_DEVICE_EXTENSIONS_WITH_VERSION) {
        let mut kept: Vec<u8> = entries
            .as_chunks::<NAME_VERSION_SIZE>()
            .0
            .iter()
            .filter(|entry| {
                let name = &entry[4..];
                let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
                offered(&String::from_utf8_lossy(&name[..end]))
            })
            .flatten()
            .copied()
            .collect();
        kept.extend(crate::util::name_version(
            RGPU_DEVICE_EXTENSION,
            crate::util::version_number(1, 0, 0),
        ));
        info.insert(CL_DEVICE_EXTENSIONS_WITH_VERSION, kept);
    }
    // Native kernels (host functions the device calls) cannot run on another machine.
    if let Some(value) = info.get_mut(&CL_DEVICE_EXECUTION_CAPABILITIES) {
        if let Some(bits) = value.get(..8) {
            let bits = u64::from_le_bytes(bits.try_into().unwrap()) & !CL_EXEC_NATIVE_KERNEL;
            *value = crate::util::bytes_of(&bits);
        }
    }
    let bool_false = crate::util::bytes_of(&(CL_FALSE as cl_bool));
    // Host memory is not shared with a device on another machine.
    info.insert(CL_DEVICE_HOST_UNIFIED_MEMORY, bool_false.clone());
    // Not offered through rgpu (yet): SVM, pipes, device-side enqueue, partitioning.
    info.insert(
        CL_DEVICE_SVM_CAPABILITIES,
        crate::util::bytes_of(&(0 as cl_bitfield)),
    );
    info.insert(CL_DEVICE_PIPE_SUPPORT, bool_false);
    info.insert(
        CL_DEVICE_MAX_PIPE_ARGS,
        crate::util::bytes_of(&(0 as cl_uint)),
    );
    info.insert(
        CL_DEVICE_DEVICE_ENQUEUE_CAPABILITIES,
        crate::util::bytes_of(&(0 as cl_bitfield)),
    );
    info.insert(
        CL_DEVICE_PARTITION_MAX_SUB_DEVICES,
        crate::util::bytes_of(&(0 as cl_uint)),
    );
    info.insert(
        CL_DEVICE_PARTITION_PROPERTIES,
        crate::util::bytes_of(&(0 as cl_device_partition_property)),
    );
    info.insert(
        CL_DEVICE_PARTITION_AFFINITY_DOMAIN,
        crate::util::bytes_of(&(0 as cl_bitfield)),
    );
    info.insert(CL_DEVICE_PARTITION_TYPE, Vec::new());
    info.insert(CL_DEVICE_RGPU_SERVER, crate::util::string_bytes(&server));
    handle::create(Device {
        link: Arc::clone(link),
        id: desc.id,
        info,
        device_type,
    })
}

/// What identifies a served device across a restart of its server: its id and its name.
pub(crate) fn device_identity(desc: &DeviceDesc) -> (Id, Vec<u8>) {
    let name = desc
        .info
        .iter()
        .find(|(param, _)| *param == CL_DEVICE_NAME)
        .map(|(_, value)| value.clone())
        .unwrap_or_default();
    (desc.id, name)
}

/// A server's order to move (`rgpu migrate`): the move runs on a thread of its own, as the
/// program's own `rgpu_opencl_migrate` would.
fn install_move_listener(conn: &Arc<Connection>) {
    let weak = Arc::downgrade(conn);
    conn.set_move_listener(move |to| {
        let Some(conn) = weak.upgrade() else { return };
        let from = conn.endpoint().to_string();
        let target = to.clone();
        let spawned = std::thread::Builder::new()
            .name("rgpu-move".into())
            .spawn(move || {
                if let Err(why) = crate::migration::migrate(&from, &target) {
                    log::warn!("rgpu: the server asked to move to {target}; not moved: {why}");
                }
            });
        if let Err(e) = spawned {
            log::warn!("rgpu: cannot start moving to {to}: {e}");
        }
    });
}

fn install_event_listener(conn: &Arc<Connection>) {
    let key = Arc::as_ptr(conn) as usize;
    conn.set_event_listener(move |id, status| {
        let Some(rt) = runtime_if_ready() else { return };
        let event = rt.notified_events.lock().unwrap().get(&(key, id)).cloned();
        let event = event.or_else(|| {
            let weak = rt.command_events.lock().unwrap().remove(&(key, id));
            weak.and_then(|w| w.upgrade())
        });
        if let Some(event) = event {
            crate::api::event::set_status(&event, status);
        }
    });
}

/// The runtime if it finished initializing; for code on the connection's reader thread, which
/// must never wait for initialization (initialization waits for that thread).
pub fn runtime_if_ready() -> Option<&'static Runtime> {
    RUNTIME.get().and_then(Option::as_ref)
}

impl Runtime {
    /// Runs an application callback on the callback thread (never on the connection's reader
    /// thread, since a callback may itself call OpenCL and wait for the server).
    pub fn run_callback(&self, job: Box<dyn FnOnce() + Send>) {
        let _ = self.callbacks.lock().unwrap().send(job);
    }

    /// Remembers an event for the server's completion notification.
    pub fn watch_event(&self, event: &Ref<Event>) {
        let key = (Arc::as_ptr(&event.conn) as usize, event.id);
        self.notified_events
            .lock()
            .unwrap()
            .insert(key, event.clone());
    }

    pub fn unwatch_event(&self, event: &Event) {
        let key = (Arc::as_ptr(&event.conn) as usize, event.id);
        self.notified_events.lock().unwrap().remove(&key);
        self.command_events.lock().unwrap().remove(&key);
    }

    /// Remembers the event of a command the server completes, for the final status the server
    /// sends with the next wait that implies it.
    pub fn track_command_event(&self, event: &Ref<Event>) {
        let key = (Arc::as_ptr(&event.conn) as usize, event.id);
        let mut events = self.command_events.lock().unwrap();
        // Events released before any wait told their status: drop them now and then.
        if events.len() >= 4096 && events.len().is_power_of_two() {
            events.retain(|_, weak| weak.strong_count() > 0);
        }
        events.insert(key, Arc::downgrade(event));
    }

    pub fn devices(&self) -> &[Ref<Device>] {
        &self.platform.obj.devices
    }
}
