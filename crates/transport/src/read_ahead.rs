//! Reading a TLS connection ahead, on a thread of its own.
//!
//! Opening TLS records costs a core's time; a thread that reads a connection and then copies
//! what it read (into a device's staging buffer) would do both in turn. A read-ahead thread
//! opens the records while the reading thread copies, and the data lanes of a session open
//! theirs in parallel. Only data lanes use it: on a session's own connection the hand-over
//! between threads would cost every small request a wake-up. A plain socket needs none of
//! this: reading it is already just a copy.

use std::io::{self, Read};
use std::sync::mpsc;

use crate::Stream;

/// Plaintext read ahead, in buffers of this size...
const BUFFER: usize = 256 << 10;
/// ...at most this many waiting per connection.
const DEPTH: usize = 4;

/// A connection's reading side: read directly, or (TLS) through a read-ahead thread.
pub enum ReadHalf {
    Direct(Stream),
    Ahead(ReadAhead),
    /// A Unix socket read with `recvmsg`, keeping the descriptors that come with the bytes
    /// (the shared-memory region a client attaches: crate::shared_ring).
    KeepingFds(Stream, std::collections::VecDeque<std::os::fd::OwnedFd>),
}

impl ReadHalf {
    /// Reads `stream` ahead on a thread named `name`, TLS or not.
    pub fn ahead(stream: Stream, name: &str) -> io::Result<ReadHalf> {
        Ok(ReadHalf::Ahead(ReadAhead::start(stream, name)?))
    }

    /// Ends the connection (both directions): a thread blocked reading it wakes up.
    pub fn shutdown(&self) {
        match self {
            ReadHalf::Direct(stream) => stream.shutdown(),
            ReadHalf::Ahead(ahead) => ahead.stream.shutdown(),
            ReadHalf::KeepingFds(stream, _) => stream.shutdown(),
        }
    }

    /// A session's reading side: on a plain Unix socket it keeps the descriptors the client
    /// sends ([`ReadHalf::take_fd`]); otherwise read directly.
    pub fn for_session(stream: Stream) -> ReadHalf {
        match stream {
            Stream::Unix(_) => ReadHalf::KeepingFds(stream, Default::default()),
            other => ReadHalf::Direct(other),
        }
    }

    /// The oldest descriptor received with the bytes read so far.
    pub fn take_fd(&mut self) -> Option<std::os::fd::OwnedFd> {
        match self {
            ReadHalf::KeepingFds(_, fds) => fds.pop_front(),
            _ => None,
        }
    }
}

impl Read for ReadHalf {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        match self {
            ReadHalf::Direct(stream) => {
                if let Some(socket) = stream.raw_fd() {
                    crate::spin::until_readable(socket);
                }
                stream.read(out)
            }
            ReadHalf::Ahead(ahead) => ahead.read(out),
            ReadHalf::KeepingFds(stream, fds) => {
                if crate::fork::forked() {
                    return Err(crate::fork::forked_error());
                }
                let socket = stream
                    .raw_fd()
                    .ok_or_else(|| io::Error::other("no socket"))?;
                crate::spin::until_readable(socket);
                crate::shared_ring::recv_keeping_fds(socket, out, fds)
            }
        }
    }
}

/// A connection read by a thread of its own into a bounded queue of buffers, which go back to
/// it once read. The thread ends when the connection does (or fails), or when the reading
/// side is dropped and it next has something to hand over.
pub struct ReadAhead {
    /// For shutdown.
    stream: Stream,
    filled: mpsc::Receiver<io::Result<(Vec<u8>, usize)>>,
    spent: mpsc::Sender<Vec<u8>>,
    current: Vec<u8>,
    at: usize,
    len: usize,
    ended: bool,
}

impl ReadAhead {
    fn start(stream: Stream, name: &str) -> io::Result<ReadAhead> {
        let mut source = stream.try_clone()?;
        let (filled_tx, filled) = mpsc::sync_channel(DEPTH);
        let (spent, spent_rx) = mpsc::channel::<Vec<u8>>();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || loop {
                let mut buf = spent_rx.try_recv().unwrap_or_else(|_| vec![0u8; BUFFER]);
                let (read, last) = match source.read(&mut buf) {
                    Ok(0) => (Ok((buf, 0)), true),
                    Ok(n) => (Ok((buf, n)), false),
                    Err(e) => (Err(e), true),
                };
                if filled_tx.send(read).is_err() || last {
                    return;
                }
            })?;
        Ok(ReadAhead {
            stream,
            filled,
            spent,
            current: Vec::new(),
            at: 0,
            len: 0,
            ended: false,
        })
    }

    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.at == self.len {
            if self.ended {
                return Ok(0);
            }
            let spent = std::mem::take(&mut self.current);
            if !spent.is_empty() {
                let _ = self.spent.send(spent);
            }
            match self.filled.recv() {
                Ok(Ok((buf, n))) => {
                    self.current = buf;
                    self.at = 0;
                    self.len = n;
                    self.ended = n == 0;
                }
                Ok(Err(e)) => {
                    self.ended = true;
                    return Err(e);
                }
                Err(_) => {
                    self.ended = true;
                    return Ok(0);
                }
            }
        }
        let n = out.len().min(self.len - self.at);
        out[..n].copy_from_slice(&self.current[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}
