//! CUDA arrays (textures' memory), copies to and from them (through the staging buffers, like
//! device memory), and texture and surface objects over arrays and device memory. Arrays and
//! objects belong to the session (destroyed with it).

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::{check, Status, INVALID_HANDLE, INVALID_VALUE};
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{serve, Answer, ArrayDesc, Extent, Id, Place};
use rgpu_protocol::ServerMsg;

use super::copies::{read_from_device, write_to_device, Location};
use super::owned;
use super::raw::Raw;
use super::session::{code, CudaSession, Served};
use crate::session::End;

/// `CU_RESOURCE_TYPE_ARRAY` / `_MIPMAPPED_ARRAY`: the resource's first union word is an array
/// (or mipmapped array) handle.
const RESOURCE_ARRAY: u32 = 0;
const RESOURCE_MIPMAPPED_ARRAY: u32 = 1;

impl serve::Arrays for Served<'_> {
    fn array_create(&mut self, ctx: Id, id: Id, desc: ArrayDesc) -> Status {
        let cuda = &mut *self.cuda;
        let made = cuda.create_in(ctx, |cuda, raw| {
            let d = array_descriptor(&desc);
            // SAFETY: a local descriptor and out-pointer.
            check(unsafe { cu_call!(cuda.backend.driver, cuArray3DCreate_v2(raw, d.as_ptr())) })
        });
        code(made.map(|raw| {
            let array = owned::Array::new(raw, cuda.current, &cuda.backend);
            cuda.arrays.insert(id, array);
        }))
    }

    fn array_destroy(&mut self, id: Id) -> Answer<()> {
        let taken = self.cuda.arrays.remove(&id);
        self.cuda.destroy(taken)
    }

    fn mipmapped_array_create(&mut self, ctx: Id, id: Id, desc: ArrayDesc, levels: u32) -> Status {
        let cuda = &mut *self.cuda;
        let made = cuda.create_in(ctx, |cuda, raw| {
            let d = array_descriptor(&desc);
            // SAFETY: a local descriptor and out-pointer; the driver checks the level count.
            check(unsafe {
                cu_call!(
                    cuda.backend.driver,
                    cuMipmappedArrayCreate(raw, d.as_ptr(), levels)
                )
            })
        });
        code(made.map(|raw| {
            let mipmap = owned::MipmappedArray::new(raw, cuda.current, &cuda.backend);
            cuda.mipmapped_arrays.insert(id, mipmap);
        }))
    }

    fn mipmapped_array_destroy(&mut self, id: Id) -> Answer<()> {
        let cuda = &mut *self.cuda;
        cuda.mipmap_levels.retain(|_, (mipmap, _)| *mipmap != id);
        let taken = cuda.mipmapped_arrays.remove(&id);
        cuda.destroy(taken)
    }

    fn mipmapped_array_get_level(&mut self, mipmap: Id, level: u32, id: Id) -> Answer<ArrayDesc> {
        let cuda = &mut *self.cuda;
        let raw = cuda
            .mipmapped_arrays
            .get(&mipmap)
            .map(owned::MipmappedArray::raw)
            .ok_or(INVALID_HANDLE)?;
        let mut array = std::ptr::null_mut();
        // SAFETY: a live mipmapped array of this session and a local out-pointer.
        check(unsafe {
            cu_call!(
                cuda.backend.driver,
                cuMipmappedArrayGetLevel(&mut array, raw, level)
            )
        })?;
        let mut d = Raw::<CUDA_ARRAY3D_DESCRIPTOR>::zeroed();
        // SAFETY: the level's array and a local out-descriptor.
        check(unsafe {
            cu_call!(
                cuda.backend.driver,
                cuArray3DGetDescriptor_v2(d.as_mut_ptr(), array)
            )
        })?;
        let p = d.as_ptr();
        // SAFETY: the descriptor the driver filled, each field read as an integer of its width.
        let desc = unsafe {
            ArrayDesc {
                width: std::ptr::addr_of!((*p).Width).read() as u64,
                height: std::ptr::addr_of!((*p).Height).read() as u64,
                depth: std::ptr::addr_of!((*p).Depth).read() as u64,
                format: std::ptr::addr_of!((*p).Format).cast::<u32>().read(),
                channels: std::ptr::addr_of!((*p).NumChannels).read(),
                flags: std::ptr::addr_of!((*p).Flags).read(),
            }
        };
        cuda.mipmap_levels.insert(id, (mipmap, array));
        Ok(desc)
    }

    fn memcpy_htoa(
        &mut self,
        ctx: Id,
        stream: Id,
        array: Id,
        origin: [u64; 3],
        extent: Extent,
        bulk_len: u64,
    ) -> Result<Answer<()>, End> {
        let (session, cuda) = (&mut *self.session, &mut *self.cuda);
        let Ok(at) = cuda.array_location(array, origin, extent) else {
            session.drop_bulk()?;
            return Ok(Err(INVALID_HANDLE));
        };
        let packed = extent.packed();
        write_to_device(session, cuda, ctx, stream, at, extent, packed, bulk_len).map(check)
    }

    fn memcpy_atoh(
        &mut self,
        seq: u64,
        ctx: Id,
        stream: Id,
        array: Id,
        origin: [u64; 3],
        extent: Extent,
    ) -> Result<(), End> {
        let (session, cuda) = (&mut *self.session, &mut *self.cuda);
        match cuda.array_location(array, origin, extent) {
            Ok(at) => {
                read_from_device(session, cuda, seq, ctx, stream, at, extent, extent.packed())
            }
            Err(status) => {
                let end = ServerMsg::ReadDone {
                    status: status as i32,
                };
                session.send_read(seq, None, &end)
            }
        }
    }

    fn memcpy_array(
        &mut self,
        ctx: Id,
        stream: Id,
        src: Place,
        dst: Place,
        extent: Extent,
    ) -> Answer<()> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx)?;
        let stream = cuda.stream(stream)?;
        let mut copy = Raw::<CUDA_MEMCPY3D>::zeroed();
        let p = copy.as_mut_ptr();
        let src_array = match src {
            Place::Array { id, .. } => cuda.array(id)?,
            Place::Device { .. } => std::ptr::null_mut(),
        };
        let dst_array = match dst {
            Place::Array { id, .. } => cuda.array(id)?,
            Place::Device { .. } => std::ptr::null_mut(),
        };
        // SAFETY: fields written through the pointer with valid values of their types.
        unsafe {
            match src {
                Place::Device { ptr, pitch } => {
                    (*p).srcMemoryType = CUmemorytype::CU_MEMORYTYPE_DEVICE;
                    (*p).srcDevice = ptr;
                    (*p).srcPitch = pitch.row as usize;
                    (*p).srcHeight = pitch.slice_rows.max(extent.height) as usize;
                }
                Place::Array { origin, .. } => {
                    (*p).srcMemoryType = CUmemorytype::CU_MEMORYTYPE_ARRAY;
                    (*p).srcArray = src_array;
                    (*p).srcXInBytes = origin[0] as usize;
                    (*p).srcY = origin[1] as usize;
                    (*p).srcZ = origin[2] as usize;
                }
            }
            match dst {
                Place::Device { ptr, pitch } => {
                    (*p).dstMemoryType = CUmemorytype::CU_MEMORYTYPE_DEVICE;
                    (*p).dstDevice = ptr;
                    (*p).dstPitch = pitch.row as usize;
                    (*p).dstHeight = pitch.slice_rows.max(extent.height) as usize;
                }
                Place::Array { origin, .. } => {
                    (*p).dstMemoryType = CUmemorytype::CU_MEMORYTYPE_ARRAY;
                    (*p).dstArray = dst_array;
                    (*p).dstXInBytes = origin[0] as usize;
                    (*p).dstY = origin[1] as usize;
                    (*p).dstZ = origin[2] as usize;
                }
            }
            (*p).WidthInBytes = extent.width as usize;
            (*p).Height = extent.height as usize;
            (*p).Depth = extent.depth as usize;
        }
        // SAFETY: this session's live arrays and device addresses, checked by the driver.
        check(unsafe {
            cu_call!(
                cuda.backend.driver,
                cuMemcpy3DAsync_v2(copy.as_ptr(), stream)
            )
        })
    }

    fn tex_object_create(
        &mut self,
        ctx: Id,
        resource: Vec<u8>,
        texture: Vec<u8>,
        view: Vec<u8>,
    ) -> Answer<u64> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx)?;
        let resource = cuda.resource_desc(&resource)?;
        let texture = Raw::<CUDA_TEXTURE_DESC>::from_bytes(&texture)?;
        let view = match view.is_empty() {
            true => None,
            false => Some(Raw::<CUDA_RESOURCE_VIEW_DESC>::from_bytes(&view)?),
        };
        let view_ptr = view.as_ref().map_or(std::ptr::null(), Raw::as_ptr);
        let mut object = 0;
        // SAFETY: local descriptors (read by the driver, which checks them) and out-value.
        check(unsafe {
            cu_call!(
                cuda.backend.driver,
                cuTexObjectCreate(&mut object, resource.as_ptr(), texture.as_ptr(), view_ptr)
            )
        })?;
        let kept = owned::TexObject::new(object, cuda.current, &cuda.backend);
        cuda.tex_objects.insert(object, kept);
        Ok(object)
    }

    fn surf_object_create(&mut self, ctx: Id, resource: Vec<u8>) -> Answer<u64> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx)?;
        let resource = cuda.resource_desc(&resource)?;
        let mut object = 0;
        // SAFETY: as above.
        check(unsafe {
            cu_call!(
                cuda.backend.driver,
                cuSurfObjectCreate(&mut object, resource.as_ptr())
            )
        })?;
        let kept = owned::SurfObject::new(object, cuda.current, &cuda.backend);
        cuda.surf_objects.insert(object, kept);
        Ok(object)
    }

    fn object_destroy(&mut self, object: u64, surface: bool) -> Answer<()> {
        let cuda = &mut *self.cuda;
        if surface {
            let taken = cuda.surf_objects.remove(&object);
            if taken.is_none() {
                return Err(INVALID_VALUE);
            }
            cuda.destroy(taken)
        } else {
            let taken = cuda.tex_objects.remove(&object);
            if taken.is_none() {
                return Err(INVALID_VALUE);
            }
            cuda.destroy(taken)
        }
    }
}

impl CudaSession {
    /// The driver's handle of array `id`.
    /// An array the session made, or a level of one of its mipmapped arrays.
    fn array(&self, id: Id) -> Result<CUarray, Status> {
        self.arrays
            .get(&id)
            .map(owned::Array::raw)
            .or_else(|| self.mipmap_levels.get(&id).map(|&(_, array)| array))
            .ok_or(INVALID_HANDLE)
    }

    /// Where `extent`'s rows from `origin` lie in array `id`, for the staging copies.
    fn array_location(&self, id: Id, origin: [u64; 3], extent: Extent) -> Result<Location, Status> {
        let raw = self.array(id)?;
        let packed = extent.packed();
        Ok(Location::Array {
            raw,
            origin,
            row: packed.row,
            slice: packed.row.saturating_mul(packed.slice_rows),
        })
    }

    /// A `CUDA_RESOURCE_DESC` from its bytes, an array's session id made its handle.
    fn resource_desc(&self, bytes: &[u8]) -> Result<Raw<CUDA_RESOURCE_DESC>, Status> {
        let mut desc = Raw::<CUDA_RESOURCE_DESC>::from_bytes(bytes)?;
        let p = desc.as_mut_ptr();
        // SAFETY: the type field read as its integer.
        let kind = unsafe { std::ptr::addr_of!((*p).resType).cast::<u32>().read() };
        if kind == RESOURCE_ARRAY {
            // SAFETY: as above: the union's first word holds the array's id from the client.
            let id = unsafe { std::ptr::addr_of!((*p).res).cast::<u64>().read() };
            let array = self.array(id)?;
            // SAFETY: the union's first word is the array handle for this type.
            unsafe {
                std::ptr::addr_of_mut!((*p).res)
                    .cast::<CUarray>()
                    .write(array)
            };
        } else if kind == RESOURCE_MIPMAPPED_ARRAY {
            // SAFETY: as above, for a mipmapped array.
            let id = unsafe { std::ptr::addr_of!((*p).res).cast::<u64>().read() };
            let mipmap = self
                .mipmapped_arrays
                .get(&id)
                .map(owned::MipmappedArray::raw)
                .ok_or(INVALID_HANDLE)?;
            // SAFETY: the union's first word is the mipmapped array handle for this type.
            unsafe {
                std::ptr::addr_of_mut!((*p).res)
                    .cast::<CUmipmappedArray>()
                    .write(mipmap)
            };
        } else if kind != 2 && kind != 3 {
            // Linear (2) and pitched (3) memory pass as they are; nothing else exists.
            return Err(INVALID_VALUE);
        }
        Ok(desc)
    }
}

/// `CUDA_ARRAY3D_DESCRIPTOR` from the wire.
fn array_descriptor(desc: &ArrayDesc) -> Raw<CUDA_ARRAY3D_DESCRIPTOR> {
    let mut d = Raw::<CUDA_ARRAY3D_DESCRIPTOR>::zeroed();
    let p = d.as_mut_ptr();
    // SAFETY: fields written through the pointer, each as an integer of its width (the format
    // as the client's integer, which the driver checks).
    unsafe {
        std::ptr::addr_of_mut!((*p).Width).write(desc.width as usize);
        std::ptr::addr_of_mut!((*p).Height).write(desc.height as usize);
        std::ptr::addr_of_mut!((*p).Depth).write(desc.depth as usize);
        std::ptr::addr_of_mut!((*p).Format)
            .cast::<u32>()
            .write(desc.format);
        std::ptr::addr_of_mut!((*p).NumChannels).write(desc.channels);
        std::ptr::addr_of_mut!((*p).Flags).write(desc.flags);
    }
    d
}
