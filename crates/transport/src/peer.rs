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
}

/// What an exporter said of an allocation's IPC handle; `None`: it has none to share.
pub type HandleAnswer = Result<Option<Shareable>, String>;

/// An exported range's allocation, to be mapped through its IPC handle.
#[derive(Clone, Debug)]
pub struct Shareable {
    pub handle: Vec<u8>,
    /// The range's offset in the allocation.
    pub offset: u64,
    /// The range is ready and the export used up: copy it without [`Links::share`].
    pub ready: bool,
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

    /// The answer to a [`LinkRequest::Handle`]: the export's IPC handle and offset, ready or
    /// not (`None`: it has none).
    fn handle_answer(&mut self) -> Result<Option<Shareable>, String> {
        let shareable = |handle, offset, ready| Shareable {
            handle,
            offset,
            ready,
        };
        match self.answer()? {
            (LinkReply::Handle { handle, offset }, 0) => Ok(Some(shareable(handle, offset, false))),
            (LinkReply::HandleReady { handle, offset }, 0) => {
                Ok(Some(shareable(handle, offset, true)))
            }
            (LinkReply::Refused { .. }, 0) => Ok(None),
            (other, _) => Err(format!(
                "the exporter answered {other:?} to a handle request"
            )),
        }
    }

    /// Waits until the export is ready to be copied through its IPC handle: the range's
    /// offset in its allocation, `Ok(Err(..))` when the exporter refused (the link can be used
    /// again). After an offset the exporter waits for [`LinkRequest::Shared`].
    fn share(&mut self, export: &PeerExport) -> Result<Result<u64, String>, String> {
        self.send(&LinkRequest::Share {
            ticket: export.ticket,
        })?;
        match self.answer()? {
            (LinkReply::Handle { offset, .. }, 0) => Ok(Ok(offset)),
            (LinkReply::Refused { reason }, 0) => Ok(Err(reason)),
            (other, _) => Err(format!("the exporter answered {other:?} to a share")),
        }
    }
}

/// A copy through an export's IPC handle that the exporter has said is ready: it waits, on
/// this link, to hear whether the puller copied ([`Sharing::end`]), for at most
/// [`PEER_TIMEOUT`]. Dropped without `end`, the link closes and the export stays.
pub struct Sharing {
    link: Link,
    export: PeerExport,
}

impl Sharing {
    /// Tells the exporter whether the whole range was copied (the export is used up) and puts
    /// the link back in `links`' pool.
    pub fn end(mut self, links: &Links, copied: bool) -> Result<(), String> {
        self.link
            .send(&LinkRequest::Shared { copied })
            .map_err(|e| format!("{}: {e}", self.export.endpoint))?;
        links.give_back(&self.export, self.link);
        Ok(())
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

    /// Runs `body` on a link to the export's session, idle or new, and hands the link back
    /// with the result; a link that fails is dropped.
    fn on_link<T>(
        &self,
        export: &PeerExport,
        mut body: impl FnMut(&mut Link) -> Result<T, String>,
    ) -> Result<(T, Link), String> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&Self::key(export))
            .and_then(Vec::pop);
        let mut link = match idle {
            Some(mut link) => match body(&mut link) {
                Ok(value) => return Ok((value, link)),
                // Its exporter may have closed it while it was idle: once more on a new one.
                Err(e) => {
                    log::debug!("an idle fabric link failed ({e}); opening another");
                    self.open(export)?
                }
            },
            None => self.open(export)?,
        };
        let value = body(&mut link)?;
        Ok((value, link))
    }

    /// Runs `body` on a link to the export's session (see [`Links::on_link`]), which goes
    /// back to the pool afterwards.
    fn with_link<T>(
        &self,
        export: &PeerExport,
        body: impl FnMut(&mut Link) -> Result<T, String>,
    ) -> Result<T, String> {
        let (value, link) = self.on_link(export, body)?;
        self.give_back(export, link);
        Ok(value)
    }

    /// Tells the exporter that the bytes of `export` are in the puller's device memory now
    /// (for a landing: that the pusher copied them).
    pub fn delivered(&self, export: &PeerExport) -> Result<(), String> {
        self.tell(
            export,
            &LinkRequest::Delivered {
                ticket: export.ticket,
            },
        )
    }

    /// Tells a landing's server that the pusher could not copy into it: it pulls the bytes.
    pub fn pull_instead(&self, landing: &PeerExport) -> Result<(), String> {
        self.tell(
            landing,
            &LinkRequest::PullInstead {
                ticket: landing.ticket,
            },
        )
    }

    /// Sends a request that has no answer.
    fn tell(&self, export: &PeerExport, request: &LinkRequest) -> Result<(), String> {
        self.with_link(export, |link| link.send(request))
            .map_err(|e| format!("{}: {e}", export.endpoint))
    }

    /// The IPC handles of several exported allocations and each range's offset in its
    /// allocation, asked for before the exports are ready (`None`: the exporter has none to
    /// give), in the order of `exports`. The requests to one exporting session go out
    /// together on one link and are answered in turn: a round trip for the lot, not one each.
    pub fn handles(&self, exports: &[&PeerExport]) -> Vec<HandleAnswer> {
        let mut answers: Vec<Option<HandleAnswer>> = exports.iter().map(|_| None).collect();
        // The exports of each session, in order.
        let mut sessions: Vec<((String, u64), Vec<usize>)> = Vec::new();
        for (k, export) in exports.iter().enumerate() {
            let key = Self::key(export);
            match sessions.iter_mut().find(|(s, _)| *s == key) {
                Some((_, members)) => members.push(k),
                None => sessions.push((key, vec![k])),
            }
        }
        for (_, members) in sessions {
            let first = exports[members[0]];
            let asked = self.with_link(first, |link| {
                // One write for all the requests.
                for &k in &members {
                    let request = LinkRequest::Handle {
                        ticket: exports[k].ticket,
                    };
                    link.writer
                        .queue(&request, 0, &[])
                        .map_err(|e| format!("sending to the exporter: {e}"))?;
                }
                link.writer
                    .flush()
                    .map_err(|e| format!("sending to the exporter: {e}"))?;
                members
                    .iter()
                    .map(|_| link.handle_answer())
                    .collect::<Result<Vec<_>, String>>()
            });
            let asked: Vec<_> = match asked {
                Ok(each) => each.into_iter().map(Ok).collect(),
                Err(e) => members
                    .iter()
                    .map(|_| Err(format!("{}: {e}", first.endpoint)))
                    .collect(),
            };
            for (&k, answer) in members.iter().zip(asked) {
                answers[k] = Some(answer);
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err("no answer".into())))
            .collect()
    }

    /// Waits until `export` is ready to be copied through its IPC handle (mapped already,
    /// [`Links::handles`]): the copy may start, and the exporter waits to hear of its end.
    /// Returns the range's offset in its allocation; `Ok(None)`: the exporter refused.
    pub fn share(&self, export: &PeerExport) -> Result<Option<(Sharing, u64)>, String> {
        let (answer, link) = self
            .on_link(export, |link| link.share(export))
            .map_err(|e| format!("{}: {e}", export.endpoint))?;
        match answer {
            Ok(offset) => Ok(Some((
                Sharing {
                    link,
                    export: export.clone(),
                },
                offset,
            ))),
            Err(reason) => {
                log::debug!("{}: no IPC copy: {reason}", export.endpoint);
                self.give_back(export, link);
                Ok(None)
            }
        }
    }

    /// Pulls all `size` bytes of `export` into `sink`, striped over several links when large.
    /// Returns once every byte is in the sink.
    pub fn pull(&self, export: &PeerExport, size: u64, sink: &dyn PullSink) -> Result<(), String> {
        let at = |e: String| format!("{}: {e}", export.endpoint);
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
