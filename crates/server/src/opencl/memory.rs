//! Buffers, sub-buffers, images and samplers.

use rgpu_cl_api::sys;
use rgpu_protocol::opencl::{serve, Answer, Id, ImageDesc, ImageFormat};

use crate::opencl::handles::MemEntry;
use crate::opencl::native::{self, host_size, ClResult};
use crate::session::{End, Session};

impl serve::Memory for Session {
    fn create_buffer(
        &mut self,
        id: Id,
        context: Id,
        flags: u64,
        size: u64,
        properties: Vec<u64>,
        bulk_len: u64,
    ) -> Result<Answer<()>, End> {
        if flags & sys::CL_MEM_ALLOC_HOST_PTR != 0 && bulk_len == size {
            if let Some(in_place) = self.bulk_in_place(size) {
                return Ok(self.create_buffer_in_segment(id, context, flags, size, in_place));
            }
        }
        let host = match self.receive_initial_contents(bulk_len, usize::try_from(size).ok())? {
            Ok(host) => host,
            Err(status) => return Ok(Err(status)),
        };
        let result = (|| {
            self.cl.handles.mems.check_free(id)?;
            let bytes = size;
            let size = host_size(size)?;
            let context = self.cl.handles.contexts.get(context)?;
            self.cl.handles.charge_memory(bytes)?;
            let mem = context
                .create_buffer(flags, size, host.as_deref(), &properties)
                .inspect_err(|_| self.cl.handles.usage.refund_memory(bytes))?;
            self.cl.handles.mems.insert(
                id,
                MemEntry {
                    mem,
                    derived: false,
                    charged: bytes,
                },
            )
        })();
        Ok(result)
    }

    fn create_sub_buffer(
        &mut self,
        id: Id,
        parent: Id,
        flags: u64,
        origin: u64,
        size: u64,
    ) -> Answer<()> {
        self.cl.handles.mems.check_free(id)?;
        let mem = self
            .cl
            .handles
            .mems
            .get(parent)?
            .mem
            .create_sub_buffer(flags, origin, size)?;
        self.cl.handles.mems.insert(
            id,
            MemEntry {
                mem,
                derived: true,
                charged: 0,
            },
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn create_image(
        &mut self,
        id: Id,
        context: Id,
        flags: u64,
        format: ImageFormat,
        desc: ImageDesc,
        properties: Vec<u64>,
        bulk_len: u64,
    ) -> Result<Answer<()>, End> {
        let format = native::ImageFormat {
            channel_order: format.channel_order,
            channel_data_type: format.channel_data_type,
        };
        let sizes = (|| -> ClResult<[usize; 6]> {
            Ok([
                host_size(desc.width)?,
                host_size(desc.height)?,
                host_size(desc.depth)?,
                host_size(desc.array_size)?,
                host_size(desc.row_pitch)?,
                host_size(desc.slice_pitch)?,
            ])
        })();
        let expected = sizes
            .ok()
            .and_then(|[width, height, depth, array_size, ..]| {
                let probe = native::ImageDesc {
                    image_type: desc.image_type,
                    width,
                    height,
                    depth,
                    array_size,
                    row_pitch: 0,
                    slice_pitch: 0,
                    num_mip_levels: 0,
                    num_samples: 0,
                    mem_object: None,
                };
                native::packed_image_size(format, &probe)
            });
        let host = match self.receive_initial_contents(bulk_len, expected)? {
            Ok(host) => host,
            Err(status) => return Ok(Err(status)),
        };
        let result = (|| {
            self.cl.handles.mems.check_free(id)?;
            rgpu_cl_api::validate::image_descriptor(
                desc.image_type,
                desc.width,
                desc.num_mip_levels,
                desc.num_samples,
            )?;
            let [width, height, depth, array_size, row_pitch, slice_pitch] = sizes?;
            let source = match desc.mem_object {
                0 => None,
                source => Some(
                    &self
                        .cl
                        .handles
                        .mems
                        .get(source)
                        .map_err(|_| sys::CL_INVALID_IMAGE_DESCRIPTOR)?
                        .mem,
                ),
            };
            let native_desc = native::ImageDesc {
                image_type: desc.image_type,
                width,
                height,
                depth,
                array_size,
                row_pitch,
                slice_pitch,
                num_mip_levels: desc.num_mip_levels,
                num_samples: desc.num_samples,
                mem_object: source,
            };
            let context = self.cl.handles.contexts.get(context)?;
            let derived = desc.mem_object != 0;
            // An image made from a buffer uses that buffer's memory.
            let charged = if derived {
                0
            } else {
                native::packed_image_size(format, &native_desc).unwrap_or(0) as u64
            };
            self.cl.handles.charge_memory(charged)?;
            let mem = context
                .create_image(flags, format, &native_desc, host.as_deref(), &properties)
                .inspect_err(|_| self.cl.handles.usage.refund_memory(charged))?;
            self.cl.handles.mems.insert(
                id,
                MemEntry {
                    mem,
                    derived,
                    charged,
                },
            )
        })();
        Ok(result)
    }

    fn create_sampler(&mut self, id: Id, context: Id, properties: Vec<u64>) -> Answer<()> {
        self.cl.handles.samplers.check_free(id)?;
        let sampler = self
            .cl
            .handles
            .contexts
            .get(context)?
            .create_sampler(&properties)?;
        self.cl.handles.samplers.insert(id, sampler)
    }

    fn get_supported_image_formats(
        &mut self,
        context: Id,
        flags: u64,
        image_type: u32,
    ) -> Answer<Vec<ImageFormat>> {
        let formats = self
            .cl
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

impl Session {
    /// A `CL_MEM_ALLOC_HOST_PTR` buffer of a client on this host, whose memory is the client's
    /// shared segment (`in_place`: its name and the buffer's address in it): the client's maps
    /// and unmaps only synchronize it (`Command::SyncHostMemory`), no data crosses the
    /// connection, and on a CPU device the buffer is that memory itself.
    fn create_buffer_in_segment(
        &mut self,
        id: Id,
        context: Id,
        flags: u64,
        size: u64,
        (segment, at): (u64, *const u8),
    ) -> Answer<()> {
        self.cl.handles.mems.check_free(id)?;
        let region = self
            .segment_region(segment)
            .ok_or(sys::CL_INVALID_HOST_PTR)?;
        let context = self.cl.handles.contexts.get(context)?;
        self.cl.handles.charge_memory(size)?;
        let made = context
            .create_buffer_in(flags, host_size(size)?, at.cast_mut())
            // The segment stays mapped here until the implementation is done with the buffer,
            // whenever the client lets go of it.
            .and_then(|mem| mem.keep_until_destroyed(Box::new(region)).map(|()| mem));
        let mem = made.inspect_err(|_| self.cl.handles.usage.refund_memory(size))?;
        self.cl.handles.mems.insert(
            id,
            MemEntry {
                mem,
                derived: false,
                charged: size,
            },
        )
    }

    /// Receives a creation's initial contents (`bulk_len` bytes, which must be `expected`)
    /// into memory. `Ok(Err(status))` when they cannot be taken (the bytes are skipped).
    fn receive_initial_contents(
        &mut self,
        bulk_len: u64,
        expected: Option<usize>,
    ) -> Result<ClResult<Option<Vec<u8>>>, End> {
        if bulk_len == 0 {
            return Ok(Ok(None));
        }
        let fits = expected.is_some_and(|e| e as u64 == bulk_len);
        let mut data = Vec::new();
        if !fits || data.try_reserve_exact(bulk_len as usize).is_err() {
            self.drop_bulk()?;
            return Ok(Err(if fits {
                sys::CL_OUT_OF_HOST_MEMORY
            } else {
                sys::CL_INVALID_HOST_PTR
            }));
        }
        data.resize(bulk_len as usize, 0);
        self.take_bulk(&mut data)?;
        Ok(Ok(Some(data)))
    }
}
