"""Quotas: sessions in all and per client, device memory and objects per session, idle
sessions. Over a limit, the client gets the API's own error (or, for sessions, no device of
that server) and the server logs why; what one session holds never counts against another."""

import os
import re
import signal
import subprocess
import time

import rgpu_harness as h

MIB = 1 << 20


def allocate(c_program, server, size, count):
    r = h.run_rgpu(c_program("isolation"), [server], args=["allocate", str(size), str(count)],
                   timeout=120)
    assert not r.timed_out and r.returncode == 0, r.describe() + server.log_tail()
    allocated = len(re.findall(r"^ALLOCATED \d+$", r.stdout, re.M))
    refused = re.search(r"^REFUSED (\d+) (-?\d+)", r.stdout, re.M)
    return allocated, (int(refused.group(2)) if refused else None), r


def test_memory_quota_refuses_with_the_apis_error(start_server, c_program):
    server = start_server(args=["--session-memory", "64M"])
    allocated, code, r = allocate(c_program, server, 24 * MIB, 5)
    assert allocated == 2 and code == -5, r.stdout  # CL_OUT_OF_RESOURCES at the third
    assert "memory quota" in server.log(), server.log_tail()
    # What a session released, and what another session holds, is not counted again.
    allocated, code, r = allocate(c_program, server, 24 * MIB, 2)
    assert allocated == 2 and code is None, r.stdout
    assert server.alive()


def test_object_quota(start_server, c_program):
    server = start_server(args=["--session-objects", "40"])
    allocated, code, r = allocate(c_program, server, 64, 100)
    # The context, queue and the buffers count; the 40th object is refused.
    assert 30 <= allocated < 40 and code == -6, r.stdout  # CL_OUT_OF_HOST_MEMORY
    assert "object quota" in server.log(), server.log_tail()


def test_session_limits_per_client_and_in_all(start_server, c_program):
    server = start_server(args=["--max-sessions-per-client", "1"])
    holder = h.hold_session(c_program("isolation"), server)
    try:
        r = h.run_rgpu(c_program("platform_device"), [server], timeout=60)
        assert not r.timed_out and r.returncode != 0, r.describe()
        assert "max_sessions_per_client" in server.log(), server.log_tail()
        assert "max_sessions_per_client" in r.stderr, r.describe()
    finally:
        holder.communicate("go\n", timeout=60)
    assert holder.returncode == 0
    # The place came back with the session.
    h.assert_pass(h.run_rgpu(c_program("platform_device"), [server]), "platform_device", server)

    full = start_server(args=["--max-sessions", "1"])
    holder = h.hold_session(c_program("isolation"), full)
    try:
        r = h.run_rgpu(c_program("platform_device"), [full], timeout=60)
        assert r.returncode != 0 and "server is full" in full.log(), full.log_tail()
    finally:
        holder.communicate("go\n", timeout=60)


def test_idle_sessions_are_closed_busy_ones_are_not(start_server, c_program):
    server = start_server(args=["--idle-timeout", "2"])
    holder = h.hold_session(c_program("isolation"), server)
    server.wait_log("idle_timeout", timeout=20)
    assert "no request for 2 s (idle_timeout); closing it" in server.log(), server.log_tail()
    out, _ = holder.communicate("go\n", timeout=60)
    assert holder.returncode != 0, out  # its session is gone: the next calls fail
    # A client that keeps calling (1 MiB rounds, without end) for three idle timeouts is never
    # closed.
    busy = subprocess.Popen(h.rgpu_run_cmd([server], [c_program("stress_write"), "1", "0"]),
                            env=h.base_env(RGPU_TEST_PLATFORM="rgpu"), text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    time.sleep(6)
    still_running = busy.poll() is None
    os.killpg(busy.pid, signal.SIGKILL)
    _, err = busy.communicate(timeout=30)
    assert still_running, err
    assert server.log().count("idle_timeout") == 1, server.log_tail()


def test_a_flood_of_idle_authenticated_sessions_is_bounded(start_server):
    """Sixty authenticated sessions that never send a request, against max_sessions 16: the
    first 16 are served (each by a worker), the rest are refused at the handshake with the
    reason; when the flood ends, the workers and their descriptors are gone."""
    from test_robustness import handshake, ping, read_frame
    server = start_server(args=["--max-sessions", "16", "--max-sessions-per-client", "0",
                                "--prestarted-workers", "1"])
    time.sleep(1)
    before = len(server.worker_pids())
    held, refused = [], 0
    try:
        for _ in range(60):
            try:
                held.append(handshake(server))
            except AssertionError:
                refused += 1
        assert (len(held), refused) == (16, 44), (len(held), refused)
        # Refusals are logged by the workers that ran the handshakes, which may finish
        # writing the line just after their client read the refusal.
        assert server.wait_log("server is full", count=44) == 44, server.log_tail()
        # The sessions that got in are served.
        for n, s in enumerate(held):
            ping(s, 100 + n)
        # The listener's own descriptors stay few: refused connections were closed.
        listener_fds = len(os.listdir(f"/proc/{server.pid}/fd"))
        assert listener_fds < 64, listener_fds
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(server.worker_pids()) > before:
        time.sleep(0.2)
    assert len(server.worker_pids()) <= before, (before, server.worker_pids())
    assert server.alive()
