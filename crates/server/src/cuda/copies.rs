//! Copies: host to device (the request's bulk, through staging buffers), device to host (the
//! data streamed back in chunks while later ones are still on the GPU), and between devices of
//! this server.

use std::ffi::c_void;
use std::ptr::null_mut;

use rgpu_cuda_api::native::{check, Status, INVALID_VALUE, SUCCESS};
use rgpu_cuda_api::sys::*;
use rgpu_cuda_api::{cu_call, wire};
use rgpu_protocol::cuda::{serve, Answer, DevicePtr, Extent, Id, Pitch};
use rgpu_protocol::ServerMsg;

use super::pieces::{pieces, Piece};
use super::raw::Raw;
use super::session::{CudaSession, Served, INVALID_CONTEXT};
use super::staging::CHUNK;
use crate::lanes::StripedOut;
use crate::session::{End, Session};

impl serve::Copies for Served<'_> {
    fn memcpy_htod(
        &mut self,
        ctx: Id,
        stream: Id,
        dst: DevicePtr,
        extent: Extent,
        pitch: Pitch,
        bulk_len: u64,
    ) -> Result<Answer<()>, End> {
        let (session, cuda) = (&mut *self.session, &mut *self.cuda);
        write_to_device(
            session,
            cuda,
            ctx,
            stream,
            Location::Device(dst),
            extent,
            pitch,
            bulk_len,
        )
        .map(check)
    }

    fn memcpy_dtoh(
        &mut self,
        seq: u64,
        ctx: Id,
        stream: Id,
        src: DevicePtr,
        extent: Extent,
        pitch: Pitch,
    ) -> Result<(), End> {
        let (session, cuda) = (&mut *self.session, &mut *self.cuda);
        read_from_device(
            session,
            cuda,
            seq,
            ctx,
            stream,
            Location::Device(src),
            extent,
            pitch,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn memcpy_dtod(
        &mut self,
        ctx: Id,
        stream: Id,
        dst: DevicePtr,
        dst_pitch: Pitch,
        src: DevicePtr,
        src_pitch: Pitch,
        src_ctx: Id,
        extent: Extent,
    ) -> Answer<()> {
        let copy = DeviceCopy {
            dst,
            dst_pitch,
            src,
            src_pitch,
            extent,
        };
        self.cuda.copy_on_device(ctx, stream, src_ctx, copy)
    }
}

/// The rows of a device-to-device copy: `extent`, lying `src_pitch` / `dst_pitch` apart.
#[derive(Clone, Copy)]
pub(super) struct DeviceCopy {
    pub(super) dst: u64,
    pub(super) dst_pitch: Pitch,
    pub(super) src: u64,
    pub(super) src_pitch: Pitch,
    pub(super) extent: Extent,
}

impl DeviceCopy {
    pub(super) fn descriptor(&self) -> CUDA_MEMCPY3D {
        wire::device_copy_params(
            self.dst,
            self.dst_pitch,
            self.src,
            self.src_pitch,
            self.extent,
        )
    }

    fn peer_descriptor(&self, dst_ctx: CUcontext, src_ctx: CUcontext) -> CUDA_MEMCPY3D_PEER {
        let d = self.descriptor();
        CUDA_MEMCPY3D_PEER {
            srcXInBytes: 0,
            srcY: 0,
            srcZ: 0,
            srcLOD: 0,
            srcMemoryType: d.srcMemoryType,
            srcHost: d.srcHost,
            srcDevice: d.srcDevice,
            srcArray: null_mut(),
            srcContext: src_ctx,
            srcPitch: d.srcPitch,
            srcHeight: d.srcHeight,
            dstXInBytes: 0,
            dstY: 0,
            dstZ: 0,
            dstLOD: 0,
            dstMemoryType: d.dstMemoryType,
            dstHost: d.dstHost,
            dstDevice: d.dstDevice,
            dstArray: null_mut(),
            dstContext: dst_ctx,
            dstPitch: d.dstPitch,
            dstHeight: d.dstHeight,
            WidthInBytes: d.WidthInBytes,
            Height: d.Height,
            Depth: d.Depth,
        }
    }
}

impl CudaSession {
    /// A device-to-device copy on `stream` of `ctx`; `src_ctx` (when not 0) is the context of
    /// `src`, of another device of this server (a peer copy).
    fn copy_on_device(
        &mut self,
        ctx: Id,
        stream: Id,
        src_ctx: Id,
        copy: DeviceCopy,
    ) -> Result<(), Status> {
        if !copy.extent.fits(copy.src_pitch) || !copy.extent.fits(copy.dst_pitch) {
            return Err(INVALID_VALUE);
        }
        let peer = match src_ctx {
            0 => None,
            id => Some(self.contexts.get(&id).ok_or(INVALID_CONTEXT)?.raw),
        };
        self.enter(ctx)?;
        let stream = self.stream(stream)?;
        let driver = &self.backend.driver;
        let DeviceCopy {
            dst, src, extent, ..
        } = copy;
        let contiguous =
            extent.is_contiguous(copy.src_pitch) && extent.is_contiguous(copy.dst_pitch);
        let size = extent.bytes().ok_or(INVALID_VALUE)? as usize;
        let status = match (peer, contiguous) {
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            (None, true) => unsafe {
                cu_call!(driver, cuMemcpyDtoDAsync_v2(dst, src, size, stream))
            },
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            (Some(src_ctx), true) => unsafe {
                cu_call!(
                    driver,
                    cuMemcpyPeerAsync(dst, self.current, src, src_ctx, size, stream)
                )
            },
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            (None, false) => unsafe {
                cu_call!(driver, cuMemcpy3DAsync_v2(&copy.descriptor(), stream))
            },
            (Some(src_ctx), false) => {
                let peer_copy = copy.peer_descriptor(self.current, src_ctx);
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                unsafe { cu_call!(driver, cuMemcpy3DPeerAsync(&peer_copy, stream)) }
            }
        };
        check(status)
    }
}

/// Streams the request's bulk data (`extent`'s rows, packed) to `dst`, where the rows lie
/// `pitch` apart, through the staging buffers. Returns the copy's status (the bulk is
/// consumed whatever happens); `Err` only if the connection failed.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_to_device(
    session: &mut Session,
    cuda: &mut CudaSession,
    ctx: Id,
    stream: Id,
    dst: Location,
    extent: Extent,
    pitch: Pitch,
    len: u64,
) -> Result<Status, End> {
    let target = cuda.enter(ctx).and_then(|()| cuda.stream(stream));
    let stream = match target {
        Ok(_) if !extent.fits(pitch) || extent.bytes() != Some(len) => Err(INVALID_VALUE),
        other => other,
    };
    let stream = match stream {
        Ok(stream) => stream,
        Err(status) => {
            session.drop_bulk()?;
            return Ok(status);
        }
    };
    if let Some(status) = write_in_place(session, cuda, stream, dst, extent, pitch, len) {
        return Ok(status);
    }
    if let Some(status) = write_from_ring(session, cuda, stream, dst, extent, pitch)? {
        return Ok(status);
    }
    let driver = &cuda.backend.driver;
    for piece in pieces(extent, pitch, CHUNK) {
        let slot = cuda
            .staging
            .next_slot(driver, cuda.current)
            .and_then(|slot| Ok((slot, cuda.staging.buffer(driver, slot)?)));
        let (slot, buffer) = match slot {
            Ok(found) => found,
            Err(status) => {
                session.drop_bulk()?;
                return Ok(status);
            }
        };
        let buffer = &mut buffer[..piece.bytes()];
        session.take_bulk(buffer)?;
        let copied = copy_piece(driver, Direction::ToDevice, dst, piece, buffer, stream)
            .and_then(|()| cuda.staging.guard(driver, slot, cuda.current, stream));
        if let Err(status) = copied {
            session.drop_bulk()?;
            return Ok(status);
        }
    }
    Ok(SUCCESS)
}

/// A copy whose bytes lie in one of the client's shared host-memory segments: the device
/// reads them in place (one DMA on the stream, as a native copy from page-locked memory).
/// `None`: not such a copy (nothing was taken).
fn write_in_place(
    session: &mut Session,
    cuda: &mut CudaSession,
    stream: CUstream,
    dst: Location,
    extent: Extent,
    pitch: Pitch,
    len: u64,
) -> Option<Status> {
    let Location::Device(device) = dst else {
        return None;
    };
    if !extent.is_contiguous(pitch) {
        return None;
    }
    let (segment, at) = session.bulk_in_place(len)?;
    let host = at.cast_mut();
    dma_with_segment(
        session,
        cuda,
        segment,
        Direction::ToDevice,
        device,
        host,
        len as usize,
        stream,
    )
}

/// One DMA on `stream` between device memory and `len` bytes at `host` in the client's shared
/// segment `segment` (registered with the driver at its first copy).
#[allow(clippy::too_many_arguments)]
fn dma_with_segment(
    session: &Session,
    cuda: &mut CudaSession,
    segment: u64,
    direction: Direction,
    device: u64,
    host: *mut u8,
    len: usize,
    stream: CUstream,
) -> Option<Status> {
    let (base, size) = session.segment(segment)?;
    let issued = cuda.register_host(base, size).and_then(|()| {
        let driver = &cuda.backend.driver;
        // SAFETY: `host` and `len` lie inside the registered segment (checked when the
        // request was read); the driver checks the device range.
        check(unsafe {
            match direction {
                Direction::ToDevice => cu_call!(
                    driver,
                    cuMemcpyHtoDAsync_v2(device, host.cast(), len, stream)
                ),
                Direction::FromDevice => cu_call!(
                    driver,
                    cuMemcpyDtoHAsync_v2(host.cast(), device, len, stream)
                ),
            }
        })
    });
    Some(issued.err().unwrap_or(SUCCESS))
}

/// A copy whose bytes come through the client's shared ring, when the stream is idle: the
/// device reads them in the ring (registered with the driver) as they arrive, and they are
/// given back, half a ring at a time, once read. (On a busy stream the bytes go through the
/// staging buffers instead: the session thread never waits for the stream's earlier work.)
/// `None`: not such a copy (nothing was taken).
fn write_from_ring(
    session: &mut Session,
    cuda: &mut CudaSession,
    stream: CUstream,
    dst: Location,
    extent: Extent,
    pitch: Pitch,
) -> Result<Option<Status>, End> {
    let Location::Device(device) = dst else {
        return Ok(None);
    };
    let Some((base, size)) = session.bulk_ring_region() else {
        return Ok(None);
    };
    let driver = &cuda.backend.driver;
    // SAFETY: this session's stream; only asks.
    let idle = unsafe { cu_call!(driver, cuStreamQuery(stream)) } == SUCCESS;
    if !idle || !extent.is_contiguous(pitch) || cuda.register_host(base, size).is_err() {
        return Ok(None);
    }
    let driver = &cuda.backend.driver;
    let window = (size / 4) as u64; // half of one of the two rings
    let total = extent.bytes().unwrap_or(0);
    let mut offset = 0u64;
    let mut status = SUCCESS;
    while offset < total {
        let (at, n) = session.take_ring_bulk((total - offset).min(RING_PIECE as u64))?;
        if status == SUCCESS {
            // SAFETY: `at` and `n` are bytes in the ring, registered above and held until
            // released below, after the copy is done.
            status = check(unsafe {
                cu_call!(
                    driver,
                    cuMemcpyHtoDAsync_v2(device + offset, at.cast(), n, stream)
                )
            })
            .err()
            .unwrap_or(SUCCESS);
        }
        offset += n as u64;
        // Held bytes stay under half a ring, so the client always has room to go on.
        if offset == total || session.ring_bulk_held() >= window {
            // SAFETY: this session's stream: the copies issued so far are done after it.
            let synced = check(unsafe { cu_call!(driver, cuStreamSynchronize(stream)) });
            if status == SUCCESS {
                status = synced.err().unwrap_or(SUCCESS);
            }
            session.release_ring_bulk()?;
        }
    }
    Ok(Some(status))
}

/// How a read's data reaches the client, decided once per read.
enum ReadRoute {
    /// The client asked for it in one of its shared host-memory segments: the device writes
    /// it there in place, and the reply says the copy was issued (the program's
    /// synchronization orders it, as for a native asynchronous copy).
    InPlace {
        segment: u64,
        host: *mut u8,
        device: u64,
        len: usize,
    },
    /// Through the client's shared ring (a client on this host), piece by piece.
    Ring { device: u64, len: usize },
    /// Through staging, on the socket; `may_stripe`: or over the data lanes, where the client
    /// takes large reads there (not for a read the client expected in place).
    Staged { may_stripe: bool },
}

fn read_route(session: &Session, src: Location, extent: Extent, pitch: Pitch) -> ReadRoute {
    let contiguous = match (src, extent.bytes()) {
        (Location::Device(device), Some(len)) if extent.is_contiguous(pitch) => {
            Some((device, len as usize))
        }
        _ => None,
    };
    let asked_in_place = session.read_in_place(extent.bytes().unwrap_or(0) as usize);
    match (contiguous, asked_in_place) {
        (Some((device, len)), Some((segment, host))) => ReadRoute::InPlace {
            segment,
            host,
            device,
            len,
        },
        (None, Some(_)) => ReadRoute::Staged { may_stripe: false },
        (Some((device, len)), None)
            if len as u64 >= rgpu_protocol::RING_MIN && session.writer.has_ring() =>
        {
            ReadRoute::Ring { device, len }
        }
        _ => ReadRoute::Staged { may_stripe: true },
    }
}

/// Sends `extent`'s rows at `src` (lying `pitch` apart) to the client by the read's route:
/// staged reads in chunks, several in flight on the GPU while earlier ones are sent. Ends
/// with the status (deferred errors included), in the same write as the last chunk.
#[allow(clippy::too_many_arguments)]
pub(super) fn read_from_device(
    session: &mut Session,
    cuda: &mut CudaSession,
    seq: u64,
    ctx: Id,
    stream: Id,
    src: Location,
    extent: Extent,
    pitch: Pitch,
) -> Result<(), End> {
    let (status, last) = match cuda.enter(ctx).and_then(|()| cuda.stream(stream)) {
        Ok(_) if !extent.fits(pitch) => (INVALID_VALUE, None),
        Ok(stream) => match read_route(session, src, extent, pitch) {
            ReadRoute::InPlace {
                segment,
                host,
                device,
                len,
            } => {
                let direction = Direction::FromDevice;
                let issued =
                    dma_with_segment(session, cuda, segment, direction, device, host, len, stream);
                (issued.unwrap_or(INVALID_VALUE), None)
            }
            ReadRoute::Ring { device, len } => (
                read_through_ring(session, cuda, seq, stream, device, len)?,
                None,
            ),
            ReadRoute::Staged { may_stripe } => {
                let mut striped = match may_stripe {
                    true => session.start_striped_read(seq, extent.bytes().unwrap_or(0))?,
                    false => None,
                };
                let sent =
                    stream_out(session, cuda, seq, stream, src, extent, pitch, &mut striped)?;
                match striped {
                    Some(out) => {
                        session.finish_striped_read(out)?;
                        (sent.0, None)
                    }
                    None => sent,
                }
            }
        },
        Err(status) => (status, None),
    };
    let mut status = cuda.sync_status(status);
    let driver = &cuda.backend.driver;
    let data = match last {
        Some((slot, offset, len)) if status == SUCCESS => match cuda.staging.buffer(driver, slot) {
            Ok(buffer) => Some((offset, &buffer[..len])),
            Err(error) => {
                status = error;
                None
            }
        },
        _ => None,
    };
    let end = ServerMsg::ReadDone {
        status: status as i32,
    };
    session.send_read(seq, data, &end)
}

/// Pieces a read through the shared ring is copied in: half a ring's worth in flight while
/// the client takes earlier ones out.
const RING_PIECE: usize = 2 << 20;

/// A read of `len` bytes of device memory at `src` through the client's shared ring (a client
/// on this host): the device copies each piece straight into the ring (registered with the
/// driver), and each is published to the client once its copy is done, while later pieces
/// are still on their way. Returns the copy's status.
fn read_through_ring(
    session: &mut Session,
    cuda: &mut CudaSession,
    seq: u64,
    stream: CUstream,
    src: u64,
    len: usize,
) -> Result<Status, End> {
    let writer = session.writer.clone();
    let stopping = session.shared.stopping();
    let broken = |e: rgpu_transport::TransportError| End::from_transport(e, stopping);
    let Some(mut ring) = writer.ring_sender() else {
        return Ok(INVALID_VALUE);
    };
    let (base, size) = ring.region();
    if let Err(status) = cuda.register_host(base, size) {
        return Ok(status);
    }
    let driver = &cuda.backend.driver;
    let depth = (size / 4 / RING_PIECE).max(1); // half of one of the two rings
    let mut in_flight = std::collections::VecDeque::with_capacity(depth);
    let mut offset = 0usize;
    let mut status = SUCCESS;
    while status == SUCCESS && (offset < len || !in_flight.is_empty()) {
        while status == SUCCESS && offset < len && in_flight.len() < depth {
            // Waits for room only with nothing in flight: the client cannot take bytes that
            // are not published yet.
            let (at, n) = ring
                .reserve((len - offset).min(RING_PIECE), in_flight.is_empty())
                .map_err(broken)?;
            if n == 0 {
                break;
            }
            let mut event = null_mut();
            let flags = CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
            // SAFETY: `at` and `n` are room in the ring, registered with the driver above;
            // the driver checks the device range.
            let issued = check(unsafe {
                cu_call!(
                    driver,
                    cuMemcpyDtoHAsync_v2(at.cast(), src + offset as u64, n, stream)
                )
            })
            // SAFETY: a new event of the current context, recorded on the copy's stream.
            .and_then(|()| check(unsafe { cu_call!(driver, cuEventCreate(&mut event, flags)) }))
            // SAFETY: as above.
            .and_then(|()| check(unsafe { cu_call!(driver, cuEventRecord(event, stream)) }));
            if let Err(failed) = issued {
                status = failed;
                if !event.is_null() {
                    in_flight.push_back((event, offset, 0));
                }
                break;
            }
            in_flight.push_back((event, offset, n));
            offset += n;
        }
        let Some((event, at_offset, n)) = in_flight.pop_front() else {
            break;
        };
        // SAFETY: an event made above.
        let done = check(unsafe { cu_call!(driver, cuEventSynchronize(event)) });
        // SAFETY: as above; not used again.
        unsafe { cu_call!(driver, cuEventDestroy_v2(event)) };
        match done {
            Ok(()) if status == SUCCESS && n > 0 => {
                ring.publish(seq, at_offset as u64, n).map_err(broken)?
            }
            Ok(()) => {}
            Err(failed) => status = failed,
        }
    }
    if status != SUCCESS {
        for (event, _, _) in in_flight {
            // SAFETY: events made above, waited for before they go.
            unsafe { cu_call!(driver, cuEventSynchronize(event)) };
            // SAFETY: as above.
            unsafe { cu_call!(driver, cuEventDestroy_v2(event)) };
        }
        ring.cancel_reserved();
    }
    Ok(status)
}

/// Issues the copies to staging and sends every piece but the last, which it returns as
/// (staging slot, packed offset, length), with the status so far. With `striped`, every piece
/// goes to the data lanes' sending threads (lent: `Staging` waits for them before it reuses a
/// slot) and nothing is returned.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn stream_out(
    session: &mut Session,
    cuda: &mut CudaSession,
    seq: u64,
    stream: CUstream,
    src: Location,
    extent: Extent,
    pitch: Pitch,
    striped: &mut Option<StripedOut>,
) -> Result<(Status, Option<(usize, u64, usize)>), End> {
    let driver = &cuda.backend.driver;
    let mut to_issue = pieces(extent, pitch, CHUNK);
    // (slot, packed offset, bytes) of the pieces on their way to staging, oldest first.
    let mut in_flight = std::collections::VecDeque::with_capacity(super::staging::SLOTS);
    let mut packed_offset = 0u64;
    loop {
        // Keep the pipeline full: staging slots minus the one being sent. A slot still being
        // written out by a data lane is waited for only when nothing else can go on: pieces
        // already copied are dealt first, so every lane stays busy (waiting here with copied
        // pieces in hand kept two lanes of eight writing).
        while in_flight.len() < super::staging::SLOTS - 1
            && (in_flight.is_empty() || cuda.staging.next_is_free())
        {
            let Some(piece) = to_issue.next() else { break };
            let issue = cuda
                .staging
                .next_slot(driver, cuda.current)
                .and_then(|slot| {
                    let buffer = cuda.staging.buffer(driver, slot)?;
                    let buffer = &mut buffer[..piece.bytes()];
                    copy_piece(driver, Direction::FromDevice, src, piece, buffer, stream)?;
                    cuda.staging.guard(driver, slot, cuda.current, stream)?;
                    Ok(slot)
                });
            match issue {
                Ok(slot) => in_flight.push_back((slot, packed_offset, piece.bytes())),
                Err(status) => return Ok((status, None)),
            }
            packed_offset += piece.bytes() as u64;
        }
        let Some((slot, offset, len)) = in_flight.pop_front() else {
            return Ok((SUCCESS, None));
        };
        if in_flight.is_empty() && striped.is_none() {
            return Ok((SUCCESS, Some((slot, offset, len))));
        }
        let buffer = match cuda.staging.buffer(driver, slot) {
            Ok(buffer) => &buffer[..len],
            Err(status) => return Ok((status, None)),
        };
        match striped.as_mut() {
            Some(out) => {
                // SAFETY: the slot's buffer is not handed out again (nor freed) before `done`
                // finishes: `Staging` waits for what it lent.
                let done = unsafe { session.deal_read(out, buffer) }?;
                cuda.staging.lend(slot, done);
            }
            None => session.send(&ServerMsg::Data { offset }, seq, buffer)?,
        }
    }
}

#[derive(Clone, Copy)]
enum Direction {
    ToDevice,
    FromDevice,
}

/// Where a copy's rows are on this server: device memory, or a CUDA array.
#[derive(Clone, Copy)]
pub(super) enum Location {
    /// Device memory from this address (rows laid out by the copy's pitch).
    Device(u64),
    /// An array, from `origin` (x in bytes, row, slice); the copy's pieces are counted in its
    /// packed layout, `row` bytes a row and `slice` bytes a slice.
    Array {
        raw: CUarray,
        origin: [u64; 3],
        row: u64,
        slice: u64,
    },
}

/// Issues on `stream` the copy of one piece between `staging` (its rows packed) and the rows
/// at `at` (`piece.device_offset` into them): for device memory one 1D copy for a single row,
/// else one 2D copy; for an array one 3D copy of the piece's rows.
fn copy_piece(
    driver: &rgpu_cuda_api::native::Driver,
    direction: Direction,
    at: Location,
    piece: Piece,
    staging: &mut [u8],
    stream: CUstream,
) -> Result<(), Status> {
    let base = match at {
        Location::Device(base) => base,
        Location::Array {
            raw,
            origin,
            row,
            slice,
        } => {
            return copy_array_piece(
                driver, direction, raw, origin, row, slice, piece, staging, stream,
            )
        }
    };
    let device = base + piece.device_offset;
    let host = staging.as_mut_ptr().cast::<c_void>();
    let status = match (direction, piece.rows) {
        // SAFETY: this session's live handles and local buffers; the driver checks addresses.
        (Direction::ToDevice, 1) => unsafe {
            cu_call!(
                driver,
                cuMemcpyHtoDAsync_v2(device, host, piece.width, stream)
            )
        },
        // SAFETY: this session's live handles and local buffers; the driver checks addresses.
        (Direction::FromDevice, 1) => unsafe {
            cu_call!(
                driver,
                cuMemcpyDtoHAsync_v2(host, device, piece.width, stream)
            )
        },
        (direction, rows) => {
            let (host_type, device_type) = (
                CUmemorytype::CU_MEMORYTYPE_HOST,
                CUmemorytype::CU_MEMORYTYPE_DEVICE,
            );
            let to_device = matches!(direction, Direction::ToDevice);
            let copy = CUDA_MEMCPY2D {
                srcXInBytes: 0,
                srcY: 0,
                srcMemoryType: if to_device { host_type } else { device_type },
                srcHost: host,
                srcDevice: device,
                srcArray: null_mut(),
                srcPitch: if to_device { piece.width } else { piece.pitch },
                dstXInBytes: 0,
                dstY: 0,
                dstMemoryType: if to_device { device_type } else { host_type },
                dstHost: host,
                dstDevice: device,
                dstArray: null_mut(),
                dstPitch: if to_device { piece.pitch } else { piece.width },
                WidthInBytes: piece.width,
                Height: rows,
            };
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            unsafe { cu_call!(driver, cuMemcpy2DAsync_v2(&copy, stream)) }
        }
    };
    check(status)
}

/// The array side of `copy_piece`: the piece's place in the packed layout (`row`, `slice`
/// bytes) made an offset from `origin` in the array.
#[allow(clippy::too_many_arguments)]
fn copy_array_piece(
    driver: &rgpu_cuda_api::native::Driver,
    direction: Direction,
    array: CUarray,
    origin: [u64; 3],
    row: u64,
    slice: u64,
    piece: Piece,
    staging: &mut [u8],
    stream: CUstream,
) -> Result<(), Status> {
    let offset = piece.device_offset;
    let (z, within) = (offset / slice.max(1), offset % slice.max(1));
    let (y, x) = (within / row.max(1), within % row.max(1));
    let host = staging.as_mut_ptr().cast::<c_void>();
    let mut copy = Raw::<CUDA_MEMCPY3D>::zeroed();
    let p = copy.as_mut_ptr();
    let (array_x, array_y, array_z) = (
        (origin[0] + x) as usize,
        (origin[1] + y) as usize,
        (origin[2] + z) as usize,
    );
    // SAFETY: fields written through the pointer with valid values of their types.
    unsafe {
        match direction {
            Direction::ToDevice => {
                (*p).srcMemoryType = CUmemorytype::CU_MEMORYTYPE_HOST;
                (*p).srcHost = host;
                (*p).srcPitch = piece.width;
                (*p).srcHeight = piece.rows;
                (*p).dstMemoryType = CUmemorytype::CU_MEMORYTYPE_ARRAY;
                (*p).dstArray = array;
                (*p).dstXInBytes = array_x;
                (*p).dstY = array_y;
                (*p).dstZ = array_z;
            }
            Direction::FromDevice => {
                (*p).srcMemoryType = CUmemorytype::CU_MEMORYTYPE_ARRAY;
                (*p).srcArray = array;
                (*p).srcXInBytes = array_x;
                (*p).srcY = array_y;
                (*p).srcZ = array_z;
                (*p).dstMemoryType = CUmemorytype::CU_MEMORYTYPE_HOST;
                (*p).dstHost = host;
                (*p).dstPitch = piece.width;
                (*p).dstHeight = piece.rows;
            }
        }
        (*p).WidthInBytes = piece.width;
        (*p).Height = piece.rows;
        (*p).Depth = 1;
    }
    // SAFETY: a live array of this session and a local buffer; the driver checks the box.
    check(unsafe { cu_call!(driver, cuMemcpy3DAsync_v2(copy.as_ptr(), stream)) })
}
