//! CUDA IPC: device memory and events shared between processes (PyTorch's multiprocessing,
//! DataLoader workers, inference servers). The server shares the object under a random ticket
//! (crates/server/src/cuda/ipc.rs); the handle the program passes to another process names the
//! exporting server and session and carries the ticket, never the driver's own handle. The
//! other process's server presents the ticket to the exporting session and maps the object,
//! which works where the two servers are one machine's (usually they are one server).
//!
//! A handle's 64 bytes: [`MAGIC`], the exporting server (a hash of its address as the
//! program's `RGPU_SERVERS` names it: processes of one program name their servers alike), the
//! exporting session's id, and the ticket (32 bytes).

use std::ffi::{c_char, c_uint};
use std::sync::Mutex;

use rgpu_client::CudaClient;
use rgpu_cuda_api::sys::*;
use rgpu_protocol::{LaneKey, PeerExport};

use super::memory::{context_of, forget_device_range, is_device_memory, record_device_range};
use super::{status, write_out, Outcome};
use crate::objects::{current_context, Context, Event};
use crate::ranges::RangeMap;

/// The first bytes of an rgpu IPC handle (and its layout's version).
const MAGIC: [u8; 8] = *b"rgpuIPC1";

/// Other processes' allocations this process mapped (`cuIpcOpenMemHandle`), with their
/// context's handle: the only addresses `cuIpcCloseMemHandle` takes.
static MAPPED: Mutex<RangeMap<usize>> = Mutex::new(RangeMap::new());

/// What an rgpu IPC handle names.
#[derive(Debug, PartialEq)]
struct Shared {
    server: u64,
    session: u64,
    ticket: LaneKey,
}

impl Shared {
    fn encode(&self) -> [c_char; 64] {
        let mut bytes = [0u8; 64];
        bytes[..8].copy_from_slice(&MAGIC);
        bytes[8..16].copy_from_slice(&self.server.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.session.to_le_bytes());
        bytes[24..56].copy_from_slice(&self.ticket);
        bytes.map(|b| b as c_char)
    }

    /// `None`: not a handle rgpu made.
    fn decode(raw: &[c_char; 64]) -> Option<Shared> {
        let bytes = raw.map(|b| b as u8);
        if bytes[..8] != MAGIC {
            return None;
        }
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        Some(Shared {
            server: word(8),
            session: word(16),
            ticket: bytes[24..56].try_into().unwrap(),
        })
    }

    /// The share as the program's own servers reach it (`INVALID_VALUE`: no server of this
    /// program made it).
    fn export(&self) -> Result<PeerExport, CUresult> {
        let servers = crate::servers::servers()?;
        let endpoint = servers
            .devices
            .iter()
            .map(|device| device.link.endpoint().to_string())
            .find(|endpoint| server_key(endpoint) == self.server)
            .ok_or_else(|| {
                log::warn!("rgpu: an IPC handle of a server this program does not use");
                CUresult::CUDA_ERROR_INVALID_VALUE
            })?;
        Ok(PeerExport {
            endpoint,
            session: self.session,
            ticket: self.ticket,
        })
    }

    /// A share made on `ctx`'s session under `ticket`.
    fn of(ctx: &Context, ticket: LaneKey) -> Shared {
        Shared {
            server: server_key(&ctx.conn.endpoint().to_string()),
            session: ctx.conn.session_id(),
            ticket,
        }
    }
}

/// A server's address, hashed (FNV-1a: stable across builds and processes).
pub(super) fn server_key(endpoint: &str) -> u64 {
    endpoint.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

pub unsafe fn cuIpcGetMemHandle(pHandle: *mut CUipcMemHandle, dptr: CUdeviceptr) -> CUresult {
    status((|| {
        if pHandle.is_null() || !is_device_memory(dptr) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = context_of(dptr)?;
        let ticket = ctx
            .conn
            .cuda()
            .ipc_share_memory(ctx.remote, dptr)
            .outcome()?;
        let handle = CUipcMemHandle {
            reserved: Shared::of(&ctx, ticket).encode(),
        };
        // SAFETY: the caller's out-pointer, checked non-null.
        unsafe { write_out(pHandle, handle) }
    })())
}

pub unsafe fn cuIpcOpenMemHandle_v2(
    pdptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    Flags: c_uint,
) -> CUresult {
    status(current_context().and_then(|ctx| {
        if pdptr.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let from = Shared::decode(&handle.reserved)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?
            .export()?;
        let server = ctx.conn.cuda();
        let mapped = server.ipc_open_memory(ctx.remote, from, Flags).outcome()?;
        // Another server's memory of this program may hold the address already (each server's
        // driver has its own address space): then the mapping cannot be told from it.
        if super::memory::overlaps_known_range(mapped.ptr, mapped.size) {
            log::warn!("rgpu: an IPC mapping at an address another server's memory holds");
            let _ = server.ipc_close_memory(ctx.remote, mapped.ptr).outcome();
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        record_device_range(mapped.ptr, mapped.size, &ctx);
        MAPPED
            .lock()
            .unwrap()
            .insert(mapped.ptr, mapped.size, ctx.handle);
        // SAFETY: the caller's out-pointer, checked non-null.
        unsafe { write_out(pdptr, mapped.ptr) }
    }))
}

/// The CUDA 4 name, with the same parameters.
pub unsafe fn cuIpcOpenMemHandle(
    pdptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    Flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuIpcOpenMemHandle_v2(pdptr, handle, Flags) }
}

pub unsafe fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult {
    status((|| {
        let mapped = MAPPED.lock().unwrap().get(dptr);
        let Some((_, ctx)) = mapped else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        let ctx =
            Context::from_handle(ctx as CUcontext).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        // Stream-ordered work on the mapping may still be posted: it goes first.
        ctx.conn
            .cuda()
            .ipc_close_memory(ctx.remote, dptr)
            .outcome()?;
        MAPPED.lock().unwrap().remove(dptr);
        forget_device_range(dptr);
        Ok(())
    })())
}

pub unsafe fn cuIpcGetEventHandle(pHandle: *mut CUipcEventHandle, event: CUevent) -> CUresult {
    status((|| {
        if pHandle.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let event = Event::from_handle(event).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let ctx = event.context()?;
        let ticket = ctx.conn.cuda().ipc_share_event(event.remote).outcome()?;
        let handle = CUipcEventHandle {
            reserved: Shared::of(&ctx, ticket).encode(),
        };
        // SAFETY: the caller's out-pointer, checked non-null.
        unsafe { write_out(pHandle, handle) }
    })())
}

pub unsafe fn cuIpcOpenEventHandle(phEvent: *mut CUevent, handle: CUipcEventHandle) -> CUresult {
    status(current_context().and_then(|ctx| {
        if phEvent.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let from = Shared::decode(&handle.reserved)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?
            .export()?;
        let event = Event::new(&ctx);
        ctx.conn
            .cuda()
            .ipc_open_event(ctx.remote, event.remote, from)
            .outcome()?;
        // SAFETY: the caller's out-pointer, checked non-null.
        unsafe { write_out(phEvent, event.into_handle()) }
    }))
}

/// Forgets the IPC mappings of a destroyed context (the driver unmapped them with it).
pub(crate) fn forget_mappings_of(ctx: &Context) {
    let gone = MAPPED
        .lock()
        .unwrap()
        .remove_where(|owner| owner == ctx.handle);
    for start in gone {
        forget_device_range(start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_keeps_what_it_names_and_others_are_not_ours() {
        let shared = Shared {
            server: server_key("gpu1:7450"),
            session: 0x0102_0304_0506_0708,
            ticket: [0xa5; 32],
        };
        let raw = shared.encode();
        assert_eq!(Shared::decode(&raw), Some(shared));
        // The driver's own handles (and zeros) are not rgpu's.
        assert_eq!(Shared::decode(&[0; 64]), None);
        assert_ne!(server_key("gpu1:7450"), server_key("gpu2:7450"));
    }
}
