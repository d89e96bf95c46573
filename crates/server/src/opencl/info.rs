//! The inventory, clGet*Info queries and releases of any object. Info values that are native handles (a queue's context, a program's
//! devices, ...) mean nothing to the client, so each pointer-sized handle is replaced by the
//! session's id for that object (0 when the session has no id for it).

use rgpu_cl_api::sys;
use rgpu_protocol::opencl::{serve, Answer, Id, InfoQuery, Inventory, ObjKind};

use crate::opencl::native::{ClResult, Device};
use crate::session::Session;

/// What kind of handle an info value holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HandleValue {
    Platform,
    Device,
    Context,
    Queue,
    Mem,
    Program,
    /// A context property list, whose CL_CONTEXT_PLATFORM value is a platform handle.
    ContextProperties,
    /// A host pointer of the server's: never shown to the client.
    HostPointer,
}

fn handle_value(query: &InfoQuery, param: u32) -> Option<HandleValue> {
    use HandleValue::*;
    let kind = match (query, param) {
        (InfoQuery::Device(_), sys::CL_DEVICE_PLATFORM) => Platform,
        (InfoQuery::Device(_), sys::CL_DEVICE_PARENT_DEVICE) => Device,
        (InfoQuery::Context(_), sys::CL_CONTEXT_DEVICES) => Device,
        (InfoQuery::Context(_), sys::CL_CONTEXT_PROPERTIES) => ContextProperties,
        (InfoQuery::Queue(_), sys::CL_QUEUE_CONTEXT) => Context,
        (InfoQuery::Queue(_), sys::CL_QUEUE_DEVICE) => Device,
        (InfoQuery::Queue(_), sys::CL_QUEUE_DEVICE_DEFAULT) => Queue,
        (InfoQuery::Mem(_) | InfoQuery::Image(_), sys::CL_MEM_CONTEXT) => Context,
        (InfoQuery::Mem(_) | InfoQuery::Image(_), sys::CL_MEM_ASSOCIATED_MEMOBJECT) => Mem,
        (InfoQuery::Mem(_) | InfoQuery::Image(_), sys::CL_MEM_HOST_PTR) => HostPointer,
        (InfoQuery::Image(_), sys::CL_IMAGE_BUFFER) => Mem,
        (InfoQuery::Sampler(_), sys::CL_SAMPLER_CONTEXT) => Context,
        (InfoQuery::Program(_), sys::CL_PROGRAM_CONTEXT) => Context,
        (InfoQuery::Program(_), sys::CL_PROGRAM_DEVICES) => Device,
        (InfoQuery::Kernel(_), sys::CL_KERNEL_PROGRAM) => Program,
        (InfoQuery::Kernel(_), sys::CL_KERNEL_CONTEXT) => Context,
        (InfoQuery::Event(_), sys::CL_EVENT_COMMAND_QUEUE) => Queue,
        (InfoQuery::Event(_), sys::CL_EVENT_CONTEXT) => Context,
        _ => return None,
    };
    Some(kind)
}

const WORD: usize = std::mem::size_of::<usize>();

impl serve::Objects for Session {
    fn get_inventory(&mut self) -> Inventory {
        self.cl.inventory.wire.clone()
    }

    fn get_info(&mut self, query: InfoQuery, param: u32) -> Answer<Vec<u8>> {
        let value = self.native_info(&query, param)?;
        Ok(match handle_value(&query, param) {
            Some(kind) => self.translate(kind, &value),
            None => value,
        })
    }

    fn release(&mut self, kind: ObjKind, id: Id) -> Answer<()> {
        self.cl.handles.release(kind, id)
    }
}

impl Session {
    fn device_or_none(&self, id: Id) -> ClResult<Option<Device>> {
        match id {
            0 => Ok(None),
            id => self
                .cl
                .device(id)
                .map(|d| Some(d.native))
                .ok_or(sys::CL_INVALID_DEVICE),
        }
    }

    fn native_info(&self, query: &InfoQuery, param: u32) -> ClResult<Vec<u8>> {
        let h = &self.cl.handles;
        match query {
            InfoQuery::Platform(id) => {
                let platform = self
                    .cl
                    .inventory
                    .platform(*id)
                    .ok_or(sys::CL_INVALID_PLATFORM)?;
                self.cl.library()?.platform_info(platform.native, param)
            }
            InfoQuery::Device(id) => {
                let device = self.cl.device(*id).ok_or(sys::CL_INVALID_DEVICE)?;
                self.cl.library()?.device_info(device.native, param)
            }
            InfoQuery::Context(id) => h.contexts.get(*id)?.info(param),
            InfoQuery::Queue(id) => h.queues.get(*id)?.queue.info(param),
            InfoQuery::Mem(id) => h.mems.get(*id)?.mem.info(param),
            InfoQuery::Image(id) => h.mems.get(*id)?.mem.image_info(param),
            InfoQuery::Sampler(id) => h.samplers.get(*id)?.info(param),
            InfoQuery::Program(id) => h.programs.get(*id)?.info(param),
            InfoQuery::ProgramBuild { program, device } => {
                let device = self.cl.device(*device).ok_or(sys::CL_INVALID_DEVICE)?;
                h.programs.get(*program)?.build_info(device.native, param)
            }
            InfoQuery::Kernel(id) => h.kernels.get(*id)?.kernel.info(param),
            InfoQuery::KernelWorkGroup { kernel, device } => {
                let device = self.device_or_none(*device)?;
                h.kernels
                    .get(*kernel)?
                    .kernel
                    .work_group_info(device, param)
            }
            InfoQuery::KernelArg { kernel, index } => {
                h.kernels.get(*kernel)?.kernel.arg_info(*index, param)
            }
            InfoQuery::KernelSubGroup {
                kernel,
                device,
                input,
                output_size,
            } => {
                let device = self.device_or_none(*device)?;
                h.kernels
                    .get(*kernel)?
                    .kernel
                    .sub_group_info(device, param, input, *output_size)
            }
            InfoQuery::Event(id) => h.events.get(*id)?.info(param),
            InfoQuery::EventProfiling(id) => h.events.get(*id)?.profiling_info(param),
        }
    }

    /// Replaces each pointer-sized handle in `value` by the matching id.
    fn translate(&self, kind: HandleValue, value: &[u8]) -> Vec<u8> {
        let words: Vec<usize> = value
            .as_chunks::<WORD>()
            .0
            .iter()
            .map(|w| rgpu_cl_api::params::decode_unsigned(w) as usize)
            .collect();
        let ids: Vec<u64> = match kind {
            HandleValue::ContextProperties => {
                let mut out = words.iter().map(|&w| w as u64).collect::<Vec<_>>();
                let mut i = 0;
                while i + 1 < out.len() && out[i] != 0 {
                    if out[i] == sys::CL_CONTEXT_PLATFORM as u64 {
                        out[i + 1] = self.cl.inventory.platform_id_of(out[i + 1] as usize);
                    }
                    i += 2;
                }
                out
            }
            _ => words.iter().map(|&addr| self.id_of(kind, addr)).collect(),
        };
        ids.iter().flat_map(|id| id.to_le_bytes()).collect()
    }

    fn id_of(&self, kind: HandleValue, addr: usize) -> Id {
        if addr == 0 {
            return 0;
        }
        let h = &self.cl.handles;
        let find = |mut entries: Box<dyn Iterator<Item = (Id, usize)> + '_>| {
            entries.find(|(_, a)| *a == addr).map_or(0, |(id, _)| id)
        };
        match kind {
            HandleValue::Platform => self.cl.inventory.platform_id_of(addr),
            HandleValue::Device => self
                .cl
                .client_device_id(self.cl.inventory.device_id_of(addr)),
            HandleValue::Context => {
                find(Box::new(h.contexts.iter().map(|(id, c)| (*id, c.addr()))))
            }
            HandleValue::Queue => find(Box::new(
                h.queues.iter().map(|(id, q)| (*id, q.queue.addr())),
            )),
            HandleValue::Mem => find(Box::new(h.mems.iter().map(|(id, m)| (*id, m.mem.addr())))),
            HandleValue::Program => {
                find(Box::new(h.programs.iter().map(|(id, p)| (*id, p.addr()))))
            }
            HandleValue::ContextProperties | HandleValue::HostPointer => 0,
        }
    }
}
