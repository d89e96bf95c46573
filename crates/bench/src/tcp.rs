//! The raw loopback TCP baseline: what any remoting over one TCP stream can at best reach on
//! this machine, measured in the same run as the OpenCL figures.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Instant;

use serde::Serialize;

use crate::{max, median, min};

/// Bytes per write() in the bandwidth test, as rgpu's bulk transfers use.
const WRITE_SIZE: usize = 1 << 20;
/// Bytes each way in the round-trip test.
const PING_SIZE: usize = 64;
const PING_WARMUP: usize = 200;

#[derive(Clone, Debug, Serialize)]
pub struct TcpBaseline {
    pub bandwidth_gbps: f64,
    pub bandwidth_best_gbps: f64,
    pub bytes_per_run: u64,
    pub write_size: usize,
    pub round_trip_us: f64,
    pub round_trip_min_us: f64,
    /// The same ping-pong over a Unix socket pair (the raw link of a `unix:` server).
    pub unix_round_trip_us: f64,
    pub unix_round_trip_min_us: f64,
    pub ping_bytes: usize,
    pub pings: usize,
}

pub fn measure(bytes_per_run: u64, runs: usize, pings: usize) -> io::Result<TcpBaseline> {
    let bandwidths = bandwidth_samples(bytes_per_run, runs)?;
    baseline(&bandwidths, bytes_per_run, pings)
}

/// GB/s of `runs` runs of the raw baseline's bandwidth test.
pub fn bandwidth_samples(bytes_per_run: u64, runs: usize) -> io::Result<Vec<f64>> {
    (0..runs.max(1))
        .map(|_| bandwidth_once(bytes_per_run))
        .collect()
}

/// The baseline from bandwidth samples already taken, with `pings` round trips measured now.
pub fn baseline(bandwidths: &[f64], bytes_per_run: u64, pings: usize) -> io::Result<TcpBaseline> {
    let round_trips = round_trips(pings)?;
    let unix_round_trips = {
        let (client, echo) = std::os::unix::net::UnixStream::pair()?;
        ping_pong(client, echo, pings)?
    };
    Ok(TcpBaseline {
        bandwidth_gbps: median(bandwidths),
        bandwidth_best_gbps: max(bandwidths),
        bytes_per_run,
        write_size: WRITE_SIZE,
        round_trip_us: median(&round_trips),
        round_trip_min_us: min(&round_trips),
        unix_round_trip_us: median(&unix_round_trips),
        unix_round_trip_min_us: min(&unix_round_trips),
        ping_bytes: PING_SIZE,
        pings,
    })
}

/// One stream over 127.0.0.1: the sender writes `total` bytes in 1 MiB writes; the time runs
/// until the receiver has read them all and said so.
fn bandwidth_once(total: u64) -> io::Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let receiver = thread::spawn(move || -> io::Result<()> {
        let (mut stream, _) = listener.accept()?;
        let mut buffer = vec![0u8; WRITE_SIZE];
        let mut received = 0u64;
        while received < total {
            match stream.read(&mut buffer)? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => received += n as u64,
            }
        }
        stream.write_all(&[1])
    });
    let mut stream = TcpStream::connect(address)?;
    stream.set_nodelay(true)?;
    let chunk = vec![0x5au8; WRITE_SIZE];
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < total {
        let n = (total - sent).min(WRITE_SIZE as u64) as usize;
        stream.write_all(&chunk[..n])?;
        sent += n as u64;
    }
    let mut done = [0u8; 1];
    stream.read_exact(&mut done)?;
    let seconds = start.elapsed().as_secs_f64();
    receiver
        .join()
        .map_err(|_| io::Error::other("receiver thread panicked"))??;
    Ok(total as f64 / seconds / 1e9)
}

/// The bandwidth of the same traffic as a window of `window` transfers of `size` bytes: the
/// sender sends its `size`-byte buffer `window` times, the receiver reads into a `size`-byte
/// buffer. Unlike the 1 MiB baseline, buffers larger than the caches cost memory bandwidth
/// here too, as they do for an OpenCL transfer of that size. Median GB/s of `runs` runs.
pub fn sized_bandwidth(size: usize, window: usize, runs: usize) -> io::Result<f64> {
    let once = || -> io::Result<f64> {
        let total = (size * window) as u64;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let receiver = thread::spawn(move || -> io::Result<()> {
            let (mut stream, _) = listener.accept()?;
            receive_cycling(&mut stream, size, total)?;
            stream.write_all(&[1])
        });
        let mut stream = TcpStream::connect(address)?;
        stream.set_nodelay(true)?;
        let buffer = vec![0x5au8; size];
        let start = Instant::now();
        for _ in 0..window {
            for chunk in buffer.chunks(WRITE_SIZE) {
                stream.write_all(chunk)?;
            }
        }
        let mut done = [0u8; 1];
        stream.read_exact(&mut done)?;
        let seconds = start.elapsed().as_secs_f64();
        receiver
            .join()
            .map_err(|_| io::Error::other("receiver thread panicked"))??;
        Ok(total as f64 / seconds / 1e9)
    };
    let samples = (0..runs.max(1))
        .map(|_| once())
        .collect::<io::Result<Vec<f64>>>()?;
    Ok(median(&samples))
}

/// 64-byte ping-pongs with TCP_NODELAY; each round trip's time in microseconds.
fn round_trips(count: usize) -> io::Result<Vec<f64>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let client = TcpStream::connect(address)?;
    client.set_nodelay(true)?;
    let (echo, _) = listener.accept()?;
    echo.set_nodelay(true)?;
    ping_pong(client, echo, count)
}

/// 64-byte ping-pongs from `client` to a thread echoing on `echo`, both ends blocking in
/// their reads; each round trip's time in microseconds.
fn ping_pong<S: Read + Write + Send + 'static>(
    mut client: S,
    mut echo: S,
    count: usize,
) -> io::Result<Vec<f64>> {
    let echo = thread::spawn(move || -> io::Result<()> {
        let mut message = [0u8; PING_SIZE];
        loop {
            match echo.read_exact(&mut message) {
                Ok(()) => echo.write_all(&message)?,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    });
    let mut message = [7u8; PING_SIZE];
    let mut times = Vec::with_capacity(count);
    for i in 0..PING_WARMUP + count {
        let start = Instant::now();
        client.write_all(&message)?;
        client.read_exact(&mut message)?;
        if i >= PING_WARMUP {
            times.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    drop(client);
    echo.join()
        .map_err(|_| io::Error::other("echo thread panicked"))??;
    Ok(times)
}

/// Reads `total` bytes from `stream` into a `size`-byte buffer, over and over (as a receiver
/// of transfers of that size would), in reads of at most [`WRITE_SIZE`].
fn receive_cycling(stream: &mut TcpStream, size: usize, total: u64) -> io::Result<()> {
    let mut buffer = vec![0u8; size.max(1)];
    let (mut received, mut at) = (0u64, 0usize);
    while received < total {
        let end = (at + WRITE_SIZE).min(buffer.len());
        match stream.read(&mut buffer[at..end])? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => {
                received += n as u64;
                at = if at + n == buffer.len() { 0 } else { at + n };
            }
        }
    }
    Ok(())
}

/// [`sized_bandwidth`] striped over `streams` connections at once, each carrying an equal
/// share of every transfer (as a pull striped over several links does). Median GB/s.
pub fn striped_bandwidth(
    size: usize,
    window: usize,
    streams: usize,
    runs: usize,
) -> io::Result<f64> {
    let share = size.div_ceil(streams.max(1)).max(1);
    let once = || -> io::Result<f64> {
        let total = (share * window) as u64;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let mut senders = Vec::new();
        for _ in 0..streams.max(1) {
            let mut stream = TcpStream::connect(address)?;
            stream.set_nodelay(true)?;
            let (mut accepted, _) = listener.accept()?;
            senders.push(thread::spawn(move || -> io::Result<()> {
                let buffer = vec![0x5au8; share];
                let mut go = [0u8; 1];
                accepted.read_exact(&mut go)?;
                for _ in 0..window {
                    for chunk in buffer.chunks(WRITE_SIZE) {
                        accepted.write_all(chunk)?;
                    }
                }
                Ok(())
            }));
            senders.push(thread::spawn(move || -> io::Result<()> {
                stream.write_all(&[1])?;
                receive_cycling(&mut stream, share, total)
            }));
        }
        let start = Instant::now();
        for handle in senders {
            handle
                .join()
                .map_err(|_| io::Error::other("a stream's thread panicked"))??;
        }
        let seconds = start.elapsed().as_secs_f64();
        Ok((total * streams.max(1) as u64) as f64 / seconds / 1e9)
    };
    let samples = (0..runs.max(1))
        .map(|_| once())
        .collect::<io::Result<Vec<f64>>>()?;
    Ok(median(&samples))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_something() {
        let baseline = measure(8 << 20, 1, 50).unwrap();
        assert!(baseline.bandwidth_gbps > 0.0);
        assert!(baseline.round_trip_us > 0.0);
        assert!(sized_bandwidth(3 << 20, 2, 1).unwrap() > 0.0);
        assert!(striped_bandwidth(3 << 20, 2, 4, 1).unwrap() > 0.0);
        assert!(striped_bandwidth(64 << 10, 3, 3, 2).unwrap() > 0.0);
    }
}
