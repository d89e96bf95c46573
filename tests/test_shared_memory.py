"""The shared-memory path for a client on the server's host: through a `unix:` server the
client attaches a shared region, and large writes and reads cross it instead of the socket.
Real OpenCL programs on PoCL through a real server; the server's own counters (the trace's
session record) say which path the bytes took."""

import rgpu_harness as h

MIB = 1 << 20


def run_traced(prog, server, tmp_path, args=(), **env):
    pattern = tmp_path / "trace.%p.jsonl"
    r = h.run_rgpu(prog, [server], args=args, RGPU_TRACE=str(pattern), **env)
    traces = list(tmp_path.glob("trace.*.jsonl"))
    assert len(traces) == 1, (traces, r.describe())
    _, _, sessions = h.read_trace(traces[0])
    assert len(sessions) == 1, sessions
    for t in traces:
        t.unlink()
    return r, sessions[0]["counters"]


def test_unix_clients_move_bulk_through_shared_memory(c_program, start_server, tmp_path):
    server = start_server(unix=True)
    r, counters = run_traced(c_program("buffers"), server, tmp_path)
    h.assert_pass(r, "buffers", server)
    # buffers moves a 64 MiB buffer both ways (and more besides).
    assert counters["shared_received"] >= 64 * MIB, counters
    assert counters["shared_sent"] >= 64 * MIB, counters
    assert counters["shared_received"] <= counters["bulk_received"], counters
    assert "shared memory attached" in server.log()


def test_a_small_ring_wraps_many_times(c_program, start_server, tmp_path):
    """64 MiB through a 1 MiB ring: every transfer wraps and waits for room, both ways."""
    server = start_server(unix=True)
    r, counters = run_traced(c_program("buffers"), server, tmp_path, RGPU_SHARED_RING_MB="1")
    h.assert_pass(r, "buffers", server)
    assert counters["shared_sent"] >= 64 * MIB and counters["shared_received"] >= 64 * MIB


def test_reads_and_writes_in_rounds_through_the_ring(c_program, start_server, tmp_path):
    server = start_server(unix=True)
    prog = c_program("stress_write")
    for mode in ("write", "read"):
        r, counters = run_traced(prog, server, tmp_path, args=["48", "3", mode])
        h.assert_pass(r, "stress_write", server)
        assert r.stdout.count("WROTE") == 3, r.stdout
        moved = counters["shared_received"] if mode == "write" else counters["shared_sent"]
        assert moved >= 3 * 48 * MIB, (mode, counters)


def test_shared_memory_can_be_turned_off(c_program, start_server, tmp_path):
    server = start_server(unix=True)
    r, counters = run_traced(c_program("buffers"), server, tmp_path, RGPU_SHARED_MEMORY="off")
    h.assert_pass(r, "buffers", server)
    assert counters["shared_received"] == 0 and counters["shared_sent"] == 0, counters
    assert counters["bulk_received"] >= 64 * MIB, counters


def test_tcp_clients_use_the_socket(c_program, server, tmp_path):
    """With the move to the same-host socket off (the suite's default, RGPU_SAME_HOST=off)."""
    r, counters = run_traced(c_program("buffers"), server, tmp_path)
    h.assert_pass(r, "buffers", server)
    assert counters["shared_received"] == 0 and counters["shared_sent"] == 0, counters


def test_tcp_clients_on_the_servers_host_move_to_shared_memory(c_program, server, tmp_path):
    """A client that names a TCP server on its own host asks it for its same-host socket
    (an abstract Unix socket), takes its session there and moves bulk through shared memory;
    the program still sees the server it named."""
    pattern = tmp_path / "trace.%p.jsonl"
    r = h.run_rgpu(c_program("buffers"), [server], RGPU_TRACE=str(pattern), RGPU_SAME_HOST="on")
    h.assert_pass(r, "buffers", server)
    traces = list(tmp_path.glob("trace.*.jsonl"))
    assert len(traces) == 1, (traces, r.describe())
    _, _, sessions = h.read_trace(traces[0])
    traces[0].unlink()
    assert len(sessions) == 1, sessions
    assert sessions[0]["endpoint"] == server.endpoint, sessions[0]
    counters = sessions[0]["counters"]
    assert counters["shared_received"] >= 64 * MIB, counters
    assert counters["shared_sent"] >= 64 * MIB, counters
    log = server.log()
    assert "clients on this host are offered unix:@rgpu-" in log, log
    assert "shared memory attached" in log, log
    # Turned off, or without shared memory, the client stays on TCP.
    for off in (dict(RGPU_SAME_HOST="off"), dict(RGPU_SAME_HOST="on", RGPU_SHARED_MEMORY="off")):
        r, counters = run_traced(c_program("buffers"), server, tmp_path, **off)
        h.assert_pass(r, "buffers", server)
        assert counters["shared_received"] == 0 and counters["shared_sent"] == 0, (off, counters)


def map_traffic(prog, server, tmp_path):
    """Runs the alloc_host program traced; the bytes its clCreateBuffer, map and unmap calls
    moved, and the server's counters."""
    pattern = tmp_path / "trace.%p.jsonl"
    r = h.run_rgpu(prog, [server], RGPU_TRACE=str(pattern))
    h.assert_pass(r, "alloc_host", server)
    traces = list(tmp_path.glob("trace.*.jsonl"))
    assert len(traces) == 1, traces
    _, records, sessions = h.read_trace(traces[0])
    traces[0].unlink()
    moved = {}
    for rec in records:
        if rec["call"] in ("clCreateBuffer", "clEnqueueMapBuffer", "clEnqueueUnmapMemObject"):
            moved[rec["call"]] = moved.get(rec["call"], 0) + rec["bytes_out"] + rec["bytes_in"]
    return moved, sessions[0]["counters"]


def test_alloc_host_ptr_buffers_are_shared_memory(c_program, start_server, server, tmp_path):
    """CL_MEM_ALLOC_HOST_PTR buffers of a client on the server's host lie in memory shared
    with the server: created, mapped, written, computed on and read back with no data moving
    for the creation (with its initial contents), the maps or the unmaps. Over TCP the same
    program moves their bytes."""
    prog = c_program("alloc_host")
    h.assert_pass(h.run_native(prog), "alloc_host")
    moved, counters = map_traffic(prog, start_server(unix=True), tmp_path)
    assert moved == {"clCreateBuffer": 0, "clEnqueueMapBuffer": 0,
                     "clEnqueueUnmapMemObject": 0}, moved
    # Only the explicit 16 MiB read came back.
    assert counters["bulk_sent"] < 20 * MIB, counters
    moved, _ = map_traffic(prog, server, tmp_path)
    assert moved["clEnqueueMapBuffer"] >= 32 * MIB, moved
    assert moved["clEnqueueUnmapMemObject"] >= 16 * MIB, moved
