//! Page-locked host memory that kernels reach ("zero-copy", mapped memory): with unified
//! addressing a program may pass a pointer into its pinned host memory straight to a kernel
//! (XLA's timer spins a kernel on such a flag; NVIDIA's zero-copy samples and Numba's mapped
//! arrays read and write such buffers). That memory is in this process, which the server's
//! GPU cannot reach, so a launch whose parameters point into it gets a *mirror* instead: mapped
//! pinned memory of the server's (`HostMirror`), its device address written into the
//! parameter in place of the host address.
//!
//! The two are kept in step at the points where the program may look: the host's changes go
//! to the server before each launch and synchronization that involves the mirror's server
//! (compared with the bytes last exchanged, so only what changed travels, and at once: a
//! kernel may be spinning on it); after a synchronization completes, the device's view comes
//! back. Pointers to pinned memory stored inside other memory (not parameters) are not seen.

use std::sync::{Arc, Mutex};

use rgpu_client::CudaClient;
use rgpu_cuda_api::sys::CUresult;
use rgpu_protocol::cuda::HOST_MIRROR_MAX;

use super::memory::host_pointers_in;
use super::Outcome;
use crate::objects::Context;

/// One pinned allocation mirrored on one server.
struct Mirror {
    /// The host allocation's start (its size is the shadow's).
    host: u64,
    /// The context it was made in (its server's connection carries the exchanges).
    ctx: Arc<Context>,
    /// Its device address on that server.
    remote: u64,
    /// The bytes last exchanged with the server.
    shadow: Vec<u8>,
}

static MIRRORS: Mutex<Vec<Mirror>> = Mutex::new(Vec::new());

fn mirrors() -> std::sync::MutexGuard<'static, Vec<Mirror>> {
    MIRRORS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Rewrites the parameter words of a launch on `ctx` that point into pinned host memory to
/// the mirrors' device addresses (making mirrors where there are none yet), after sending the
/// host's changes.
pub(crate) fn translate_params(ctx: &Arc<Context>, params: &mut [u8]) -> Result<(), CUresult> {
    for (index, start, size) in host_pointers_in(params) {
        let word = &mut params[index * 8..index * 8 + 8];
        let value = u64::from_ne_bytes(word.try_into().unwrap());
        if size > HOST_MIRROR_MAX {
            log::warn!(
                "rgpu: a kernel argument points into {size} bytes of page-locked host memory, \
                 more than a mirror holds ({HOST_MIRROR_MAX}); the server's GPU cannot reach it"
            );
            continue;
        }
        let remote = mirror_of(ctx, start, size)?;
        word.copy_from_slice(&(remote + (value - start)).to_ne_bytes());
    }
    Ok(())
}

/// The device address of the mirror of `start..start+size` on `ctx`'s server, made now if
/// there is none; the host's changes are sent either way.
fn mirror_of(ctx: &Arc<Context>, start: u64, size: u64) -> Result<u64, CUresult> {
    let mut all = mirrors();
    let same_server = |m: &Mirror| Arc::ptr_eq(&m.ctx.conn, &ctx.conn);
    if let Some(mirror) = all.iter_mut().find(|m| m.host == start && same_server(m)) {
        push(mirror)?;
        return Ok(mirror.remote);
    }
    let server = ctx.conn.cuda();
    let remote = server.host_mirror(ctx.remote, size).outcome()?;
    log::debug!("pinned host memory {start:#x} ({size} bytes) mirrored at {remote:#x}");
    let mut mirror = Mirror {
        host: start,
        ctx: ctx.clone(),
        remote,
        shadow: vec![0; size as usize],
    };
    push(&mut mirror)?;
    all.push(mirror);
    Ok(remote)
}

/// Sends the host's bytes that changed since the last exchange (one run, first change to
/// last), posted.
fn push(mirror: &mut Mirror) -> Result<(), CUresult> {
    // SAFETY: the mirror's host allocation is page-locked memory of the program, alive while
    // mirrored (freeing it forgets the mirror first).
    let now = unsafe { std::slice::from_raw_parts(mirror.host as *const u8, mirror.shadow.len()) };
    let Some(first) = now.iter().zip(&mirror.shadow).position(|(a, b)| a != b) else {
        return Ok(());
    };
    let last = now.len()
        - now
            .iter()
            .rev()
            .zip(mirror.shadow.iter().rev())
            .position(|(a, b)| a != b)
            .unwrap_or(0);
    let changed = &now[first..last];
    let server = mirror.ctx.conn.cuda();
    server
        .host_mirror_write(mirror.remote, first as u64, changed)
        .outcome()?;
    mirror.shadow[first..last].copy_from_slice(changed);
    Ok(())
}

/// Whether `ctx`'s server has mirrors of the program's mapped host memory (whose device
/// view every synchronization brings back, so none may be skipped).
pub(crate) fn active(ctx: &Context) -> bool {
    mirrors()
        .iter()
        .any(|m| Arc::ptr_eq(&m.ctx.conn, &ctx.conn))
}

/// Around a synchronization with `ctx`'s server: the host's changes go first (a kernel may be
/// waiting for them), then, once it succeeded, the device's view of each mirror comes back.
pub(crate) fn synchronized<T>(
    ctx: &Context,
    sync: impl FnOnce() -> Result<T, CUresult>,
) -> Result<T, CUresult> {
    let any = mirrors()
        .iter()
        .any(|m| Arc::ptr_eq(&m.ctx.conn, &ctx.conn));
    if !any {
        return sync();
    }
    for mirror in mirrors()
        .iter_mut()
        .filter(|m| Arc::ptr_eq(&m.ctx.conn, &ctx.conn))
    {
        push(mirror)?;
    }
    let done = sync()?;
    for mirror in mirrors()
        .iter_mut()
        .filter(|m| Arc::ptr_eq(&m.ctx.conn, &ctx.conn))
    {
        let server = mirror.ctx.conn.cuda();
        let bytes = server.host_mirror_read(mirror.remote).outcome()?;
        if bytes.len() == mirror.shadow.len() {
            // SAFETY: as in `push`; the program reads its mapped memory after synchronizing.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), mirror.host as *mut u8, bytes.len())
            };
            mirror.shadow = bytes;
        }
    }
    Ok(done)
}

/// Forgets the mirrors made in `ctx` (being destroyed: the server frees them with it).
pub(crate) fn forget_context(ctx: &Context) {
    mirrors().retain(|m| !std::ptr::eq(Arc::as_ptr(&m.ctx), ctx));
}

/// Forgets the mirrors of the pinned allocation at `start` (being freed or unregistered).
pub(crate) fn forget(start: u64) {
    mirrors().retain(|m| {
        if m.host != start {
            return true;
        }
        let _ = m.ctx.conn.cuda().host_mirror_free(m.remote);
        false
    });
}
