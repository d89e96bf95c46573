//! The rgpu wire protocol: message definitions shared by client and server, framing, the
//! connection preamble and the authentication math. No I/O lives here.
//!
//! A connection starts with a fixed [`Preamble`] each way, so that a version mismatch is found
//! before any message is decoded; it also says whether the connection continues in TLS. Then
//! (inside TLS where agreed) the server sends a [`ServerMsg::Challenge`], the client
//! answers with [`ClientMsg::Authenticate`] and the server with [`ServerMsg::Welcome`] (or
//! [`ServerMsg::Fatal`]), after [`ServerMsg::Queued`] notices while another application uses
//! its devices exclusively. After that the client sends requests and the server replies.

#[macro_use]
pub mod table;
#[macro_use]
pub mod sample;
pub mod auth;
pub mod cuda;
pub mod fabric;
pub mod frame;
pub mod nvml;
pub mod opencl;
pub mod session;

use serde::{Deserialize, Serialize};

pub use frame::{decode_body, encode_frame, encode_frame_striped, FrameHeader, HEADER_LEN};

/// Bumped on every incompatible change of any message.
pub const PROTOCOL_VERSION: u32 = 43;
/// First bytes on the wire, each way.
pub const MAGIC: [u8; 4] = *b"RGPU";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// The peer sent something this protocol version cannot accept; the session ends.
    Malformed(String),
    /// The peer speaks another protocol version.
    VersionMismatch { ours: u32, theirs: u32 },
    /// The peer is no rgpu endpoint: it answered with these bytes.
    NotRgpu(Vec<u8>),
    /// A message could not be encoded (too large).
    Encode(String),
}

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProtocolError::Malformed(why) => write!(f, "malformed message: {why}"),
            ProtocolError::VersionMismatch { ours, theirs } => write!(
                f,
                "rgpu protocol version mismatch: this side speaks version {ours}, the peer \
                 speaks version {theirs}; run the same rgpu release on client and server"
            ),
            ProtocolError::Encode(why) => write!(f, "cannot encode message: {why}"),
            ProtocolError::NotRgpu(first) => write!(
                f,
                "the peer is not an rgpu server or client (it began with {:?})",
                String::from_utf8_lossy(first)
            ),
        }
    }
}

impl std::error::Error for ProtocolError {}

/// The bytes each side sends first, in the clear: magic, protocol version, flags, and (from a
/// client) the session a data lane joins. The client's says whether it continues in TLS; the
/// server's echoes that, or says the connection is refused (a [`ServerMsg::Fatal`] in the
/// clear follows, saying why). The lane's session is only a routing hint for the listener (the
/// lane's key is checked inside the authenticated handshake).
///
/// Each side reads the peer's first [`Preamble::HEAD_LEN`] bytes (magic and version) before
/// the rest, so that peers of other versions, whose preambles may be shorter, get a clear
/// version mismatch rather than a wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preamble {
    pub version: u32,
    pub flags: u32,
    /// Set in a data lane's preamble: the session it joins.
    pub lane_of: Option<u64>,
}

impl Preamble {
    pub const LEN: usize = 24;
    pub const HEAD_LEN: usize = 8;
    /// The connection continues in TLS 1.3 after the preambles.
    pub const TLS: u32 = 1;
    /// Server only: the connection is refused; a Fatal frame in the clear says why.
    pub const REFUSED: u32 = 2;
    /// Server only: the client must prove it holds the server's token before anything else
    /// (before TLS): the server's preamble is followed by a 32-byte nonce, the client answers
    /// with `auth::preauth_proof` (32 bytes), and the server's verdict is one byte (1: go on;
    /// 0: refused, and the connection closes). So a peer without the token never reaches the
    /// process that would serve it.
    pub const PREAUTH: u32 = 4;
    const KNOWN_FLAGS: u32 = Self::TLS | Self::REFUSED | Self::PREAUTH;

    /// A client's: TLS or not, and the session a data lane joins.
    pub fn client(tls: bool, lane_of: Option<u64>) -> Self {
        Preamble {
            version: PROTOCOL_VERSION,
            flags: if tls { Self::TLS } else { 0 },
            lane_of,
        }
    }

    /// A server's, with these flags.
    pub fn server(flags: u32) -> Self {
        Preamble {
            version: PROTOCOL_VERSION,
            flags,
            lane_of: None,
        }
    }

    pub fn tls(&self) -> bool {
        self.flags & Self::TLS != 0
    }

    pub fn refused(&self) -> bool {
        self.flags & Self::REFUSED != 0
    }

    pub fn preauth(&self) -> bool {
        self.flags & Self::PREAUTH != 0
    }

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[0..4].copy_from_slice(&MAGIC);
        out[4..8].copy_from_slice(&self.version.to_le_bytes());
        out[8..12].copy_from_slice(&self.flags.to_le_bytes());
        out[12..20].copy_from_slice(&self.lane_of.unwrap_or(0).to_le_bytes());
        out[20..24].copy_from_slice(Self::END);
        out
    }

    /// The preamble's last bytes: an empty line, so that a server of a text protocol
    /// (HTTP) that a client reaches by mistake answers at once, and the client can say that
    /// the peer is no rgpu server instead of waiting out its handshake.
    const END: &'static [u8; 4] = b"\r\n\r\n";

    /// Checks the magic and the version (the first [`Preamble::HEAD_LEN`] bytes).
    pub fn check_head(raw: &[u8; Self::HEAD_LEN]) -> Result<(), ProtocolError> {
        if raw[0..4] != MAGIC {
            return Err(ProtocolError::NotRgpu(raw.to_vec()));
        }
        let theirs = u32::from_le_bytes(raw[4..8].try_into().unwrap());
        if theirs != PROTOCOL_VERSION {
            return Err(ProtocolError::VersionMismatch {
                ours: PROTOCOL_VERSION,
                theirs,
            });
        }
        Ok(())
    }

    /// Decodes a whole preamble of this version.
    pub fn decode(raw: &[u8; Self::LEN]) -> Result<Self, ProtocolError> {
        Self::check_head(raw[..Self::HEAD_LEN].try_into().unwrap())?;
        let flags = u32::from_le_bytes(raw[8..12].try_into().unwrap());
        if flags & !Self::KNOWN_FLAGS != 0 {
            return Err(ProtocolError::Malformed(format!(
                "unknown preamble flags {flags:#x}"
            )));
        }
        let lane_of = u64::from_le_bytes(raw[12..20].try_into().unwrap());
        if &raw[20..24] != Self::END {
            return Err(ProtocolError::Malformed("preamble without its end".into()));
        }
        Ok(Preamble {
            version: PROTOCOL_VERSION,
            flags,
            lane_of: (lane_of != 0).then_some(lane_of),
        })
    }
}

pub type Nonce = [u8; 32];
pub type Proof = [u8; 32];
/// The secret a session's data lanes present to join it (random, from the session's welcome).
pub type LaneKey = [u8; 32];

/// Bytes a striped transfer deals to each lane in turn: chunk `i` of the transfer's bytes goes
/// over lane `i % lanes`, as raw bytes (no frame), in order.
pub const LANE_CHUNK: u64 = 1 << 20;
/// The most data lanes a session may have.
pub const MAX_LANES: u32 = 8;
/// A frame header's `lanes` when the frame's bulk is in the session's shared-memory ring
/// (`AttachShared`), in the frame's direction, right after the bulk of the frames before it.
pub const IN_RING: u32 = u32::MAX;
/// A frame header's `lanes` when the request's bulk bytes are in a shared host-memory segment
/// (`AttachHostMemory`): the frame's 24 bulk bytes are then a [`SegmentSpan`] naming them.
pub const IN_SEGMENT: u32 = u32::MAX - 1;
/// A frame header's `lanes` when a read's data is to go into a shared host-memory segment
/// (the frame's 24 bulk bytes are the [`SegmentSpan`]); the server may put it there itself
/// (its `ReadDone` then says the copy was issued, as an asynchronous copy's call does) or
/// send it as usual.
pub const INTO_SEGMENT: u32 = u32::MAX - 2;

/// Bytes in a shared host-memory segment: which segment, where in it, how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentSpan {
    pub segment: u64,
    pub offset: u64,
    pub len: u64,
}

impl SegmentSpan {
    pub const ENCODED_LEN: usize = 24;

    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        out[0..8].copy_from_slice(&self.segment.to_le_bytes());
        out[8..16].copy_from_slice(&self.offset.to_le_bytes());
        out[16..24].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    pub fn decode(raw: &[u8; Self::ENCODED_LEN]) -> SegmentSpan {
        let at = |i: usize| u64::from_le_bytes(raw[i..i + 8].try_into().unwrap());
        SegmentSpan {
            segment: at(0),
            offset: at(8),
            len: at(16),
        }
    }
}

/// Bulk of at least this many bytes goes through the shared-memory ring where there is one.
pub const RING_MIN: u64 = 64 << 10;
/// Where another server finds an export: the exporting server as its client reaches it, the
/// session that made the export, and the export's ticket (one use; chosen at random by the
/// exporting session's client, so that an export can be posted without waiting for a reply).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerExport {
    pub endpoint: String,
    pub session: u64,
    pub ticket: LaneKey,
}
/// Transfers of at least this many bytes go striped over the data lanes where a session has
/// them (one [`LANE_CHUNK`] per lane or more); smaller ones follow their frame.
pub const STRIPE_MIN: u64 = 4 << 20;

/// How the bytes `[at, at + len)` of a striped transfer over `lanes` lanes are dealt: the
/// pieces, in order, each with its lane and its range relative to `at` (a piece never
/// crosses a [`LANE_CHUNK`] boundary).
pub fn dealt(
    at: u64,
    len: usize,
    lanes: u32,
) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> {
    let lanes = u64::from(lanes.max(1));
    let mut done = 0usize;
    std::iter::from_fn(move || {
        if done >= len {
            return None;
        }
        let position = at + done as u64;
        let lane = ((position / LANE_CHUNK) % lanes) as usize;
        let left_in_chunk = (LANE_CHUNK - position % LANE_CHUNK) as usize;
        let n = left_in_chunk.min(len - done);
        let range = done..done + n;
        done += n;
        Some((lane, range))
    })
}

/// What a connection says in its handshake to become data lane `index` of session `session`
/// instead of a session of its own. A data lane carries only the raw bytes of striped
/// transfers, which several lanes move in parallel (one TCP stream is bound by one core's
/// copying); their requests travel on the session's own connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneAttach {
    pub session: u64,
    pub key: LaneKey,
    pub index: u32,
}

/// Client to server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ClientMsg {
    /// Answer to the challenge. `proof` is absent when the client has no token.
    Authenticate {
        client_nonce: Nonce,
        proof: Option<Proof>,
        /// For the server's log: program name and pid.
        client_name: String,
        /// Present when this connection is to be a data lane of an existing session.
        lane: Option<LaneAttach>,
        /// Which application the session belongs to (`RGPU_APP_ID`): on a server whose
        /// devices are used exclusively, the sessions of one application share them.
        application: String,
        /// Seconds the client waits for a server whose devices another application uses
        /// exclusively (0: refuse at once); the server sends `Queued` while it waits.
        wait_secs: u32,
    },
    /// The session's own messages (session.rs).
    Session(session::SessionRequest),
    Cl(opencl::ClRequest),
    Cu(cuda::CuRequest),
    /// The client library is alive: the answer to the server's `Heartbeat`, sent by the
    /// library's own thread whatever the program is doing. No reply.
    Alive,
}

impl ClientMsg {
    pub fn expects_reply(&self) -> bool {
        match self {
            ClientMsg::Authenticate { .. } => true,
            ClientMsg::Alive => false,
            ClientMsg::Session(req) => req.expects_reply(),
            ClientMsg::Cl(req) => req.expects_reply(),
            ClientMsg::Cu(req) => req.expects_reply(),
        }
    }

    /// The message's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            ClientMsg::Authenticate { .. } => "Authenticate",
            ClientMsg::Alive => "Alive",
            ClientMsg::Session(req) => req.name(),
            ClientMsg::Cl(req) => req.name(),
            ClientMsg::Cu(req) => req.name(),
        }
    }
}

/// Server to client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ServerMsg {
    Challenge {
        server_nonce: Nonce,
        /// Whether the client must prove it holds the token.
        token_required: bool,
        server_name: String,
    },
    Welcome {
        session_id: u64,
        /// Proves to the client that the server holds the token too (zeros without a token).
        server_proof: Proof,
        /// What this session's data lanes present to join it.
        lane_key: LaneKey,
    },
    /// The session is over; the reason is meant for the user.
    Fatal { message: String },
    /// The reply to the session request with the frame's seq.
    Session(session::SessionReply),
    /// The reply to the request with the frame's seq.
    Cl(opencl::ClReply),
    /// The reply to the CUDA request with the frame's seq.
    Cu(cuda::CuReply),
    /// A chunk of a read's data (OpenCL or CUDA) for the request with the frame's seq, at this
    /// byte offset of the read. Bulk: the chunk.
    Data { offset: u64 },
    /// The end of a read (OpenCL or CUDA) for the request with the frame's seq, after its
    /// `Data`: its status (an OpenCL status or a `CUresult`).
    ReadDone { status: i32 },
    /// An event the client asked about (`NotifyEvent`) reached `status`.
    EventStatus { event: opencl::Id, status: i32 },
    /// Before the welcome: the server's devices are in exclusive use by another application,
    /// and this one waits behind `ahead` others (sent again when that changes).
    Queued { ahead: u32 },
    /// The session is still carrying out a request (sent every second while one takes longer):
    /// the server is alive though it answers nothing yet, as a long kernel's `clFinish` keeps
    /// it. Clients count any frame as a sign of life (rgpu_client's liveness watchdog).
    Working,
    /// The client has been silent for a while: its library answers `Alive`, or the server
    /// closes the session after `client_timeout` (a hung client, or a path that keeps TCP
    /// alive but delivers nothing).
    Heartbeat,
    /// Sent just before the reply to the request with the frame's seq when the client asked
    /// (`TimeReplies`, for its call trace): how long the server spent on the request, from
    /// taking it off the connection to its reply, µs.
    Timing { server_us: u32 },
    /// Final statuses (`CL_COMPLETE` or an error) of events the client holds, sent before the
    /// reply to a `Finish` or `WaitForEvents` (whose completion they follow from) so that the
    /// client answers later queries of those events itself. `statuses[i]` is `events[i]`'s.
    EventsFinal {
        events: Vec<opencl::Id>,
        statuses: Vec<i32>,
    },
    /// Sent just before the successful reply to the CUDA synchronization with the frame's seq:
    /// CUDA events whose latest record, the `generations[i]`-th record of `events[i]` the
    /// session asked for, has completed (and which were not reported since). The client
    /// answers later queries and synchronizations of those events itself until it records
    /// them again.
    CuEventsDone {
        events: Vec<cuda::Id>,
        generations: Vec<u64>,
    },
    /// The server's operator asks the client to move its session to the server at `endpoint`
    /// (`rgpu migrate`, docs/migration.md); the client moves what it can, on a thread of its
    /// own, and its old session ends when it has.
    MoveTo { endpoint: String },
}

sample_struct!(PeerExport {
    endpoint,
    session,
    ticket
});
sample_struct!(LaneAttach {
    session,
    key,
    index
});
sample_enum!(ClientMsg {
    Authenticate { client_nonce, proof, client_name, lane, application, wait_secs },
    Session(request),
    Cl(request),
    Cu(request),
    Alive,
});
sample_enum!(ServerMsg {
    Challenge { server_nonce, token_required, server_name },
    Welcome { session_id, server_proof, lane_key },
    Fatal { message },
    Session(reply),
    Cl(reply),
    Cu(reply),
    Data { offset },
    ReadDone { status },
    EventStatus { event, status },
    Queued { ahead },
    Working,
    Heartbeat,
    Timing { server_us },
    EventsFinal { events, statuses },
    CuEventsDone { events, generations },
    MoveTo { endpoint },
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dealing_follows_the_lane_chunks() {
        let chunk = LANE_CHUNK as usize;
        // From the start of a transfer: whole chunks, lane after lane.
        let pieces: Vec<_> = dealt(0, 2 * chunk + 5, 2).collect();
        assert_eq!(
            pieces,
            vec![
                (0, 0..chunk),
                (1, chunk..2 * chunk),
                (0, 2 * chunk..2 * chunk + 5)
            ]
        );
        // From inside one: the first piece ends at the chunk's end; ranges are relative.
        let pieces: Vec<_> = dealt(LANE_CHUNK + 10, chunk, 3).collect();
        assert_eq!(pieces, vec![(1, 0..chunk - 10), (2, chunk - 10..chunk)]);
        assert_eq!(dealt(7, 0, 4).count(), 0);
    }
}
