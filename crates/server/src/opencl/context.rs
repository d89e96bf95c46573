//! Contexts, queues, samplers.

use rgpu_cl_api::sys;
use rgpu_protocol::opencl::{Id, ImageFormat};

use crate::handles::QueueEntry;
use crate::native::{self, ClResult};
use crate::session::Session;

impl Session {
    pub(crate) fn create_context(
        &mut self,
        id: Id,
        devices: &[Id],
        properties: &[u64],
    ) -> ClResult<()> {
        self.handles.contexts.check_free(id)?;
        let Some(&first) = devices.first() else {
            return Err(sys::CL_INVALID_VALUE);
        };
        let inventory = self.inventory.clone();
        let platform_id = inventory
            .device(first)
            .ok_or(sys::CL_INVALID_DEVICE)?
            .platform;
        // One context spans one platform.
        if devices.iter().any(|&d| {
            inventory
                .device(d)
                .is_none_or(|d| d.platform != platform_id)
        }) {
            return Err(sys::CL_INVALID_DEVICE);
        }
        let platform = inventory
            .platform(platform_id)
            .ok_or(sys::CL_INVALID_PLATFORM)?;
        let natives = self.native_devices(devices)?;
        let context = self
            .cl()?
            .create_context(platform.native, &natives, properties)?;
        self.handles.contexts.insert(id, context)
    }

    pub(crate) fn create_queue(
        &mut self,
        id: Id,
        context: Id,
        device: Id,
        properties: &[u64],
    ) -> ClResult<()> {
        self.handles.queues.check_free(id)?;
        rgpu_cl_api::validate::queue_properties(properties)?;
        let served = self
            .inventory
            .device(device)
            .ok_or(sys::CL_INVALID_DEVICE)?;
        let with_properties = self
            .inventory
            .platform(served.platform)
            .is_some_and(|p| p.major_version >= 2);
        let queue = self.handles.contexts.get(context)?.create_queue(
            served.native,
            properties,
            with_properties,
        )?;
        let out_of_order = queue.is_out_of_order();
        self.handles.queues.insert(
            id,
            QueueEntry {
                queue,
                out_of_order,
            },
        )
    }

    pub(crate) fn create_sampler(
        &mut self,
        id: Id,
        context: Id,
        properties: &[u64],
    ) -> ClResult<()> {
        self.handles.samplers.check_free(id)?;
        let sampler = self
            .handles
            .contexts
            .get(context)?
            .create_sampler(properties)?;
        self.handles.samplers.insert(id, sampler)
    }

    pub(crate) fn supported_image_formats(
        &self,
        context: Id,
        flags: u64,
        image_type: u32,
    ) -> ClResult<Vec<ImageFormat>> {
        let formats = self
            .handles
            .contexts
            .get(context)?
            .supported_image_formats(flags, image_type)?;
        Ok(formats
            .into_iter()
            .map(|f: native::ImageFormat| ImageFormat {
                channel_order: f.channel_order,
                channel_data_type: f.channel_data_type,
            })
            .collect())
    }
}
