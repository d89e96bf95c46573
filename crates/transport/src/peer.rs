//! Pulling another server's export (device memory a session of it made readable once, for
//! MPI transfers between servers: docs/mpi.md): a connection to the exporting server that
//! presents itself as a data lane of the exporting session whose key is the export's ticket
//! ([`PEER_PULL_LANE`]), authenticated like any connection, then the export's bytes. Servers
//! pull into their devices; clients pull into host memory.
//!
//! After the handshake the puller sends one byte: [`BYTES`] (send the bytes) or [`IPC`]
//! (the puller is a server on this machine: hand over the CUDA IPC handle of the exported
//! allocation if there is one). To `IPC` the exporter answers [`NO_HANDLE`] (the bytes follow)
//! or [`HANDLE`] followed by the 64-byte handle and the little-endian offset of the range in
//! the allocation; the puller then answers [`COPIED`] (done) or [`NOT_COPIED`] (the bytes
//! follow). The handle thus only ever goes to a server that presented the ticket.

use std::io::{Read, Write};
use std::time::Duration;

use rgpu_protocol::{LaneAttach, PeerExport, PEER_PULL_LANE};

use crate::{client_handshake, Endpoint, Stream, TlsConnector, Token};

/// Bytes moved at a time.
pub const CHUNK: usize = 8 << 20;
/// How long either side of a pull waits for the other: to connect, and for each step.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(30);
/// The bytes of a CUDA IPC handle.
pub const IPC_HANDLE_BYTES: usize = 64;

/// The puller's first byte: the bytes, please.
pub const BYTES: u8 = 1;
/// The puller's first byte: the IPC handle, if there is one.
pub const IPC: u8 = 2;
/// The exporter's answer to [`IPC`]: no handle, the bytes follow.
pub const NO_HANDLE: u8 = 0;
/// The exporter's answer to [`IPC`]: the handle and the offset follow.
pub const HANDLE: u8 = 1;
/// The puller's answer to a handle: it copied the range.
pub const COPIED: u8 = 1;
/// The puller's answer to a handle: it could not; the bytes, please.
pub const NOT_COPIED: u8 = 0;

/// Copies an export through its allocation's IPC handle and the range's offset there; false
/// when it cannot (another machine's handle, memory the driver will not share).
pub type IpcCopy<'a> = &'a mut dyn FnMut(&[u8; IPC_HANDLE_BYTES], u64) -> bool;

/// Pulls `size` bytes of `from` (another server's export), calling `write` with each chunk and
/// its offset, or, where `ipc` is given and the exporter has a handle it can use, through
/// `ipc`. `token`: the token the exporting server asks for (a server's own: the servers of a
/// cluster share one); `who`: how the puller introduces itself.
pub fn pull(
    from: &PeerExport,
    size: u64,
    token: Option<&Token>,
    tls: &TlsConnector,
    who: &str,
    ipc: Option<IpcCopy>,
    mut write: impl FnMut(u64, &[u8]) -> Result<(), String>,
) -> Result<(), String> {
    let endpoint =
        Endpoint::parse(&from.endpoint).map_err(|e| format!("{}: {e}", from.endpoint))?;
    let stream =
        Stream::connect(&endpoint, PEER_TIMEOUT).map_err(|e| format!("{endpoint}: {e}"))?;
    stream
        .set_read_timeout(Some(PEER_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let attach = LaneAttach {
        session: from.session,
        key: from.ticket,
        index: PEER_PULL_LANE,
    };
    let (mut stream, _) = client_handshake(stream, tls, &endpoint, token, who, Some(attach))
        .map_err(|e| format!("{endpoint}: {e}"))?;
    let failed = |e: std::io::Error| format!("{endpoint}: {e}");
    stream
        .set_read_timeout(Some(PEER_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(PEER_TIMEOUT)))
        .map_err(failed)?;
    // The go-ahead (the welcome has arrived): what comes next is the exporter's.
    let first = if ipc.is_some() { IPC } else { BYTES };
    send_byte(&mut stream, first).map_err(failed)?;
    if let Some(copy) = ipc {
        if read_byte(&mut stream).map_err(failed)? == HANDLE {
            let mut handle = [0u8; IPC_HANDLE_BYTES];
            let mut offset = [0u8; 8];
            stream
                .read_exact(&mut handle)
                .and_then(|()| stream.read_exact(&mut offset))
                .map_err(failed)?;
            let copied = copy(&handle, u64::from_le_bytes(offset));
            send_byte(&mut stream, if copied { COPIED } else { NOT_COPIED }).map_err(failed)?;
            if copied {
                return Ok(());
            }
        }
    }
    let mut buffer = vec![0u8; CHUNK.min(size as usize).max(1)];
    let mut offset = 0u64;
    while offset < size {
        let n = (size - offset).min(buffer.len() as u64) as usize;
        stream.read_exact(&mut buffer[..n]).map_err(|e| {
            format!("{endpoint}: the export ended after {offset} of {size} bytes: {e}")
        })?;
        write(offset, &buffer[..n])?;
        offset += n as u64;
    }
    Ok(())
}

/// Writes one byte of the pull's dialogue.
pub fn send_byte(stream: &mut Stream, byte: u8) -> std::io::Result<()> {
    stream.write_all(&[byte])?;
    stream.flush()
}

/// Reads one byte of the pull's dialogue.
pub fn read_byte(stream: &mut Stream) -> std::io::Result<u8> {
    let mut byte = [0u8; 1];
    stream.read_exact(&mut byte)?;
    Ok(byte[0])
}
