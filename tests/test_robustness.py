"""Robustness of real server processes: concurrent clients, clients killed mid-transfer, wrong
tokens, malformed frames, unreachable or dying servers, clean shutdown."""

import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import rgpu_harness as h

MIB = 1024 * 1024


# ---------------------------------------------------------------- helpers

class Client:
    """A program run through `rgpu run` in the background, its stdout read line by line."""

    def __init__(self, servers, cmd, **env):
        self.proc = subprocess.Popen(
            h.rgpu_run_cmd(servers, cmd),
            env=h.base_env(RGPU_TEST_PLATFORM="rgpu", **env), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, errors="replace",
            start_new_session=True)
        self.lines: list[str] = []
        self.err: list[str] = []
        self._cv = threading.Condition()
        self._open = 2
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.err), daemon=True).start()

    def _pump(self, stream, into):
        for line in stream:
            with self._cv:
                into.append(line.rstrip("\n"))
                self._cv.notify_all()
        with self._cv:
            self._open -= 1
            self._cv.notify_all()

    def wait_line(self, pattern: str, timeout: float) -> bool:
        """Waits until stdout has a line matching pattern (False on timeout or exit)."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                if any(rx.search(line) for line in self.lines):
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or self._open == 0:
                    return False
                self._cv.wait(min(left, 0.2))

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def describe(self) -> str:
        return ("--- client stdout ---\n" + "\n".join(self.lines[-50:]) +
                "\n--- client stderr ---\n" + "\n".join(self.err[-50:]))


def rss_mib(server) -> float:
    return server.rss_kb() / 1024.0


class RssSampler:
    """Samples a server's RSS in the background; keeps the peak."""

    def __init__(self, server, period=0.05):
        self.server, self.period, self.peak = server, period, 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss_mib(self.server))
            except (OSError, RuntimeError):
                return
            time.sleep(self.period)

    def stop(self) -> float:
        self._stop.set()
        self._t.join()
        return self.peak


def no_rgpu_devices(r: h.Result) -> bool:
    return not h.parse_clinfo_l(r.stdout).get("rgpu")


# ---------------------------------------------------------------- (a) concurrent clients

def test_two_clients_at_once(c_program, server):
    prog = c_program("buffers")
    with ThreadPoolExecutor(2) as ex:
        results = list(ex.map(lambda _: h.run_rgpu(prog, [server]), range(2)))
    for r in results:
        h.assert_pass(r, "buffers", server)
    assert server.alive()


def test_three_different_clients_at_once(c_program, server):
    # Programs whose failure here means a concurrency problem (the API-group programs that
    # check error codes are run on their own in test_opencl_groups.py).
    runs = [("buffers", []), ("images_samplers", []), ("stress_write", ["64", "4"])]
    with ThreadPoolExecutor(3) as ex:
        results = list(ex.map(lambda ga: h.run_rgpu(c_program(ga[0]), [server], ga[1]), runs))
    for (g, _), r in zip(runs, results):
        h.assert_pass(r, g, server)


# ---------------------------------------------------------------- (b) killed mid-transfer

def wait_rss_at_most(server, limit_mib: float, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    now = rss_mib(server)
    while now > limit_mib and time.monotonic() < deadline:
        time.sleep(0.2)
        now = rss_mib(server)
    return now


@pytest.mark.parametrize("direction", ["write", "read"])
def test_client_killed_mid_transfer(direction, c_program, server):
    buffers, stress = c_program("buffers"), c_program("stress_write")
    # A complete session first (64 MiB transfers), so PoCL and the server's staging are warm.
    h.assert_pass(h.run_rgpu(buffers, [server]), "buffers", server)
    time.sleep(0.5)
    base = rss_mib(server)
    sampler = RssSampler(server)
    client = Client([server], [stress, "256", "0", direction])
    try:
        ok = client.wait_line(r"^WROTE 1$", timeout=120)
        assert ok, f"the 256 MiB {direction} loop never completed a round\n{client.describe()}" \
                   f"\n{server.log_tail()}"
        time.sleep(1.0)  # a later 256 MiB round is in flight
        assert client.proc.poll() is None, f"{direction} loop ended early\n{client.describe()}"
    finally:
        client.kill()
    peak = sampler.stop()
    assert server.alive(), f"server died with its client\n{server.log_tail()}"
    assert peak >= base + 128, (f"server RSS went from {base:.0f} MiB to only {peak:.0f} MiB "
                                f"while a 256 MiB buffer was written; the test is vacuous")
    slack = max(64.0, 0.25 * base)
    now = wait_rss_at_most(server, base + slack, timeout=20)
    assert now <= base + slack, (f"server RSS did not come back: before {base:.0f} MiB, peak "
                                 f"{peak:.0f} MiB, 20 s after the kill {now:.0f} MiB "
                                 f"(allowed {base + slack:.0f})\n{server.log_tail()}")
    # The server noticed and released the session.
    assert server.wait_log(r"(?i)disconnect|lost|closing|released"), server.log_tail()
    # Another client works.
    h.assert_pass(h.run_rgpu(buffers, [server]), "buffers", server)


def test_clients_that_exit_without_releasing(c_program, server):
    """Sessions that end without releasing their objects (normal exit, and SIGKILL right after
    connecting) leave nothing behind."""
    stress = c_program("stress_write")
    r = h.run_rgpu(stress, [server], ["64", "1"])
    h.assert_pass(r, "stress_write", server)
    time.sleep(0.5)
    base = rss_mib(server)
    for _ in range(3):
        r = h.run_rgpu(stress, [server], ["64", "2", "leak"])
        h.assert_pass(r, "stress_write", server)
    for _ in range(3):
        c = Client([server], [stress, "64"])
        c.wait_line(r"^START", timeout=60)
        c.kill()
    now = wait_rss_at_most(server, base + 64, timeout=20)
    assert now <= base + 64, f"RSS {base:.0f} -> {now:.0f} MiB after 6 sessions"
    assert server.alive()


# ---------------------------------------------------------------- (c) tokens

GOOD = "correct-token-0123456789abcdef"
BAD = "wrong-token-9876543210fedcba"


def test_a_missing_token_file_is_named(rgpu_bins, tmp_path):
    """RGPU_TOKEN_FILE naming no file: `rgpu devices` and `rgpu run` say so, before anything
    else (not a hint about the ICD loader, which then finds no rgpu platform)."""
    missing = tmp_path / "no-such-token"
    for cmd in (["devices", "--servers", "127.0.0.1:1"],
                ["run", "--servers", "127.0.0.1:1", "--", "true"]):
        r = h.run([str(h.RGPU), *cmd], h.base_env(RGPU_TOKEN_FILE=str(missing)), timeout=60)
        assert r.returncode != 0, r.describe()
        assert f"cannot read token file {missing}" in r.stderr, r.describe()
        assert "ICD loader" not in r.stderr, r.describe()


def test_rgpu_run_says_when_no_server_answers(rgpu_bins):
    """`rgpu run` with no server reachable says so on stderr (the program runs, and sees no
    rgpu device); with a server up it says nothing of the kind."""
    r = h.run([str(h.RGPU), "run", "--servers", "127.0.0.1:1", "--", "true"], h.base_env(),
              timeout=60)
    assert r.returncode == 0, r.describe()
    assert "no server can be reached (127.0.0.1:1: " in r.stderr, r.describe()


def test_wrong_token_rejected(c_program, start_server, tmp_path):
    token = tmp_path / "token"
    token.write_text(GOOD + "\n")
    server = start_server(token_file=token)
    assert re.search(r"(?i)token", server.log()), server.log_tail()
    listing = ["clinfo", "-l"]

    # Wrong token: no rgpu device (or an error), in bounded time; the server says why.
    r = h.run(h.rgpu_run_cmd([server], listing), h.base_env(RGPU_TOKEN=BAD), timeout=60)
    assert not r.timed_out, r.describe()
    assert no_rgpu_devices(r), f"wrong token still lists devices\n{r.describe()}"
    assert server.wait_log(r"(?i)(wrong|bad|invalid|missing).{0,20}token|token.{0,20}(wrong|"
                           r"mismatch|invalid|rejected)"), \
        f"server log does not say the token was wrong\n{server.log_tail()}"

    # No token at all.
    r = h.run(h.rgpu_run_cmd([server], listing), h.base_env(), timeout=60)
    assert not r.timed_out and no_rgpu_devices(r), r.describe()
    # A wrong token file.
    bad_file = tmp_path / "bad"
    bad_file.write_text(BAD)
    r = h.run(h.rgpu_run_cmd([server], listing, token_file=bad_file), h.base_env(), timeout=60)
    assert not r.timed_out and no_rgpu_devices(r), r.describe()
    # A test program with the wrong token fails cleanly.
    r = h.run_rgpu(c_program("platform_device"), [server], RGPU_TOKEN=BAD, timeout=60)
    assert not r.timed_out and r.returncode != 0, r.describe()

    # The right token, three ways.
    pd = c_program("platform_device")
    h.assert_pass(h.run_rgpu(pd, [server], RGPU_TOKEN=GOOD), "platform_device", server)
    h.assert_pass(h.run_rgpu(pd, [server], token_file=token), "platform_device", server)
    h.assert_pass(h.run_rgpu(c_program("buffers"), [server], RGPU_TOKEN_FILE=str(token)),
                  "buffers", server)
    assert server.alive()


# ---------------------------------------------------------------- (d) malformed frames

def protocol_version() -> int:
    src = (h.REPO / "crates" / "protocol" / "src" / "lib.rs").read_text()
    m = re.search(r"pub const PROTOCOL_VERSION: u32 = (\d+);", src)
    return int(m.group(1)) if m else 1


PREAMBLE_LEN = 24


def preamble(version=None, magic=b"RGPU", flags=0) -> bytes:
    """A client's preamble: magic, version, flags (1: TLS follows), the session a lane joins,
    an empty line."""
    v = protocol_version() if version is None else version
    return magic + v.to_bytes(4, "little") + flags.to_bytes(4, "little") + bytes(8) + b"\r\n\r\n"


def frame(body: bytes, seq: int, bulk: bytes = b"", flags: int = 0) -> bytes:
    """A frame; `flags` is the header's second word (the data-lane count)."""
    return struct.pack("<IIQQ", len(body), flags, seq, len(bulk)) + body + bulk


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def connect(server) -> socket.socket:
    if server.endpoint.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX)
        s.connect(server.endpoint[5:])
    else:
        s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    s.settimeout(10)
    return s


def read_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def read_frame(s: socket.socket):
    body_len, flags, seq, bulk_len = struct.unpack("<IIQQ", read_exact(s, 24))
    assert flags == 0
    body = read_exact(s, body_len)
    bulk = read_exact(s, bulk_len) if bulk_len else b""
    return seq, body, bulk


def handshake(server) -> socket.socket:
    """Connects and authenticates without a token (ClientMsg::Authenticate, postcard)."""
    s = connect(server)
    s.sendall(preamble())
    theirs = read_exact(s, PREAMBLE_LEN)
    assert theirs[:4] == b"RGPU", theirs
    _, body, _ = read_frame(s)
    assert body[0] == 0, f"expected Challenge, got {body[:8]!r}"  # ServerMsg::Challenge
    name = b"malformed-frame-test"
    # Authenticate: nonce, proof None, name, lane None, application (the name), wait 0 s.
    auth = (b"\x00" + os.urandom(32) + b"\x00" + varint(len(name)) + name + b"\x00"
            + varint(len(name)) + name + varint(0))
    s.sendall(frame(auth, 1))
    _, body, _ = read_frame(s)
    assert body[0] == 1, f"expected Welcome, got {body[:40]!r}"  # ServerMsg::Welcome
    return s


# ServerMsg::Working and ::Heartbeat: signs of life and requests for one, not replies.
SIGNS_OF_LIFE = (b"\x0a", b"\x0b")


def ping(s: socket.socket, seq: int) -> None:
    s.sendall(frame(b"\x01\x00", seq))  # ClientMsg::Session(SessionRequest::Ping)
    body = SIGNS_OF_LIFE[0]
    while body in SIGNS_OF_LIFE:
        _, body, _ = read_frame(s)
    # ServerMsg::Session(SessionReply::Ping(()))
    assert body == b"\x03\x00", f"expected the ping's reply, got {body[:40]!r}"


def closed_by_peer(s: socket.socket, timeout: float) -> bool:
    """True once the server closes the connection (after an optional Fatal frame)."""
    s.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not s.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False
    return False


def bad_sessions(server):
    """Yields (description, socket) for each kind of malformed input, input already sent."""
    # Garbage right after a valid preamble (before the handshake completes).
    s = connect(server)
    s.sendall(preamble() + os.urandom(4096))
    yield "garbage after the preamble", s
    # Bad magic, wrong version.
    s = connect(server)
    s.sendall(preamble(magic=b"HTTP") + b"GET / HTTP/1.0\r\n\r\n")
    yield "bad magic", s
    s = connect(server)
    s.sendall(preamble(version=protocol_version() + 100))
    yield "wrong protocol version", s
    # Asks for TLS, then sends what is not a TLS handshake.
    s = connect(server)
    s.sendall(preamble(flags=1) + os.urandom(4096))
    yield "garbage instead of a TLS handshake", s
    # Unknown preamble flags.
    s = connect(server)
    s.sendall(preamble(flags=0x80))
    yield "unknown preamble flags", s
    # In a live session: a body that does not decode.
    s = handshake(server)
    ping(s, 2)
    s.sendall(frame(b"\xff" * 40, 3))
    yield "undecodable body in a session", s
    # An unknown message variant.
    s = handshake(server)
    s.sendall(frame(b"\x7f\x00\x00", 2))
    yield "unknown message variant", s
    # Bulk striped over more data lanes than a session may have.
    s = handshake(server)
    s.sendall(frame(b"\x01", 2, flags=0x80))
    yield "too many lanes", s
    # A body length over the limit.
    s = handshake(server)
    s.sendall(struct.pack("<IIQQ", 0xFFFFFFF0, 0, 2, 0) + b"\x01" * 64)
    yield "oversized body length", s
    # A zero body length.
    s = handshake(server)
    s.sendall(struct.pack("<IIQQ", 0, 0, 2, 0))
    yield "empty body", s


def test_malformed_frames_close_only_that_session(c_program, server):
    buffers, other = c_program("buffers"), c_program("images_samplers")
    # A real client keeps working while the bad sessions come and go.
    good = ThreadPoolExecutor(1)
    future = good.submit(h.run_rgpu, buffers, [server])
    time.sleep(0.5)
    problems = []
    n = 0
    for what, s in bad_sessions(server):
        n += 1
        if not closed_by_peer(s, 15):
            problems.append(f"{what}: the server kept the connection open")
        s.close()
    # A truncated frame: the client hangs up half way through.
    s = handshake(server)
    s.sendall(struct.pack("<IIQQ", 1000, 0, 2, 0) + b"\x02" * 10)
    s.close()
    n += 1
    # A truncated preamble.
    s = connect(server)
    s.sendall(b"RGP")
    s.close()
    assert server.alive(), f"server died on malformed input\n{server.log_tail()}"
    r = future.result(timeout=h.PROGRAM_TIMEOUT + 30)
    good.shutdown()
    h.assert_pass(r, "buffers", server)
    assert not problems, "\n".join(problems) + "\n" + server.log_tail()
    # A fresh session with a live ping, and a full client, still work afterwards.
    s = handshake(server)
    ping(s, 2)
    ping(s, 3)
    s.close()
    h.assert_pass(h.run_rgpu(other, [server]), "images_samplers", server)
    # Each bad session left a log line.
    hits = re.findall(r"(?im)^.*(refused|closing|lost|malformed|invalid|version|magic).*$",
                      server.log())
    assert len(hits) >= n - 1, f"{len(hits)} log lines for {n} bad sessions\n{server.log_tail()}"


def server_tree(pid: int) -> list[int]:
    """A process and all its descendants (a server and its session workers)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in open(f"/proc/{p}/task/{task}/children").read().split()]
            found.append(p)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return found


def server_tree_rss_kib(pid: int) -> int:
    """Memory of a process and all its descendants, in KiB: their proportional set size
    (pages shared between them, such as the libraries every worker maps, counted once)."""
    total = 0
    for p in server_tree(pid):
        try:
            rollup = open(f"/proc/{p}/smaps_rollup").read()
            total += int(re.search(r"^Pss:\s+(\d+)", rollup, re.M).group(1))
        except (FileNotFoundError, ProcessLookupError, AttributeError):
            pass
    return total


def test_unauthenticated_frames_cannot_claim_memory(server):
    """Frame headers announcing 256 MiB bodies before authentication: each connection is
    closed at once, before any body byte is sent, and the server's memory (all its
    processes) stays within 16 MiB per connection (it once zero-filled 256 MiB for each)."""
    before = server_tree_rss_kib(server.proc.pid)
    held = []
    for _ in range(20):
        s = connect(server)
        s.sendall(preamble())
        read_exact(s, PREAMBLE_LEN)
        read_frame(s)  # the Challenge
        s.sendall(struct.pack("<IIQQ", 256 << 20, 0, 1, 0))
        held.append(s)
    for s in held:
        assert closed_by_peer(s, 10), "the server waited for an oversized pre-auth body"
    grown_mib = (server_tree_rss_kib(server.proc.pid) - before) / 1024
    for s in held:
        s.close()
    # Each connection still gets a worker process before it authenticates (a few MiB, until
    # authentication moves before the worker): the bound is per connection, far below 256 MiB.
    assert grown_mib < 20 * 16, f"the server grew {grown_mib:.0f} MiB\n{server.log_tail()}"
    assert "where at most 8192 are taken" in server.log(), server.log_tail()
    s = handshake(server)
    ping(s, 2)
    s.close()


# crates/server/src/handshakes.rs
MAX_HANDSHAKES_PER_SOURCE = 64


def test_a_flood_of_unauthenticated_connections_is_capped(c_program, server):
    """300 connections from one address that send only a preamble: at most 64 of them get a
    worker (the rest are closed at once), the server's memory stays within 16 MiB per place,
    and a client from another address runs beside them (it once took 137 workers for 100)."""
    buffers = c_program("buffers")
    before = server_tree_rss_kib(server.proc.pid)
    flood = []
    for _ in range(300):
        s = socket.socket()
        s.settimeout(10)
        try:
            s.bind(("127.0.0.2", 0))
            s.connect(("127.0.0.1", server.port))
            s.sendall(preamble())
        except OSError:
            pass
        flood.append(s)
    try:
        time.sleep(2)
        # The listener, the prestarted workers, one per place: once the pool has settled (a
        # worker it started for a connection that took another may still be on its way out).
        bound = 1 + 2 + MAX_HANDSHAKES_PER_SOURCE
        settled = time.monotonic() + 10
        processes = len(server_tree(server.proc.pid))
        while processes > bound and time.monotonic() < settled:
            time.sleep(0.2)
            processes = len(server_tree(server.proc.pid))
        assert processes <= bound, f"{processes} processes\n{server.log_tail()}"
        grown_mib = (server_tree_rss_kib(server.proc.pid) - before) / 1024
        print(f"grown {grown_mib:.0f} MiB, {processes} processes")
        assert grown_mib < MAX_HANDSHAKES_PER_SOURCE * 16, f"the server grew {grown_mib:.0f} MiB"
        h.assert_pass(h.run_rgpu(buffers, [server]), "buffers", server)
        assert "handshakes under way" in server.log(), server.log_tail()
    finally:
        for s in flood:
            s.close()


def preauth_proof(token: str, nonce: bytes) -> bytes:
    """auth::preauth_proof: HMAC-SHA256 over a label, the server's nonce and 32 zero bytes."""
    import hashlib
    import hmac
    return hmac.new(token.strip().encode(), b"rgpu preauth v1" + nonce + bytes(32),
                    hashlib.sha256).digest()


def test_a_token_servers_workers_serve_only_peers_that_proved_the_token(c_program,
                                                                        start_server,
                                                                        tmp_path):
    """A server with a token has the client prove it holds it right after the preambles, in
    the listener, before any worker is given the connection: 500 connections that send only
    a preamble and 50 whose proof is wrong (or whose frame header announces 256 MiB) get no
    worker (the server keeps its prestarted one), the server's memory stays within a few MiB,
    each wrong proof is refused in the clear, and a client with the token runs beside them."""
    token = tmp_path / "token"
    token.write_text(GOOD + "\n")
    server = start_server(token_file=token)
    buffers = c_program("buffers")
    before_rss = server_tree_rss_kib(server.proc.pid)
    before = len(server_tree(server.proc.pid))
    held = []
    try:
        for i in range(500):
            s = socket.socket()
            s.settimeout(10)
            try:
                # Three addresses: 192 places at most (64 each), the rest of the 256 left to
                # the connections below and the healthy client.
                s.bind((f"127.0.0.{2 + i % 3}", 0))
                s.connect(("127.0.0.1", server.port))
                s.sendall(preamble())
            except OSError:
                pass
            held.append(s)
        refused = 0
        for i in range(50):
            s = connect(server)
            s.sendall(preamble())
            answer = read_exact(s, PREAMBLE_LEN)
            flags = int.from_bytes(answer[8:12], "little")
            assert flags & 4, f"no pre-authentication asked for: flags {flags}"
            nonce = read_exact(s, 32)
            proof = preauth_proof(BAD, nonce) if i % 2 else bytes(32)
            s.sendall(proof + struct.pack("<IIQQ", 256 << 20, 0, 1, 0))
            verdict = read_exact(s, 1)
            refused += verdict == b"\0"
            assert closed_by_peer(s, 10), "a connection with a wrong proof stayed open"
            s.close()
        assert refused == 50, refused
        time.sleep(1)
        processes = len(server_tree(server.proc.pid))
        assert processes <= before, f"{processes} processes (before: {before})\n" \
            f"{server.log_tail()}"
        grown_mib = (server_tree_rss_kib(server.proc.pid) - before_rss) / 1024
        print(f"grown {grown_mib:.1f} MiB")
        assert grown_mib < 64, f"the server grew {grown_mib:.0f} MiB"
        h.assert_pass(h.run_rgpu(buffers, [server], RGPU_TOKEN_FILE=str(token)), "buffers",
                      server)
        assert "wrong token (pre-authentication)" in server.log(), server.log_tail()
    finally:
        for s in held:
            s.close()


def test_lane_claims_cannot_find_a_session(c_program, server):
    """Session ids are random: lane claims naming the ids a sequential server would have
    given (1..200) reach no session's worker (the listener refuses each), and a session
    running meanwhile is untouched."""
    buffers = c_program("buffers")
    good = ThreadPoolExecutor(1)
    future = good.submit(h.run_rgpu, buffers, [server])
    time.sleep(0.5)
    unanswered = 0
    for guess in range(1, 201):
        s = connect(server)
        # A plaintext client preamble whose last word names the session a lane joins.
        s.sendall(preamble()[:12] + guess.to_bytes(8, "little") + preamble()[20:])
        # Refused by the listener itself: after its preamble, the connection closes; a lane
        # that reached a session's worker would get the handshake's Challenge instead.
        try:
            read_exact(s, PREAMBLE_LEN)
            answer = s.recv(64)
        except (ConnectionResetError, socket.timeout, EOFError):
            answer = b""
        unanswered += answer == b""
        s.close()
    h.assert_pass(future.result(timeout=h.PROGRAM_TIMEOUT + 30), "buffers", server)
    good.shutdown()
    assert unanswered == 200, f"{200 - unanswered} claims reached a worker\n{server.log_tail()}"
    ids = [int(i) for i in re.findall(r"session (\d+): \S+ connected", server.log())]
    assert ids and all(i > 1 << 32 for i in ids), ids


def test_a_drip_fed_handshake_is_closed_at_its_deadline(server):
    """A peer that sends its preamble a byte every 2 s passes every per-read timeout (10 s),
    but not the whole handshake's deadline (15 s): closed before it is done (40 s)."""
    s = connect(server)
    started = time.monotonic()
    closed = False
    for byte in preamble():
        try:
            s.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            closed = True
            break
        if closed_by_peer(s, 2):
            closed = True
            break
    elapsed = time.monotonic() - started
    s.close()
    assert closed, f"a drip-fed preamble was read to its end ({elapsed:.0f} s)"
    assert 13 <= elapsed <= 30, f"closed after {elapsed:.0f} s"
    assert "ran past its deadline" in server.log(), server.log_tail()


# ---------------------------------------------------------------- (e) unreachable servers

def test_no_server_running(c_program, rgpu_bins):
    port = h.free_port()
    ep = f"127.0.0.1:{port}"
    t0 = time.monotonic()
    r = h.run(h.rgpu_run_cmd([ep], ["clinfo", "-l"]), h.base_env(), timeout=60)
    assert not r.timed_out, r.describe()
    assert time.monotonic() - t0 < 30, f"took {time.monotonic() - t0:.1f}s\n{r.describe()}"
    assert no_rgpu_devices(r), r.describe()
    # The native platform is still usable beside the dead one.
    assert any(h.NATIVE_PLATFORM in p for p in h.parse_clinfo_l(r.stdout)), r.describe()
    r = h.run_rgpu(c_program("platform_device"), [ep], timeout=60)
    assert not r.timed_out and r.returncode != 0, r.describe()


def test_one_dead_server_of_two(c_program, server):
    """One listed server is down: the live one's devices are listed and work."""
    dead = f"127.0.0.1:{h.free_port()}"
    r = h.run(h.rgpu_run_cmd([server, dead], ["clinfo", "-l"]), h.base_env(), timeout=60)
    assert not r.timed_out and r.returncode == 0, r.describe()
    devs = h.parse_clinfo_l(r.stdout).get("rgpu", [])
    assert devs == h.native_device_names(), r.describe()
    r = h.run_rgpu(c_program("platform_device"), [server, dead],
                   RGPU_TEST_EXPECT_SERVER=server.endpoint)
    h.assert_pass(r, "platform_device", server)


def test_unresponsive_server(c_program, rgpu_bins):
    """A peer that accepts connections and never answers: the client gives up in bounded time."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        lsock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(lsock.accept()[0])
            except socket.timeout:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        ep = "127.0.0.1:%d" % lsock.getsockname()[1]
        t0 = time.monotonic()
        r = h.run(h.rgpu_run_cmd([ep], ["clinfo", "-l"]), h.base_env(), timeout=90)
        assert not r.timed_out, f"client hung on a silent server\n{r.describe()}"
        assert time.monotonic() - t0 < 60
        assert no_rgpu_devices(r), r.describe()
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        lsock.close()


def test_server_dies_under_a_client(c_program, start_server):
    """SIGKILL of the server while a client streams data: the client fails, it does not hang."""
    server = start_server()
    client = Client([server], [c_program("stress_write"), "128"])
    try:
        assert client.wait_line(r"^WROTE 1$", 120), client.describe() + server.log_tail()
        server.stop(signal.SIGKILL)
        code = client.wait(60)
        assert code is not None, "client hung after its server died\n" + client.describe()
        assert code != 0, client.describe()
    finally:
        client.kill()


# ---------------------------------------------------------------- shutdown

def test_sigterm_stops_server_cleanly(c_program, start_server):
    server = start_server()
    h.assert_pass(h.run_rgpu(c_program("platform_device"), [server]), "platform_device", server)
    code = server.stop(signal.SIGTERM, timeout=15)
    assert code == 0, f"exit {code} after SIGTERM\n{server.log_tail()}"


def test_sigterm_with_a_connected_client(c_program, start_server):
    server = start_server()
    client = Client([server], [c_program("stress_write"), "64"])
    try:
        assert client.wait_line(r"^WROTE 1$", 120), client.describe() + server.log_tail()
        t0 = time.monotonic()
        code = server.stop(signal.SIGTERM, timeout=20)
        assert code is not None, f"server ignored SIGTERM for 20 s\n{server.log_tail()}"
        assert time.monotonic() - t0 < 20
        assert client.wait(60) is not None, "client hung after its server stopped\n" + \
            client.describe()
    finally:
        client.kill()


CL_PANIC_PROBE = r"""
import ctypes
cl = ctypes.CDLL("libOpenCL.so.1")
platforms = (ctypes.c_void_p * 16)()
count = ctypes.c_uint()
assert cl.clGetPlatformIDs(16, platforms, ctypes.byref(count)) == 0
name = ctypes.create_string_buffer(64)
rgpu = None
for i in range(count.value):
    cl.clGetPlatformInfo(ctypes.c_void_p(platforms[i]), 0x0902, 64, name, None)
    if name.value == b"rgpu":
        rgpu = ctypes.c_void_p(platforms[i])
assert rgpu, "no rgpu platform"
device = ctypes.c_void_p()
assert cl.clGetDeviceIDs(rgpu, ctypes.c_uint64(0xFFFFFFFF), 1, ctypes.byref(device), None) == 0
error = ctypes.c_int()
cl.clCreateContext.restype = ctypes.c_void_p
context = ctypes.c_void_p(cl.clCreateContext(None, 1, ctypes.byref(device), None, None,
                                             ctypes.byref(error)))
assert error.value == 0, error.value
cl.clCreateBuffer.restype = ctypes.c_void_p
buffer = ctypes.c_void_p(cl.clCreateBuffer(context, ctypes.c_uint64(1), ctypes.c_size_t(4096),
                                           None, ctypes.byref(error)))
assert error.value == 0, error.value
# RGPU_TEST_PANIC_IN makes this entry point panic inside: the C caller gets
# CL_OUT_OF_HOST_MEMORY (-6), and the program goes on.
assert cl.clReleaseMemObject(buffer) == -6
assert cl.clReleaseContext(context) == 0
print("PASS")
"""


def test_a_panic_inside_an_opencl_entry_point_is_an_error_not_an_abort(server):
    cmd = h.rgpu_run_cmd([server.endpoint], ["python3", "-c", CL_PANIC_PROBE])
    env = h.base_env(RGPU_TEST_PANIC_IN="clReleaseMemObject")
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "PASS" in result.stdout, (
        f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-4000:]}"
    )
    assert "clReleaseMemObject panicked (RGPU_TEST_PANIC_IN=clReleaseMemObject)" in \
        result.stderr, result.stderr[-4000:]
