//! The link emulator, for experiments: `RGPU_LINK=rtt=200us,bandwidth=10Gbit` makes every
//! connection this process opens (a session's connection and its data lanes) behave as if it
//! crossed a link with that round-trip time and that bandwidth, both directions.
//!
//! The program's side of an emulated connection is one end of a socket pair; two pump threads
//! per direction carry the bytes to and from the real socket. A chunk read from one side
//! leaves the link's serializer `len / bandwidth` after the previous one did (or after it
//! arrived, if the link was idle) and is written to the other side half a round trip later:
//! latency and bandwidth add as on a real store-and-forward link, and back-to-back chunks
//! pipeline. At most [`MAX_QUEUED`] bytes wait in each direction (the link's buffer): a sender
//! faster than the link blocks, as it would on a socket. Chunks go out on time to within the
//! few microseconds of a spin: the pump threads ask the kernel for exact timers (no timer
//! slack) and each writer stops sleeping early by the most it has recently overslept
//! ([`Oversleep`]), spinning the rest. On machines with cores to spare the pumps also spin a
//! moment before blocking, so a small message does not pay a thread's wake-up per hop. The link
//! cannot be faster than the real one under it (loopback: tens of Gbit/s).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::Stream;

/// What `RGPU_LINK` asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkSpec {
    /// Round-trip time added (each direction gets half).
    pub rtt: Duration,
    /// The link's rate, bits per second (`None`: as fast as the real link).
    pub bits_per_second: Option<f64>,
}

impl std::str::FromStr for LinkSpec {
    type Err = String;

    /// `rtt=200us,bandwidth=10Gbit` (either may be left out; units ns, us, ms, s and bit,
    /// Kbit, Mbit, Gbit — decimal, per second; `Gbps` etc. too).
    fn from_str(text: &str) -> Result<LinkSpec, String> {
        let mut spec = LinkSpec {
            rtt: Duration::ZERO,
            bits_per_second: None,
        };
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("`{part}`: expected key=value"))?;
            match key.trim() {
                "rtt" | "latency" => spec.rtt = parse_duration(value.trim())?,
                "bandwidth" | "bw" => spec.bits_per_second = Some(parse_rate(value.trim())?),
                other => return Err(format!("unknown link setting `{other}` (rtt, bandwidth)")),
            }
        }
        Ok(spec)
    }
}

fn split_unit(text: &str) -> (f64, &str) {
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    (text[..end].parse().unwrap_or(f64::NAN), text[end..].trim())
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = split_unit(text);
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return Err(format!("`{text}`: a time needs a unit: ns, us, ms, s")),
    };
    if !number.is_finite() || number < 0.0 {
        return Err(format!("`{text}`: not a time"));
    }
    Ok(Duration::from_secs_f64(number * scale))
}

fn parse_rate(text: &str) -> Result<f64, String> {
    let (number, unit) = split_unit(text);
    let scale = match unit
        .trim_end_matches("ps")
        .trim_end_matches("it")
        .trim_end_matches("/s")
    {
        "b" => 1.0,
        "Kb" | "kb" => 1e3,
        "Mb" => 1e6,
        "Gb" => 1e9,
        _ => {
            return Err(format!(
                "`{text}`: a rate needs a unit: bit, Kbit, Mbit, Gbit"
            ))
        }
    };
    if !number.is_finite() || number <= 0.0 {
        return Err(format!("`{text}`: not a rate"));
    }
    Ok(number * scale)
}

/// The link `RGPU_LINK` asks for in this process (read once; a bad value is reported once and
/// ignored).
pub fn from_env() -> Option<LinkSpec> {
    static SPEC: OnceLock<Option<LinkSpec>> = OnceLock::new();
    *SPEC.get_or_init(|| {
        let text = std::env::var("RGPU_LINK")
            .ok()
            .filter(|t| !t.trim().is_empty())?;
        match text.parse() {
            Ok(spec) => {
                log::info!("RGPU_LINK: every connection emulates {spec:?}");
                Some(spec)
            }
            Err(why) => {
                eprintln!("rgpu: RGPU_LINK={text}: {why}; not emulating a link");
                None
            }
        }
    })
}

/// The most bytes waiting in one direction of a link.
const MAX_QUEUED: usize = 8 << 20;
/// The most bytes one pump read takes, and the slice each is paced as.
const READ_SIZE: usize = 256 << 10;
const SLICE: usize = 16 << 10;
/// How long before a chunk is due its writer stops sleeping and spins.
const SPIN: Duration = Duration::from_micros(30);

/// A connection through an emulated link: the program's end of the socket pair, and the real
/// socket (kept to describe the peer, to set its liveness and to shut it down).
#[derive(Debug)]
pub struct EmulatedStream {
    app: TcpStream,
    real: Arc<Stream>,
}

impl EmulatedStream {
    pub(crate) fn app(&self) -> &TcpStream {
        &self.app
    }

    pub(crate) fn app_mut(&mut self) -> &mut TcpStream {
        &mut self.app
    }

    /// The real connection under the link.
    pub fn real(&self) -> &Stream {
        &self.real
    }

    pub(crate) fn try_clone(&self) -> io::Result<EmulatedStream> {
        Ok(EmulatedStream {
            app: self.app.try_clone()?,
            real: Arc::clone(&self.real),
        })
    }

    pub(crate) fn shutdown(&self) {
        let _ = self.app.shutdown(std::net::Shutdown::Both);
        self.real.shutdown();
    }

    pub(crate) fn peer_is_local(&self) -> bool {
        self.real.peer_is_local()
    }

    pub(crate) fn peer_ip(&self) -> Option<IpAddr> {
        self.real.peer_ip()
    }
}

/// The two serializers of one emulated link. Every connection of this process to one peer (a
/// session's connection and its data lanes) crosses the same link, so they take turns on its
/// serializers as they would on a real network: four lanes do not get four times the rate.
#[derive(Default)]
pub struct Wire {
    up: Serializer,
    down: Serializer,
}

impl Wire {
    /// The link to `peer` (any name for it: connections naming the same peer share it).
    pub fn to(peer: &str) -> Arc<Wire> {
        static WIRES: OnceLock<Mutex<std::collections::HashMap<String, Arc<Wire>>>> =
            OnceLock::new();
        let mut wires = WIRES.get_or_init(Default::default).lock().unwrap();
        Arc::clone(wires.entry(peer.to_string()).or_default())
    }
}

/// When a direction's serializer is free again (`None`: never used).
#[derive(Default)]
struct Serializer(Mutex<Option<Instant>>);

impl Serializer {
    /// Each of `lengths`, handed over at `arrived`, leaves when the serializer is free plus its
    /// own time on it; returns when each has left.
    fn pass(&self, arrived: Instant, lengths: impl Iterator<Item = Duration>) -> Vec<Instant> {
        let mut free = self.0.lock().unwrap();
        let mut at = free.map_or(arrived, |f| f.max(arrived));
        let leaves = lengths
            .map(|took| {
                at += took;
                at
            })
            .collect();
        *free = Some(at);
        leaves
    }
}

/// Puts `real` behind an emulated `spec` link of its own.
pub fn emulate(real: Stream, spec: LinkSpec) -> io::Result<Stream> {
    emulate_on(real, spec, Arc::new(Wire::default()))
}

/// Puts `real` behind the emulated `spec` link `wire`, shared with the other connections on it.
pub fn emulate_on(real: Stream, spec: LinkSpec, wire: Arc<Wire>) -> io::Result<Stream> {
    let (app, link_end) = loopback_pair()?;
    stamp_arrivals(link_end.as_raw_fd());
    if let Some(fd) = real.raw_fd() {
        stamp_arrivals(fd);
    }
    let real_reader = real.try_clone()?;
    let real_writer = real.try_clone()?;
    let real = Arc::new(real);
    let one_way = spec.rtt / 2;
    let to_server = Direction::new(spec.bits_per_second, one_way, &wire, |w| &w.up);
    let to_program = Direction::new(spec.bits_per_second, one_way, &wire, |w| &w.down);
    {
        let src = link_end.try_clone()?;
        let dir = Arc::clone(&to_server);
        let fd = Some(src.as_raw_fd());
        spawn("rgpu-link-up-read", move || dir.read_from(src, fd))?;
        let dir = Arc::clone(&to_server);
        let real = Arc::clone(&real);
        let end = link_end.try_clone()?;
        spawn("rgpu-link-up-write", move || {
            dir.write_to(real_writer, || {
                // The program is gone (or the server): end both sides.
                real.shutdown();
                let _ = end.shutdown(std::net::Shutdown::Both);
            })
        })?;
    }
    {
        let dir = Arc::clone(&to_program);
        let fd = real_reader.raw_fd();
        spawn("rgpu-link-down-read", move || {
            dir.read_from(real_reader, fd)
        })?;
        let dir = Arc::clone(&to_program);
        let real = Arc::clone(&real);
        let end = link_end;
        let closer = end.try_clone()?;
        spawn("rgpu-link-down-write", move || {
            dir.write_to(end, || {
                let _ = closer.shutdown(std::net::Shutdown::Both);
                real.shutdown();
            })
        })?;
    }
    Ok(Stream::Emulated(Box::new(EmulatedStream { app, real })))
}

fn spawn(name: &str, body: impl FnOnce() + Send + 'static) -> io::Result<()> {
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            // Exact timers: the default 50 µs of slack would make every sleep late by that much.
            // SAFETY: PR_SET_TIMERSLACK takes an integer argument and affects only this thread.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
            body()
        })
        .map(drop)
}

/// One direction of a link: the chunks in flight, each with when it is due at the far end.
struct Direction {
    bits_per_second: Option<f64>,
    one_way: Duration,
    /// The link this direction is part of, and which of its serializers it uses.
    wire: Arc<Wire>,
    serializer: fn(&Wire) -> &Serializer,
    queue: Mutex<Queue>,
    changed: Condvar,
}

#[derive(Default)]
struct Queue {
    chunks: VecDeque<(Instant, Option<Vec<u8>>)>,
    bytes: usize,
    /// The writer gave up (its side failed): the reader stops too.
    closed: bool,
}

impl Direction {
    fn new(
        bits_per_second: Option<f64>,
        one_way: Duration,
        wire: &Arc<Wire>,
        serializer: fn(&Wire) -> &Serializer,
    ) -> Arc<Direction> {
        Arc::new(Direction {
            bits_per_second,
            one_way,
            wire: Arc::clone(wire),
            serializer,
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
        })
    }

    fn serialization(&self, bytes: usize) -> Duration {
        self.bits_per_second.map_or(Duration::ZERO, |rate| {
            Duration::from_secs_f64(bytes as f64 * 8.0 / rate)
        })
    }

    /// Reads the sending side until it ends (or fails), queuing each slice with its due
    /// time; `None` marks the end, after which the writer closes both sides.
    /// `fd` is the socket under `src` (plain TCP or Unix, then read directly with its kernel
    /// receive time, see [`read_stamped`]), polled before each read ([`spin_until_readable`]).
    fn read_from(&self, mut src: impl Read, fd: Option<RawFd>) {
        let mut buf = vec![0u8; READ_SIZE];
        let serializer = (self.serializer)(&self.wire);
        loop {
            if let Some(fd) = fd {
                spin_until_readable(fd);
            }
            let read = match fd {
                Some(fd) => read_stamped(fd, &mut buf),
                None => src.read(&mut buf).map(|n| (n, None)),
            };
            let (n, stamped) = match read {
                Ok((n, stamped)) => (n, stamped),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => (0, None),
            };
            // When the bytes reached this end's socket: this thread may have woken well after
            // (from an idle CPU: tens of µs), which is not the link's time.
            let arrived = stamped.unwrap_or_else(Instant::now);
            let mut queue = self.queue.lock().unwrap();
            while n > 0 && queue.bytes >= MAX_QUEUED && !queue.closed {
                queue = self.changed.wait(queue).unwrap();
            }
            if queue.closed {
                return;
            }
            if n == 0 {
                let last = serializer.pass(arrived, std::iter::once(Duration::ZERO))[0];
                queue.chunks.push_back((last + self.one_way, None));
                self.changed.notify_all();
                return;
            }
            let slices = buf[..n].chunks(SLICE);
            let leaves =
                serializer.pass(arrived, slices.clone().map(|s| self.serialization(s.len())));
            for (slice, leaves) in slices.zip(leaves) {
                queue.bytes += slice.len();
                queue
                    .chunks
                    .push_back((leaves + self.one_way, Some(slice.to_vec())));
            }
            self.changed.notify_all();
        }
    }

    /// Writes each queued chunk to the receiving side when it is due; `on_end` runs at the
    /// end of the stream or when writing fails.
    fn write_to(&self, mut dst: impl Write, on_end: impl FnOnce()) {
        let mut oversleep = Oversleep::default();
        loop {
            let (due, chunk) = {
                let mut queue = self.next_queued();
                while queue.chunks.is_empty() {
                    queue = self.changed.wait(queue).unwrap();
                }
                queue.chunks.pop_front().unwrap()
            };
            oversleep.wait_until(due);
            let Some(chunk) = chunk else { break };
            let written = dst.write_all(&chunk);
            {
                let mut queue = self.queue.lock().unwrap();
                queue.bytes -= chunk.len();
                if written.is_err() {
                    queue.closed = true;
                }
                self.changed.notify_all();
            }
            if written.is_err() {
                break;
            }
        }
        on_end();
    }
}

impl Direction {
    /// The queue, once it has a chunk or after a short spin (on machines with cores to spare:
    /// a sleeping writer's wake-up would add tens of µs to every small message).
    fn next_queued(&self) -> std::sync::MutexGuard<'_, Queue> {
        if spin_allowed() {
            let start = Instant::now();
            while start.elapsed() < idle_spin() {
                if let Ok(queue) = self.queue.try_lock() {
                    if !queue.chunks.is_empty() {
                        return queue;
                    }
                }
                std::hint::spin_loop();
            }
        }
        self.queue.lock().unwrap()
    }
}

/// How long an idle pump spins for the next chunk before it sleeps (`RGPU_LINK_SPIN_US`, for
/// experiments; default 200 µs).
fn idle_spin() -> Duration {
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = std::env::var("RGPU_LINK_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(200);
        Duration::from_micros(us)
    })
}

/// Whether the machine has cores enough for the writers to spin (8 or more).
fn spin_allowed() -> bool {
    static ALLOWED: OnceLock<bool> = OnceLock::new();
    *ALLOWED.get_or_init(|| std::thread::available_parallelism().is_ok_and(|n| n.get() >= 8))
}

/// Waits for `fd` to have data by polling it for up to [`idle_spin`] (where spinning is
/// allowed), so that the blocking read after it does not sleep when data comes soon.
fn spin_until_readable(fd: RawFd) {
    if !spin_allowed() {
        return;
    }
    let start = Instant::now();
    let mut pollfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    while start.elapsed() < idle_spin() {
        // SAFETY: one valid pollfd, timeout 0 (never blocks).
        if unsafe { libc::poll(&mut pollfd, 1, 0) } != 0 {
            return;
        }
        std::hint::spin_loop();
    }
}

/// Asks the kernel to stamp each segment `fd` receives with the time it arrived (TCP does;
/// Unix sockets ignore it and their reads go unstamped).
fn stamp_arrivals(fd: RawFd) {
    let flags: libc::c_int =
        (libc::SOF_TIMESTAMPING_RX_SOFTWARE | libc::SOF_TIMESTAMPING_SOFTWARE) as libc::c_int;
    // SAFETY: a socket option taking an int, given a valid pointer and its size.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPING,
            (&flags as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

/// Reads from the socket `fd` into `buf`: the count, and when the data arrived in the socket
/// if the kernel stamped it ([`stamp_arrivals`]).
fn read_stamped(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<Instant>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Room for one SCM_TIMESTAMPING (three timespecs) with its header, aligned.
    let mut control = [0u64; 16];
    // SAFETY: a zeroed msghdr is valid; its pointers are set below to live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: msg points at `buf` and `control`, both alive and of the sizes given.
    let n = unsafe { libc::recvmsg(fd, &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut stamp = None;
    // SAFETY: walks the control messages the kernel wrote within `control`.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_TIMESTAMPING
            {
                let software =
                    std::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const libc::timespec);
                stamp = instant_of_realtime(software);
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok((n as usize, stamp))
}

/// The `Instant` of a CLOCK_REALTIME time in the recent past (`None` if zero, in the future
/// or over a second ago: not a time to trust).
fn instant_of_realtime(at: libc::timespec) -> Option<Instant> {
    if at.tv_sec == 0 && at.tv_nsec == 0 {
        return None;
    }
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut now) };
    let monotonic_now = Instant::now();
    let age_ns =
        (now.tv_sec - at.tv_sec) as i128 * 1_000_000_000 + (now.tv_nsec - at.tv_nsec) as i128;
    (0..1_000_000_000)
        .contains(&age_ns)
        .then(|| monotonic_now - Duration::from_nanos(age_ns as u64))
}

/// A connected pair of loopback TCP sockets (the program's end and the link's): unlike a Unix
/// socket pair, the kernel stamps what each receives with its arrival time. The accepted end
/// must be the one this call connected (another local process could have raced to connect).
fn loopback_pair() -> io::Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))?;
    let app = TcpStream::connect(listener.local_addr()?)?;
    loop {
        let (link_end, from) = listener.accept()?;
        if from == app.local_addr()? {
            app.set_nodelay(true)?;
            link_end.set_nodelay(true)?;
            return Ok((app, link_end));
        }
    }
}

/// A writer's sleeps: how late they have recently woken, so the next sleep ends that much
/// (plus [`SPIN`]) before its chunk is due and a spin covers the rest.
struct Oversleep {
    /// The recent worst lateness, decaying by 1/16 per sleep.
    late: Duration,
}

impl Default for Oversleep {
    fn default() -> Self {
        Oversleep {
            late: Duration::from_micros(20),
        }
    }
}

impl Oversleep {
    /// Sleeps until shortly before `due`, then spins to it.
    fn wait_until(&mut self, due: Instant) {
        let margin = SPIN + self.late;
        let now = Instant::now();
        if due > now + margin {
            let wake = due - margin;
            std::thread::sleep(wake - now);
            let late = Instant::now().saturating_duration_since(wake);
            self.late = (self.late - self.late / 16).max(late).min(MAX_MARGIN);
        }
        while Instant::now() < due {
            std::hint::spin_loop();
        }
    }
}

/// The most a writer stops sleeping before a chunk is due.
const MAX_MARGIN: Duration = Duration::from_millis(2);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_settings_parse_with_their_units() {
        let spec: LinkSpec = "rtt=200us,bandwidth=10Gbit".parse().unwrap();
        assert_eq!(spec.rtt, Duration::from_micros(200));
        assert_eq!(spec.bits_per_second, Some(10e9));
        let spec: LinkSpec = "bandwidth=100Mbps".parse().unwrap();
        assert_eq!(spec.rtt, Duration::ZERO);
        assert_eq!(spec.bits_per_second, Some(100e6));
        let spec: LinkSpec = "rtt=5ms".parse().unwrap();
        assert_eq!(
            (spec.rtt, spec.bits_per_second),
            (Duration::from_millis(5), None)
        );
        assert_eq!(
            "rtt=1.5s".parse::<LinkSpec>().unwrap().rtt,
            Duration::from_millis(1500)
        );
        for bad in [
            "rtt=5",
            "rtt=fast",
            "bandwidth=10",
            "speed=1Gbit",
            "rtt",
            "bandwidth=0Gbit",
        ] {
            assert!(bad.parse::<LinkSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn bytes_cross_an_emulated_link_whole_and_in_order() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let echo = std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let mut buf = vec![0u8; 1 << 16];
            loop {
                match socket.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => socket.write_all(&buf[..n]).unwrap(),
                }
            }
        });
        let real = Stream::Tcp(std::net::TcpStream::connect(addr).unwrap());
        let spec = LinkSpec {
            rtt: Duration::from_micros(100),
            bits_per_second: Some(1e9),
        };
        let mut stream = emulate(real, spec).unwrap();
        assert!(stream.peer_is_local());
        let sent: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut reader = stream.try_clone().unwrap();
        let expected = sent.len();
        let back = std::thread::spawn(move || {
            let mut got = vec![0u8; expected];
            reader.read_exact(&mut got).unwrap();
            got
        });
        stream.write_all(&sent).unwrap();
        assert_eq!(back.join().unwrap(), sent);
        stream.shutdown();
        echo.join().unwrap();
    }
}
