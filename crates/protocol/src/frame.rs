//! Framing: every message after the preamble is one frame.
//!
//! ```text
//! +-----------+-----------+-----------+-------------+----------------+-------------+
//! | body_len  | lanes     | seq       | bulk_len    | body           | bulk        |
//! | u32 LE    | u32 LE    | u64 LE    | u64 LE      | postcard bytes | raw bytes   |
//! +-----------+-----------+-----------+-------------+----------------+-------------+
//! ```
//!
//! The body is a small postcard-encoded message; bulk data (buffer contents) follows it raw so
//! that both ends can stream it straight between the socket and user or staging memory. A frame
//! with `lanes` > 0 has its bulk striped over that many of the session's data lanes instead
//! (see [`crate::LANE_CHUNK`]); nothing follows it. A frame with `lanes` = [`crate::IN_RING`]
//! has its bulk in the session's shared-memory ring (a client on the server's host:
//! `rgpu_transport::shared_ring`); nothing follows it either. With [`crate::IN_SEGMENT`] or
//! [`crate::INTO_SEGMENT`] the 24 bulk bytes that follow name bytes in a shared host-memory
//! segment ([`crate::SegmentSpan`]).

use crate::ProtocolError;

/// Bytes in an encoded [`FrameHeader`].
pub const HEADER_LEN: usize = 24;
/// Largest message body accepted (program binaries and sources travel in bodies).
pub const MAX_BODY_LEN: u32 = 256 << 20;
/// Largest bulk payload accepted in one frame.
pub const MAX_BULK_LEN: u64 = 1 << 40;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FrameHeader {
    pub body_len: u32,
    /// 0, the number of data lanes the bulk comes over, or [`crate::IN_RING`] (the bulk then
    /// does not follow the frame).
    pub lanes: u32,
    /// Request sequence number; a reply or data chunk carries the seq of its request.
    pub seq: u64,
    pub bulk_len: u64,
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..4].copy_from_slice(&self.body_len.to_le_bytes());
        out[4..8].copy_from_slice(&self.lanes.to_le_bytes());
        out[8..16].copy_from_slice(&self.seq.to_le_bytes());
        out[16..24].copy_from_slice(&self.bulk_len.to_le_bytes());
        out
    }

    /// Decodes and validates a header; a frame that breaks a limit is malformed.
    pub fn decode(raw: &[u8; HEADER_LEN]) -> Result<Self, ProtocolError> {
        let u32_at = |i: usize| u32::from_le_bytes(raw[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(raw[i..i + 8].try_into().unwrap());
        let header = FrameHeader {
            body_len: u32_at(0),
            lanes: u32_at(4),
            seq: u64_at(8),
            bulk_len: u64_at(16),
        };
        let shared = [crate::IN_RING, crate::IN_SEGMENT, crate::INTO_SEGMENT];
        if header.lanes > crate::MAX_LANES && !shared.contains(&header.lanes) {
            return Err(ProtocolError::Malformed(format!(
                "bulk striped over {} lanes (at most {})",
                header.lanes,
                crate::MAX_LANES
            )));
        }
        if header.body_len == 0 || header.body_len > MAX_BODY_LEN {
            return Err(ProtocolError::Malformed(format!(
                "frame body length {} out of range",
                header.body_len
            )));
        }
        if header.bulk_len > MAX_BULK_LEN {
            return Err(ProtocolError::Malformed(format!(
                "frame bulk length {} out of range",
                header.bulk_len
            )));
        }
        Ok(header)
    }
}

/// Appends a complete frame header and body for `msg` to `out` (reused across calls so the hot
/// path does not allocate). The caller sends `bulk_len` raw bytes after it.
pub fn encode_frame<T: serde::Serialize>(
    msg: &T,
    seq: u64,
    bulk_len: u64,
    out: &mut Vec<u8>,
) -> Result<(), ProtocolError> {
    encode_frame_striped(msg, seq, bulk_len, 0, out)
}

/// Like [`encode_frame`], for a frame whose `bulk_len` bytes come over `lanes` data lanes.
pub fn encode_frame_striped<T: serde::Serialize>(
    msg: &T,
    seq: u64,
    bulk_len: u64,
    lanes: u32,
    out: &mut Vec<u8>,
) -> Result<(), ProtocolError> {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER_LEN]);
    let body_start = out.len();
    let encoded = postcard::to_extend(msg, std::mem::take(out))
        .map_err(|e| ProtocolError::Encode(e.to_string()))?;
    *out = encoded;
    let body_len = out.len() - body_start;
    if body_len > MAX_BODY_LEN as usize {
        out.truncate(start);
        return Err(ProtocolError::Encode(format!(
            "message body of {body_len} bytes exceeds the protocol limit"
        )));
    }
    let header = FrameHeader {
        body_len: body_len as u32,
        lanes,
        seq,
        bulk_len,
    };
    out[start..body_start].copy_from_slice(&header.encode());
    Ok(())
}

/// Decodes a frame body; trailing bytes or a bad encoding make the frame malformed.
pub fn decode_body<'a, T: serde::Deserialize<'a>>(body: &'a [u8]) -> Result<T, ProtocolError> {
    let (msg, rest) = postcard::take_from_bytes::<T>(body)
        .map_err(|e| ProtocolError::Malformed(format!("undecodable message: {e}")))?;
    if !rest.is_empty() {
        return Err(ProtocolError::Malformed(format!(
            "{} trailing bytes after message",
            rest.len()
        )));
    }
    Ok(msg)
}
