"""The session worker's flight recorder (crates/server/src/flight.rs): a worker that dies of a
fatal signal writes the request it was serving, the requests before it and a native backtrace
to the server's log; SIGUSR2 writes the recent requests of a live session. Real server, real
program over a socket; the crash is the worker aborting where RGPU_TEST_WORKER_ABORT_IN says."""

import os
import re
import signal
import time

import rgpu_harness as h


def test_a_crashed_worker_names_its_request_and_leaves_a_backtrace(c_program, start_server):
    env = h.base_env(RGPU_TEST_WORKER_ABORT_IN="CreateSubBuffer")
    server = start_server(env=env)
    r = h.run_rgpu(c_program("buffers"), [server])
    assert r.returncode != 0, r.describe()
    assert server.wait_log(r"its worker process \d+ was killed by signal 6", timeout=20), \
        server.log_tail()
    log = server.log()
    assert re.search(r"rgpu: session \d+: its worker \(pid \d+\) got fatal signal 6 while "
                     r"serving CreateSubBuffer seq \d+, bulk \d+ B", log), server.log_tail()
    ring = log[log.index("the requests before it"):]
    assert re.search(r"\n  \S+ seq \d+, bulk \d+ B, at \d+ ms, \d+ us\n", ring), ring[:2000]
    assert "CreateSubBuffer" in ring and "not finished" in ring, ring[:2000]
    assert "native backtrace of the worker" in log, server.log_tail()
    frames = log[log.index("native backtrace"):]
    assert "abort" in frames and re.search(r"\(\+0x[0-9a-f]+\)", frames), server.log_tail()
    assert server.alive(), "the server itself goes on"
    # Other sessions are served: a program without sub-buffers runs.
    ok = h.run_rgpu(c_program("platform_device"), [server])
    h.assert_pass(ok, "platform_device", server)


def test_sigusr2_dumps_a_live_sessions_requests(c_program, server):
    # A session held open (the isolation program waits for its stdin to close).
    holder = h.hold_session(c_program("isolation"), server)
    try:
        deadline = time.monotonic() + 30
        serving = []
        while time.monotonic() < deadline and not serving:
            serving = [pid for pid in server.worker_pids() if _serving(pid)]
            time.sleep(0.1)
        assert serving, server.log_tail()
        for pid in serving:
            os.kill(pid, signal.SIGUSR2)
        assert server.wait_log(r"requests asked for \(SIGUSR2\)", timeout=10), server.log_tail()
        assert all(_alive(pid) for pid in serving), "a dump does not stop the worker"
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def _serving(pid: int) -> bool:
    """Whether a worker has a session (its handlers are installed once it does)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(line for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGUSR2 - 1)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
