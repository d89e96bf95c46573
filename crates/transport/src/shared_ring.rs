//! The shared-memory path between a client and a server on one host: a memory region the
//! client creates (a sealed memfd), hands to the server over the Unix socket (SCM_RIGHTS) and
//! both map. It holds two rings of bulk bytes, one each way; frames still travel on the socket
//! and say when their bulk is in the ring (`rgpu_protocol::IN_RING`), so requests and replies
//! keep one order. Each ring has one producer and one consumer at a time: bytes are copied in,
//! the `produced` counter published, and the consumer wakes on a futex word in the region
//! (a process-shared futex: the two ends are different processes).
//!
//! The peer may write anything into the region at any time, so each end keeps its own count
//! of what it produced or consumed and only reads the other's: a count that would put more
//! than the ring's size in flight is a broken peer, and nothing is ever copied outside the
//! mapping. Every wait is bounded.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where the rings' data start (the first page holds the counters).
const DATA_START: usize = 4096;
/// Largest ring accepted (each way).
pub const MAX_RING_LEN: u64 = 256 << 20;
/// Bytes written to or taken from a ring before the other end hears of them: while the
/// consumer copies one piece out, the producer copies the next in (each piece by several
/// threads: crate::copier).
const PIECE: usize = 2 << 20;
/// How often a waiting end looks again at whether its peer is gone.
const WAIT_SLICE: Duration = Duration::from_millis(50);
const MAGIC: u64 = u64::from_le_bytes(*b"rgpuring");

/// One direction's counters, each on its own cache line.
#[repr(C, align(64))]
struct Counters {
    /// Bytes put into the ring since it was made (the producer's).
    produced: AtomicU64,
    /// Bumped after each change of `produced`: the futex word the consumer sleeps on.
    produced_wake: AtomicU32,
    _pad: [u8; 52],
    /// Bytes taken out of the ring (the consumer's).
    consumed: AtomicU64,
    consumed_wake: AtomicU32,
}

#[repr(C)]
struct Header {
    magic: u64,
    ring_len: u64,
    _pad: [u8; 48],
    to_server: Counters,
    to_client: Counters,
}

const _: () = assert!(std::mem::size_of::<Header>() <= DATA_START);

/// The size of a region for two rings of `ring_len` bytes (whole pages, at most
/// [`MAX_RING_LEN`]).
fn region_len(ring_len: u64) -> io::Result<usize> {
    if ring_len == 0 || ring_len > MAX_RING_LEN || !ring_len.is_multiple_of(4096) {
        return Err(io::Error::other(format!("bad ring size {ring_len}")));
    }
    Ok(DATA_START + 2 * ring_len as usize)
}

/// A mapped shared region (unmapped on drop).
pub struct SharedRegion {
    fd: OwnedFd,
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access to it goes through atomics or
// through a ring end, which one thread owns at a time.
unsafe impl Send for SharedRegion {}
// SAFETY: as above.
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// The region for two rings of `ring_len` bytes, initialized.
    pub fn create(ring_len: u64) -> io::Result<Arc<SharedRegion>> {
        let region = Self::create_plain(region_len(ring_len)?)?;
        let header = region.header();
        // SAFETY: the header lies at the start of the fresh mapping, which nobody else sees yet.
        unsafe {
            std::ptr::addr_of_mut!((*header).ring_len).write(ring_len);
            std::ptr::addr_of_mut!((*header).magic).write(MAGIC);
        }
        Ok(region)
    }

    /// Maps a region a client sent for rings of `ring_len` bytes each way, after the checks of
    /// [`SharedRegion::adopt_plain`] and of its header.
    pub fn adopt(fd: OwnedFd, ring_len: u64) -> io::Result<Arc<SharedRegion>> {
        let region = Self::adopt_plain(fd, region_len(ring_len)? as u64)?;
        let header = region.header();
        // SAFETY: inside the mapping; the peer may change it, so it is read once as plain data.
        let (magic, theirs) = unsafe {
            (
                std::ptr::addr_of!((*header).magic).read_volatile(),
                std::ptr::addr_of!((*header).ring_len).read_volatile(),
            )
        };
        if magic != MAGIC || theirs != ring_len {
            return Err(io::Error::other("the region's header does not match"));
        }
        Ok(region)
    }

    /// `len` bytes of shared memory (whole pages): a new memfd, sealed against shrinking and
    /// growing (a server that maps it never faults on a truncated file), mapped.
    pub fn create_plain(len: usize) -> io::Result<Arc<SharedRegion>> {
        if len == 0 || !len.is_multiple_of(4096) {
            return Err(io::Error::other(format!("bad shared region size {len}")));
        }
        // SAFETY: a constant NUL-terminated name and flags.
        let raw = unsafe {
            libc::memfd_create(
                c"rgpu-shared".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just made and owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: our own descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: our own descriptor.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Arc::new(Self::map_fd(fd, len)?))
    }

    /// Maps shared memory a client sent, after checking that it is a memfd sealed against
    /// shrinking, of exactly `len` bytes.
    pub fn adopt_plain(fd: OwnedFd, len: u64) -> io::Result<Arc<SharedRegion>> {
        // SAFETY: a descriptor we own.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(io::Error::other(
                "the shared memory is not sealed against shrinking",
            ));
        }
        // SAFETY: a zeroed stat filled by the kernel.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if len == 0 || stat.st_size as u64 != len {
            return Err(io::Error::other(format!(
                "the shared memory has {} bytes, {len} expected",
                stat.st_size
            )));
        }
        let len = usize::try_from(len).map_err(io::Error::other)?;
        Ok(Arc::new(Self::map_fd(fd, len)?))
    }

    /// Where the mapping starts in this process, and its length.
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn map_fd(fd: OwnedFd, len: usize) -> io::Result<SharedRegion> {
        // SAFETY: a fresh shared mapping of the whole file; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedRegion {
            fd,
            base: base.cast(),
            len,
        })
    }

    /// The descriptor to send to the server.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn header(&self) -> *mut Header {
        self.base.cast()
    }

    fn ring_len(&self) -> usize {
        (self.len - DATA_START) / 2
    }

    /// The two ends this side owns: (producer, consumer). The client produces into the
    /// to-server ring and consumes the to-client one; the server the other way round.
    pub fn ends(self: &Arc<Self>, client: bool) -> (RingProducer, RingConsumer) {
        let ring = self.ring_len();
        // SAFETY: both counter blocks lie inside the header page of the mapping.
        let (to_server, to_client) = unsafe {
            (
                std::ptr::addr_of!((*self.header()).to_server),
                std::ptr::addr_of!((*self.header()).to_client),
            )
        };
        // SAFETY: the data areas lie inside the mapping (DATA_START + 2 rings = len).
        let (server_data, client_data) =
            unsafe { (self.base.add(DATA_START), self.base.add(DATA_START + ring)) };
        let (out, out_data, back, back_data) = if client {
            (to_server, server_data, to_client, client_data)
        } else {
            (to_client, client_data, to_server, server_data)
        };
        (
            RingProducer {
                _region: self.clone(),
                counters: out,
                data: out_data,
                ring,
                produced: 0,
                reserved: 0,
            },
            RingConsumer {
                _region: self.clone(),
                counters: back,
                data: back_data,
                ring,
                consumed: 0,
                taken: 0,
            },
        )
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer used (ends hold the region alive).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// What a waiting end asks between slices: `Err` ends the wait (the peer is gone).
pub type StillThere<'a> = &'a dyn Fn() -> io::Result<()>;

fn broken(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("shared ring: {why}"))
}

/// Sleeps on `word` while it still holds `seen`, at most `timeout` (a process-shared futex).
fn futex_wait(word: &AtomicU32, seen: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: a futex word inside the live mapping; the kernel only reads it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
}

fn futex_wake(word: &AtomicU32) {
    word.fetch_add(1, Ordering::Release);
    // SAFETY: a futex word inside the live mapping.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        )
    };
}

/// Waits until `ready` gives a value, sleeping on `word` between looks; bounded by `deadline`
/// and by `still_there`.
fn wait_for<T>(
    word: &AtomicU32,
    deadline: Instant,
    still_there: StillThere<'_>,
    mut ready: impl FnMut() -> io::Result<Option<T>>,
) -> io::Result<T> {
    let mut spins = 0;
    loop {
        let seen = word.load(Ordering::Acquire);
        if let Some(value) = ready()? {
            return Ok(value);
        }
        // A peer in the middle of a copy publishes within microseconds: look again a few
        // times before sleeping.
        if spins < 64 {
            spins += 1;
            std::hint::spin_loop();
            continue;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "shared ring: the peer went quiet",
            ));
        }
        still_there()?;
        futex_wait(word, seen, left.min(WAIT_SLICE));
    }
}

/// The end that copies bytes into a ring.
pub struct RingProducer {
    _region: Arc<SharedRegion>,
    counters: *const Counters,
    data: *mut u8,
    ring: usize,
    /// What this end produced (its own count; the region's copy is for the peer).
    produced: u64,
    /// How far room was handed out ([`RingProducer::reserve`]); at least `produced`.
    reserved: u64,
}

// SAFETY: the pointers are into the region this end keeps alive; one thread uses an end at a
// time (`&mut self`).
unsafe impl Send for RingProducer {}

impl RingProducer {
    fn counters(&self) -> &Counters {
        // SAFETY: inside the mapping, which `_region` keeps alive; only atomics are touched.
        unsafe { &*self.counters }
    }

    /// The ring's size.
    pub fn capacity(&self) -> usize {
        self.ring
    }

    /// The mapping the ring lies in (base address, length), for a device to register.
    pub fn region(&self) -> (*mut u8, usize) {
        (self._region.base, self._region.len)
    }

    /// Copies `bytes` into the ring, waiting for room as the consumer takes them.
    pub fn write(
        &mut self,
        mut bytes: &[u8],
        timeout: Duration,
        still_there: StillThere<'_>,
    ) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        while !bytes.is_empty() {
            let (at, n) = self.reserve(bytes.len().min(PIECE), Some(deadline), still_there)?;
            // SAFETY: `reserve` handed out [at, at+n), inside the ring's data area, which the
            // consumer does not read until it is published.
            unsafe { crate::copier::copy(bytes.as_ptr(), at, n) };
            self.publish(n)?;
            bytes = &bytes[n..];
        }
        Ok(())
    }

    /// Room for up to `max` bytes after what was reserved before, one contiguous run (it may
    /// be shorter: the ring's end, or the room there is): its address and length. With a
    /// deadline, waits for room; without, gives 0 bytes when there is none.
    pub fn reserve(
        &mut self,
        max: usize,
        deadline: Option<Instant>,
        still_there: StillThere<'_>,
    ) -> io::Result<(*mut u8, usize)> {
        let ring = self.ring as u64;
        let reserved = self.reserved;
        let free_now = || {
            let consumed = self.counters().consumed.load(Ordering::Acquire);
            match reserved.checked_sub(consumed) {
                Some(used) if used <= ring => Ok((used < ring).then_some(ring - used)),
                _ => Err(broken("the consumer's count is impossible")),
            }
        };
        let free = match deadline {
            Some(deadline) => wait_for(
                &self.counters().consumed_wake,
                deadline,
                still_there,
                free_now,
            )?,
            None => free_now()?.unwrap_or(0),
        };
        let at = (reserved % ring) as usize;
        let n = max.min(free as usize).min(self.ring - at);
        self.reserved += n as u64;
        // SAFETY: `at` lies inside the ring's data area.
        Ok((unsafe { self.data.add(at) }, n))
    }

    /// Gives back the room reserved and not published (a fill that failed).
    pub fn cancel_reserved(&mut self) {
        self.reserved = self.produced;
    }

    /// Hands the consumer the next `n` reserved bytes (filled by now).
    pub fn publish(&mut self, n: usize) -> io::Result<()> {
        if self.produced + n as u64 > self.reserved {
            return Err(broken("published more than was reserved"));
        }
        self.produced += n as u64;
        self.counters()
            .produced
            .store(self.produced, Ordering::Release);
        futex_wake(&self.counters().produced_wake);
        Ok(())
    }
}

/// The end that takes bytes out of a ring.
pub struct RingConsumer {
    _region: Arc<SharedRegion>,
    counters: *const Counters,
    data: *const u8,
    ring: usize,
    consumed: u64,
    /// How far bytes were handed out in place ([`RingConsumer::take`]); at least `consumed`.
    taken: u64,
}

// SAFETY: as for `RingProducer`.
unsafe impl Send for RingConsumer {}

impl RingConsumer {
    fn counters(&self) -> &Counters {
        // SAFETY: inside the mapping, which `_region` keeps alive; only atomics are touched.
        unsafe { &*self.counters }
    }

    /// The mapping the ring lies in (base address, length), for a device to register.
    pub fn region(&self) -> (*mut u8, usize) {
        (self._region.base, self._region.len)
    }

    /// How many bytes were taken in place and not released yet.
    pub fn held(&self) -> u64 {
        self.taken - self.consumed
    }

    /// The next bytes, up to `max`, left where they are (one contiguous run, waiting for at
    /// least one byte): their address and length. They stay the caller's until released.
    pub fn take(
        &mut self,
        max: usize,
        timeout: Duration,
        still_there: StillThere<'_>,
    ) -> io::Result<(*const u8, usize)> {
        let deadline = Instant::now() + timeout;
        let ring = self.ring as u64;
        let taken = self.taken;
        let ready = wait_for(
            &self.counters().produced_wake,
            deadline,
            still_there,
            || {
                let produced = self.counters().produced.load(Ordering::Acquire);
                match produced.checked_sub(taken) {
                    Some(ready) if produced - self.consumed <= ring => {
                        Ok((ready > 0).then_some(ready))
                    }
                    _ => Err(broken("the producer's count is impossible")),
                }
            },
        )?;
        let at = (taken % ring) as usize;
        let n = max.min(ready as usize).min(self.ring - at);
        self.taken += n as u64;
        // SAFETY: `at` lies inside the ring's data area.
        Ok((unsafe { self.data.add(at) }, n))
    }

    /// Gives the producer back the oldest `n` bytes taken in place.
    pub fn release(&mut self, n: u64) -> io::Result<()> {
        if self.consumed + n > self.taken {
            return Err(broken("released more than was taken"));
        }
        self.consumed += n;
        self.counters()
            .consumed
            .store(self.consumed, Ordering::Release);
        futex_wake(&self.counters().consumed_wake);
        Ok(())
    }

    /// Takes the next `dst.len()` bytes (`None`: drops them), waiting for them to arrive.
    pub fn read(
        &mut self,
        mut dst: Option<&mut [u8]>,
        mut len: usize,
        timeout: Duration,
        still_there: StillThere<'_>,
    ) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        let mut done = 0usize;
        if self.taken != self.consumed {
            return Err(broken("a copy out while bytes are held in place"));
        }
        while len > 0 {
            let ring = self.ring as u64;
            let consumed = self.consumed;
            let ready = wait_for(
                &self.counters().produced_wake,
                deadline,
                still_there,
                || {
                    let produced = self.counters().produced.load(Ordering::Acquire);
                    match produced.checked_sub(consumed) {
                        Some(ready) if ready <= ring => Ok((ready > 0).then_some(ready)),
                        _ => Err(broken("the producer's count is impossible")),
                    }
                },
            )?;
            let at = (consumed % ring) as usize;
            let n = len.min(ready as usize).min(self.ring - at).min(PIECE);
            if let Some(dst) = dst.as_deref_mut() {
                // SAFETY: [at, at+n) lies inside the ring's data area, published by the
                // producer; `dst` has `len` bytes from `done` on. Copied by several threads:
                // one core's copy is slower than the device writes the ring.
                unsafe { crate::copier::copy(self.data.add(at), dst.as_mut_ptr().add(done), n) };
            }
            self.consumed += n as u64;
            self.taken = self.consumed;
            self.counters()
                .consumed
                .store(self.consumed, Ordering::Release);
            futex_wake(&self.counters().consumed_wake);
            done += n;
            len -= n;
        }
        Ok(())
    }
}

/// Sends `bytes` on a Unix socket with `fd` attached (SCM_RIGHTS) to its first byte.
pub fn send_with_fd(socket: RawFd, bytes: &[u8], fd: RawFd) -> io::Result<()> {
    let mut sent = 0;
    let mut control = [0u8; 64];
    while sent < bytes.len() {
        let mut iov = libc::iovec {
            iov_base: bytes[sent..].as_ptr() as *mut libc::c_void,
            iov_len: bytes.len() - sent,
        };
        // SAFETY: a zeroed msghdr filled in below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if sent == 0 {
            // SAFETY: CMSG_SPACE of one descriptor fits `control` (64 bytes).
            let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            // SAFETY: `msg` has a control buffer of `space` bytes; the first header fits.
            unsafe {
                let cmsg = libc::CMSG_FIRSTHDR(&msg);
                (*cmsg).cmsg_level = libc::SOL_SOCKET;
                (*cmsg).cmsg_type = libc::SCM_RIGHTS;
                (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
            }
        }
        // SAFETY: `msg` points at live buffers for the call's duration.
        let n = unsafe { libc::sendmsg(socket, &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        sent += n as usize;
    }
    Ok(())
}

/// Descriptors a reading end keeps (more are closed as they come).
const KEPT_FDS: usize = 4;

/// Reads from a Unix socket into `buf`, keeping descriptors that came with the bytes in
/// `fds` (at most [`KEPT_FDS`]; the rest are closed).
pub(crate) fn recv_keeping_fds(
    socket: RawFd,
    buf: &mut [u8],
    fds: &mut std::collections::VecDeque<OwnedFd>,
) -> io::Result<usize> {
    let mut control = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: a zeroed msghdr filled in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    let n = loop {
        // SAFETY: `msg` points at live buffers for the call's duration.
        let n = unsafe { libc::recvmsg(socket, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // SAFETY: walking the control messages the kernel wrote into `control`.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let bytes = (*cmsg).cmsg_len as usize - (data as usize - cmsg as usize);
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    let raw = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    let fd = OwnedFd::from_raw_fd(raw);
                    if fds.len() < KEPT_FDS {
                        fds.push_back(fd);
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn there() -> io::Result<()> {
        Ok(())
    }

    #[test]
    fn bytes_cross_both_rings_in_order_across_wraps() {
        let client = SharedRegion::create(64 << 10).unwrap();
        let fd = client.fd.try_clone().unwrap();
        let server = SharedRegion::adopt(fd, 64 << 10).unwrap();
        let (mut to_server, _) = client.ends(true);
        let (_, mut from_client) = server.ends(false);
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let sent = data.clone();
        let writer = std::thread::spawn(move || {
            for piece in sent.chunks(40_000) {
                to_server
                    .write(piece, Duration::from_secs(10), &there)
                    .unwrap();
            }
        });
        let mut got = vec![0u8; data.len()];
        for piece in got.chunks_mut(33_333) {
            let len = piece.len();
            from_client
                .read(Some(piece), len, Duration::from_secs(10), &there)
                .unwrap();
        }
        writer.join().unwrap();
        assert_eq!(got, data);
    }

    #[test]
    fn a_region_not_sealed_or_of_another_size_is_refused() {
        let region = SharedRegion::create(64 << 10).unwrap();
        let fd = region.fd.try_clone().unwrap();
        assert!(SharedRegion::adopt(fd, 128 << 10).is_err());
        // SAFETY: a constant name.
        let raw = unsafe { libc::memfd_create(c"plain".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: fresh and ours.
        let plain = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ours.
        unsafe { libc::ftruncate(plain.as_raw_fd(), (DATA_START + (128 << 10)) as _) };
        assert!(SharedRegion::adopt(plain, 64 << 10).is_err());
    }

    #[test]
    fn a_reader_waiting_for_a_silent_peer_gives_up() {
        let region = SharedRegion::create(64 << 10).unwrap();
        let (_, mut consumer) = region.ends(false);
        let start = Instant::now();
        let result = consumer.read(None, 10, Duration::from_millis(200), &there);
        assert!(result.is_err());
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn an_impossible_count_from_the_peer_is_an_error() {
        let region = SharedRegion::create(64 << 10).unwrap();
        let (_, mut consumer) = region.ends(false);
        // The client's side of the to-server ring claims more than the ring holds.
        // SAFETY: the header of our own mapping.
        unsafe {
            (*region.header())
                .to_server
                .produced
                .store(1 << 40, Ordering::Release)
        };
        let result = consumer.read(None, 10, Duration::from_secs(1), &there);
        assert_eq!(result.unwrap_err().kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn a_descriptor_travels_with_its_bytes() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let region = SharedRegion::create(64 << 10).unwrap();
        send_with_fd(a.as_raw_fd(), b"hello", region.raw_fd()).unwrap();
        let mut fds = std::collections::VecDeque::new();
        let mut buf = [0u8; 16];
        let n = recv_keeping_fds(b.as_raw_fd(), &mut buf, &mut fds).unwrap();
        assert_eq!(&buf[..n], b"hello");
        let fd = fds.pop_front().expect("a descriptor");
        SharedRegion::adopt(fd, 64 << 10).unwrap();
    }
}
