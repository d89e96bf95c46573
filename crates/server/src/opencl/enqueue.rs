//! Queue commands. Transfers are split into chunks that pass through the staging pool:
//!
//! - a write receives chunk n from the socket and enqueues its device copy at once, so the
//!   receive of chunk n+1 overlaps the copy of chunk n; the chunk's buffer goes back to the
//!   pool when its copy completes;
//! - a read enqueues every chunk's device copy and hands it to the completion thread, which
//!   sends each chunk when it is complete and then the final status.
//!
//! - large plain buffer transfers to CPU devices bypass staging: see [`MAP_MIN`].
//!
//! Rectangular and image transfers are split by whole rows or slices, so every chunk is a
//! contiguous piece of the tightly packed host data.

use rgpu_cl_api::params::decode_unsigned;
use rgpu_cl_api::sys;
use rgpu_protocol::opencl::{serve, Answer, BufferRect, Command, Id, Transfer as WireTransfer};
use rgpu_protocol::ServerMsg;

use crate::opencl::completion::Job;
use crate::opencl::native::{host_size, ClResult, Event, InFlight, Mem, Queue, QueueDevice, Waker};
use crate::opencl::staging::{StagingBuf, Target};
use crate::session::{End, Session};

/// Plain buffer transfers at least this large on an in-order queue of a CPU device skip the
/// staging pool: the server maps the buffer range (which on a CPU device is the buffer's own
/// memory) and receives the data straight into it, or sends it straight from it. That saves
/// one memcpy per byte, which on a machine with few cores competes with the socket copies.
const MAP_MIN: usize = 256 << 10;

/// A contiguous piece of a transfer's packed host data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    /// Byte offset in the packed host data (and, for a plain buffer transfer, in the buffer
    /// from the transfer's offset).
    host_offset: usize,
    len: usize,
    /// First row and slice of the piece within the region.
    row: usize,
    slice: usize,
    rows: usize,
    slices: usize,
}

/// Pieces of at most `chunk` bytes of a linear range of `size` bytes.
fn linear_pieces(size: usize, chunk: usize) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut offset = 0;
    loop {
        let len = (size - offset).min(chunk);
        pieces.push(Piece {
            host_offset: offset,
            len,
            row: 0,
            slice: 0,
            rows: 1,
            slices: 1,
        });
        offset += len;
        if offset >= size {
            return pieces;
        }
    }
}

/// Pieces of whole slices (or whole rows of one slice, when a slice exceeds `chunk`) of a
/// region of `slices` slices of `rows` rows of `row_bytes` bytes, packed tightly. A piece
/// exceeds `chunk` only when a single row does.
fn row_pieces(row_bytes: usize, rows: usize, slices: usize, chunk: usize) -> ClResult<Vec<Piece>> {
    let slice_bytes = row_bytes.checked_mul(rows).ok_or(sys::CL_INVALID_VALUE)?;
    slice_bytes
        .checked_mul(slices)
        .ok_or(sys::CL_INVALID_VALUE)?;
    if slice_bytes == 0 || slices == 0 {
        // Nothing to move; one empty piece lets the implementation judge the arguments.
        return Ok(vec![Piece {
            host_offset: 0,
            len: 0,
            row: 0,
            slice: 0,
            rows,
            slices,
        }]);
    }
    let mut pieces = Vec::new();
    if slice_bytes <= chunk {
        let per_piece = chunk / slice_bytes;
        let mut slice = 0;
        while slice < slices {
            let count = per_piece.min(slices - slice);
            pieces.push(Piece {
                host_offset: slice * slice_bytes,
                len: count * slice_bytes,
                row: 0,
                slice,
                rows,
                slices: count,
            });
            slice += count;
        }
    } else {
        let per_piece = (chunk / row_bytes).max(1);
        for slice in 0..slices {
            let mut row = 0;
            while row < rows {
                let count = per_piece.min(rows - row);
                pieces.push(Piece {
                    host_offset: slice * slice_bytes + row * row_bytes,
                    len: count * row_bytes,
                    row,
                    slice,
                    rows: count,
                    slices: 1,
                });
                row += count;
            }
        }
    }
    Ok(pieces)
}

/// How to cut a transfer, once its size is known to be sane.
enum Pieces {
    Linear(usize),
    /// Row bytes, rows, slices.
    Rows(usize, usize, usize),
}

enum Geometry {
    Linear {
        offset: usize,
    },
    Rect {
        origin: [usize; 3],
        row_bytes: usize,
        pitches: [usize; 2],
    },
    Image {
        origin: [usize; 3],
        width: usize,
    },
}

/// A transfer between the packed host data and one mem object, ready to run piece by piece.
struct Transfer {
    queue: Queue,
    out_of_order: bool,
    mem: Mem,
    wait: Vec<Event>,
    geometry: Geometry,
    pieces: Vec<Piece>,
    total: u64,
    /// What the queue's device is, when the implementation says.
    device: Option<QueueDevice>,
}

impl Transfer {
    fn start(
        &self,
        read: bool,
        index: usize,
        buf: StagingBuf,
        waker: Option<Waker>,
    ) -> ClResult<InFlight<StagingBuf>> {
        let piece = self.pieces[index];
        // On an in-order queue the first piece's wait covers the rest.
        let wait: Vec<&Event> = if index == 0 || self.out_of_order {
            self.wait.iter().collect()
        } else {
            Vec::new()
        };
        match self.geometry {
            Geometry::Linear { offset } => {
                let at = offset
                    .checked_add(piece.host_offset)
                    .ok_or(sys::CL_INVALID_VALUE)?;
                if read {
                    self.queue
                        .read_buffer(&self.mem, at, buf, piece.len, &wait, waker)
                } else {
                    self.queue
                        .write_buffer(&self.mem, at, buf, piece.len, &wait, waker)
                }
            }
            Geometry::Rect {
                origin,
                row_bytes,
                pitches,
            } => self.queue.transfer_buffer_rect(
                read,
                &self.mem,
                [origin[0], origin[1] + piece.row, origin[2] + piece.slice],
                [row_bytes, piece.rows, piece.slices],
                pitches,
                buf,
                &wait,
                waker,
            ),
            Geometry::Image { origin, width } => self.queue.transfer_image(
                read,
                &self.mem,
                [origin[0], origin[1] + piece.row, origin[2] + piece.slice],
                [width, piece.rows, piece.slices],
                buf,
                &wait,
                waker,
            ),
        }
    }

    /// The event that stands for the whole transfer: the last piece's on an in-order queue,
    /// a marker after all of them on an out-of-order one.
    fn completion_event(&self, mut pieces: Vec<Event>) -> ClResult<Option<Event>> {
        if pieces.len() <= 1 || !self.out_of_order {
            return Ok(pieces.pop());
        }
        let all: Vec<&Event> = pieces.iter().collect();
        self.queue.marker(&all).map(Some)
    }
}

fn checked_origin(origin: [u64; 3]) -> ClResult<[usize; 3]> {
    Ok([
        host_size(origin[0])?,
        host_size(origin[1])?,
        host_size(origin[2])?,
    ])
}

impl serve::Commands for Session {
    fn enqueue(&mut self, queue: Id, wait: Vec<Id>, event: Id, command: Command) -> Answer<()> {
        self.enqueue_command(queue, &wait, event, command)
            .inspect_err(|&e| self.cl.fail_event(event, Some(queue), e))
    }

    fn enqueue_now(&mut self, queue: Id, wait: Vec<Id>, event: Id, command: Command) -> Answer<()> {
        self.enqueue(queue, wait, event, command)
    }

    fn enqueue_write(
        &mut self,
        queue: Id,
        wait: Vec<Id>,
        event: Id,
        transfer: WireTransfer,
        bulk_len: u64,
    ) -> Result<Answer<()>, End> {
        self.write_transfer(bulk_len, queue, &wait, event, &transfer)?;
        Ok(Ok(()))
    }

    fn enqueue_read(
        &mut self,
        seq: u64,
        queue: Id,
        wait: Vec<Id>,
        event: Id,
        transfer: WireTransfer,
    ) -> Result<(), End> {
        self.read_transfer(seq, queue, &wait, event, &transfer);
        Ok(())
    }
}

impl Session {
    /// Looks up what a transfer command needs and plans its pieces.
    fn plan_transfer(
        &self,
        queue: Id,
        wait: &[Id],
        event: Id,
        wanted: &WireTransfer,
    ) -> ClResult<Transfer> {
        if event != 0 {
            self.cl.handles.events.check_free(event)?;
        }
        let entry = self.cl.handles.queues.get(queue)?;
        let wait = self.wait_list(wait)?;
        let chunk = self.cl.pool.chunk_size();
        let (mem_id, geometry, pieces, total) = match *wanted {
            WireTransfer::Buffer {
                buffer,
                offset,
                size,
            } => {
                let size_host = host_size(size)?;
                let geometry = Geometry::Linear {
                    offset: host_size(offset)?,
                };
                (buffer, geometry, Pieces::Linear(size_host), size)
            }
            WireTransfer::BufferRect { buffer, rect } => {
                let (geometry, rows, total) = rect_plan(&rect)?;
                (buffer, geometry, rows, total)
            }
            WireTransfer::Image {
                image,
                origin,
                region,
            } => {
                let mem = &self.cl.handles.mems.get(image)?.mem;
                let element = mem.image_layout()?.element_size;
                let [width, rows, slices] = checked_origin(region)?;
                let row_bytes = width.checked_mul(element).ok_or(sys::CL_INVALID_VALUE)?;
                let total = row_bytes
                    .checked_mul(rows)
                    .and_then(|v| v.checked_mul(slices))
                    .ok_or(sys::CL_INVALID_VALUE)? as u64;
                let pieces = Pieces::Rows(row_bytes, rows, slices);
                let geometry = Geometry::Image {
                    origin: checked_origin(origin)?,
                    width,
                };
                (image, geometry, pieces, total)
            }
        };
        let mem = self.cl.handles.mems.get(mem_id)?.mem.clone();
        // Every byte of a valid transfer is a distinct byte of the object, so a larger one is
        // refused before any memory is planned or allocated for it.
        let mem_size = decode_unsigned(&mem.info(sys::CL_MEM_SIZE)?);
        if total > mem_size {
            return Err(sys::CL_INVALID_VALUE);
        }
        let pieces = match pieces {
            Pieces::Linear(size) => linear_pieces(size, chunk),
            Pieces::Rows(row_bytes, rows, slices) => row_pieces(row_bytes, rows, slices, chunk)?,
        };
        Ok(Transfer {
            device: entry.queue.device().ok(),
            queue: entry.queue.clone(),
            out_of_order: entry.out_of_order,
            mem,
            wait,
            geometry,
            pieces,
            total,
        })
    }

    /// A staging buffer of `len` bytes suited to the transfer's device.
    fn staging_for(&self, transfer: &Transfer, len: usize) -> Option<StagingBuf> {
        match transfer.device {
            Some(device) => self.cl.pool.take_for(
                len,
                &Target {
                    queue: &transfer.queue,
                    device,
                    may_block: !self.cl.device_may_wait_for_client(),
                },
            ),
            None => self.cl.pool.take(len),
        }
    }

    /// The buffer range a transfer may move through a mapping instead of staging (see
    /// [`MAP_MIN`]): its offset and length. Mapping waits on the request thread for the
    /// queue's earlier work, so only while nothing queued can wait for a later request.
    fn mappable(&self, transfer: &Transfer) -> Option<(usize, usize)> {
        let Geometry::Linear { offset } = transfer.geometry else {
            return None;
        };
        let len = usize::try_from(transfer.total).ok()?;
        let cpu = transfer.device.is_some_and(|d| d.cpu);
        (cpu && !transfer.out_of_order && len >= MAP_MIN && !self.cl.device_may_wait_for_client())
            .then_some((offset, len))
    }

    /// A write received straight into the mapped buffer range; false (nothing received) when
    /// the range cannot be mapped, for the staging path to take over.
    fn write_mapped(
        &mut self,
        transfer: &Transfer,
        queue: Id,
        event: Id,
        (offset, len): (usize, usize),
    ) -> Result<bool, End> {
        let wait: Vec<&Event> = transfer.wait.iter().collect();
        let Ok(mut mapping) = transfer
            .queue
            .map_buffer(&transfer.mem, true, offset, len, &wait)
        else {
            return Ok(false);
        };
        // On failure the mapping is undone as it drops.
        self.take_bulk(mapping.as_mut_slice())?;
        match mapping.unmap() {
            Ok(native) => {
                let _ = transfer.queue.flush();
                if event != 0 {
                    if let Err(e) = self.cl.keep_command_event(event, native) {
                        self.defer("write", e);
                    }
                }
            }
            Err(e) => {
                self.defer("write", e);
                self.cl.fail_event(event, Some(queue), e);
            }
        }
        Ok(true)
    }

    /// A read sent straight from the mapped buffer range, answered here; false (nothing sent)
    /// when the range cannot be mapped.
    fn read_mapped(
        &mut self,
        seq: u64,
        transfer: &Transfer,
        queue: Id,
        event: Id,
        (offset, len): (usize, usize),
    ) -> bool {
        let wait: Vec<&Event> = transfer.wait.iter().collect();
        let Ok(mapping) = transfer
            .queue
            .map_buffer(&transfer.mem, false, offset, len, &wait)
        else {
            return false;
        };
        let data = mapping.as_slice();
        for piece in linear_pieces(len, self.cl.pool.chunk_size()) {
            let chunk = &data[piece.host_offset..piece.host_offset + piece.len];
            let at = ServerMsg::Data {
                offset: piece.host_offset as u64,
            };
            if self.send(&at, seq, chunk).is_err() {
                // The connection is gone; the request loop ends at its next read.
                break;
            }
        }
        let status = match mapping.unmap() {
            Ok(native) => {
                let _ = transfer.queue.flush();
                if event != 0 {
                    let _ = self.cl.handles.events.insert(event, native);
                }
                self.cl.take_deferred().unwrap_or(sys::CL_SUCCESS)
            }
            Err(e) => {
                self.cl.fail_event(event, Some(queue), e);
                e
            }
        };
        let _ = self.send(&ServerMsg::ReadDone { status }, seq, &[]);
        true
    }

    /// A write: its data is the frame's bulk, received chunk by chunk. Its failures are
    /// deferred here.
    fn write_transfer(
        &mut self,
        bulk_len: u64,
        queue: Id,
        wait: &[Id],
        event: Id,
        wanted: &WireTransfer,
    ) -> Result<(), End> {
        let transfer = self
            .plan_transfer(queue, wait, event, wanted)
            .and_then(|t| {
                if t.total == bulk_len {
                    Ok(t)
                } else {
                    Err(sys::CL_INVALID_VALUE)
                }
            });
        let transfer = match transfer {
            Ok(transfer) => transfer,
            Err(e) => {
                // The data must still be taken off the connection.
                self.drop_bulk()?;
                self.defer("write", e);
                self.cl.fail_event(event, Some(queue), e);
                return Ok(());
            }
        };
        if let Some(range) = self.mappable(&transfer) {
            if self.write_mapped(&transfer, queue, event, range)? {
                return Ok(());
            }
        }
        let mut status = Ok(());
        let mut events = Vec::new();
        for index in 0..transfer.pieces.len() {
            let len = transfer.pieces[index].len;
            let Some(mut buf) = self.staging_for(&transfer, len).filter(|_| status.is_ok()) else {
                self.skip_bulk(len as u64)?;
                status = status.and(Err(sys::CL_OUT_OF_HOST_MEMORY));
                continue;
            };
            self.take_bulk(&mut buf.as_mut_slice()[..len])?;
            match transfer.start(false, index, buf, None) {
                Ok(in_flight) => {
                    if event != 0 {
                        events.push(in_flight.event().clone());
                    }
                    // Dropping it hands the buffer back to the pool once the copy completes.
                    drop(in_flight);
                    // Submit now, so the copy overlaps the next receive and the buffer returns.
                    let _ = transfer.queue.flush();
                }
                Err(e) => status = Err(e),
            }
        }
        let bound = status.and_then(|()| transfer.completion_event(events));
        match bound {
            Ok(Some(native)) if event != 0 => {
                if let Err(e) = self.cl.keep_command_event(event, native) {
                    self.defer("write", e);
                }
            }
            Ok(_) => {}
            Err(e) => {
                self.defer("write", e);
                self.cl.fail_event(event, Some(queue), e);
            }
        }
        Ok(())
    }

    /// A read: chunks go to the completion thread, which sends them and the final status.
    fn read_transfer(
        &mut self,
        seq: u64,
        queue: Id,
        wait: &[Id],
        event: Id,
        wanted: &WireTransfer,
    ) {
        let transfer = match self.plan_transfer(queue, wait, event, wanted) {
            Ok(transfer) => transfer,
            Err(e) => {
                self.cl.completion().send(Job::ReadEnd { seq, status: e });
                self.cl.fail_event(event, Some(queue), e);
                return;
            }
        };
        if let Some(range) = self.mappable(&transfer) {
            if self.read_mapped(seq, &transfer, queue, event, range) {
                return;
            }
        }
        if transfer.pieces.len() == 1 && !self.cl.device_may_wait_for_client() {
            return self.read_now(seq, queue, event, transfer);
        }
        let mut status = Ok(());
        let mut events = Vec::new();
        for index in 0..transfer.pieces.len() {
            let piece = transfer.pieces[index];
            let Some(buf) = self.staging_for(&transfer, piece.len) else {
                status = Err(sys::CL_OUT_OF_HOST_MEMORY);
                break;
            };
            match transfer.start(true, index, buf, Some(self.cl.waker.clone())) {
                Ok(in_flight) => {
                    let _ = transfer.queue.flush();
                    if event != 0 && (transfer.out_of_order || index + 1 == transfer.pieces.len()) {
                        events.push(in_flight.event().clone());
                    }
                    self.cl.completion().send(Job::ReadChunk {
                        seq,
                        offset: piece.host_offset as u64,
                        len: piece.len,
                        transfer: in_flight,
                    });
                }
                Err(e) => {
                    status = Err(e);
                    break;
                }
            }
        }
        let bound = status.and_then(|()| transfer.completion_event(events));
        let final_status = match &bound {
            Ok(_) => self.cl.take_deferred().unwrap_or(sys::CL_SUCCESS),
            Err(e) => *e,
        };
        self.cl.completion().send(Job::ReadEnd {
            seq,
            status: final_status,
        });
        match bound {
            Ok(Some(native)) if event != 0 => {
                let _ = self.cl.handles.events.insert(event, native);
            }
            Ok(_) => {}
            Err(e) => self.cl.fail_event(event, Some(queue), e),
        }
    }

    /// A read of one piece when nothing can wait for the client: done and answered on the
    /// request thread, without the hand-over to the completion thread (small synchronous reads
    /// are latency-bound).
    fn read_now(&mut self, seq: u64, queue: Id, event: Id, transfer: Transfer) {
        let piece = transfer.pieces[0];
        let outcome = match self.staging_for(&transfer, piece.len) {
            None => Err(sys::CL_OUT_OF_HOST_MEMORY),
            Some(buf) => transfer.start(true, 0, buf, None).and_then(|in_flight| {
                let _ = transfer.queue.flush();
                in_flight.event().wait_fast();
                let bound = transfer.completion_event(if event != 0 {
                    vec![in_flight.event().clone()]
                } else {
                    Vec::new()
                })?;
                Ok((in_flight, bound))
            }),
        };
        let (status, buf) = match outcome {
            Ok((in_flight, bound)) => {
                let (status, buf) = in_flight
                    .take_if_complete()
                    .unwrap_or((sys::CL_OUT_OF_RESOURCES, None));
                if let (Some(native), true) = (bound, event != 0) {
                    let _ = self.cl.handles.events.insert(event, native);
                }
                if status < 0 {
                    (status, None)
                } else {
                    (self.cl.take_deferred().unwrap_or(sys::CL_SUCCESS), buf)
                }
            }
            Err(e) => {
                self.cl.fail_event(event, Some(queue), e);
                (e, None)
            }
        };
        let data = buf
            .as_ref()
            .map(|buf| (0, &buf.as_slice()[..piece.len.min(buf.capacity())]));
        let last = ServerMsg::ReadDone { status };
        let _ = self.writer.send_read(seq, data, &last);
    }

    /// Every command other than reads and writes: one native call.
    fn enqueue_command(
        &mut self,
        queue: Id,
        wait: &[Id],
        event: Id,
        command: Command,
    ) -> ClResult<()> {
        if event != 0 {
            self.cl.handles.events.check_free(event)?;
        }
        if let Command::NdRange { kernel, args, .. } = &command {
            // Arguments are set before the launch takes its copy of them.
            self.apply_kernel_args(*kernel, args)?;
        }
        let h = &self.cl.handles;
        let q = &h.queues.get(queue)?.queue;
        let wait_events = self.wait_list(wait)?;
        let wait: Vec<&Event> = wait_events.iter().collect();
        let mem = |id: Id| h.mems.get(id).map(|m| &m.mem);
        let native = match command {
            Command::CopyBuffer {
                src,
                dst,
                src_offset,
                dst_offset,
                size,
            } => q.copy_buffer(mem(src)?, mem(dst)?, [src_offset, dst_offset, size], &wait)?,
            Command::CopyBufferRect {
                src,
                dst,
                src_origin,
                dst_origin,
                region,
                src_row_pitch,
                src_slice_pitch,
                dst_row_pitch,
                dst_slice_pitch,
            } => q.copy_buffer_rect(
                mem(src)?,
                mem(dst)?,
                src_origin,
                dst_origin,
                region,
                [
                    src_row_pitch,
                    src_slice_pitch,
                    dst_row_pitch,
                    dst_slice_pitch,
                ],
                &wait,
            )?,
            Command::FillBuffer {
                buffer,
                pattern,
                offset,
                size,
            } => q.fill_buffer(mem(buffer)?, &pattern, offset, size, &wait)?,
            Command::CopyImage {
                src,
                dst,
                src_origin,
                dst_origin,
                region,
            } => q.copy_image(mem(src)?, mem(dst)?, src_origin, dst_origin, region, &wait)?,
            Command::FillImage {
                image,
                color,
                origin,
                region,
            } => q.fill_image(mem(image)?, &color, origin, region, &wait)?,
            Command::CopyImageToBuffer {
                src,
                dst,
                src_origin,
                region,
                dst_offset,
            } => {
                q.copy_image_to_buffer(mem(src)?, mem(dst)?, src_origin, region, dst_offset, &wait)?
            }
            Command::CopyBufferToImage {
                src,
                dst,
                src_offset,
                dst_origin,
                region,
            } => {
                q.copy_buffer_to_image(mem(src)?, mem(dst)?, src_offset, dst_origin, region, &wait)?
            }
            Command::NdRange {
                kernel,
                work_dim,
                offset,
                global,
                local,
                ..
            } => q.nd_range(
                &h.kernels.get(kernel)?.kernel,
                work_dim,
                offset.as_deref(),
                &global,
                local.as_deref(),
                &wait,
            )?,
            Command::MarkerWithWaitList => q.marker(&wait)?,
            Command::BarrierWithWaitList => q.barrier(&wait)?,
            Command::MigrateMemObjects { objects, flags } => {
                let objects: Vec<&Mem> =
                    objects.iter().map(|&id| mem(id)).collect::<ClResult<_>>()?;
                q.migrate(&objects, flags, &wait)?
            }
            Command::SyncHostMemory {
                buffer,
                offset,
                size,
                to_device,
            } => {
                let (offset, size) = (host_size(offset)?, host_size(size)?);
                q.sync_host_memory(mem(buffer)?, offset, size, to_device, &wait)?
            }
        };
        if event != 0 {
            self.cl.keep_command_event(event, native)?;
        }
        Ok(())
    }
}

/// The geometry, row layout and packed size of a rectangular buffer transfer. Zero pitches
/// are resolved first (OpenCL derives them from the whole region, not from a piece).
fn rect_plan(rect: &BufferRect) -> ClResult<(Geometry, Pieces, u64)> {
    let [row_bytes, rows, slices] = checked_origin(rect.region)?;
    let row_pitch = match host_size(rect.buffer_row_pitch)? {
        0 => row_bytes,
        pitch => pitch,
    };
    let slice_pitch = match host_size(rect.buffer_slice_pitch)? {
        0 => row_pitch.checked_mul(rows).ok_or(sys::CL_INVALID_VALUE)?,
        pitch => pitch,
    };
    let total = row_bytes
        .checked_mul(rows)
        .and_then(|v| v.checked_mul(slices))
        .ok_or(sys::CL_INVALID_VALUE)? as u64;
    let geometry = Geometry::Rect {
        origin: checked_origin(rect.buffer_origin)?,
        row_bytes,
        pitches: [row_pitch, slice_pitch],
    };
    Ok((geometry, Pieces::Rows(row_bytes, rows, slices), total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covers(pieces: &[Piece], total: usize) {
        let mut next = 0;
        for piece in pieces {
            assert_eq!(piece.host_offset, next, "{pieces:?}");
            next += piece.len;
        }
        assert_eq!(next, total);
    }

    #[test]
    fn linear_pieces_cover_the_range() {
        covers(&linear_pieces(10, 4), 10);
        assert_eq!(linear_pieces(10, 4).len(), 3);
        assert_eq!(linear_pieces(8, 4).len(), 2);
        assert_eq!(linear_pieces(0, 4).len(), 1);
    }

    #[test]
    fn row_pieces_are_whole_slices_or_rows() {
        // 3 slices of 2 rows of 10 bytes, chunk 45: two slices (40 bytes) per piece.
        let pieces = row_pieces(10, 2, 3, 45).unwrap();
        covers(&pieces, 60);
        assert_eq!(pieces.len(), 2);
        assert_eq!(
            (pieces[1].slice, pieces[1].slices, pieces[1].rows),
            (2, 1, 2)
        );
        // A slice larger than a chunk: rows of one slice per piece.
        let pieces = row_pieces(10, 5, 2, 25).unwrap();
        covers(&pieces, 100);
        assert!(pieces.iter().all(|p| p.slices == 1 && p.rows <= 2));
        assert_eq!((pieces[3].slice, pieces[3].row), (1, 0));
        // A row larger than a chunk is one piece.
        let pieces = row_pieces(100, 2, 1, 30).unwrap();
        covers(&pieces, 200);
        assert_eq!(pieces.len(), 2);
        // Empty regions still make one (empty) piece.
        assert_eq!(row_pieces(0, 2, 2, 30).unwrap().len(), 1);
        assert!(row_pieces(usize::MAX, 2, 1, 30).is_err());
    }
}
