//! The host's part of graphs: copies between host memory and the device (copy nodes with a
//! host side, and host<->device copies made while a stream captures) and host functions (host
//! nodes, and `cuLaunchHostFunc` while a stream captures). The GPU cannot reach this machine,
//! so the graph on the server holds only device work, and each launch does the host's part:
//!
//! - each copy gets a staging buffer in device memory on the server; the graph holds a device
//!   copy between it and the device side, and every launch moves the host side through the
//!   connection, in stream order — the host rows to the staging buffer before the graph, the
//!   staging buffer to the host rows after it. Natively the node reads or writes host memory
//!   when it runs; a program sees no difference as long as it does not change the source rows,
//!   or read the destination rows, while the graph runs (which CUDA forbids for memory in
//!   flight);
//! - host functions run on this machine, in the order they were added, once the graph has run
//!   (and its copies to the host have landed): the launch waits for the stream, as
//!   `cuLaunchHostFunc` does (stream.rs). A host node's place in the graph is an empty node on
//!   the server, so dependencies on it hold. What a function does can reach the device only
//!   through later calls, so running it after the graph's later nodes changes nothing the
//!   device sees; it does see what those later nodes copied to the host.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use rgpu_client::CudaClient;
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{DevicePtr, Extent, Id, Pitch};

use super::Outcome;
use crate::objects::Context;

/// Device memory on the server holding one copy's packed rows.
pub(crate) struct Staging {
    ctx: Arc<Context>,
    pub ptr: DevicePtr,
}

impl Drop for Staging {
    fn drop(&mut self) {
        // Graphs and executable graphs that used it are gone.
        let _ = self.ctx.conn.cuda().mem_free(self.ctx.remote, self.ptr);
    }
}

/// Which way a host copy goes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Direction {
    ToDevice,
    ToHost,
}

/// One host side of a graph's copy, moved at each launch.
pub(crate) struct HostCopy {
    pub direction: Direction,
    /// The host rows: first byte and layout.
    pub host: u64,
    pub host_pitch: Pitch,
    pub extent: Extent,
    pub staging: Staging,
}

/// A host function of a graph, and the data it is called with.
pub(crate) struct HostCall {
    pub function: unsafe extern "C" fn(*mut c_void),
    pub data: usize,
}

/// One piece of the host's part of a graph.
#[derive(Clone)]
pub(crate) enum Work {
    Copy(Arc<HostCopy>),
    Call(Arc<HostCall>),
}

/// The host's part of a graph or executable graph, in the order it was added.
pub(crate) type HostWork = Mutex<Vec<Work>>;

/// Host work added while a stream captured, by capture id, until the capture ends.
static CAPTURED: Mutex<BTreeMap<u64, Vec<Work>>> = Mutex::new(BTreeMap::new());

/// A staging buffer for `extent`'s packed rows on `ctx`'s server, and the host copy it serves.
pub(crate) fn stage(
    ctx: &Arc<Context>,
    direction: Direction,
    host: u64,
    host_pitch: Pitch,
    extent: Extent,
) -> Result<Arc<HostCopy>, CUresult> {
    let bytes = extent
        .bytes()
        .filter(|&b| b > 0)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let ptr = ctx.conn.cuda().staging_alloc(ctx.remote, bytes).outcome()?;
    Ok(Arc::new(HostCopy {
        direction,
        host,
        host_pitch,
        extent,
        staging: Staging {
            ctx: ctx.clone(),
            ptr,
        },
    }))
}

/// Notes host work added while capture `capture` was in progress.
pub(crate) fn note_captured(capture: u64, work: Work) {
    CAPTURED
        .lock()
        .unwrap()
        .entry(capture)
        .or_default()
        .push(work);
}

/// The host work of a capture that ended.
pub(crate) fn take_captured(capture: u64) -> Vec<Work> {
    CAPTURED
        .lock()
        .unwrap()
        .remove(&capture)
        .unwrap_or_default()
}

/// Before a launch on `stream` of `ctx`: the host rows of every copy to the device go to
/// their staging buffers (posted, in stream order).
pub(crate) fn before_launch(ctx: &Context, stream: Id, work: &[Work]) -> Result<(), CUresult> {
    for copy in copies(work, Direction::ToDevice) {
        let rows = super::copy::host_rows(copy.host, copy.host_pitch, copy.extent);
        let linear = Extent::linear(rows.len() as u64);
        ctx.conn
            .cuda()
            .memcpy_htod(
                ctx.remote,
                stream,
                copy.staging.ptr,
                linear,
                linear.packed(),
                &rows,
            )
            .outcome()?;
    }
    Ok(())
}

/// After a launch: every copy to the host reads its staging buffer into the host rows, in
/// stream order (the rows land when the graph has run, before any later synchronization of the
/// stream returns); then, if the graph has host functions, they run once the stream is done.
pub(crate) fn after_launch(ctx: &Context, stream: Id, work: &[Work]) -> Result<(), CUresult> {
    for copy in copies(work, Direction::ToHost) {
        let (host, pitch) = (copy.host, copy.host_pitch);
        super::copy::read_staged(ctx, stream, copy.staging.ptr, host, pitch, copy.extent)?;
    }
    let mut calls = work
        .iter()
        .filter_map(|w| match w {
            Work::Call(call) => Some(call),
            Work::Copy(_) => None,
        })
        .peekable();
    if calls.peek().is_some() {
        super::stream::synchronize_stream(ctx, stream)?;
        for call in calls {
            // SAFETY: the program's host function with its data, as the driver would call it.
            unsafe { (call.function)(call.data as *mut c_void) };
        }
    }
    Ok(())
}

fn copies(work: &[Work], direction: Direction) -> impl Iterator<Item = &Arc<HostCopy>> {
    work.iter().filter_map(move |w| match w {
        Work::Copy(copy) if copy.direction == direction => Some(copy),
        _ => None,
    })
}
