"""`rgpu server --metrics ADDR`: Prometheus text at /metrics, through a real server and real
sessions: a held session is counted active with its requests, and after it ends its requests
stay in the totals; anything but GET /metrics is refused; a slow or oversized request costs
only its own connection."""

import re
import subprocess
import socket
import time
import urllib.error
import urllib.request

import rgpu_harness as h


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def wait_for(port, name, predicate, timeout=15):
    deadline = time.monotonic() + timeout
    while True:
        values = scrape(port)
        if predicate(values.get(name)) or time.monotonic() > deadline:
            return values
        time.sleep(0.2)


def test_metrics_count_sessions_and_their_requests(c_program, start_server, gcc, tmp_path):
    port = h.free_port()
    server = start_server(args=["--metrics", f"127.0.0.1:{port}"])
    assert server.wait_log(r"metrics: http://127\.0\.0\.1:\d+/metrics"), server.log_tail()
    first = scrape(port)
    assert first["rgpu_sessions_active"] == 0 and first["rgpu_requests_total"] == 0, first

    holder = h.hold_session(c_program("isolation"), server)
    try:
        values = wait_for(port, "rgpu_sessions_active", lambda v: v == 1)
        assert values["rgpu_sessions_active"] == 1, values
        sessions = [k for k in values if k.startswith("rgpu_session_requests_total{")]
        assert len(sessions) == 1 and 'client="isolation' in sessions[0], sessions
        values = wait_for(port, sessions[0], lambda v: v and v > 0)
        assert values[sessions[0]] > 0, values
        # The held session's buffer and objects, as its quotas count them.
        held = sessions[0].replace("rgpu_session_requests_total", "rgpu_session_memory_bytes")
        values = wait_for(port, held, lambda v: v and v > 0)
        assert values[held] > 0, values
        objects = sessions[0].replace("rgpu_session_requests_total", "rgpu_session_objects")
        assert values[objects] > 0, values
        # Its queues: a session waiting for its client has none.
        for queue in ("rgpu_session_queued_bytes", "rgpu_session_unsent_bytes"):
            assert values[sessions[0].replace("rgpu_session_requests_total", queue)] == 0, values
        # rgpu top shows it.
        top = h.run([str(h.RGPU), "top", "--metrics", f"127.0.0.1:{port}", "--once"],
                    h.base_env())
        assert top.returncode == 0, top.describe()
        assert top.stdout.startswith("sessions: 1 active"), top.stdout
        assert re.search(r"\n\d+ +isolation", top.stdout), top.stdout
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)

    r = h.run_rgpu(c_program("buffers"), [server])
    h.assert_pass(r, "buffers", server)
    # The programs program checks that a bad kernel source fails to build and that a kernel
    # name the program lacks is refused: failures the server reports.
    r = h.run_rgpu(c_program("programs"), [server])
    h.assert_pass(r, "programs", server)
    # 16 MiB buffers: their writes go over the session's data lanes.
    example = tmp_path / "vector_add"
    subprocess.run([gcc, "-O2", "-o", str(example), str(h.REPO / "examples" / "vector_add.c"),
                    "-lOpenCL", "-lm"], check=True)
    r = h.run_rgpu(example, [server], EXAMPLE_PLATFORM="rgpu", EXAMPLE_N="4194304")
    assert r.returncode == 0 and "result: OK" in r.stdout, r.describe()
    values = wait_for(port, 'rgpu_sessions_ended_total{how="normal"}', lambda v: v and v >= 4)
    assert values['rgpu_sessions_ended_total{how="normal"}'] >= 4, values
    # Replies are the requests clients waited for: some, not all (releases, launches and
    # writes are posted).
    assert 0 < values["rgpu_replies_total"] < values["rgpu_requests_total"], values
    assert (2 * 16 << 20) <= values["rgpu_lane_received_bytes_total"] \
        <= values["rgpu_received_bulk_bytes_total"], values
    # Failures the server reported, by code (OpenCL's are negative).
    errors = {k: v for k, v in values.items() if k.startswith('rgpu_errors_total{api="opencl"')}
    assert errors and all(re.search(r'code="-\d+"', k) for k in errors), values
    assert values["rgpu_sessions_active"] == 0, values
    assert values["rgpu_sessions_started_total"] >= 2, values
    assert values["rgpu_requests_total"] > 0 and values["rgpu_received_bulk_bytes_total"] > 0, values
    assert values["rgpu_busy_seconds_total"] > 0, values
    assert values["rgpu_sent_bulk_bytes_total"] > 0, values  # buffers reads its buffers back
    assert not [k for k in values if k.startswith("rgpu_session_requests_total{")], values
    # By request name, over all sessions: the buffers program's writes and reads are there.
    calls = {k[len('rgpu_calls_total{call="'):-2]: v for k, v in values.items()
             if k.startswith("rgpu_calls_total{")}
    assert calls.get("CreateBuffer", 0) >= 1 and calls.get("CreateContext", 0) >= 2, calls
    assert sum(calls.values()) == values["rgpu_requests_total"], (calls, values)


def test_metrics_endpoint_refuses_everything_else(start_server):
    port = h.free_port()
    server = start_server(args=["--metrics", f"127.0.0.1:{port}"])
    assert server.wait_log(r"metrics: http://"), server.log_tail()
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10)
        raise AssertionError("/ answered")
    except urllib.error.HTTPError as e:
        assert e.code == 404
    # A client that sends an endless request line, and one that sends nothing: each is cut off
    # (4 KiB, 2 s) and the endpoint answers the next scrape.
    flood = socket.create_connection(("127.0.0.1", port))
    try:
        flood.sendall(b"GET /" + b"x" * 100_000)
    except OSError:
        pass
    silent = socket.create_connection(("127.0.0.1", port))
    assert "rgpu_sessions_active" in scrape(port)
    flood.close()
    silent.close()
    assert server.alive()


def test_metrics_address_in_use_is_an_error(rgpu_bins):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    r = h.run([str(h.RGPU), "server", "--listen", "127.0.0.1:0", "--metrics", f"127.0.0.1:{port}"],
              h.base_env(), timeout=60)
    taken.close()
    assert r.returncode != 0 and re.search(r"metrics: cannot listen", r.stderr), r.describe()
