//! Byte streams between client and server: TCP, or a Unix socket for same-host clients.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

use crate::tls::TlsStream;

/// Where a server listens or a client connects: `host:port`, or `unix:/path/to/socket`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Tcp(String),
    Unix(PathBuf),
}

impl Endpoint {
    /// Whether this is a Unix socket (a server on this host).
    pub fn is_unix(&self) -> bool {
        matches!(self, Endpoint::Unix(_))
    }

    pub fn parse(text: &str) -> Result<Endpoint, String> {
        let text = text.trim();
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("empty Unix socket path".into());
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        if text.is_empty() {
            return Err("empty server address".into());
        }
        if !text.contains(':') {
            return Err(format!("'{text}' is not host:port or unix:/path"));
        }
        Ok(Endpoint::Tcp(text.to_string()))
    }

    /// Parses a comma-separated list such as `RGPU_SERVERS`.
    pub fn parse_list(text: &str) -> Result<Vec<Endpoint>, String> {
        text.split(',')
            .filter(|part| !part.trim().is_empty())
            .map(Endpoint::parse)
            .collect()
    }
}

impl Endpoint {
    /// Whether both endpoints are surely on one machine (Unix sockets, the same host, or
    /// both loopback): where CUDA IPC handles of one server's memory open in the other.
    pub fn same_machine(&self, other: &Endpoint) -> bool {
        fn host(addr: &str) -> &str {
            let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
            host.trim_start_matches('[').trim_end_matches(']')
        }
        fn loopback(host: &str) -> bool {
            host == "localhost"
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        match (self, other) {
            (Endpoint::Unix(_), Endpoint::Unix(_)) => true,
            (Endpoint::Tcp(a), Endpoint::Tcp(b)) => {
                let (a, b) = (host(a), host(b));
                a == b || (loopback(a) && loopback(b))
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Tcp(addr) => f.write_str(addr),
            Endpoint::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// Which kind of socket a [`Stream`] is, for passing it between processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum StreamKind {
    Tcp,
    Unix,
}

#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// TLS over one of the others (see [`crate::tls`]).
    Tls(Box<TlsStream>),
    /// One of the others behind the link emulator (`RGPU_LINK`, see [`crate::link`]).
    Emulated(Box<crate::link::EmulatedStream>),
}

impl Stream {
    /// Connects with a bound on the time spent (every address of a host name is tried).
    pub fn connect(endpoint: &Endpoint, timeout: Duration) -> io::Result<Stream> {
        if crate::fork::forked() {
            // The parent's connections are unusable here; the library says so first.
            return Err(crate::fork::forked_error());
        }
        crate::fork::note_connection_opened();
        let real = Self::connect_real(endpoint, timeout)?;
        match crate::link::from_env() {
            // One link per server: its connection and data lanes share its rate.
            Some(spec) => {
                let wire = crate::link::Wire::to(&endpoint.to_string());
                crate::link::emulate_on(real, spec, wire)
            }
            None => Ok(real),
        }
    }

    fn connect_real(endpoint: &Endpoint, timeout: Duration) -> io::Result<Stream> {
        match endpoint {
            Endpoint::Unix(path) => Ok(Stream::Unix(match abstract_name(path) {
                Some(name) => UnixStream::connect_addr(&abstract_address(name)?)?,
                None => UnixStream::connect(path)?,
            })),
            Endpoint::Tcp(addr) => {
                let mut last_err = None;
                for sock_addr in addr.to_socket_addrs()? {
                    match TcpStream::connect_timeout(&sock_addr, timeout) {
                        Ok(stream) => {
                            stream.set_nodelay(true)?;
                            return Ok(Stream::Tcp(stream));
                        }
                        Err(e) => last_err = Some(e),
                    }
                }
                Err(last_err.unwrap_or_else(|| {
                    io::Error::new(io::ErrorKind::NotFound, format!("{addr}: no address"))
                }))
            }
        }
    }

    /// The socket's descriptor, for polling; `None` for TLS (its bytes are not the socket's) and
    /// emulated links.
    pub fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        match self {
            Stream::Tcp(s) => Some(s.as_raw_fd()),
            Stream::Unix(s) => Some(s.as_raw_fd()),
            Stream::Tls(_) | Stream::Emulated(_) => None,
        }
    }

    /// The socket underneath, TLS or not (for its queues' sizes); `None` behind the link
    /// emulator, whose socket is a local pair.
    pub fn socket_fd(&self) -> Option<std::os::fd::RawFd> {
        match self {
            Stream::Tls(s) => s.socket().socket_fd(),
            other => other.raw_fd(),
        }
    }

    /// `Err` once the peer has closed or the connection has failed (looked at without
    /// waiting; for waits on something else the peer should do, such as a shared ring).
    pub fn peer_still_there(&self) -> io::Result<()> {
        let Some(fd) = self.socket_fd() else {
            return Ok(());
        };
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one pollfd for the call's duration; a zero timeout.
        let n = unsafe { libc::poll(&mut poll, 1, 0) };
        if n > 0 && poll.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the peer closed the connection",
            ));
        }
        Ok(())
    }

    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tls(s) => Stream::Tls(Box::new(s.try_clone()?)),
            Stream::Emulated(s) => Stream::Emulated(Box::new(s.try_clone()?)),
        })
    }

    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(timeout),
            Stream::Unix(s) => s.set_read_timeout(timeout),
            Stream::Tls(s) => s.socket().set_read_timeout(timeout),
            Stream::Emulated(s) => s.app().set_read_timeout(timeout),
        }
    }

    pub fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(timeout),
            Stream::Unix(s) => s.set_write_timeout(timeout),
            Stream::Tls(s) => s.socket().set_write_timeout(timeout),
            Stream::Emulated(s) => s.app().set_write_timeout(timeout),
        }
    }

    /// The stream's socket, to hand to another process (see [`Stream::from_fd`]). Only a
    /// plain socket can move: a TLS connection's state stays in this process (its streams
    /// are handed over before the TLS handshake).
    pub fn into_fd(self) -> Result<(StreamKind, OwnedFd), Stream> {
        match self {
            Stream::Tcp(s) => Ok((StreamKind::Tcp, OwnedFd::from(s))),
            Stream::Unix(s) => Ok((StreamKind::Unix, OwnedFd::from(s))),
            other @ (Stream::Tls(_) | Stream::Emulated(_)) => Err(other),
        }
    }

    /// A stream on a socket another process handed over (made by [`Stream::into_fd`]).
    pub fn from_fd(kind: StreamKind, fd: OwnedFd) -> Stream {
        match kind {
            StreamKind::Tcp => Stream::Tcp(TcpStream::from(fd)),
            StreamKind::Unix => Stream::Unix(UnixStream::from(fd)),
        }
    }

    /// Makes a peer that vanished (a host gone, a silent network partition) an error within
    /// about `timeout`, whether or not anything is being sent: TCP keepalive probes an idle
    /// connection, and TCP_USER_TIMEOUT bounds how long sent data (or a probe) may stay
    /// unacknowledged. A peer that is merely busy still acknowledges at the TCP level, so a
    /// long-running request is not mistaken for a dead peer. A Unix socket's peer closing is
    /// seen at once, so it needs nothing.
    pub fn set_liveness(&self, timeout: Duration) -> io::Result<()> {
        let tcp = match self {
            Stream::Tcp(tcp) => tcp,
            Stream::Tls(tls) => return tls.socket().set_liveness(timeout),
            Stream::Emulated(link) => return link.real().set_liveness(timeout),
            Stream::Unix(_) => return Ok(()),
        };
        let socket = socket2::SockRef::from(tcp);
        let idle = (timeout / 3).max(Duration::from_secs(1));
        let interval = (timeout / 6).max(Duration::from_secs(1));
        socket.set_tcp_keepalive(
            &socket2::TcpKeepalive::new()
                .with_time(idle)
                .with_interval(interval)
                .with_retries(6),
        )?;
        socket.set_tcp_user_timeout(Some(timeout))
    }

    /// Ends both directions; a thread blocked reading the stream wakes up. Not in a forked
    /// child: the socket is the parent's (see [`crate::fork`]).
    pub fn shutdown(&self) {
        if crate::fork::forked() {
            return;
        }
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
            Stream::Tls(s) => {
                s.socket().shutdown();
                Ok(())
            }
            Stream::Emulated(s) => {
                s.shutdown();
                Ok(())
            }
        };
    }

    /// Whether this is a Unix socket (under an emulated link: whether the real one is).
    pub fn is_unix(&self) -> bool {
        match self {
            Stream::Unix(_) => true,
            Stream::Emulated(s) => s.real().is_unix(),
            Stream::Tcp(_) | Stream::Tls(_) => false,
        }
    }

    /// Whether the peer is on this machine (loopback TCP or a Unix socket).
    pub fn peer_is_local(&self) -> bool {
        match self {
            Stream::Unix(_) => true,
            Stream::Tcp(s) => s.peer_addr().map(|a| a.ip().is_loopback()).unwrap_or(false),
            Stream::Tls(s) => s.socket().peer_is_local(),
            Stream::Emulated(s) => s.peer_is_local(),
        }
    }

    /// The user whose process holds the other end, where that process is on this machine:
    /// from the kernel for a Unix socket, from the kernel's socket table (/proc/net/tcp*) for
    /// TCP; `None` for a peer elsewhere (or not found).
    pub fn peer_uid(&self) -> Option<u32> {
        match self {
            Stream::Unix(s) => unix_peer_uid(s),
            Stream::Tcp(s) => {
                let (ours, theirs) = (s.local_addr().ok()?, s.peer_addr().ok()?);
                // The peer's socket: bound to its address, connected to ours.
                tcp_socket_owner(theirs, ours)
            }
            Stream::Tls(s) => s.socket().peer_uid(),
            Stream::Emulated(s) => s.real().peer_uid(),
        }
    }

    /// This end's IP address (`None` for a Unix socket or an emulated link).
    pub fn local_ip(&self) -> Option<std::net::IpAddr> {
        match self {
            Stream::Tcp(s) => s.local_addr().ok().map(|a| a.ip()),
            Stream::Tls(s) => s.socket().local_ip(),
            Stream::Unix(_) | Stream::Emulated(_) => None,
        }
    }

    /// The peer's IP address (`None` for a Unix socket).
    pub fn peer_ip(&self) -> Option<std::net::IpAddr> {
        match self {
            Stream::Unix(_) => None,
            Stream::Tcp(s) => s.peer_addr().ok().map(|a| a.ip()),
            Stream::Tls(s) => s.socket().peer_ip(),
            Stream::Emulated(s) => s.peer_ip(),
        }
    }

    pub fn peer_description(&self) -> String {
        match self {
            Stream::Unix(_) => "unix socket peer".to_string(),
            Stream::Tcp(s) => s
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "unknown peer".into()),
            Stream::Tls(s) => format!("{} (TLS)", s.socket().peer_description()),
            Stream::Emulated(s) => format!("{} (emulated link)", s.real().peer_description()),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if crate::fork::forked() {
            return Err(crate::fork::forked_error());
        }
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
            Stream::Emulated(s) => s.app_mut().read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if crate::fork::forked() {
            return Err(crate::fork::forked_error());
        }
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
            Stream::Emulated(s) => s.app_mut().write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        if crate::fork::forked() {
            return Err(crate::fork::forked_error());
        }
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
            Stream::Tls(s) => s.write_vectored(bufs),
            Stream::Emulated(s) => s.app_mut().write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A bound listening socket.
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    pub fn bind(endpoint: &Endpoint) -> io::Result<Listener> {
        match endpoint {
            Endpoint::Tcp(addr) => Ok(Listener::Tcp(TcpListener::bind(addr.as_str())?)),
            Endpoint::Unix(path) => {
                if let Some(name) = abstract_name(path) {
                    let listener = UnixListener::bind_addr(&abstract_address(name)?)?;
                    return Ok(Listener::Unix(listener, path.clone()));
                }
                // A stale socket file from a previous run would make bind fail.
                if path.exists() && UnixStream::connect(path).is_err() {
                    let _ = std::fs::remove_file(path);
                }
                Ok(Listener::Unix(UnixListener::bind(path)?, path.clone()))
            }
        }
    }

    pub fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Tcp(l) => {
                let (stream, _) = l.accept()?;
                stream.set_nodelay(true)?;
                Ok(Stream::Tcp(stream))
            }
            Listener::Unix(l, _) => Ok(Stream::Unix(l.accept()?.0)),
        }
    }

    /// The address actually bound (resolves port 0).
    pub fn local_endpoint(&self) -> io::Result<Endpoint> {
        match self {
            Listener::Tcp(l) => Ok(Endpoint::Tcp(l.local_addr()?.to_string())),
            Listener::Unix(_, path) => Ok(Endpoint::Unix(path.clone())),
        }
    }

    /// Whether only clients on this machine can reach the listener.
    pub fn is_local_only(&self) -> bool {
        match self {
            Listener::Unix(..) => true,
            Listener::Tcp(l) => l
                .local_addr()
                .map(|a: SocketAddr| a.ip().is_loopback())
                .unwrap_or(false),
        }
    }

    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        match self {
            Listener::Tcp(l) => l.set_nonblocking(nonblocking),
            Listener::Unix(l, _) => l.set_nonblocking(nonblocking),
        }
    }

    /// Waits (at most `timeout`) until one of `listeners` has a connection to accept.
    pub fn wait_any(listeners: &[Listener], timeout: Duration) {
        use std::os::fd::AsRawFd;
        let mut fds: Vec<libc::pollfd> = listeners
            .iter()
            .map(|listener| libc::pollfd {
                fd: match listener {
                    Listener::Tcp(l) => l.as_raw_fd(),
                    Listener::Unix(l, _) => l.as_raw_fd(),
                },
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let millis = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `fds.len()` valid pollfds for the duration of the call.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, millis) };
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            if abstract_name(path).is_none() {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// The name of an abstract Unix socket (`unix:@name`: no file, gone with the socket, reachable
/// only from the same network namespace), or `None` for a socket file's path.
pub fn abstract_name(path: &std::path::Path) -> Option<&[u8]> {
    use std::os::unix::ffi::OsStrExt;
    path.as_os_str().as_bytes().strip_prefix(b"@")
}

fn abstract_address(name: &[u8]) -> io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(name)
}

/// This machine's host name (`None` where it cannot be read or is empty): names a server, and
/// the application a client process belongs to.
/// The uid of a Unix socket's peer process (SO_PEERCRED).
fn unix_peer_uid(socket: &UnixStream) -> Option<u32> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain values, zeroed is valid.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a socket this value owns and a local out-struct of the size given.
    let got = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (got == 0).then_some(cred.uid)
}

/// The uid owning this machine's TCP socket bound to `local` and connected to `remote`, from
/// the kernel's socket tables.
fn tcp_socket_owner(local: SocketAddr, remote: SocketAddr) -> Option<u32> {
    let table = match local {
        SocketAddr::V4(_) => "/proc/net/tcp",
        SocketAddr::V6(_) => "/proc/net/tcp6",
    };
    let text = std::fs::read_to_string(table).ok()?;
    let (local, remote) = (proc_net_address(local), proc_net_address(remote));
    text.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // sl, local_address, rem_address, st, tx:rx, tr:when, retrnsmt, uid, ...
        (fields.len() > 7 && fields[1] == local && fields[2] == remote)
            .then(|| fields[7].parse().ok())
            .flatten()
    })
}

/// An address as /proc/net/tcp* writes it: the address's 32-bit words in hex as the host
/// stores them, a colon, the port in hex.
fn proc_net_address(address: SocketAddr) -> String {
    let words: Vec<u32> = match address {
        SocketAddr::V4(a) => vec![u32::from_ne_bytes(a.ip().octets())],
        SocketAddr::V6(a) => a
            .ip()
            .octets()
            .chunks(4)
            .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
            .collect(),
    };
    let hex: String = words.iter().map(|w| format!("{w:08X}")).collect();
    format!("{hex}:{:04X}", address.port())
}

pub fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .ok()
        .filter(|name| !name.is_empty())
}

#[cfg(test)]
mod tests {
    use super::Endpoint;

    #[test]
    fn the_peer_of_a_local_connection_is_this_user() {
        // SAFETY: a plain system call.
        let me = unsafe { libc::geteuid() };
        for host in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(listener) = std::net::TcpListener::bind(host) else {
                continue; // no IPv6 loopback here
            };
            let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (accepted, _) = listener.accept().unwrap();
            assert_eq!(super::Stream::Tcp(accepted).peer_uid(), Some(me), "{host}");
            assert_eq!(super::Stream::Tcp(client).peer_uid(), Some(me), "{host}");
        }
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(super::Stream::Unix(a).peer_uid(), Some(me));
    }

    #[test]
    fn the_peer_of_another_users_connection_is_that_user() {
        use std::os::unix::process::CommandExt;
        // SAFETY: a plain system call.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root, to connect as another user");
            return;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let script = format!(
            "import socket, time; s = socket.create_connection(('127.0.0.1', {port})); time.sleep(10)"
        );
        let mut child = std::process::Command::new("python3")
            .args(["-c", &script])
            .uid(65534)
            .gid(65534)
            .spawn()
            .expect("python3 runs");
        let (accepted, _) = listener.accept().unwrap();
        let uid = super::Stream::Tcp(accepted).peer_uid();
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(uid, Some(65534));
    }

    #[test]
    fn addresses_are_written_as_the_kernel_writes_them() {
        let v4: std::net::SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let v6: std::net::SocketAddr = "[::1]:443".parse().unwrap();
        if cfg!(target_endian = "little") {
            assert_eq!(super::proc_net_address(v4), "0100007F:1F90");
            assert_eq!(
                super::proc_net_address(v6),
                "00000000000000000000000001000000:01BB"
            );
        }
    }

    #[test]
    fn endpoints_on_one_machine() {
        let at = |s: &str| Endpoint::parse(s).unwrap();
        assert!(at("127.0.0.1:1").same_machine(&at("127.0.0.1:2")));
        assert!(at("127.0.0.1:1").same_machine(&at("[::1]:2")));
        assert!(at("gpu1:7000").same_machine(&at("gpu1:7001")));
        assert!(!at("gpu1:7000").same_machine(&at("gpu2:7000")));
        assert!(!at("10.0.0.1:7000").same_machine(&at("127.0.0.1:7000")));
        assert!(at("unix:/run/a").same_machine(&at("unix:/run/b")));
    }
}
