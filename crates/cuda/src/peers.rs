//! Device memory moved between servers for rgpu's MPI interposer (docs/mpi.md): a rank
//! exports a range of its device memory, another rank's server pulls it straight from the
//! exporting server. C entry points the interposer gets at cuInit (api/init.rs); each returns a
//! `CUresult`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use rgpu_client::{CudaClient, Endpoint, ExportRecord};
use rgpu_cuda_api::sys::{CUevent_flags, CUresult};
use rgpu_protocol::cuda::{ExportKeep, Id, RangePull};
use rgpu_protocol::PeerExport;

use crate::api::memory::context_of;
use crate::api::Outcome;
use crate::objects::Context;

/// Runs an entry point for the interposer through the C boundary's one guard (a panic is
/// CUDA_ERROR_UNKNOWN, never crossing into C); the result as a plain `CUresult` number.
fn guarded(name: &'static str, body: impl FnOnce() -> Result<(), CUresult>) -> i32 {
    crate::boundary::guard(name, || match body() {
        Ok(()) => CUresult::CUDA_SUCCESS,
        Err(e) => e,
    }) as i32
}

/// Exports `size` bytes at device address `ptr` (after the earlier work of its context's
/// default stream) and describes the export in `out`. Nothing waits for the server.
///
/// # Safety
/// `out` is valid for writing.
#[no_mangle]
pub unsafe extern "C" fn rgpu_cuda_export(ptr: u64, size: u64, out: *mut ExportRecord) -> i32 {
    guarded("rgpu_cuda_export", || {
        if out.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = context_of(ptr)?;
        crate::api::managed::before_device_work(None);
        // Posted: the ticket is ours to choose, and the puller's link waits for the export.
        let ticket = rgpu_client::new_ticket();
        let record =
            ExportRecord::new(&ctx.conn, ticket).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        ctx.conn
            .cuda()
            .export_range(ctx.remote, 0, ptr, size, ticket, ExportKeep::Unguarded)
            .outcome()?;
        // SAFETY: the caller's out-pointer, checked non-null.
        unsafe { out.write(record) };
        Ok(())
    })
}

/// Fills `size` bytes at device address `dst` with the export `from` describes, pulled by
/// `dst`'s server from the exporting one.
///
/// # Safety
/// `from` is valid for reading.
#[no_mangle]
pub unsafe extern "C" fn rgpu_cuda_pull(dst: u64, size: u64, from: *const ExportRecord) -> i32 {
    guarded("rgpu_cuda_pull", || {
        // SAFETY: the caller's record, checked non-null.
        let record = unsafe { from.as_ref() }.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let export = record.export().ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let ctx = context_of(dst)?;
        let ipc = pull_by_ipc(&ctx, &export);
        crate::api::managed::before_device_work(None);
        // Pulled in the background, ordered on the default stream; its end is ours to wait for
        // (a failed pull is reported there, and the interposer moves the bytes another way).
        ctx.conn
            .cuda()
            .pull_range(ctx.remote, Some(0), dst, size, export, ipc)
            .outcome()?;
        crate::api::stream::synchronize_stream(&ctx, 0)
    })
}

/// Whether `ctx`'s server copies `export` device to device through its IPC handle: on one
/// machine (RGPU_MPI_IPC=0: always over the network, to measure that path on one machine).
fn pull_by_ipc(ctx: &Context, export: &PeerExport) -> bool {
    crate::api::fabric_ipc()
        && !std::env::var("RGPU_MPI_IPC").is_ok_and(|v| v == "0")
        && Endpoint::parse(&export.endpoint).is_ok_and(|at| at.same_machine(&ctx.conn.endpoint()))
}

/// Streams of the interposer's batched pulls per context (by its handle and server id), made
/// the first time: blocking streams, so that a pull comes after the default stream's earlier
/// work, as a single pull's does; several, so that the servers move the batch's messages side
/// by side (a server runs one stream's pulls one after another). With an event for each but
/// the first, through which the first waits for the others: a batch ends with one round trip.
#[derive(Clone)]
struct BatchStreams {
    streams: Vec<Id>,
    /// `joins[i]`: recorded on `streams[i + 1]`, waited for by `streams[0]`.
    joins: Vec<Id>,
}

fn batch_streams(ctx: &Context) -> Result<BatchStreams, CUresult> {
    type Kept = Mutex<HashMap<(usize, Id), BatchStreams>>;
    static KEPT: OnceLock<Kept> = OnceLock::new();
    let mut kept = KEPT
        .get_or_init(Kept::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let made = kept
        .entry((ctx.handle, ctx.remote))
        .or_insert_with(|| BatchStreams {
            streams: Vec::new(),
            joins: Vec::new(),
        });
    let server = ctx.conn.cuda();
    while made.streams.len() < BATCH_STREAMS {
        let id = ctx.conn.new_id();
        server.create_stream(id, ctx.remote, 0, 0).outcome()?;
        made.streams.push(id);
    }
    while made.joins.len() < BATCH_STREAMS - 1 {
        let id = ctx.conn.new_id();
        server
            .create_event(
                id,
                ctx.remote,
                CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
            )
            .outcome()?;
        made.joins.push(id);
    }
    Ok(made.clone())
}

/// Waits until every pull posted on `used` (indices into `batch.streams`) is done: the first
/// stream waits for the others' events, then is synchronized (one round trip).
fn wait_for_batch(ctx: &Context, batch: &BatchStreams, used: &[usize]) -> Result<(), CUresult> {
    let server = ctx.conn.cuda();
    let join = batch.streams[0];
    for &i in used.iter().filter(|&&i| i > 0) {
        let event = batch.joins[i - 1];
        server
            .record_event(ctx.remote, event, batch.streams[i], 0)
            .outcome()?;
        server
            .stream_wait_event(ctx.remote, join, event, 0)
            .outcome()?;
    }
    crate::api::stream::synchronize_stream(ctx, join)
}

/// Streams a batch of pulls is spread over, per context.
const BATCH_STREAMS: usize = 8;

/// The pulls of one batch in one context.
struct ContextBatch {
    ctx: Arc<Context>,
    streams: BatchStreams,
    /// Indices into `streams.streams` of those that got a pull.
    used: Vec<usize>,
    pulls: Vec<RangePull>,
}

/// Pulls `count` exports at once, export `from[i]` into device memory at `dsts[i]` (`sizes[i]`
/// bytes), each by the server of its destination straight from the exporting server; returns
/// once all are in place. On failure (the first one is returned) some may be and some not: the
/// interposer moves each message another way.
///
/// # Safety
/// `dsts`, `sizes` and `from` each hold `count` valid entries.
#[no_mangle]
pub unsafe extern "C" fn rgpu_cuda_pull_batch(
    count: u32,
    dsts: *const u64,
    sizes: *const u64,
    from: *const ExportRecord,
) -> i32 {
    guarded("rgpu_cuda_pull_batch", || {
        if count == 0 {
            return Ok(());
        }
        if dsts.is_null() || sizes.is_null() || from.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let count = count as usize;
        // SAFETY: the caller's arrays of `count` entries, checked non-null.
        let (dsts, sizes, from) = unsafe {
            (
                std::slice::from_raw_parts(dsts, count),
                std::slice::from_raw_parts(sizes, count),
                std::slice::from_raw_parts(from, count),
            )
        };
        crate::api::managed::before_device_work(None);
        let started = std::time::Instant::now();
        // The pulls of each context go out as one request (its server asks each exporter for
        // all of their IPC handles at once); then each context's batch is waited for.
        let mut batches: Vec<ContextBatch> = Vec::new();
        let mut first_error = None;
        for (k, ((&dst, &size), record)) in dsts.iter().zip(sizes).zip(from).enumerate() {
            let planned = (|| {
                let export = record.export().ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
                let ctx = context_of(dst)?;
                let ipc = pull_by_ipc(&ctx, &export);
                let at = match batches.iter().position(|b| Arc::ptr_eq(&b.ctx, &ctx)) {
                    Some(at) => at,
                    None => {
                        let streams = batch_streams(&ctx)?;
                        batches.push(ContextBatch {
                            ctx,
                            streams,
                            used: Vec::new(),
                            pulls: Vec::new(),
                        });
                        batches.len() - 1
                    }
                };
                let batch = &mut batches[at];
                let index = k % BATCH_STREAMS;
                if !batch.used.contains(&index) {
                    batch.used.push(index);
                }
                batch.pulls.push(RangePull {
                    stream: Some(batch.streams.streams[index]),
                    dst,
                    size,
                    from: export,
                    ipc,
                });
                Ok(())
            })();
            if let Err(e) = planned {
                first_error.get_or_insert(e);
            }
        }
        for batch in &mut batches {
            let (ctx, pulls) = (&batch.ctx, std::mem::take(&mut batch.pulls));
            if let Err(e) = ctx.conn.cuda().pull_ranges(ctx.remote, pulls).outcome() {
                first_error.get_or_insert(e);
            }
        }
        for batch in &batches {
            if let Err(e) = wait_for_batch(&batch.ctx, &batch.streams, &batch.used) {
                first_error.get_or_insert(e);
            }
        }
        log::debug!(
            "rgpu: {count} pulls by the servers in {} us: {first_error:?}",
            started.elapsed().as_micros()
        );
        first_error.map_or(Ok(()), Err)
    })
}

/// Withdraws an export of the memory at `ptr` that nobody pulled.
///
/// # Safety
/// `from` is valid for reading.
#[no_mangle]
pub unsafe extern "C" fn rgpu_cuda_unexport(ptr: u64, from: *const ExportRecord) -> i32 {
    guarded("rgpu_cuda_unexport", || {
        // SAFETY: the caller's record, checked non-null.
        let record = unsafe { from.as_ref() }.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let ctx = context_of(ptr)?;
        ctx.conn.cuda().unexport(record.ticket).outcome()
    })
}

/// Fills `size` bytes of host memory at `dst` with the export `from` describes, pulled by this
/// process straight from the exporting server.
///
/// # Safety
/// `from` is valid for reading, `dst` for writing `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn rgpu_cuda_pull_host(
    dst: *mut u8,
    size: u64,
    from: *const ExportRecord,
) -> i32 {
    guarded("rgpu_cuda_pull_host", || {
        // SAFETY: the caller's record, checked non-null.
        let record = unsafe { from.as_ref() }.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if dst.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's buffer of `size` bytes.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst, size as usize) };
        rgpu_client::pull_to_host(record, dst).map_err(|e| {
            log::warn!("rgpu: pulling an export into host memory: {e}");
            CUresult::CUDA_ERROR_UNKNOWN
        })
    })
}
