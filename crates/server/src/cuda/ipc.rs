//! CUDA IPC between the sessions of different processes (`cuIpcGetMemHandle`,
//! `cuIpcOpenMemHandle`, `cuIpcGetEventHandle`, `cuIpcOpenEventHandle`): PyTorch's
//! multiprocessing, DataLoader workers and inference servers share GPU tensors this way.
//!
//! The exporting session takes the driver's IPC handle and shares it as a *lasting* export of
//! the fabric (crate::fabric) under a random ticket of this server's choosing; its client gets
//! the ticket, never the handle. The importing session's server presents the ticket over a
//! fabric link (authenticated with the cluster's token), gets the handle (only a server process
//! of this machine and user does: `may_map_handles`), and opens it with the driver. So only a
//! process the exporter's program gave the handle to can map the memory, and only through a
//! server of the same machine, where the driver's handle means anything.

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::{check, Status, INVALID_HANDLE, INVALID_VALUE};
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{serve, Answer, DevicePtr, Id, IpcMapping};
use rgpu_protocol::{LaneKey, PeerExport};

use super::owned;
use super::session::{code, Served};
use crate::fabric::Source;

/// What a session shared, for its share to end with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum SharedObject {
    /// An allocation, by its context and base address.
    Memory(usize, DevicePtr),
    Event(Id),
}

/// The driver's IPC handle of a shared object: given to the servers that present its ticket.
struct IpcHandle(Vec<u8>);

impl Source for IpcHandle {
    fn ready(&self) -> Result<bool, String> {
        Ok(true)
    }

    fn read(&self, _: u64, _: u64, _: crate::fabric::Send) -> Result<(), String> {
        Err("an IPC share is mapped, not read".into())
    }

    fn handle(&self) -> Option<(Vec<u8>, u64)> {
        Some((self.0.clone(), 0))
    }

    fn readable(&self) -> bool {
        false
    }
}

fn bytes_of(reserved: &[std::ffi::c_char; 64]) -> Vec<u8> {
    reserved.iter().map(|&b| b as u8).collect()
}

fn reserved_of(bytes: &[u8]) -> Result<[std::ffi::c_char; 64], Status> {
    let raw: [u8; 64] = bytes.try_into().map_err(|_| INVALID_VALUE)?;
    Ok(raw.map(|b| b as std::ffi::c_char))
}

impl Served<'_> {
    /// The ticket of `object`'s share, sharing it (with the driver's handle `handle`) the
    /// first time.
    fn share(
        &mut self,
        object: SharedObject,
        handle: impl FnOnce(&mut Self) -> Result<Vec<u8>, Status>,
    ) -> Answer<LaneKey> {
        if let Some(ticket) = self.cuda.ipc_shares.get(&object) {
            return Ok(*ticket);
        }
        let handle = handle(self)?;
        let ticket = rgpu_transport::random_lane_key();
        let session = &self.session;
        session
            .shared
            .fabric
            .add_lasting(session.id, ticket, Box::new(IpcHandle(handle)))
            .map_err(|e| {
                log::warn!("session {}: {e}", session.id);
                INVALID_VALUE
            })?;
        self.cuda.ipc_shares.insert(object, ticket);
        Ok(ticket)
    }

    /// Ends the share of `object`, if it was shared (its memory was freed, or it destroyed).
    pub(super) fn unshare(&mut self, object: SharedObject) {
        if let Some(ticket) = self.cuda.ipc_shares.remove(&object) {
            let session = &self.session;
            session.shared.fabric.remove(session.id, &ticket);
        }
    }

    /// The driver's IPC handle of another session's share `from`, asked of its session over
    /// a fabric link (bounded by the link's timeouts).
    fn shared_handle(&self, from: &PeerExport) -> Result<Vec<u8>, Status> {
        let id = self.session.id;
        let links = super::peers::fabric_links(&self.session.shared).map_err(|e| {
            log::warn!("session {id}: {e}");
            INVALID_VALUE
        })?;
        match links.handles(&[from]).pop() {
            Some(Ok(Some(shared))) => Ok(shared.handle),
            Some(Ok(None)) => {
                log::warn!("session {id}: an IPC handle was refused (not shared, or withdrawn)");
                Err(INVALID_VALUE)
            }
            Some(Err(e)) => {
                log::warn!("session {id}: asking for an IPC handle: {e}");
                Err(INVALID_VALUE)
            }
            None => Err(INVALID_VALUE),
        }
    }
}

impl serve::Ipc for Served<'_> {
    fn ipc_share_memory(&mut self, ctx: Id, ptr: DevicePtr) -> Answer<LaneKey> {
        self.cuda.enter(ctx)?;
        let driver = &self.cuda.backend.driver;
        let (mut base, mut len) = (0u64, 0usize);
        // SAFETY: local out-values; the driver checks the address.
        check(unsafe { cu_call!(driver, cuMemGetAddressRange_v2(&mut base, &mut len, ptr)) })?;
        let object = SharedObject::Memory(self.cuda.current as usize, base);
        self.share(object, |served| {
            // SAFETY: plain bytes, valid zeroed.
            let mut handle: CUipcMemHandle = unsafe { std::mem::zeroed() };
            let driver = &served.cuda.backend.driver;
            // SAFETY: a local out-struct and an allocation's base in the current context.
            check(unsafe { cu_call!(driver, cuIpcGetMemHandle(&mut handle, base)) })?;
            Ok(bytes_of(&handle.reserved))
        })
    }

    fn ipc_share_event(&mut self, event: Id) -> Answer<LaneKey> {
        let raw = self.cuda.event(event)?;
        self.share(SharedObject::Event(event), |served| {
            // SAFETY: plain bytes, valid zeroed.
            let mut handle: CUipcEventHandle = unsafe { std::mem::zeroed() };
            let driver = &served.cuda.backend.driver;
            // SAFETY: a local out-struct and a live event of the session; the driver checks
            // that it was made for IPC.
            check(unsafe { cu_call!(driver, cuIpcGetEventHandle(&mut handle, raw)) })?;
            Ok(bytes_of(&handle.reserved))
        })
    }

    fn ipc_open_memory(&mut self, ctx: Id, from: PeerExport, flags: u32) -> Answer<IpcMapping> {
        self.cuda.enter(ctx)?;
        let handle = CUipcMemHandle {
            reserved: reserved_of(&self.shared_handle(&from)?)?,
        };
        let driver = &self.cuda.backend.driver;
        let mut ptr = 0u64;
        // SAFETY: a handle by value and a local out-value; the driver checks the handle.
        check(unsafe { cu_call!(driver, cuIpcOpenMemHandle_v2(&mut ptr, handle, flags)) })?;
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: local out-values; the address was just mapped.
        check(unsafe { cu_call!(driver, cuMemGetAddressRange_v2(&mut base, &mut size, ptr)) })?;
        self.cuda.ipc_mappings.insert(ptr, self.cuda.current);
        Ok(IpcMapping {
            ptr,
            size: size as u64,
        })
    }

    fn ipc_close_memory(&mut self, ctx: Id, ptr: DevicePtr) -> Status {
        let cuda = &mut *self.cuda;
        let closed = cuda.enter(ctx).and_then(|()| {
            if !cuda.ipc_mappings.contains_key(&ptr) {
                return Err(INVALID_VALUE);
            }
            // SAFETY: a mapping this session opened; the driver checks it.
            check(unsafe { cu_call!(cuda.backend.driver, cuIpcCloseMemHandle(ptr)) })
        });
        if closed.is_ok() {
            cuda.ipc_mappings.remove(&ptr);
        }
        code(closed)
    }

    fn ipc_open_event(&mut self, ctx: Id, id: Id, from: PeerExport) -> Status {
        if self.cuda.events.contains_key(&id) {
            return INVALID_HANDLE;
        }
        let opened = self.cuda.enter(ctx).and_then(|()| {
            let handle = CUipcEventHandle {
                reserved: reserved_of(&self.shared_handle(&from)?)?,
            };
            let cuda = &mut *self.cuda;
            let raw = cuda.create_in(ctx, |cuda, raw| {
                // SAFETY: a handle by value and a local out-value; the driver checks the handle.
                check(unsafe { cu_call!(cuda.backend.driver, cuIpcOpenEventHandle(raw, handle)) })
            })?;
            let event = owned::Event::new(raw, cuda.current, &cuda.backend);
            cuda.events.insert(id, event);
            Ok(())
        });
        code(opened)
    }
}
