//! Copies in every form: host↔device and device↔device, 1D, 2D and 3D, synchronous and
//! ordered on a stream, unified (`cuMemcpy`) and peer.
//!
//! Every copy becomes one [`Transfer`]: an [`Extent`] of rows and, for each side, where its first
//! byte is, how its rows lie ([`Pitch`]) and whose memory it is. Rows travel packed: the rows of
//! a host side that are not contiguous are packed here before a write and unpacked after a
//! read; a device side's pitch goes to its server, which copies between its staging buffers and
//! the device rows. Devices of one server copy between themselves on that server; a copy
//! between devices of different servers is relayed through this process.
//!
//! Copies to the device are posted: they leave with the next flush, in stream order, and report
//! failures at the next synchronizing call. A copy to the host waits for its data, except an
//! async copy into page-locked memory, whose data the reader thread writes when it arrives (any
//! later synchronizing reply comes after it on the same socket).

use std::ffi::c_void;
use std::sync::Arc;

use rgpu_client::{CudaClient, Handoff, ReadSink, SendPtr};
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{DevicePtr, ExportKeep, Extent, Id, Pitch, Place};

use super::graph_host_work::{note_captured, stage, Direction, HostCopy, Work};
use super::memory::{allocation_context, is_device_memory, is_page_locked, note_async_read_error};
use super::stream::synchronize_stream;
use super::Outcome;
use super::{from_remote, status};
use crate::objects::{capture_of, current_context, resolve_stream, Array, Context};
use crate::results::client_error;

/// Bytes per step of a copy relayed between devices of different servers.
const RELAY_CHUNK: u64 = 8 << 20;
/// Synchronous copies between servers up to this size are relayed through this process (one
/// round trip to each server) rather than moved by the fabric (several hops between the
/// servers): measured faster on one machine's loopback, where the fabric's 8-byte copy took
/// 165-200 us (docs/benchmarks.md).
const SMALL_SYNC_RELAY_MAX: u64 = 64 << 10;

/// `CUmemorytype` values, read as integers: a descriptor may hold values the enum lacks.
const MEMORY_HOST: u32 = 1;
const MEMORY_DEVICE: u32 = 2;
const MEMORY_ARRAY: u32 = 3;
const MEMORY_UNIFIED: u32 = 4;

#[derive(Clone)]
enum Memory {
    Host,
    /// Device memory, with the context that owns it.
    Device(Arc<Context>),
    /// A CUDA array, from an origin (x in bytes, row, slice).
    Array(Arc<Array>, [u64; 3]),
}

/// One side of a copy: its first byte, how its rows lie, and whose memory it is.
#[derive(Clone)]
struct Side {
    start: u64,
    pitch: Pitch,
    memory: Memory,
}

impl Side {
    fn host(start: usize, pitch: Pitch) -> Side {
        Side {
            start: start as u64,
            pitch,
            memory: Memory::Host,
        }
    }

    /// Device memory at `start`, owned by `ctx` (null: the context of the allocation holding
    /// `start`, else the current one).
    fn device(start: u64, pitch: Pitch, ctx: CUcontext) -> Result<Side, CUresult> {
        let owner = if ctx.is_null() {
            match allocation_context(start)? {
                Some(owner) => owner,
                // Unified addressing: the driver takes page-locked host memory wherever it
                // takes device memory (XLA's host memory space is such memory, copied as
                // "device").
                None if is_page_locked(start as *mut c_void, 1) => {
                    return Ok(Side::host(start as usize, pitch))
                }
                None => {
                    log::debug!("copy: {start:#x} is in no allocation known here");
                    current_context()?
                }
            }
        } else {
            let owner = Context::from_handle(ctx).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
            owner.ensure_created()?;
            owner
        };
        Ok(Side {
            start,
            pitch,
            memory: Memory::Device(owner),
        })
    }

    /// Device memory if `start` is in a device allocation, else host memory (unified
    /// addressing, as `cuMemcpy` and CU_MEMORYTYPE_UNIFIED use it).
    fn unified(start: u64, pitch: Pitch) -> Result<Side, CUresult> {
        if is_device_memory(start) {
            Side::device(start, pitch, std::ptr::null_mut())
        } else {
            Ok(Side::host(start as usize, pitch))
        }
    }
}

/// `side` as device memory when it is host memory inside a managed allocation.
fn device_if_managed(side: Side) -> Result<Side, CUresult> {
    match side.memory {
        Memory::Host if super::managed::is_managed(side.start) => {
            Side::device(side.start, side.pitch, std::ptr::null_mut())
        }
        _ => Ok(side),
    }
}

/// A copy of `extent`'s rows from `src` to `dst`.
struct Transfer {
    src: Side,
    dst: Side,
    extent: Extent,
}

/// Carries out a copy: on `stream` when given (asynchronous), else synchronously.
fn transfer(copy: Transfer, stream: Option<CUstream>) -> Result<(), CUresult> {
    let touched = [copy.src.start, copy.dst.start];
    queue_transfer(copy, stream)?;
    match stream {
        None => super::memory::finish_sync_memops(&touched),
        Some(_) => Ok(()),
    }
}

fn queue_transfer(copy: Transfer, stream: Option<CUstream>) -> Result<(), CUresult> {
    let Transfer { src, dst, extent } = copy;
    // A "host" side in managed memory is the device's memory (its host view is a copy).
    let (src, dst) = (device_if_managed(src)?, device_if_managed(dst)?);
    let host_only = matches!((&src.memory, &dst.memory), (Memory::Host, Memory::Host));
    if !host_only {
        super::managed::before_device_work(stream);
    }
    match extent.bytes() {
        None => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        Some(0) => return Ok(()),
        Some(_) => {}
    }
    // An array's rows are the driver's to lay out (it checks the box against the array).
    let fits = |side: &Side| matches!(side.memory, Memory::Array(..)) || extent.fits(side.pitch);
    if !fits(&src) || !fits(&dst) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let touches_host = matches!(src.memory, Memory::Host) || matches!(dst.memory, Memory::Host);
    if let Some(stream) = stream.filter(|&s| touches_host && capture_of(s) != 0) {
        return captured_host_copy(src, dst, extent, stream);
    }
    let queue = stream.map(resolve_stream).transpose()?;
    match (&src.memory, &dst.memory) {
        (Memory::Host, Memory::Device(owner)) => {
            let (ctx, stream_id) = queue_on(owner, queue)?;
            let data = packed_rows(&src, extent);
            // An asynchronous copy from page-locked memory may be read in place.
            let in_place = stream.is_some()
                && matches!(data, std::borrow::Cow::Borrowed(_))
                && is_page_locked(src.start as *mut c_void, data.len());
            write_device_from(
                &ctx, stream_id, dst.start, extent, dst.pitch, &data, in_place,
            )
        }
        (Memory::Device(owner), Memory::Host) => {
            let (ctx, stream_id) = queue_on(owner, queue)?;
            let span = extent.span(dst.pitch).unwrap_or(0) as usize;
            let wait = stream.is_none() || !is_page_locked(dst.start as *mut c_void, span);
            read_rows(&dst, extent, wait, |into, wait| {
                read_device(&ctx, stream_id, into, src.start, extent, src.pitch, wait)
            })
        }
        (Memory::Host, Memory::Array(array, origin)) => {
            let (ctx, stream) = queue_on(&array.ctx, queue)?;
            let data = packed_rows(&src, extent);
            let server = ctx.conn.cuda();
            server
                .memcpy_htoa(ctx.remote, stream, array.remote, *origin, extent, &data)
                .outcome()
        }
        (Memory::Array(array, origin), Memory::Host) => {
            let (ctx, stream_id) = queue_on(&array.ctx, queue)?;
            let span = extent.span(dst.pitch).unwrap_or(0) as usize;
            let wait = stream.is_none() || !is_page_locked(dst.start as *mut c_void, span);
            read_rows(&dst, extent, wait, |into, wait| {
                let len = extent.bytes().unwrap_or(0) as usize;
                let server = ctx.conn.cuda();
                read_into(into, len, wait, |sink| {
                    server
                        .memcpy_atoh(ctx.remote, stream_id, array.remote, *origin, extent, sink)
                        .outcome()
                })
            })
        }
        (Memory::Array(..), _) | (_, Memory::Array(..)) => {
            let (owner, from, to) = (array_or_device_owner(&dst)?, place(&src)?, place(&dst)?);
            if !Arc::ptr_eq(&array_or_device_owner(&src)?.conn, &owner.conn) {
                return Err(crate::unsupported::not_supported(
                    "copies between arrays and memory of different servers",
                ));
            }
            let (ctx, stream) = queue_on(&owner, queue)?;
            ctx.conn
                .cuda()
                .memcpy_array(ctx.remote, stream, from, to, extent)
                .outcome()
        }
        (Memory::Device(from), Memory::Device(to)) if Arc::ptr_eq(&from.conn, &to.conn) => {
            let (ctx, stream) = queue_on(to, queue)?;
            // Memory of another device of the server: the server copies between peers.
            let src_ctx = if from.device != ctx.device {
                from.remote
            } else {
                0
            };
            let server = ctx.conn.cuda();
            server
                .memcpy_dtod(
                    ctx.remote, stream, dst.start, dst.pitch, src.start, src.pitch, src_ctx, extent,
                )
                .outcome()
        }
        (Memory::Device(from), Memory::Device(to)) => {
            let size = extent.bytes().unwrap_or(0);
            let contiguous = extent.is_contiguous(src.pitch) && extent.is_contiguous(dst.pitch);
            // A small synchronous copy costs less through this process (a read and a posted
            // write) than the fabric's export, pull and wait between the servers.
            if contiguous && (queue.is_some() || size > SMALL_SYNC_RELAY_MAX) {
                between_servers(from, src.start, to, dst.start, size, queue)
            } else {
                relay(from, src.clone(), to, dst.clone(), extent, queue)
            }
        }
        (Memory::Host, Memory::Host) => {
            // The driver copies host to host itself; so do we, after the stream's earlier work.
            if let Some((ctx, stream)) = queue {
                synchronize_stream(&ctx, stream)?;
            }
            let rows = extent
                .row_offsets(src.pitch)
                .zip(extent.row_offsets(dst.pitch));
            for (from, to) in rows {
                // SAFETY: the API contract: both sides hold the extent's rows.
                unsafe {
                    std::ptr::copy(
                        (src.start + from) as *const u8,
                        (dst.start + to) as *mut u8,
                        extent.width as usize,
                    )
                };
            }
            Ok(())
        }
    }
}

/// The context and stream that order a copy touching `owner`'s memory: the program's stream
/// when it is on `owner`'s server; when it is on another server, its earlier work is waited
/// for and the copy goes on `owner`'s default stream; without one, `owner`'s default stream.
fn queue_on(
    owner: &Arc<Context>,
    queue: Option<(Arc<Context>, Id)>,
) -> Result<(Arc<Context>, Id), CUresult> {
    match queue {
        None => Ok((owner.clone(), 0)),
        Some((ctx, stream)) if Arc::ptr_eq(&ctx.conn, &owner.conn) => Ok((ctx, stream)),
        Some((ctx, stream)) => {
            synchronize_stream(&ctx, stream)?;
            Ok((owner.clone(), 0))
        }
    }
}

/// The shape a device side is sent with: one linear run when its rows are contiguous.
fn device_shape(extent: Extent, pitch: Pitch) -> (Extent, Pitch) {
    if extent.is_contiguous(pitch) {
        let linear = Extent::linear(extent.bytes().unwrap_or(0));
        (linear, linear.packed())
    } else {
        (extent, pitch)
    }
}

/// `src`'s rows (host memory), packed: borrowed when they already are.
fn packed_rows(src: &Side, extent: Extent) -> std::borrow::Cow<'static, [u8]> {
    let bytes = extent.bytes().unwrap_or(0) as usize;
    if extent.is_contiguous(src.pitch) {
        // SAFETY: the API contract: the source holds the extent's rows, here one run, for the
        // duration of the copy call.
        return std::borrow::Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(src.start as *const u8, bytes)
        });
    }
    let mut rows = Vec::with_capacity(bytes);
    for offset in extent.row_offsets(src.pitch) {
        // SAFETY: as above, row by row.
        rows.extend_from_slice(unsafe {
            std::slice::from_raw_parts((src.start + offset) as *const u8, extent.width as usize)
        });
    }
    std::borrow::Cow::Owned(rows)
}

/// The context that owns a device or array side.
fn array_or_device_owner(side: &Side) -> Result<Arc<Context>, CUresult> {
    match &side.memory {
        Memory::Device(owner) => Ok(owner.clone()),
        Memory::Array(array, _) => Ok(array.ctx.clone()),
        Memory::Host => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// A device or array side as the server names it.
fn place(side: &Side) -> Result<Place, CUresult> {
    match &side.memory {
        Memory::Device(_) => Ok(Place::Device {
            ptr: side.start,
            pitch: side.pitch,
        }),
        Memory::Array(array, origin) => Ok(Place::Array {
            id: array.remote,
            origin: *origin,
        }),
        Memory::Host => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

fn write_device(
    ctx: &Context,
    stream: Id,
    dst: DevicePtr,
    extent: Extent,
    pitch: Pitch,
    data: &[u8],
) -> Result<(), CUresult> {
    write_device_from(ctx, stream, dst, extent, pitch, data, false)
}

/// [`write_device`]; `in_place`: `data` is page-locked memory the program leaves alone until
/// it synchronizes (an asynchronous copy), which the server reads in place where it is shared
/// with it.
fn write_device_from(
    ctx: &Context,
    stream: Id,
    dst: DevicePtr,
    extent: Extent,
    pitch: Pitch,
    data: &[u8],
    in_place: bool,
) -> Result<(), CUresult> {
    let (extent, pitch) = device_shape(extent, pitch);
    // Large data leaves through the shared ring or striped over the connection's data lanes.
    if in_place {
        let server = ctx.conn.cuda_in_place();
        return server
            .memcpy_htod(ctx.remote, stream, dst, extent, pitch, data)
            .outcome();
    }
    let server = ctx.conn.cuda();
    server
        .memcpy_htod(ctx.remote, stream, dst, extent, pitch, data)
        .outcome()
}

/// Reads rows into the host rows of `dst` with `fetch` (which reads them packed into the
/// pointer it is given, waiting when told); waits unless `wait` is false (then `dst`'s rows
/// must be one contiguous run).
fn read_rows(
    dst: &Side,
    extent: Extent,
    wait: bool,
    fetch: impl FnOnce(*mut u8, bool) -> Result<(), CUresult>,
) -> Result<(), CUresult> {
    if extent.is_contiguous(dst.pitch) {
        return fetch(dst.start as *mut u8, wait);
    }
    let mut packed = vec![0u8; extent.bytes().unwrap_or(0) as usize];
    fetch(packed.as_mut_ptr(), true)?;
    let width = extent.width as usize;
    for (row, offset) in packed
        .chunks_exact(width)
        .zip(extent.row_offsets(dst.pitch))
    {
        // SAFETY: the API contract: the destination holds the extent's rows.
        unsafe {
            std::ptr::copy_nonoverlapping(row.as_ptr(), (dst.start + offset) as *mut u8, width)
        };
    }
    Ok(())
}

/// Reads `extent`'s rows at device address `src` (lying `pitch` apart) into `into`, packed;
/// waits unless `wait` is false.
fn read_device(
    ctx: &Context,
    stream: Id,
    into: *mut u8,
    src: DevicePtr,
    extent: Extent,
    pitch: Pitch,
    wait: bool,
) -> Result<(), CUresult> {
    let len = extent.bytes().unwrap_or(0) as usize;
    let (extent, pitch) = device_shape(extent, pitch);
    read_into(into, len, wait, |sink| {
        // A read nobody waits for goes into page-locked memory (see `queue_transfer`): where
        // that memory is shared with the server, the device writes it in place.
        if wait {
            ctx.conn
                .cuda()
                .memcpy_dtoh(ctx.remote, stream, src, extent, pitch, sink)
        } else {
            let server = ctx.conn.cuda_in_place();
            server.memcpy_dtoh(ctx.remote, stream, src, extent, pitch, sink)
        }
        .outcome()
    })
}

/// Writes `bytes` to device memory at `dst` on `ctx`'s default stream (posted).
pub(crate) fn write_linear(ctx: &Context, dst: DevicePtr, bytes: &[u8]) -> Result<(), CUresult> {
    let (extent, pitch) = linear(bytes.len());
    write_device(ctx, 0, dst, extent, pitch, bytes)
}

/// Reads `len` bytes of device memory at `src` into `into` on `ctx`'s default stream, waiting
/// for them.
pub(crate) fn read_linear(
    ctx: &Context,
    src: DevicePtr,
    into: *mut u8,
    len: usize,
) -> Result<(), CUresult> {
    let (extent, pitch) = linear(len);
    read_device(ctx, 0, into, src, extent, pitch, true)
}

/// Issues a read of `len` bytes into `into` (`issue` sends the request with the sink);
/// waits for it unless `wait` is false (a failure then surfaces at the next synchronization).
fn read_into(
    into: *mut u8,
    len: usize,
    wait: bool,
    issue: impl FnOnce(ReadSink) -> Result<(), CUresult>,
) -> Result<(), CUresult> {
    if into.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let done = wait.then(|| Arc::new(Handoff::<Result<i32, rgpu_client::ClientError>>::default()));
    let signal = done.clone();
    let sink = ReadSink {
        dst: SendPtr(into),
        len,
        done: Box::new(move |result| match signal {
            Some(signal) => signal.fill(result),
            None => note_async_read_error(match result {
                Ok(status) => status as u32,
                Err(_) => CUresult::CUDA_ERROR_DEVICE_UNAVAILABLE as u32,
            }),
        }),
    };
    issue(sink)?;
    let Some(done) = done else {
        return Ok(());
    };
    match done.wait(rgpu_client::reply_timeout_from_env()) {
        Some(Ok(status)) => from_remote(status as u32),
        Some(Err(e)) => Err(client_error(e)),
        None => Err(CUresult::CUDA_ERROR_LAUNCH_TIMEOUT),
    }
}

/// A copy of `size` bytes between devices of different servers, server to server over the
/// fabric (crates/server/src/fabric.rs): the source's server exports the range under a ticket
/// chosen here, the destination's pulls it (or, on one machine, copies device to device through
/// the allocation's IPC handle). Both requests are posted; nothing here waits for the network
/// unless the copy is synchronous.
///
/// Order: on a stream of the source's server, the export is ready after the stream's earlier
/// work and the stream goes on once the bytes are on the destination device (as a native
/// copy's stream would); on a stream of the destination's server, the pull takes its place in
/// that stream. The other side uses its context's default stream. A synchronous copy (or one
/// ordered on a third server's stream, waited for first) returns once the bytes are in place.
fn between_servers(
    from: &Arc<Context>,
    src: u64,
    to: &Arc<Context>,
    dst: u64,
    size: u64,
    queue: Option<(Arc<Context>, Id)>,
) -> Result<(), CUresult> {
    let ipc = super::fabric_ipc() && from.conn.endpoint().same_machine(&to.conn.endpoint());
    if let Some((ctx, stream)) = &queue {
        let pushable = ipc && size > 0 && super::fabric_push();
        // Into memory that has an IPC handle to share (a push into pool memory would be
        // pulled by the destination after all, later than the request's place in its order).
        if pushable
            && Arc::ptr_eq(&ctx.conn, &from.conn)
            && super::memory::is_plain_allocation(dst, size)
        {
            return push_between_servers(ctx, *stream, src, to, dst, size);
        }
    }
    // The stream that orders the copy: on the source's server, the export keeps later work
    // there from changing the bytes until they are on the destination device (held for an IPC
    // copy, else read by the stream itself as they go), and the destination pulls on a stream
    // of its own; on the destination's server, the pull takes its place in that stream.
    let (export_on, keep, pull_on, wait) = match queue {
        Some((ctx, stream)) if Arc::ptr_eq(&ctx.conn, &from.conn) => {
            let keep = if ipc {
                ExportKeep::Hold
            } else {
                ExportKeep::Staged
            };
            ((ctx, stream), keep, (to.clone(), None), false)
        }
        Some((ctx, stream)) if Arc::ptr_eq(&ctx.conn, &to.conn) => {
            let pull_on = (ctx, Some(stream));
            ((from.clone(), 0), ExportKeep::Unguarded, pull_on, false)
        }
        Some((ctx, stream)) => {
            synchronize_stream(&ctx, stream)?;
            let pull_on = (to.clone(), Some(0));
            ((from.clone(), 0), ExportKeep::Unguarded, pull_on, true)
        }
        None => (
            (from.clone(), 0),
            ExportKeep::Unguarded,
            (to.clone(), Some(0)),
            true,
        ),
    };
    let ticket = rgpu_client::new_ticket();
    let (ectx, estream) = export_on;
    ectx.conn
        .cuda()
        .export_range(ectx.remote, estream, src, size, ticket, keep)
        .outcome()?;
    let export = rgpu_protocol::PeerExport {
        endpoint: ectx.conn.endpoint().to_string(),
        session: ectx.conn.session_id(),
        ticket,
    };
    let (pctx, pstream) = pull_on;
    pctx.conn
        .cuda()
        .pull_range(pctx.remote, pstream, dst, size, export, ipc)
        .outcome()?;
    if wait {
        synchronize_stream(&pctx, 0)?;
    }
    Ok(())
}

/// A copy between servers of one machine ordered on a stream of the source's (`ctx`, `stream`):
/// the source's server copies into the destination's allocation through its IPC handle, in the
/// stream's order, as a native peer copy does (no round trip between the servers per copy, the
/// stream going straight on to its next work). The destination's server lands it (`LandRange`)
/// and, should the push not be possible, pulls instead. Both requests are posted.
fn push_between_servers(
    ctx: &Arc<Context>,
    stream: Id,
    src: u64,
    to: &Arc<Context>,
    dst: u64,
    size: u64,
) -> Result<(), CUresult> {
    let (landing, source) = (rgpu_client::new_ticket(), rgpu_client::new_ticket());
    let export = |ctx: &Arc<Context>, ticket| rgpu_protocol::PeerExport {
        endpoint: ctx.conn.endpoint().to_string(),
        session: ctx.conn.session_id(),
        ticket,
    };
    to.conn
        .cuda()
        .land_range(to.remote, dst, size, landing, export(ctx, source), true)
        .outcome()?;
    ctx.conn
        .cuda()
        .push_range(ctx.remote, stream, src, size, export(to, landing), source)
        .outcome()
}

/// A copy between devices of different servers, through this process: read from one, write
/// to the other (in chunks when both sides are contiguous). For rows the fabric does not
/// move (strided sides), and small synchronous copies. Ordered after the stream's earlier
/// work; the read is complete on return, and the write too where a third server's stream
/// ordered the copy.
fn relay(
    from: &Context,
    src: Side,
    to: &Context,
    dst: Side,
    extent: Extent,
    queue: Option<(Arc<Context>, Id)>,
) -> Result<(), CUresult> {
    // The write joins the program's stream if it is on the destination's server; else earlier
    // work on the stream is waited for, and the write is waited for at the end.
    let ordered_elsewhere = matches!(&queue, Some((ctx, _)) if !Arc::ptr_eq(&ctx.conn, &to.conn));
    let write_stream = match queue {
        Some((ctx, stream)) if Arc::ptr_eq(&ctx.conn, &to.conn) => Some((ctx, stream)),
        Some((ctx, stream)) => {
            synchronize_stream(&ctx, stream)?;
            None
        }
        None => None,
    };
    let (write_ctx, write_id) = match &write_stream {
        Some((ctx, stream)) => (&**ctx, *stream),
        None => (to, 0),
    };
    if extent.is_contiguous(src.pitch) && extent.is_contiguous(dst.pitch) {
        let total = extent.bytes().unwrap_or(0);
        let mut buffer = vec![0u8; total.min(RELAY_CHUNK) as usize];
        let mut offset = 0;
        while offset < total {
            let piece = Extent::linear((total - offset).min(RELAY_CHUNK));
            let chunk = &mut buffer[..piece.width as usize];
            let at = src.start + offset;
            read_device(from, 0, chunk.as_mut_ptr(), at, piece, piece.packed(), true)?;
            // A posted write has left (or been copied) when post returns: the buffer is free.
            let at = dst.start + offset;
            write_device(write_ctx, write_id, at, piece, piece.packed(), chunk)?;
            offset += piece.width;
        }
    } else {
        let mut packed = vec![0u8; extent.bytes().unwrap_or(0) as usize];
        let into = packed.as_mut_ptr();
        read_device(from, 0, into, src.start, extent, src.pitch, true)?;
        write_device(write_ctx, write_id, dst.start, extent, dst.pitch, &packed)?;
    }
    // A synchronous copy between devices does not wait for the device (as natively): the
    // write is on the destination's default stream, where later work finds it done. One that
    // a third server's stream ordered is waited for, as that stream's later work may be.
    if ordered_elsewhere {
        synchronize_stream(to, 0)?;
    }
    Ok(())
}

/// Copies between the host and the device cannot join a stream capture: the server would
/// record its staging buffers, not the program's memory.
/// A host<->device copy made while `stream` captures: the graph gets a device copy through a
/// staging buffer, and the host side moves at each launch (graph_host_work.rs).
fn captured_host_copy(
    src: Side,
    dst: Side,
    extent: Extent,
    stream: CUstream,
) -> Result<(), CUresult> {
    let (ctx, stream_id) = resolve_stream(stream)?;
    let (direction, host, device) = match (&src.memory, &dst.memory) {
        (Memory::Host, Memory::Device(owner)) => (Direction::ToDevice, &src, (owner, &dst)),
        (Memory::Device(owner), Memory::Host) => (Direction::ToHost, &dst, (owner, &src)),
        _ => {
            return Err(crate::unsupported::not_supported(
                "copies between host memory and arrays, or host to host, during stream capture",
            ))
        }
    };
    let (owner, device_side) = device;
    if !Arc::ptr_eq(&owner.conn, &ctx.conn) {
        return Err(crate::unsupported::not_supported(
            "captured copies with memory of another server",
        ));
    }
    let copy = stage(&ctx, direction, host.start, host.pitch, extent)?;
    let staged = extent.packed();
    let (to, to_pitch, from, from_pitch) = match direction {
        Direction::ToDevice => (
            device_side.start,
            device_side.pitch,
            copy.staging.ptr,
            staged,
        ),
        Direction::ToHost => (
            copy.staging.ptr,
            staged,
            device_side.start,
            device_side.pitch,
        ),
    };
    ctx.conn
        .cuda()
        .memcpy_dtod(
            ctx.remote, stream_id, to, to_pitch, from, from_pitch, 0, extent,
        )
        .outcome()?;
    note_captured(capture_of(stream), Work::Copy(copy));
    Ok(())
}

/// The host rows at `host` (laid out by `pitch`), packed.
pub(crate) fn host_rows(
    host: u64,
    pitch: Pitch,
    extent: Extent,
) -> std::borrow::Cow<'static, [u8]> {
    packed_rows(&Side::host(host as usize, pitch), extent)
}

/// Reads a staging buffer's packed rows into host rows, in stream order, without waiting
/// when the rows are one run (they land when the stream gets there).
pub(crate) fn read_staged(
    ctx: &Context,
    stream: Id,
    staging: DevicePtr,
    host: u64,
    pitch: Pitch,
    extent: Extent,
) -> Result<(), CUresult> {
    let dst = Side::host(host as usize, pitch);
    let linear = Extent::linear(extent.bytes().unwrap_or(0));
    read_rows(&dst, extent, false, |into, wait| {
        read_device(ctx, stream, into, staging, linear, linear.packed(), wait)
    })
}

// ---- 1D copies ----------------------------------------------------------------------------

/// `size` contiguous bytes.
fn linear(size: usize) -> (Extent, Pitch) {
    let extent = Extent::linear(size as u64);
    (extent, extent.packed())
}

fn copy_to_device(dst: u64, src: *const c_void, size: usize, stream: Option<CUstream>) -> CUresult {
    let (extent, pitch) = linear(size);
    status(
        Side::device(dst, pitch, std::ptr::null_mut()).and_then(|dst| {
            let src = Side::host(src as usize, pitch);
            transfer(Transfer { src, dst, extent }, stream)
        }),
    )
}

fn copy_to_host(dst: *mut c_void, src: u64, size: usize, stream: Option<CUstream>) -> CUresult {
    let (extent, pitch) = linear(size);
    status(
        Side::device(src, pitch, std::ptr::null_mut()).and_then(|src| {
            let dst = Side::host(dst as usize, pitch);
            transfer(Transfer { src, dst, extent }, stream)
        }),
    )
}

fn copy_on_devices(dst: u64, src: u64, size: usize, stream: Option<CUstream>) -> CUresult {
    let (extent, pitch) = linear(size);
    let null = std::ptr::null_mut();
    status((|| {
        let src = Side::device(src, pitch, null)?;
        let dst = Side::device(dst, pitch, null)?;
        transfer(Transfer { src, dst, extent }, stream)
    })())
}

/// A unified-addressing copy: each side is device memory if it lies in a device allocation.
fn copy_unified(dst: u64, src: u64, size: usize, stream: Option<CUstream>) -> CUresult {
    let (extent, pitch) = linear(size);
    status((|| {
        let src = Side::unified(src, pitch)?;
        let dst = Side::unified(dst, pitch)?;
        transfer(Transfer { src, dst, extent }, stream)
    })())
}

pub unsafe fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, size: usize) -> CUresult {
    copy_to_device(dst, src, size, None)
}

pub unsafe fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    size: usize,
    stream: CUstream,
) -> CUresult {
    copy_to_device(dst, src, size, Some(stream))
}

pub unsafe fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, size: usize) -> CUresult {
    copy_to_host(dst, src, size, None)
}

pub unsafe fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    size: usize,
    stream: CUstream,
) -> CUresult {
    copy_to_host(dst, src, size, Some(stream))
}

pub unsafe fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, size: usize) -> CUresult {
    copy_on_devices(dst, src, size, None)
}

pub unsafe fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    size: usize,
    stream: CUstream,
) -> CUresult {
    copy_on_devices(dst, src, size, Some(stream))
}

pub unsafe fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, size: usize) -> CUresult {
    copy_unified(dst, src, size, None)
}

pub unsafe fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    size: usize,
    stream: CUstream,
) -> CUresult {
    copy_unified(dst, src, size, Some(stream))
}

fn copy_peer(
    dst: u64,
    dst_ctx: CUcontext,
    src: u64,
    src_ctx: CUcontext,
    size: usize,
    stream: Option<CUstream>,
) -> CUresult {
    let (extent, pitch) = linear(size);
    status((|| {
        let src = Side::device(src, pitch, src_ctx)?;
        let dst = Side::device(dst, pitch, dst_ctx)?;
        transfer(Transfer { src, dst, extent }, stream)
    })())
}

pub unsafe fn cuMemcpyPeer(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    size: usize,
) -> CUresult {
    copy_peer(dst, dst_ctx, src, src_ctx, size, None)
}

pub unsafe fn cuMemcpyPeerAsync(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    size: usize,
    stream: CUstream,
) -> CUresult {
    copy_peer(dst, dst_ctx, src, src_ctx, size, Some(stream))
}

// ---- 2D and 3D copies ---------------------------------------------------------------------

/// One side of a 2D or 3D copy descriptor, from its fields: the memory type (as an integer),
/// both base addresses, the offset of the first byte (x bytes, row y, slice z), the row pitch,
/// the rows per slice and, for peer copies, the context.
struct Described {
    memory_type: u32,
    host: u64,
    device: u64,
    /// The array handle, for an array side.
    array: usize,
    xyz: (usize, usize, usize),
    pitch: usize,
    slice_rows: usize,
    ctx: CUcontext,
}

impl Described {
    fn side(&self) -> Result<Side, CUresult> {
        let (x, y, z) = self.xyz;
        let pitch = Pitch {
            row: self.pitch as u64,
            slice_rows: self.slice_rows as u64,
        };
        // Checked: a descriptor may hold anything.
        let offset = (z as u64)
            .checked_mul(pitch.slice_rows)
            .and_then(|rows| rows.checked_add(y as u64))
            .and_then(|rows| rows.checked_mul(pitch.row))
            .and_then(|bytes| bytes.checked_add(x as u64))
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        match self.memory_type {
            MEMORY_HOST => Ok(Side::host((self.host + offset) as usize, pitch)),
            MEMORY_DEVICE => Side::device(self.device + offset, pitch, self.ctx),
            MEMORY_UNIFIED => {
                let side = Side::unified(self.device, pitch)?;
                Ok(Side {
                    start: side.start + offset,
                    ..side
                })
            }
            MEMORY_ARRAY => {
                let array = Array::from_handle(self.array as CUarray)
                    .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
                Ok(Side {
                    start: 0,
                    pitch: Pitch {
                        row: 0,
                        slice_rows: 0,
                    },
                    memory: Memory::Array(array, [x as u64, y as u64, z as u64]),
                })
            }
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }
}

/// Reads a `CUmemorytype` field as an integer.
///
/// # Safety
/// `field` points to an initialized 32-bit field.
unsafe fn memory_type(field: *const CUmemorytype) -> u32 {
    // SAFETY: the caller's guarantee; an enum field may hold values the enum lacks.
    unsafe { field.cast::<u32>().read() }
}

/// # Safety
/// `p` is null or points to a valid `CUDA_MEMCPY2D`.
unsafe fn copy_2d(p: *const CUDA_MEMCPY2D, stream: Option<CUstream>) -> CUresult {
    // SAFETY: the caller's guarantee.
    let Some(p) = (unsafe { p.as_ref() }) else {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    };
    let extent = Extent {
        width: p.WidthInBytes as u64,
        height: p.Height as u64,
        depth: 1,
    };
    let null = std::ptr::null_mut();
    let src = Described {
        // SAFETY: a field of a valid descriptor.
        memory_type: unsafe { memory_type(std::ptr::addr_of!(p.srcMemoryType)) },
        host: p.srcHost as u64,
        device: p.srcDevice,
        array: p.srcArray as usize,
        xyz: (p.srcXInBytes, p.srcY, 0),
        pitch: p.srcPitch,
        slice_rows: p.Height,
        ctx: null,
    };
    let dst = Described {
        // SAFETY: as above.
        memory_type: unsafe { memory_type(std::ptr::addr_of!(p.dstMemoryType)) },
        host: p.dstHost as u64,
        device: p.dstDevice,
        array: p.dstArray as usize,
        xyz: (p.dstXInBytes, p.dstY, 0),
        pitch: p.dstPitch,
        slice_rows: p.Height,
        ctx: null,
    };
    status((|| {
        let (src, dst) = (src.side()?, dst.side()?);
        transfer(Transfer { src, dst, extent }, stream)
    })())
}

/// The fields `CUDA_MEMCPY3D` and `CUDA_MEMCPY3D_PEER` share, as a 3D copy; `contexts` are
/// the peer descriptor's (source, destination), null for a plain 3D copy.
macro_rules! copy_3d_from {
    ($p:expr, $contexts:expr, $stream:expr) => {{
        let p = $p;
        let (src_ctx, dst_ctx) = $contexts;
        if p.srcLOD != 0 || p.dstLOD != 0 {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let extent = Extent {
            width: p.WidthInBytes as u64,
            height: p.Height as u64,
            depth: p.Depth as u64,
        };
        let src = Described {
            // SAFETY: a field of a valid descriptor.
            memory_type: unsafe { memory_type(std::ptr::addr_of!(p.srcMemoryType)) },
            host: p.srcHost as u64,
            device: p.srcDevice,
            array: p.srcArray as usize,
            xyz: (p.srcXInBytes, p.srcY, p.srcZ),
            pitch: p.srcPitch,
            slice_rows: p.srcHeight,
            ctx: src_ctx,
        };
        let dst = Described {
            // SAFETY: as above.
            memory_type: unsafe { memory_type(std::ptr::addr_of!(p.dstMemoryType)) },
            host: p.dstHost as u64,
            device: p.dstDevice,
            array: p.dstArray as usize,
            xyz: (p.dstXInBytes, p.dstY, p.dstZ),
            pitch: p.dstPitch,
            slice_rows: p.dstHeight,
            ctx: dst_ctx,
        };
        status((|| {
            let (src, dst) = (src.side()?, dst.side()?);
            transfer(Transfer { src, dst, extent }, $stream)
        })())
    }};
}

/// # Safety
/// `p` is null or points to a valid `CUDA_MEMCPY3D`.
unsafe fn copy_3d(p: *const CUDA_MEMCPY3D, stream: Option<CUstream>) -> CUresult {
    // SAFETY: the caller's guarantee.
    let Some(p) = (unsafe { p.as_ref() }) else {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    };
    let null = std::ptr::null_mut();
    copy_3d_from!(p, (null, null), stream)
}

/// A graph's copy node: rows between device addresses of one server (copies to or from host
/// memory would run on the server, away from the program's memory: not offered).
///
/// # Safety
/// `p` is null or points to a valid `CUDA_MEMCPY3D`.
pub(crate) unsafe fn graph_copy(
    p: *const CUDA_MEMCPY3D,
) -> Result<rgpu_protocol::cuda::NodeParams, CUresult> {
    // SAFETY: the caller's guarantee.
    match unsafe { graph_copy_staged(p) }? {
        (params, None) => Ok(params),
        (_, Some(_)) => Err(crate::unsupported::not_supported(
            "new parameters with a host side for a graph copy node",
        )),
    }
}

/// A graph copy node's parameters; with a host side, the host copy its launches carry out
/// (the node copies between the device side and a staging buffer).
///
/// # Safety
/// `p` is null or a valid descriptor.
pub(crate) unsafe fn graph_copy_staged(
    p: *const CUDA_MEMCPY3D,
) -> Result<(rgpu_protocol::cuda::NodeParams, Option<Arc<HostCopy>>), CUresult> {
    // SAFETY: the caller's guarantee.
    let p = unsafe { p.as_ref() }.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if p.srcLOD != 0 || p.dstLOD != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let side = |memory_type: u32, host: u64, device: u64, xyz, pitch, slice_rows| Described {
        memory_type,
        host,
        device,
        array: 0,
        xyz,
        pitch,
        slice_rows,
        ctx: std::ptr::null_mut(),
    };
    // SAFETY: fields of a valid descriptor.
    let (src_type, dst_type) = unsafe {
        (
            memory_type(std::ptr::addr_of!(p.srcMemoryType)),
            memory_type(std::ptr::addr_of!(p.dstMemoryType)),
        )
    };
    let src = side(
        src_type,
        p.srcHost as u64,
        p.srcDevice,
        (p.srcXInBytes, p.srcY, p.srcZ),
        p.srcPitch,
        p.srcHeight,
    )
    .side()?;
    let dst = side(
        dst_type,
        p.dstHost as u64,
        p.dstDevice,
        (p.dstXInBytes, p.dstY, p.dstZ),
        p.dstPitch,
        p.dstHeight,
    )
    .side()?;
    let extent = Extent {
        width: p.WidthInBytes as u64,
        height: p.Height as u64,
        depth: p.Depth as u64,
    };
    match (&src.memory, &dst.memory) {
        (Memory::Device(a), Memory::Device(b)) if Arc::ptr_eq(&a.conn, &b.conn) => {
            // Contiguous rows (a 1D copy's pitches may be anything) travel as one run.
            let (extent, src_pitch, dst_pitch) =
                if extent.is_contiguous(src.pitch) && extent.is_contiguous(dst.pitch) {
                    let linear = Extent::linear(extent.bytes().unwrap_or(0));
                    (linear, linear.packed(), linear.packed())
                } else {
                    (extent, src.pitch, dst.pitch)
                };
            let params = rgpu_protocol::cuda::NodeParams::Copy {
                dst: dst.start,
                dst_pitch,
                src: src.start,
                src_pitch,
                extent,
            };
            Ok((params, None))
        }
        (Memory::Device(_), Memory::Device(_)) => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        (Memory::Host, Memory::Device(owner)) | (Memory::Device(owner), Memory::Host) => {
            let to_device = matches!(src.memory, Memory::Host);
            let (direction, host, device) = if to_device {
                (Direction::ToDevice, &src, &dst)
            } else {
                (Direction::ToHost, &dst, &src)
            };
            let copy = stage(owner, direction, host.start, host.pitch, extent)?;
            let staged = extent.packed();
            let params = if to_device {
                rgpu_protocol::cuda::NodeParams::Copy {
                    dst: device.start,
                    dst_pitch: device.pitch,
                    src: copy.staging.ptr,
                    src_pitch: staged,
                    extent,
                }
            } else {
                rgpu_protocol::cuda::NodeParams::Copy {
                    dst: copy.staging.ptr,
                    dst_pitch: staged,
                    src: device.start,
                    src_pitch: device.pitch,
                    extent,
                }
            };
            Ok((params, Some(copy)))
        }
        _ => Err(crate::unsupported::not_supported(
            "graph copy nodes with arrays or between host memory",
        )),
    }
}

/// The other side of a linear copy with an array (`array_copy_linear`).
pub(crate) enum Linear {
    Host(u64),
    Device(u64),
    /// Another array, `offset` bytes into its first row.
    Array(CUarray, usize),
}

/// A linear copy of `bytes` between an array (`offset` bytes into its first row) and
/// `other`: the array is the source when `array_is_source`. The CUDA API's copies with 1D
/// arrays (`cuMemcpyHtoA`, `AtoH`, `AtoD`, `DtoA`, `AtoA`).
///
/// # Safety
/// Host memory in `other` is the program's memory of `bytes`, as the API requires.
pub(crate) unsafe fn array_copy_linear(
    (array, offset): (CUarray, usize),
    array_is_source: bool,
    other: Linear,
    bytes: usize,
    stream: Option<CUstream>,
) -> CUresult {
    let extent = Extent::linear(bytes as u64);
    let array_side = |handle: CUarray, offset: usize| {
        Array::from_handle(handle)
            .map(|array| Side {
                start: 0,
                pitch: extent.packed(),
                memory: Memory::Array(array, [offset as u64, 0, 0]),
            })
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    };
    status((|| {
        let ours = array_side(array, offset)?;
        let theirs = match other {
            Linear::Host(host) => Side::host(host as usize, extent.packed()),
            Linear::Device(ptr) => Side::device(ptr, extent.packed(), std::ptr::null_mut())?,
            Linear::Array(other, offset) => array_side(other, offset)?,
        };
        let (src, dst) = match array_is_source {
            true => (ours, theirs),
            false => (theirs, ours),
        };
        transfer(Transfer { src, dst, extent }, stream)
    })())
}

/// # Safety
/// `p` is null or points to a valid `CUDA_MEMCPY3D_PEER`.
unsafe fn copy_3d_peer(p: *const CUDA_MEMCPY3D_PEER, stream: Option<CUstream>) -> CUresult {
    // SAFETY: the caller's guarantee.
    let Some(p) = (unsafe { p.as_ref() }) else {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    };
    copy_3d_from!(p, (p.srcContext, p.dstContext), stream)
}

pub unsafe fn cuMemcpy2D_v2(p: *const CUDA_MEMCPY2D) -> CUresult {
    // SAFETY: the caller's copy descriptor (null is refused), as the API requires.
    unsafe { copy_2d(p, None) }
}

pub unsafe fn cuMemcpy2DUnaligned_v2(p: *const CUDA_MEMCPY2D) -> CUresult {
    // SAFETY: the caller's copy descriptor (null is refused), as the API requires.
    unsafe { copy_2d(p, None) }
}

pub unsafe fn cuMemcpy2DAsync_v2(p: *const CUDA_MEMCPY2D, stream: CUstream) -> CUresult {
    // SAFETY: the caller's copy descriptor (null is refused), as the API requires.
    unsafe { copy_2d(p, Some(stream)) }
}

pub unsafe fn cuMemcpy3D_v2(p: *const CUDA_MEMCPY3D) -> CUresult {
    // SAFETY: the caller's copy descriptor (null is refused), as the API requires.
    unsafe { copy_3d(p, None) }
}

pub unsafe fn cuMemcpy3DAsync_v2(p: *const CUDA_MEMCPY3D, stream: CUstream) -> CUresult {
    // SAFETY: the caller's copy descriptor (null is refused), as the API requires.
    unsafe { copy_3d(p, Some(stream)) }
}

pub unsafe fn cuMemcpy3DPeer(p: *const CUDA_MEMCPY3D_PEER) -> CUresult {
    // SAFETY: the caller's copy descriptor (null is refused), as the API requires.
    unsafe { copy_3d_peer(p, None) }
}

pub unsafe fn cuMemcpy3DPeerAsync(p: *const CUDA_MEMCPY3D_PEER, stream: CUstream) -> CUresult {
    // SAFETY: the caller's copy descriptor (null is refused), as the API requires.
    unsafe { copy_3d_peer(p, Some(stream)) }
}
