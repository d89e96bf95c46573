"""Dead peers are detected on both sides, through a real silent network partition.

The client runs in a network namespace made for the test, joined to this machine by a veth
pair; the server listens on this machine's end. nftables rules on both ends drop what arrives
over the link, so the cut is silent (no reset, no ICMP, no local error for the sender), as a
pulled cable or a dead switch would be. With short liveness
times (client RGPU_LIVENESS_TIMEOUT=4, server --client-timeout 6):
- a client waiting for a reply, and one in a loop of small writes, fail with an error within
  about the liveness time instead of hanging;
- the server ends a vanished client's session (and its worker) within about its client
  timeout;
- after the link heals, new clients are served.
Needs root (network namespaces), iproute2 and nftables; skipped without root.

A path that keeps TCP alive but delivers nothing is caught by rgpu's own heartbeats, not by
TCP: a proxy on this machine that forwards both ways, then swallows what the client sends. The
client's next calls fail within its liveness time; a kernel that runs for many liveness times
still completes (the server says it is working while it waits for the device). The other way
round, the server asks a silent client for a sign of life, which the client library answers
however idle its program is: when the answers are swallowed, the server closes the session
within its client timeout."""

import os
import re
import shutil
import socket
import subprocess
import threading
import time

import pytest

import rgpu_harness as h

CLIENT_LIVENESS = 4
SERVER_CLIENT_TIMEOUT = 6
# Detection takes about the liveness time; the margin covers process start and scheduling on
# a loaded 2-core machine, not another timeout.
MARGIN = 12


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


class Link:
    """A network namespace with a veth pair to this machine, and a switch to cut it."""

    def __init__(self):
        n = os.getpid() % 200 + 20
        self.ns = f"rgpu-lv{os.getpid()}"
        self.host_if, self.ns_if = f"rgl{os.getpid()}a", f"rgl{os.getpid()}b"
        self.host_ip, self.ns_ip = f"10.213.{n}.1", f"10.213.{n}.2"
        self.cut_now = False
        self.table = f"rgpu_liveness_{os.getpid()}"
        # What an earlier run of this process left (it cannot be another process's).
        ip("link", "del", self.host_if, check=False)
        ip("netns", "del", self.ns, check=False)
        ip("netns", "add", self.ns)
        ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        ip("link", "set", self.ns_if, "netns", self.ns)
        ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        ip("link", "set", self.host_if, "up")
        self.in_ns("ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
        self.in_ns("ip", "link", "set", self.ns_if, "up")
        self.in_ns("ip", "link", "set", "lo", "up")

    def in_ns(self, *cmd):
        return subprocess.run(["ip", "netns", "exec", self.ns, *cmd], capture_output=True,
                              text=True, check=True)

    def cut(self):
        """Both directions, silently: each end drops what arrives from the other (a table of
        this test's own on this machine, matching only its veth; and one in the namespace)."""
        for prefix in ([], ["ip", "netns", "exec", self.ns]):
            match = f'iifname "{self.host_if}" ' if not prefix else ""
            script = (f"table inet {self.table} {{\n chain input {{\n"
                      f"  type filter hook input priority 0; policy accept;\n  {match}drop\n"
                      " }\n}\n")
            subprocess.run(prefix + ["nft", "-f", "-"], input=script, text=True, check=True,
                           capture_output=True)
        self.cut_now = True

    def heal(self):
        if self.cut_now:
            for prefix in ([], ["ip", "netns", "exec", self.ns]):
                subprocess.run(prefix + ["nft", "delete", "table", "inet", self.table],
                               capture_output=True)
            self.cut_now = False

    def remove(self):
        self.heal()
        ip("link", "del", self.host_if, check=False)
        ip("netns", "del", self.ns, check=False)


@pytest.fixture
def link():
    if os.geteuid() != 0:
        pytest.skip("needs root to make a network namespace")
    missing = [tool for tool in ("ip", "nft") if not shutil.which(tool)]
    assert not missing, f"{missing} not installed (scripts/setup.sh installs iproute2, nftables)"
    made = Link.__new__(Link)
    try:
        made.__init__()
    except subprocess.CalledProcessError as e:
        made.remove()
        # A chroot without its own /sys and /run mounts, a container without CAP_SYS_ADMIN.
        pytest.skip(f"cannot make a network namespace here: {' '.join(e.cmd)}: "
                    f"{(e.stderr or '').strip()}")
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture
def partition_server(start_server, link, tmp_path):
    token = tmp_path / "token"
    subprocess.run([str(h.RGPU), "token", "new", str(token)], check=True, capture_output=True)
    server = start_server(token_file=token, listen=f"{link.host_ip}:0",
                          args=["--client-timeout", str(SERVER_CLIENT_TIMEOUT)])
    return server, token


class NsClient:
    """A test program run through `rgpu run` inside the namespace; stdout read line by line."""

    def __init__(self, link, server, token, cmd, **env):
        full = ["ip", "netns", "exec", link.ns] + h.rgpu_run_cmd([server], cmd, token_file=token)
        self.proc = subprocess.Popen(
            full, env=h.base_env(RGPU_TEST_PLATFORM="rgpu",
                                 RGPU_LIVENESS_TIMEOUT=str(CLIENT_LIVENESS), **env),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            errors="replace", start_new_session=True)
        self.out: list[str] = []

    def wait_line(self, pattern, timeout):
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                return False
            self.out.append(line.rstrip())
            if rx.search(line):
                return True
        return False

    def finish(self, timeout):
        """Waits for the exit; returns (status or None on timeout, seconds waited)."""
        t0 = time.monotonic()
        try:
            rest, _ = self.proc.communicate(timeout=timeout)
            self.out += rest.splitlines()
            return self.proc.returncode, time.monotonic() - t0
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.communicate()
            return None, time.monotonic() - t0

    def describe(self):
        return "\n".join(self.out[-30:])


def test_a_waiting_call_fails_within_the_liveness_time(partition_server, link, c_program):
    server, token = partition_server
    client = NsClient(link, server, token, [c_program("isolation"), "secret", "s3cret-value"])
    assert client.wait_line(r"^READY", 60), client.describe() + server.log_tail()
    link.cut()
    client.proc.stdin.write("go\n")
    client.proc.stdin.flush()
    status, waited = client.finish(CLIENT_LIVENESS + MARGIN)
    assert status is not None, f"the client still hung {waited:.0f} s into the partition"
    assert status != 0, client.describe()
    assert waited <= CLIENT_LIVENESS + MARGIN


@pytest.mark.parametrize("lanes", ["4", "0"])
def test_small_writes_fail_within_the_liveness_time(partition_server, link, c_program, lanes):
    server, token = partition_server
    # 1 MiB writes, each followed by a small blocking read, in a loop.
    client = NsClient(link, server, token, [c_program("stress_write"), "1", "0", "write"],
                      RGPU_LANES=lanes)
    assert client.wait_line(r"^WROTE 3$", 60), client.describe() + server.log_tail()
    link.cut()
    status, waited = client.finish(CLIENT_LIVENESS + MARGIN)
    assert status is not None, f"the client still hung {waited:.0f} s into the partition"
    assert status != 0, client.describe()


def test_the_server_reclaims_a_vanished_client(partition_server, link, c_program):
    server, token = partition_server
    client = NsClient(link, server, token, [c_program("isolation"), "secret", "held"])
    assert client.wait_line(r"^READY", 60), client.describe() + server.log_tail()
    m = re.findall(r"session (\d+): isolation\[\d+\] connected", server.log())
    assert m, server.log_tail()
    session = m[-1]
    link.cut()
    t0 = time.monotonic()
    ended = rf"session {session}\b.*(connection lost|disconnected)"
    found = server.wait_log(ended, timeout=SERVER_CLIENT_TIMEOUT + MARGIN)
    waited = time.monotonic() - t0
    assert found, (f"session {session} still open {waited:.0f} s into the partition\n"
                   f"{server.log_tail()}")
    client.finish(1)
    # The link heals: the server serves new clients from there.
    link.heal()
    again = NsClient(link, server, token, [c_program("buffers")])
    status, _ = again.finish(120)
    assert status == 0, again.describe() + server.log_tail()


def test_new_contexts_reconnect_after_a_server_restart(start_server, c_program):
    """The server restarts under a running program: the program's old objects fail with a
    device-lost error (the client names the lost server), and a new context on the same device
    gets a session on the restarted server."""
    port = h.free_port()
    server = start_server(listen=f"127.0.0.1:{port}")
    proc = subprocess.Popen(
        h.rgpu_run_cmd([server], [c_program("isolation"), "recover"]),
        env=h.base_env(RGPU_TEST_PLATFORM="rgpu"), text=True, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline().strip() == "READY"
    server.stop()
    start_server(listen=f"127.0.0.1:{port}")
    out, err = proc.communicate("go\n", timeout=120)
    assert proc.returncode == 0, out + err
    assert re.search(r"^OLD -\d+", out, re.M) and "NEW OK" in out, out + err
    assert f"127.0.0.1:{port}" in err, err  # the lost server is named


class SwallowingProxy:
    """A TCP proxy on this machine in front of `server`: it forwards both ways until
    `swallow()`, then reads what the client sends and drops it, the connection staying up (the
    server hears nothing more), as a broken middlebox or a stuck peer would."""

    def __init__(self, server):
        host, port = server.endpoint.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.swallowing = threading.Event()
        self.sockets = []
        threading.Thread(target=self._accept, daemon=True).start()

    def swallow(self):
        self.swallowing.set()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False),
                             daemon=True).start()

    def _pump(self, source, sink, from_client):
        try:
            while data := source.recv(1 << 16):
                if not (from_client and self.swallowing.is_set()):
                    sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.listener.close()
        for sock in self.sockets:
            sock.close()


def ready_through(proxy, server, cmd, **env):
    """A test program run through `rgpu run` behind `proxy`, once it has said READY (its
    stdin and stdout piped, in a session of its own)."""
    proc = subprocess.Popen(
        h.rgpu_run_cmd([proxy.endpoint], cmd), env=h.base_env(RGPU_TEST_PLATFORM="rgpu", **env),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    while (line := proc.stdout.readline()) and line.strip() != "READY":
        pass
    assert line.strip() == "READY", server.log_tail()
    return proc


@pytest.fixture
def proxied_server(start_server):
    server = start_server()
    proxy = SwallowingProxy(server)
    yield server, proxy
    proxy.close()


def test_blocking_writes_into_a_swallowing_path_fail_within_the_liveness_time(
        proxied_server, c_program):
    """Blocking 2 MiB writes, then the path swallows everything the client sends: the writes
    must stop "succeeding" (posted, they never wait for the server) and the program fail within
    the liveness time."""
    server, proxy = proxied_server
    proc = ready_through(proxy, server, [c_program("liveness"), "writes"],
                         RGPU_LIVENESS_TIMEOUT=str(CLIENT_LIVENESS))
    try:
        proxy.swallow()
        t0 = time.monotonic()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=CLIENT_LIVENESS + MARGIN)
        waited = time.monotonic() - t0
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"the program still wrote into the void {CLIENT_LIVENESS + MARGIN} s later:"
                    f" {out[-2000:]}")
    # A write fails (the connection was given up), rather than the program being killed.
    assert proc.returncode != 0 and "FAIL" in out, out[-3000:]
    assert waited <= CLIENT_LIVENESS + MARGIN


def test_a_long_kernel_outlives_the_liveness_time(proxied_server, c_program):
    """A kernel of 60 s (15 liveness times), waited for with clFinish through the same proxy
    (forwarding): the server says it is working, so the client keeps waiting."""
    server, proxy = proxied_server
    r = h.run_rgpu(c_program("liveness"), [proxy.endpoint], args=["kernel", "60"], timeout=300,
                   RGPU_LIVENESS_TIMEOUT=str(CLIENT_LIVENESS))
    assert r.returncode == 0 and "PASS liveness" in r.stdout, r.stdout + r.stderr
    took = float(re.search(r"^KERNEL ([\d.]+)", r.stdout, re.M).group(1))
    assert took > 4 * CLIENT_LIVENESS, r.stdout


def test_the_server_closes_the_session_of_a_client_whose_answers_are_swallowed(
        start_server, c_program):
    """An idle client (a session held open, no call) behind the proxy, which then swallows what
    the client sends: TCP stays up, the server's heartbeats reach the client, its answers do not.
    The server closes the session, releasing what it held, within about its client timeout."""
    server = start_server(args=["--client-timeout", str(SERVER_CLIENT_TIMEOUT)])
    proxy = SwallowingProxy(server)
    proc = ready_through(proxy, server, [c_program("isolation"), "secret", "held"])
    try:
        proxy.swallow()
        t0 = time.monotonic()
        server.wait_log("has not answered", timeout=SERVER_CLIENT_TIMEOUT + MARGIN)
        assert time.monotonic() - t0 <= SERVER_CLIENT_TIMEOUT + MARGIN
        assert "client_timeout" in server.log(), server.log_tail()
        # What the session held is released.
        server.wait_log("disconnected; released", timeout=MARGIN)
    finally:
        os.killpg(proc.pid, 9)
        proc.communicate()
        proxy.close()


def test_an_idle_client_keeps_its_session(start_server, c_program):
    """A session left idle for over three client timeouts: the client library answers the
    server's heartbeats on its own thread, so the session lives and the program then passes."""
    timeout = 2
    server = start_server(args=["--client-timeout", str(timeout)])
    holder = h.hold_session(c_program("isolation"), server)
    time.sleep(3.5 * timeout)
    out, _ = holder.communicate("go\n", timeout=60)
    assert holder.returncode == 0, out + server.log_tail()
    assert "has not answered" not in server.log(), server.log_tail()
