//! Framed reading and writing over a [`Stream`], with reused buffers.

use std::io::{self, BufReader, Read, Write};

use rgpu_protocol::{
    decode_body, encode_frame, encode_frame_striped, FrameHeader, ProtocolError, HEADER_LEN,
};
use serde::{Deserialize, Serialize};

use crate::TransportError;

/// Bulk data up to this size is copied into the write buffer and sent with its frame in one
/// system call; larger payloads are written straight from the caller's memory.
const INLINE_BULK_MAX: usize = 64 << 10;
/// Large bulk goes to the socket in writes of this size. One huge write() holds the socket for
/// its whole length and the receiver then drains it in bursts: over loopback with 64 MiB of
/// cold memory each side, one 64 MiB write moved ~2.15 GB/s, 1 MiB writes ~2.8 GB/s (256 KiB:
/// ~2.1, 4 MiB: ~2.45).
const BULK_WRITE_SIZE: usize = 1 << 20;
/// A buffered write larger than this is flushed even before the caller asks.
const WRITE_BUFFER_FLUSH_AT: usize = 256 << 10;

pub struct FrameReader<R: Read> {
    inner: BufReader<R>,
    body: Vec<u8>,
    /// The largest frame body taken (before authentication: what a handshake needs).
    body_limit: u32,
}

impl<R: Read> FrameReader<R> {
    pub fn new(inner: R) -> Self {
        FrameReader {
            inner: BufReader::with_capacity(64 << 10, inner),
            body: Vec::with_capacity(4096),
            body_limit: rgpu_protocol::frame::MAX_BODY_LEN,
        }
    }

    /// A reader for an unauthenticated peer: small reads, and no frame body over `limit`
    /// bytes (one announcing more is refused before anything is allocated for it).
    pub fn unauthenticated(inner: R, limit: u32) -> Self {
        FrameReader {
            inner: BufReader::with_capacity(4 << 10, inner),
            body: Vec::new(),
            body_limit: limit,
        }
    }

    /// Reads the next frame's header and body. The frame's bulk bytes (header.bulk_len) are
    /// still to be read with [`FrameReader::read_bulk`] or skipped.
    pub fn read_frame(&mut self) -> Result<(FrameHeader, &[u8]), TransportError> {
        let mut raw = [0u8; HEADER_LEN];
        match self.inner.read_exact(&mut raw) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(TransportError::Closed)
            }
            Err(e) => return Err(e.into()),
        }
        let header = FrameHeader::decode(&raw)?;
        if header.body_len > self.body_limit {
            return Err(ProtocolError::Malformed(format!(
                "a frame body of {} bytes where at most {} are taken",
                header.body_len, self.body_limit
            ))
            .into());
        }
        self.body.resize(header.body_len as usize, 0);
        self.inner.read_exact(&mut self.body).map_err(truncated)?;
        Ok((header, &self.body))
    }

    /// Reads a frame and decodes its body as `T`.
    pub fn read_message<'a, T: Deserialize<'a>>(
        &'a mut self,
    ) -> Result<(FrameHeader, T), TransportError> {
        let (header, body) = self.read_frame()?;
        Ok((header, decode_body(body)?))
    }

    /// Reads exactly `dst.len()` bulk bytes.
    pub fn read_bulk(&mut self, dst: &mut [u8]) -> Result<(), TransportError> {
        self.inner.read_exact(dst).map_err(truncated)
    }

    /// Discards `len` bulk bytes (a payload nobody can take).
    pub fn skip_bulk(&mut self, mut len: u64) -> Result<(), TransportError> {
        let mut scratch = [0u8; 8192];
        while len > 0 {
            let n = len.min(scratch.len() as u64) as usize;
            self.read_bulk(&mut scratch[..n])?;
            len -= n as u64;
        }
        Ok(())
    }

    /// Whether bytes of a next frame have arrived already (a reader answering a burst of
    /// requests flushes its answers once this is false).
    pub fn has_buffered(&self) -> bool {
        !self.inner.buffer().is_empty()
    }

    pub fn get_ref(&self) -> &R {
        self.inner.get_ref()
    }

    pub fn get_mut(&mut self) -> &mut R {
        self.inner.get_mut()
    }
}

fn truncated(e: io::Error) -> TransportError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        TransportError::Protocol(ProtocolError::Malformed("frame truncated".into()))
    } else {
        e.into()
    }
}

/// Writes frames. Small frames are gathered into one buffer and sent with one system call at
/// the next [`FrameWriter::flush`]; this is how fire-and-forget requests get batched.
pub struct FrameWriter<W: Write> {
    inner: W,
    buf: Vec<u8>,
}

impl<W: Write> FrameWriter<W> {
    pub fn new(inner: W) -> Self {
        FrameWriter {
            inner,
            buf: Vec::with_capacity(64 << 10),
        }
    }

    /// Queues a frame with its bulk payload. Large payloads flush what is queued and then go
    /// straight from `bulk` to the socket; nothing is copied.
    pub fn queue<T: Serialize>(
        &mut self,
        msg: &T,
        seq: u64,
        bulk: &[u8],
    ) -> Result<(), TransportError> {
        self.queue_header(msg, seq, bulk.len() as u64)?;
        self.write_bulk(bulk)
    }

    /// Queues a frame whose `bulk_len` bytes the caller then supplies with one or more
    /// [`FrameWriter::write_bulk`] calls.
    pub fn queue_header<T: Serialize>(
        &mut self,
        msg: &T,
        seq: u64,
        bulk_len: u64,
    ) -> Result<(), TransportError> {
        encode_frame(msg, seq, bulk_len, &mut self.buf)?;
        Ok(())
    }

    /// Queues a frame whose `bulk_len` bytes the caller sends over `lanes` data lanes.
    pub fn queue_striped<T: Serialize>(
        &mut self,
        msg: &T,
        seq: u64,
        bulk_len: u64,
        lanes: u32,
    ) -> Result<(), TransportError> {
        encode_frame_striped(msg, seq, bulk_len, lanes, &mut self.buf)?;
        Ok(())
    }

    /// Sends bulk bytes belonging to the frame queued last.
    pub fn write_bulk(&mut self, bulk: &[u8]) -> Result<(), TransportError> {
        if bulk.len() <= INLINE_BULK_MAX {
            self.buf.extend_from_slice(bulk);
            if self.buf.len() >= WRITE_BUFFER_FLUSH_AT {
                self.flush()?;
            }
        } else {
            self.flush()?;
            for piece in bulk.chunks(BULK_WRITE_SIZE) {
                self.inner.write_all(piece)?;
            }
        }
        Ok(())
    }

    /// Sends everything queued.
    pub fn flush(&mut self) -> Result<(), TransportError> {
        if !self.buf.is_empty() {
            let result = self.inner.write_all(&self.buf);
            self.buf.clear();
            result?;
        }
        Ok(())
    }

    /// Queues and flushes one frame.
    pub fn send<T: Serialize>(
        &mut self,
        msg: &T,
        seq: u64,
        bulk: &[u8],
    ) -> Result<(), TransportError> {
        self.queue(msg, seq, bulk)?;
        self.flush()
    }

    pub fn has_pending(&self) -> bool {
        !self.buf.is_empty()
    }

    pub fn get_ref(&self) -> &W {
        &self.inner
    }
}
