//! The puller's side of the server-to-server fabric (`rgpu_protocol::fabric`): persistent
//! links to exporting sessions, kept in a pool and reused for every transfer, and pulls
//! striped over several of them. Servers pull into their devices; clients pull into host
//! memory.
//!
//! A link is opened once per (exporting server, session) and puller process: the handshake of
//! any connection (TLS where the platform asks for it, the cluster's token), presenting itself
//! as lane [`LINK_LANE`] of the exporting session with one of its live tickets as the key.
//! Each pull then costs one request frame; a large one is cut into contiguous parts pulled
//! over several links at once, each by its own thread, so several cores copy and (in TLS)
//! encrypt.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use rgpu_protocol::fabric::{LinkReply, LinkRequest, LINK_LANE};
use rgpu_protocol::{LaneAttach, PeerExport};

use crate::{client_handshake, Endpoint, FrameReader, FrameWriter, Stream, TlsConnector, Token};

/// How long either side of a link waits for the other at each step: connecting, and every
/// frame (an exporter that is still waiting for its export says so more often than this).
pub const PEER_TIMEOUT: Duration = Duration::from_secs(30);
/// How often an exporter that waits for an export tells its puller it is still there.
pub const WAITING_EVERY: Duration = Duration::from_secs(2);
/// Pulls of at least this many bytes are striped over several links.
pub const STRIPE_MIN: u64 = 8 << 20;
/// The most links one pull is striped over (`RGPU_FABRIC_LINKS` sets another number).
pub const DEFAULT_STRIPES: usize = 4;
/// Idle links kept per exporting session: as many as a burst of stream-ordered copies keeps
/// busy at once (a link per pull waiting for its export, four per striped pull), so that the
/// next burst opens none.
const IDLE_PER_SESSION: usize = 32;

/// Receives the next `buf.len()` bytes of a part from its link.
pub type Receive<'a> = &'a mut dyn FnMut(&mut [u8]) -> Result<(), String>;

/// Where pulled bytes go. Parts of one pull are taken by several threads at once.
pub trait PullSink: Sync {
    /// Takes bytes `[offset, offset + len)` of the pull, read in order with `receive`.
    fn part(&self, offset: u64, len: u64, receive: Receive) -> Result<(), String>;

    /// Copies the whole pull through the exported allocation, now that the export is ready:
    /// mapped already through its CUDA IPC handle (asked for with [`Links::handle`]; the
    /// answer that the export is ready carries none); false when it cannot.
    fn copy_shared(&self, _handle: &[u8], _offset: u64) -> bool {
        false
    }
}

/// One open link.
struct Link {
    reader: FrameReader<Stream>,
    writer: FrameWriter<Stream>,
}

impl Link {
    fn open(
        export: &PeerExport,
        token: Option<&Token>,
        tls: &TlsConnector,
        who: &str,
    ) -> Result<Link, String> {
        let endpoint =
            Endpoint::parse(&export.endpoint).map_err(|e| format!("{}: {e}", export.endpoint))?;
        let stream =
            Stream::connect(&endpoint, PEER_TIMEOUT).map_err(|e| format!("{endpoint}: {e}"))?;
        let attach = LaneAttach {
            session: export.session,
            key: export.ticket,
            index: LINK_LANE,
        };
        let (stream, _) = client_handshake(stream, tls, &endpoint, token, who, Some(attach))
            .map_err(|e| format!("{endpoint}: {e}"))?;
        let failed = |e: std::io::Error| format!("{endpoint}: {e}");
        stream
            .set_read_timeout(Some(PEER_TIMEOUT))
            .and_then(|()| stream.set_write_timeout(Some(PEER_TIMEOUT)))
            .and_then(|()| stream.set_liveness(PEER_TIMEOUT))
            .map_err(failed)?;
        let reader = FrameReader::new(stream.try_clone().map_err(failed)?);
        Ok(Link {
            reader,
            writer: FrameWriter::new(stream),
        })
    }

    fn send(&mut self, request: &LinkRequest) -> Result<(), String> {
        self.writer
            .send(request, 0, &[])
            .map_err(|e| format!("sending to the exporter: {e}"))
    }

    /// The exporter's next answer other than [`LinkReply::Waiting`], with its bulk length.
    fn answer(&mut self) -> Result<(LinkReply, u64), String> {
        loop {
            let (header, reply) = self
                .reader
                .read_message::<LinkReply>()
                .map_err(|e| format!("the exporter: {e}"))?;
            if reply != LinkReply::Waiting {
                return Ok((reply, header.bulk_len));
            }
        }
    }

    /// Pulls bytes `[offset, offset + len)` of the export into `sink`. `Ok(Err(..))`: the
    /// exporter refused, and the link can be used again.
    fn pull_part(
        &mut self,
        export: &PeerExport,
        offset: u64,
        len: u64,
        sink: &dyn PullSink,
    ) -> Result<Result<(), String>, String> {
        self.send(&LinkRequest::Pull {
            ticket: export.ticket,
            offset,
            len,
        })?;
        match self.answer()? {
            (LinkReply::Bytes, bulk) if bulk == len => {}
            (LinkReply::Refused { reason }, 0) => return Ok(Err(reason)),
            (other, _) => return Err(format!("the exporter answered {other:?} to a pull")),
        }
        let reader = &mut self.reader;
        let mut received = 0u64;
        let mut receive = |buf: &mut [u8]| {
            received += buf.len() as u64;
            if received > len {
                return Err("a part read past its length".to_string());
            }
            reader
                .read_bulk(buf)
                .map_err(|e| format!("the export ended early: {e}"))
        };
        sink.part(offset, len, &mut receive)?;
        if received != len {
            return Err(format!(
                "a part took {received} of its {len} bytes; the link is out of step"
            ));
        }
        Ok(Ok(()))
    }

    /// The export's IPC handle and offset now, ready or not (`None`: it has none).
    fn handle(&mut self, export: &PeerExport) -> Result<Option<(Vec<u8>, u64)>, String> {
        self.send(&LinkRequest::Handle {
            ticket: export.ticket,
        })?;
        match self.answer()? {
            (LinkReply::Handle { handle, offset }, 0) => Ok(Some((handle, offset))),
            (LinkReply::Refused { .. }, 0) => Ok(None),
            (other, _) => Err(format!(
                "the exporter answered {other:?} to a handle request"
            )),
        }
    }

    /// Asks for the export's IPC handle and copies through it: whether it did.
    fn share(&mut self, export: &PeerExport, sink: &dyn PullSink) -> Result<bool, String> {
        self.send(&LinkRequest::Share {
            ticket: export.ticket,
        })?;
        match self.answer()? {
            (LinkReply::Handle { handle, offset }, 0) => {
                let copied = sink.copy_shared(&handle, offset);
                self.send(&LinkRequest::Shared { copied })?;
                Ok(copied)
            }
            (LinkReply::Refused { .. }, 0) => Ok(false),
            (other, _) => Err(format!("the exporter answered {other:?} to a share")),
        }
    }
}

/// A process's links to exporting sessions, reused across pulls.
pub struct Links {
    idle: Mutex<HashMap<(String, u64), Vec<Link>>>,
    token: Option<Token>,
    tls: TlsConnector,
    who: String,
}

impl Links {
    /// Links that authenticate with `token` and secure themselves as `tls` says; `who`: how the
    /// puller introduces itself.
    pub fn new(token: Option<Token>, tls: TlsConnector, who: &str) -> Links {
        Links {
            idle: Mutex::new(HashMap::new()),
            token,
            tls,
            who: who.to_string(),
        }
    }

    fn key(export: &PeerExport) -> (String, u64) {
        (export.endpoint.clone(), export.session)
    }

    fn open(&self, export: &PeerExport) -> Result<Link, String> {
        Link::open(export, self.token.as_ref(), &self.tls, &self.who)
    }

    fn give_back(&self, export: &PeerExport, link: Link) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let links = idle.entry(Self::key(export)).or_default();
        if links.len() < IDLE_PER_SESSION {
            links.push(link);
        }
    }

    /// Runs `body` on a link to the export's session, idle or new; a link that fails is dropped.
    fn with_link<T>(
        &self,
        export: &PeerExport,
        mut body: impl FnMut(&mut Link) -> Result<T, String>,
    ) -> Result<T, String> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&Self::key(export))
            .and_then(Vec::pop);
        let mut link = match idle {
            Some(mut link) => match body(&mut link) {
                Ok(value) => {
                    self.give_back(export, link);
                    return Ok(value);
                }
                // Its exporter may have closed it while it was idle: once more on a new one.
                Err(e) => {
                    log::debug!("an idle fabric link failed ({e}); opening another");
                    self.open(export)?
                }
            },
            None => self.open(export)?,
        };
        let value = body(&mut link)?;
        self.give_back(export, link);
        Ok(value)
    }

    /// Tells the exporter that the bytes of `export` are in the puller's device memory now.
    pub fn delivered(&self, export: &PeerExport) -> Result<(), String> {
        self.with_link(export, |link| {
            link.send(&LinkRequest::Delivered {
                ticket: export.ticket,
            })
        })
        .map_err(|e| format!("{}: {e}", export.endpoint))
    }

    /// The IPC handle of the exported allocation and the range's offset in it, asked for
    /// before the export is ready (`None`: the exporter has none to give).
    pub fn handle(&self, export: &PeerExport) -> Result<Option<(Vec<u8>, u64)>, String> {
        self.with_link(export, |link| link.handle(export))
            .map_err(|e| format!("{}: {e}", export.endpoint))
    }

    /// Pulls all `size` bytes of `export` into `sink`: through the exported allocation's IPC
    /// handle when `share` and the sink can use it, else the bytes, striped over several links
    /// when large. Returns once every byte is in the sink.
    pub fn pull(
        &self,
        export: &PeerExport,
        size: u64,
        share: bool,
        sink: &dyn PullSink,
    ) -> Result<(), String> {
        let at = |e: String| format!("{}: {e}", export.endpoint);
        if share
            && self
                .with_link(export, |link| link.share(export, sink))
                .map_err(at)?
        {
            return Ok(());
        }
        let parts = plan(size);
        let pull_one = |offset: u64, len: u64| {
            self.with_link(export, |link| link.pull_part(export, offset, len, sink))
                .and_then(|refused| refused)
                .map_err(at)
        };
        if parts.len() <= 1 {
            return pull_one(0, size);
        }
        std::thread::scope(|scope| {
            let threads: Vec<_> = parts
                .iter()
                .skip(1)
                .map(|&(offset, len)| scope.spawn(move || pull_one(offset, len)))
                .collect();
            let first = pull_one(parts[0].0, parts[0].1);
            threads
                .into_iter()
                .map(|t| {
                    t.join()
                        .unwrap_or_else(|_| Err("a pulling thread panicked".into()))
                })
                .fold(first, |all, one| all.and(one))
        })
    }
}

/// The contiguous parts a pull of `size` bytes is cut into, each pulled over a link of its own
/// ([`PullSink::part`] is called once for each). Exporters and pullers both plan by it (an
/// exporting stream reads the parts in step with the puller): the servers of a cluster share
/// their `RGPU_FABRIC_LINKS`.
pub fn plan(size: u64) -> Vec<(u64, u64)> {
    static STRIPES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let stripes = *STRIPES.get_or_init(|| {
        std::env::var("RGPU_FABRIC_LINKS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or(DEFAULT_STRIPES)
            .min(16)
    });
    parts(size, stripes)
}

/// The contiguous parts a pull of `size` bytes is cut into: one below [`STRIPE_MIN`], else up
/// to `stripes` of at least half of it, on 1 MiB boundaries.
fn parts(size: u64, stripes: usize) -> Vec<(u64, u64)> {
    const ALIGN: u64 = 1 << 20;
    if size < STRIPE_MIN || stripes <= 1 {
        return vec![(0, size)];
    }
    let count = (size / (STRIPE_MIN / 2)).clamp(1, stripes as u64);
    let each = size.div_ceil(count).div_ceil(ALIGN) * ALIGN;
    (0..count)
        .map(|i| (i * each, (size.saturating_sub(i * each)).min(each)))
        .filter(|&(_, len)| len > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_pulls_take_one_link_and_large_ones_are_cut_on_mebibytes() {
        assert_eq!(parts(0, 4), vec![(0, 0)]);
        assert_eq!(parts(STRIPE_MIN - 1, 4), vec![(0, STRIPE_MIN - 1)]);
        assert_eq!(parts(64 << 20, 1), vec![(0, 64 << 20)]);
        let cut = parts((256 << 20) + 5, 4);
        assert_eq!(cut.len(), 4);
        assert_eq!(cut.iter().map(|p| p.1).sum::<u64>(), (256 << 20) + 5);
        for window in cut.windows(2) {
            assert_eq!(window[0].0 + window[0].1, window[1].0);
            assert_eq!(window[1].0 % (1 << 20), 0);
        }
        // Just above the threshold: two halves.
        assert_eq!(parts(STRIPE_MIN, 4).len(), 2);
    }
}
