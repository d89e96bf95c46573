//! Pulling another server's export (device memory a session of it made readable once, for
//! MPI transfers between servers: docs/mpi.md): a connection to the exporting server that
//! presents itself as a data lane of the exporting session whose key is the export's ticket
//! ([`PEER_PULL_LANE`]), authenticated like any connection, then the export's bytes. Servers
//! pull into their devices; clients pull into host memory.

use std::io::{Read, Write};
use std::time::Duration;

use rgpu_protocol::{LaneAttach, PeerExport, PEER_PULL_LANE};

use crate::{client_handshake, Endpoint, Stream, TlsConnector, Token};

/// Bytes moved at a time.
pub const CHUNK: usize = 8 << 20;
/// How long a pull may wait for the exporting server: to connect, and for each chunk.
const PEER_TIMEOUT: Duration = Duration::from_secs(30);

/// Pulls `size` bytes of `from` (another server's export), calling `write` with each chunk and
/// its offset. `token`: the token the exporting server asks for (a server's own: the servers
/// of a cluster share one); `who`: how the puller introduces itself.
pub fn pull(
    from: &PeerExport,
    size: u64,
    token: Option<&Token>,
    tls: &TlsConnector,
    who: &str,
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
    // The go-ahead: the welcome has arrived, so what follows is the export's bytes.
    stream
        .write_all(&[1])
        .and_then(|()| stream.flush())
        .map_err(|e| format!("{endpoint}: {e}"))?;
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
