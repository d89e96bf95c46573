//! Shareable handles of physical allocations and memory pools (`cuMemExportToShareableHandle`,
//! `cuMemPoolExportToShareableHandle` and their imports): NVIDIA's IPC samples, and programs
//! that share VMM or pool memory between processes, pass the driver's POSIX file descriptor to
//! another process (over a Unix socket) for it to import.
//!
//! A file descriptor cannot travel as bytes, and a client process must never hold the driver's
//! (it would map the memory itself, past the session). So the exporting worker *lodges* the
//! driver's descriptor with its share socket under a random 256-bit ticket, and its client
//! gets only the socket's name and the ticket, which it wraps in a descriptor of its own for
//! the program (crates/cuda/src/api/shareable.rs). The importing session's worker presents the
//! ticket on that socket and receives the driver's descriptor with SCM_RIGHTS, then imports it.
//!
//! The share socket is an abstract Unix socket with a random name, one per worker (so per
//! session), reachable from this machine's network namespace: only a server process of this
//! worker's user (or root) gets a descriptor, as only such a process can use one anyway, and
//! the connecting side checks the socket's owner likewise. Lodged descriptors live as long as
//! the exporting session (as the driver's live as long as the exporting process holds them).

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::socket::{
    connect, getsockopt, recvmsg, sendmsg, socket, sockopt, AddressFamily, ControlMessage,
    ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};
use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::{check, Status, INVALID_HANDLE, INVALID_VALUE};
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{serve, Answer, DevicePtr, Id, IpcMapping, MemProp, Pool, Shareable};
use rgpu_protocol::LaneKey;

use super::session::{code, Served, OUT_OF_MEMORY};

/// Share sockets' names: this prefix and 16 random bytes in hex.
const SOCKET_PREFIX: &str = "rgpu-share-";
/// How long one hand-over may take, on either side (both are processes of this machine).
const HAND_OVER_TIMEOUT: Duration = Duration::from_secs(5);
/// Descriptors one session may lodge (each export of a distinct allocation or pool).
const MAX_LODGED: usize = 4096;

/// What a session exported, for an object exported twice to give the same share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Exported {
    /// A physical allocation, by its id.
    Allocation(Id),
    Pool(Pool),
}

/// A worker's share socket and the descriptors lodged with it.
pub(crate) struct ShareSocket {
    name: [u8; 16],
    lodged: Arc<Mutex<HashMap<LaneKey, OwnedFd>>>,
}

impl ShareSocket {
    /// Binds a share socket of a random name and starts handing out its descriptors.
    pub(crate) fn open() -> Result<ShareSocket, String> {
        let key = rgpu_transport::random_lane_key();
        let name: [u8; 16] = key[..16].try_into().unwrap();
        let address = SocketAddr::from_abstract_name(socket_name(&name))
            .map_err(|e| format!("share socket name: {e}"))?;
        let listener =
            UnixListener::bind_addr(&address).map_err(|e| format!("share socket: {e}"))?;
        let lodged = Arc::new(Mutex::new(HashMap::new()));
        let serving = lodged.clone();
        std::thread::Builder::new()
            .name("rgpu-share-socket".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    let handed = stream
                        .map_err(|e| e.to_string())
                        .and_then(|stream| hand_out(stream, &serving));
                    if let Err(e) = handed {
                        log::debug!("share socket: {e}");
                    }
                }
            })
            .map_err(|e| format!("cannot start the share socket's thread: {e}"))?;
        Ok(ShareSocket { name, lodged })
    }

    /// This worker's share socket, opened on first use.
    fn of_this_worker() -> Result<&'static ShareSocket, Status> {
        static SOCKET: OnceLock<Result<ShareSocket, String>> = OnceLock::new();
        SOCKET.get_or_init(ShareSocket::open).as_ref().map_err(|e| {
            log::warn!("{e}");
            INVALID_VALUE
        })
    }

    /// Keeps `fd` for whoever presents the returned share's ticket.
    pub(crate) fn lodge(&self, fd: OwnedFd) -> Result<Shareable, Status> {
        let mut lodged = self.lodged.lock().unwrap();
        if lodged.len() >= MAX_LODGED {
            return Err(OUT_OF_MEMORY);
        }
        let ticket = rgpu_transport::random_lane_key();
        lodged.insert(ticket, fd);
        Ok(Shareable {
            socket: self.name,
            ticket,
        })
    }
}

/// The abstract socket name of a share socket.
fn socket_name(name: &[u8; 16]) -> String {
    let hex = hex::encode(name);
    format!("{SOCKET_PREFIX}{hex}")
}

/// Whether the peer of `socket` is a process of this process's user, or of root.
fn peer_is_ours(socket: &impl AsFd) -> Result<(), String> {
    let peer = getsockopt(socket, sockopt::PeerCredentials)
        .map_err(|e| format!("the peer's credentials: {e}"))?
        .uid();
    // SAFETY: a plain system call.
    let me = unsafe { libc::geteuid() };
    if peer == me || peer == 0 {
        Ok(())
    } else {
        Err(format!("a peer of uid {peer} (not {me} or root)"))
    }
}

/// Serves one connection of the share socket: a ticket in, a status byte out, with the
/// ticket's descriptor when it is lodged here.
fn hand_out(
    mut stream: UnixStream,
    lodged: &Mutex<HashMap<LaneKey, OwnedFd>>,
) -> Result<(), String> {
    let failed = |e: std::io::Error| e.to_string();
    stream
        .set_read_timeout(Some(HAND_OVER_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(HAND_OVER_TIMEOUT)))
        .map_err(failed)?;
    peer_is_ours(&stream)?;
    let mut ticket = [0u8; 32];
    stream.read_exact(&mut ticket).map_err(failed)?;
    // A duplicate, so that the table is not held while the peer is written to.
    let fd = match lodged.lock().unwrap().get(&ticket) {
        Some(fd) => fd.try_clone().map_err(failed)?,
        None => return stream.write_all(&[0]).map_err(failed),
    };
    let fds = [fd.as_raw_fd()];
    sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(&[1])],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map(drop)
    .map_err(|e| format!("sending a descriptor: {e}"))
}

/// The descriptor lodged under `from`'s ticket, from the share socket it names (bounded by
/// [`HAND_OVER_TIMEOUT`]).
pub(crate) fn fetch(from: &Shareable) -> Result<OwnedFd, String> {
    let address = UnixAddr::new_abstract(socket_name(&from.socket).as_bytes())
        .map_err(|e| format!("share socket name: {e}"))?;
    let socket = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .map_err(|e| format!("a socket: {e}"))?;
    // Non-blocking, so that a share socket too busy to take the connection is waited for
    // within the bound, not forever.
    let deadline = Instant::now() + HAND_OVER_TIMEOUT;
    loop {
        match connect(socket.as_raw_fd(), &address) {
            Ok(()) => break,
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR)
                if Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(nix::errno::Errno::ECONNREFUSED) => {
                return Err("no such share socket (its session ended?)".into())
            }
            Err(e) => return Err(format!("connecting to a share socket: {e}")),
        }
    }
    let mut stream = UnixStream::from(socket);
    let failed = |e: std::io::Error| e.to_string();
    stream.set_nonblocking(false).map_err(failed)?;
    stream
        .set_read_timeout(Some(HAND_OVER_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(HAND_OVER_TIMEOUT)))
        .map_err(failed)?;
    peer_is_ours(&stream)?;
    stream.write_all(&from.ticket).map_err(failed)?;
    let mut status = [0u8; 1];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(&mut status)];
    let msg = recvmsg::<()>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| format!("receiving a descriptor: {e}"))?;
    let mut fd = None;
    for cmsg in msg.cmsgs().map_err(|e| e.to_string())? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            for raw in fds {
                // SAFETY: the kernel just gave this process the descriptor.
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                fd.get_or_insert(owned);
            }
        }
    }
    fd.ok_or_else(|| "not shared (no such ticket, or withdrawn)".to_string())
}

impl Served<'_> {
    /// The share of `object`, lodging the driver's descriptor `export` gives the first time.
    fn share_once(
        &mut self,
        object: Exported,
        export: impl FnOnce(&mut Self) -> Result<OwnedFd, Status>,
    ) -> Answer<Shareable> {
        if let Some(share) = self.cuda.fd_shares.get(&object) {
            return Ok(*share);
        }
        let socket = ShareSocket::of_this_worker()?;
        let share = socket.lodge(export(self)?)?;
        self.cuda.fd_shares.insert(object, share);
        Ok(share)
    }

    /// The driver's descriptor another session shared as `from`.
    fn fetched(&self, from: &Shareable) -> Result<OwnedFd, Status> {
        fetch(from).map_err(|e| {
            log::warn!("session {}: a shareable handle: {e}", self.session.id);
            INVALID_VALUE
        })
    }
}

/// The POSIX descriptor kind of shareable handle, the one rgpu shares.
const POSIX_FD: CUmemAllocationHandleType =
    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// The descriptor a driver export call writes (as an `int`) through the pointer it is given.
fn exported_fd(export: impl FnOnce(*mut std::ffi::c_void) -> Status) -> Result<OwnedFd, Status> {
    let mut fd: i32 = -1;
    check(export((&mut fd as *mut i32).cast()))?;
    if fd < 0 {
        return Err(INVALID_VALUE);
    }
    // SAFETY: the driver just opened it for this process, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl serve::SharedHandles for Served<'_> {
    fn share_allocation(&mut self, ctx: Id, handle: Id) -> Answer<Shareable> {
        self.cuda.enter(ctx)?;
        let raw = *self.cuda.vmm_handles.get(&handle).ok_or(INVALID_HANDLE)?;
        self.share_once(Exported::Allocation(handle), |served| {
            let driver = &served.cuda.backend.driver;
            exported_fd(|out| {
                // SAFETY: an `int` out-value, as the POSIX descriptor type writes; a live
                // handle.
                unsafe { cu_call!(driver, cuMemExportToShareableHandle(out, raw, POSIX_FD, 0)) }
            })
        })
    }

    fn import_allocation(&mut self, ctx: Id, handle: Id, from: Shareable) -> Answer<MemProp> {
        self.cuda.enter(ctx)?;
        if self.cuda.vmm_handles.contains_key(&handle) {
            return Err(INVALID_HANDLE);
        }
        let fd = self.fetched(&from)?;
        let driver = &self.cuda.backend.driver;
        let mut raw = 0;
        let os_handle = fd.as_raw_fd() as usize as *mut std::ffi::c_void;
        // SAFETY: a local out-value and a descriptor this process holds (the driver takes
        // its own reference; ours closes when `fd` drops).
        check(unsafe {
            cu_call!(
                driver,
                cuMemImportFromShareableHandle(&mut raw, os_handle, POSIX_FD)
            )
        })?;
        // SAFETY: plain data, valid zeroed.
        let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
        // SAFETY: a local out-struct and the handle just imported.
        let got = check(unsafe {
            cu_call!(
                driver,
                cuMemGetAllocationPropertiesFromHandle(&mut prop, raw)
            )
        });
        if let Err(status) = got {
            // SAFETY: the handle just imported, released once.
            unsafe { cu_call!(driver, cuMemRelease(raw)) };
            return Err(status);
        }
        // Not charged: the memory is the exporter's, charged to its session.
        self.cuda.vmm_handles.insert(handle, raw);
        Ok(rgpu_cuda_api::wire::mem_prop(&prop))
    }

    fn share_pool(&mut self, pool: Pool) -> Answer<Shareable> {
        let raw = self.cuda.pool(pool)?;
        self.share_once(Exported::Pool(pool), |served| {
            let driver = &served.cuda.backend.driver;
            exported_fd(|out| {
                // SAFETY: an `int` out-value, as the POSIX descriptor type writes; a live pool.
                unsafe {
                    cu_call!(
                        driver,
                        cuMemPoolExportToShareableHandle(out, raw, POSIX_FD, 0)
                    )
                }
            })
        })
    }

    fn import_pool(&mut self, ctx: Id, id: Id, from: Shareable) -> Status {
        if self.cuda.mem_pools.contains_key(&id) {
            return INVALID_HANDLE;
        }
        let imported = self.cuda.enter(ctx).and_then(|()| {
            let fd = self.fetched(&from)?;
            let os_handle = fd.as_raw_fd() as usize as *mut std::ffi::c_void;
            self.cuda.create_pool_with(ctx, id, |cuda, raw| {
                // SAFETY: an out-pointer and a descriptor this process holds (the driver
                // takes its own reference).
                check(unsafe {
                    cu_call!(
                        cuda.backend.driver,
                        cuMemPoolImportFromShareableHandle(raw, os_handle, POSIX_FD, 0)
                    )
                })
            })
        });
        code(imported)
    }

    fn pool_export_pointer(&mut self, ctx: Id, ptr: DevicePtr) -> Answer<Vec<u8>> {
        self.cuda.enter(ctx)?;
        // SAFETY: plain bytes, valid zeroed.
        let mut data: CUmemPoolPtrExportData = unsafe { std::mem::zeroed() };
        let driver = &self.cuda.backend.driver;
        // SAFETY: a local out-struct; the driver checks the address.
        check(unsafe { cu_call!(driver, cuMemPoolExportPointer(&mut data, ptr)) })?;
        Ok(data.reserved.to_vec())
    }

    fn pool_import_pointer(&mut self, ctx: Id, pool: Pool, data: Vec<u8>) -> Answer<IpcMapping> {
        self.cuda.enter(ctx)?;
        let raw_pool = self.cuda.pool(pool)?;
        let bytes: [u8; 64] = data.as_slice().try_into().map_err(|_| INVALID_VALUE)?;
        let mut data = CUmemPoolPtrExportData { reserved: bytes };
        let driver = &self.cuda.backend.driver;
        let mut ptr = 0u64;
        // SAFETY: a local out-value and export data of the right size; the driver checks both
        // against the pool.
        check(unsafe {
            cu_call!(
                driver,
                cuMemPoolImportPointer(&mut ptr, raw_pool, &mut data)
            )
        })?;
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: local out-values; the address was just mapped.
        check(unsafe { cu_call!(driver, cuMemGetAddressRange_v2(&mut base, &mut size, ptr)) })?;
        // Freed like a stream-ordered allocation (and at the session's end if not before).
        self.cuda.async_allocations.insert(ptr, self.cuda.current);
        Ok(IpcMapping {
            ptr,
            size: size as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> (OwnedFd, OwnedFd) {
        nix::unistd::pipe().unwrap()
    }

    #[test]
    fn a_lodged_descriptor_goes_to_each_ticket_holder_and_only_to_them() {
        let socket = ShareSocket::open().unwrap();
        let (read_end, write_end) = pipe();
        let share = socket.lodge(write_end).unwrap();
        // Twice: a share is not used up (several processes import one allocation).
        for byte in [7u8, 9] {
            let fetched = fetch(&share).unwrap();
            nix::unistd::write(&fetched, &[byte]).unwrap();
            let mut got = [0u8; 1];
            nix::unistd::read(&read_end, &mut got).unwrap();
            assert_eq!(got, [byte], "the fetched descriptor is the lodged pipe");
        }
        let mut forged = share;
        forged.ticket[0] ^= 1;
        assert!(fetch(&forged).unwrap_err().contains("not shared"));
        let mut elsewhere = share;
        elsewhere.socket[0] ^= 1;
        assert!(fetch(&elsewhere)
            .unwrap_err()
            .contains("no such share socket"));
    }
}
