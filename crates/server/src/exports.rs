//! Device memory moved between servers, for MPI transfers between ranks whose GPUs are on
//! different servers (docs/mpi.md). The sending rank's session *exports* a range: the server
//! notes how to read it and hands back a random ticket. The receiving rank's server *pulls* it:
//! it connects to the exporting server as a data lane of the exporting session whose key is
//! the ticket ([`PEER_PULL_LANE`]), authenticated like any connection (the cluster's token),
//! and the exporting server streams the range's bytes, which the puller writes to its device.
//! A ticket works once; exports end with their session. The pulling side is
//! `rgpu_transport::peer::pull` (servers use it, and clients pulling into host memory).

use std::collections::HashMap;
use std::io::Write;
use std::sync::Mutex;

use rgpu_protocol::{LaneAttach, LaneKey};
use rgpu_transport::peer::{self, read_byte, send_byte, IPC_HANDLE_BYTES, PEER_TIMEOUT};
use rgpu_transport::{random_lane_key, ClientSecurity, Stream, TlsConnector};

use crate::lanes::keys_match;

/// Bytes read from the device at a time.
const CHUNK: usize = peer::CHUNK;

/// Reads `buf.len()` bytes of an export from byte `offset` of its range.
pub(crate) type ReadChunk = Box<dyn FnMut(u64, &mut [u8]) -> Result<(), String> + Send>;

struct Export {
    session: u64,
    size: u64,
    read: ReadChunk,
    /// CUDA: the IPC handle of the range's allocation and the range's offset in it, handed
    /// only to a puller that presented the ticket and asks for it (a server on this machine).
    ipc: Option<([u8; IPC_HANDLE_BYTES], u64)>,
}

/// The exports of the sessions this process serves.
#[derive(Default)]
pub(crate) struct ExportRegistry {
    exports: Mutex<HashMap<LaneKey, Export>>,
}

impl ExportRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<LaneKey, Export>> {
        self.exports.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes an export of `size` bytes by `session` (with its allocation's IPC handle and the
    /// range's offset there, for CUDA memory the driver can share): its ticket.
    pub fn add(
        &self,
        session: u64,
        size: u64,
        read: ReadChunk,
        ipc: Option<([u8; IPC_HANDLE_BYTES], u64)>,
    ) -> LaneKey {
        let ticket = random_lane_key();
        self.lock().insert(
            ticket,
            Export {
                session,
                size,
                read,
                ipc,
            },
        );
        ticket
    }

    /// Withdraws an export (nothing when it was pulled already).
    pub fn remove(&self, session: u64, ticket: &LaneKey) {
        let mut exports = self.lock();
        if exports.get(ticket).is_some_and(|e| e.session == session) {
            exports.remove(ticket);
        }
    }

    /// Forgets the exports of a session that ended.
    pub fn forget_session(&self, session: u64) {
        self.lock().retain(|_, e| e.session != session);
    }

    /// A puller's connection (`attach` came with its authenticated handshake): serves the
    /// export its ticket names on a thread of its own, once the puller says it has the
    /// handshake's welcome (its first byte), then closes. An export whose streaming fails is kept,
    /// so that the puller may try again another way.
    pub fn serve(
        self: &std::sync::Arc<Self>,
        attach: &LaneAttach,
        stream: &Stream,
    ) -> Result<(), String> {
        let refused = || "no such export on this server".to_string();
        let (ticket, export) = {
            let mut exports = self.lock();
            let ticket = exports
                .iter()
                .find(|(ticket, e)| e.session == attach.session && keys_match(ticket, &attach.key))
                .map(|(ticket, _)| *ticket)
                .ok_or_else(refused)?;
            (ticket, exports.remove(&ticket).ok_or_else(refused)?)
        };
        let mut stream = stream.try_clone().map_err(|e| e.to_string())?;
        let registry = self.clone();
        std::thread::Builder::new()
            .name("rgpu-export".into())
            .spawn(move || {
                let mut export = export;
                match stream_export(&mut stream, &mut export) {
                    Ok(()) => {}
                    Err(e) => {
                        log::warn!("export of session {}: {e}", export.session);
                        registry.lock().insert(ticket, export);
                    }
                }
                stream.shutdown();
            })
            .map_err(|e| format!("cannot start an export thread: {e}"))?;
        Ok(())
    }
}

/// Serves a puller (the dialogue of `rgpu_transport::peer`): the IPC handle when it asks for
/// one and it does the copy, else the export's bytes.
fn stream_export(stream: &mut Stream, export: &mut Export) -> Result<(), String> {
    let failed = |e: std::io::Error| format!("the puller: {e}");
    stream
        .set_read_timeout(Some(PEER_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(PEER_TIMEOUT)))
        .map_err(failed)?;
    if read_byte(stream).map_err(failed)? == peer::IPC {
        match &export.ipc {
            Some((handle, offset)) => {
                stream
                    .write_all(&[peer::HANDLE])
                    .and_then(|()| stream.write_all(handle))
                    .and_then(|()| stream.write_all(&offset.to_le_bytes()))
                    .and_then(|()| stream.flush())
                    .map_err(failed)?;
                if read_byte(stream).map_err(failed)? == peer::COPIED {
                    return Ok(());
                }
            }
            None => send_byte(stream, peer::NO_HANDLE).map_err(failed)?,
        }
    }
    let mut buffer = vec![0u8; CHUNK.min(export.size as usize).max(1)];
    let mut offset = 0u64;
    while offset < export.size {
        let n = (export.size - offset).min(buffer.len() as u64) as usize;
        (export.read)(offset, &mut buffer[..n]).map_err(|e| format!("reading the device: {e}"))?;
        stream
            .write_all(&buffer[..n])
            .map_err(|e| format!("sending to the puller: {e}"))?;
        offset += n as u64;
    }
    stream.flush().map_err(|e| e.to_string())
}

/// Pulls another server's export into this server's device memory (`write` takes each chunk
/// and its offset), authenticated with this server's token: the servers of a cluster share
/// one. Plaintext, or TLS where the exporting server offers it and the platform trusts it.
pub(crate) fn pull(
    from: &rgpu_protocol::PeerExport,
    size: u64,
    token: Option<&rgpu_transport::Token>,
    ipc: Option<peer::IpcCopy>,
    write: impl FnMut(u64, &[u8]) -> Result<(), String>,
) -> Result<(), String> {
    static TLS: std::sync::OnceLock<Result<TlsConnector, String>> = std::sync::OnceLock::new();
    let tls = TLS
        .get_or_init(|| TlsConnector::new(&ClientSecurity::default()))
        .as_ref()
        .map_err(|e| e.clone())?;
    peer::pull(from, size, token, tls, "rgpu server (pull)", ipc, write)
}
