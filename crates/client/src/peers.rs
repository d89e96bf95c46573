//! The C form of an export (rgpu_protocol::PeerExport) that rgpu's MPI interposer carries
//! between ranks (`struct rgpu_export` in mpi/rgpu_mpi.c): the client libraries fill it when a
//! rank exports a buffer and read it when a rank pulls one.

use std::ffi::c_char;

use rgpu_protocol::PeerExport;

use std::sync::OnceLock;

use rgpu_transport::peer::{Links, PullSink, Receive};

use crate::Connection;

/// Bytes for the exporting server's address, NUL-terminated.
pub const ENDPOINT_BYTES: usize = 256;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ExportRecord {
    pub endpoint: [c_char; ENDPOINT_BYTES],
    pub session: u64,
    pub ticket: [u8; 32],
}

impl ExportRecord {
    /// The record of an export made on `conn`'s session; `None` when the address does not fit.
    pub fn new(conn: &Connection, ticket: [u8; 32]) -> Option<ExportRecord> {
        let endpoint = conn.endpoint().to_string();
        if endpoint.len() >= ENDPOINT_BYTES {
            return None;
        }
        let mut record = ExportRecord {
            endpoint: [0; ENDPOINT_BYTES],
            session: conn.session_id(),
            ticket,
        };
        for (to, &from) in record.endpoint.iter_mut().zip(endpoint.as_bytes()) {
            *to = from as c_char;
        }
        Some(record)
    }

    /// The export it names (`None`: an address that is not text).
    pub fn export(&self) -> Option<PeerExport> {
        let len = self.endpoint.iter().position(|&c| c == 0)?;
        let bytes: Vec<u8> = self.endpoint[..len].iter().map(|&c| c as u8).collect();
        Some(PeerExport {
            endpoint: String::from_utf8(bytes).ok()?,
            session: self.session,
            ticket: self.ticket,
        })
    }
}

/// Pulls the export `record` describes straight into host memory (`dst`, its size bytes),
/// authenticated and secured as this process's connections are (RGPU_TOKEN*, RGPU_TLS*): for
/// a rank receiving into host memory, or whose own server cannot reach the exporting one.
/// The process's links to exporting servers are kept for later pulls.
pub fn pull_to_host(record: &ExportRecord, dst: &mut [u8]) -> Result<(), String> {
    static LINKS: OnceLock<Result<Links, String>> = OnceLock::new();
    let export = record
        .export()
        .ok_or("an export record without an address")?;
    let links = LINKS
        .get_or_init(|| {
            let config = crate::ClientConfig::from_env()?;
            Ok(Links::new(config.token, config.tls, "rgpu client (pull)"))
        })
        .as_ref()
        .map_err(|e| e.clone())?;
    let size = dst.len() as u64;
    let sink = HostSink {
        start: dst.as_mut_ptr() as usize,
        len: dst.len(),
    };
    log::debug!(
        "pulling {size} bytes from {} into host memory",
        export.endpoint
    );
    let started = std::time::Instant::now();
    let pulled = links.pull(&export, size, &sink);
    log::debug!(
        "pulled {size} bytes from {} in {} us: {pulled:?}",
        export.endpoint,
        started.elapsed().as_micros()
    );
    pulled
}

/// Host memory that parts of a pull fill, from several threads, each its own range.
struct HostSink {
    start: usize,
    len: usize,
}

impl PullSink for HostSink {
    fn part(&self, offset: u64, len: u64, receive: Receive) -> Result<(), String> {
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= self.len as u64);
        let Some(end) = end else {
            return Err("a part past the end of its buffer".into());
        };
        // SAFETY: `pull_to_host` borrows the whole buffer mutably for the pull, and its parts
        // are disjoint ranges inside it.
        let part = unsafe {
            std::slice::from_raw_parts_mut(
                (self.start + offset as usize) as *mut u8,
                (end - offset) as usize,
            )
        };
        receive(part)
    }
}
