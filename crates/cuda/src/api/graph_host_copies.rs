//! Copies between host memory and the device inside graphs (memcpy nodes with a host side, and
//! host<->device copies made while a stream captures). The GPU cannot reach this machine's
//! memory, so each such copy gets a staging buffer in device memory on the server: the graph
//! holds a device copy between the staging buffer and the device side, and every launch of the
//! graph moves the host side through the connection, in stream order — the host rows to the
//! staging buffer before the graph, the staging buffer to the host rows after it. Natively the
//! node reads or writes host memory when it runs; a program sees no difference as long as it
//! does not change the source rows, or read the destination rows, while the graph runs (which
//! CUDA's own rules for host memory in flight forbid).

use std::collections::BTreeMap;
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

/// The host copies of a graph or executable graph.
pub(crate) type HostCopies = Mutex<Vec<Arc<HostCopy>>>;

/// Host copies made while a stream captured, by capture id, until the capture ends.
static CAPTURED: Mutex<BTreeMap<u64, Vec<Arc<HostCopy>>>> = Mutex::new(BTreeMap::new());

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

/// Notes a host copy made while capture `capture` was in progress.
pub(crate) fn note_captured(capture: u64, copy: Arc<HostCopy>) {
    CAPTURED
        .lock()
        .unwrap()
        .entry(capture)
        .or_default()
        .push(copy);
}

/// The host copies of a capture that ended.
pub(crate) fn take_captured(capture: u64) -> Vec<Arc<HostCopy>> {
    CAPTURED
        .lock()
        .unwrap()
        .remove(&capture)
        .unwrap_or_default()
}

/// Before a launch on `stream` of `ctx`: the host rows of every copy to the device go to
/// their staging buffers (posted, in stream order).
pub(crate) fn before_launch(
    ctx: &Context,
    stream: Id,
    copies: &[Arc<HostCopy>],
) -> Result<(), CUresult> {
    for copy in copies.iter().filter(|c| c.direction == Direction::ToDevice) {
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
/// stream order; the rows land when the graph has run (before any later synchronization of
/// the stream returns).
pub(crate) fn after_launch(
    ctx: &Context,
    stream: Id,
    copies: &[Arc<HostCopy>],
) -> Result<(), CUresult> {
    for copy in copies.iter().filter(|c| c.direction == Direction::ToHost) {
        super::copy::read_staged(
            ctx,
            stream,
            copy.staging.ptr,
            copy.host,
            copy.host_pitch,
            copy.extent,
        )?;
    }
    Ok(())
}
