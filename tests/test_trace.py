"""Call tracing and statistics through a real server: `RGPU_TRACE=FILE` writes one JSON line per
call the program made (after a header), `RGPU_STATS=1` prints the per-entry-point table at
exit, and `rgpu trace FILE` reads the trace back into the same table. The buffers program
writes and reads buffers, so its trace must show posted writes with their bytes and blocking
reads that waited on the network."""

import rgpu_harness as h


def test_trace_and_stats_of_a_program(c_program, server, tmp_path):
    prog = c_program("buffers")
    pattern = tmp_path / "trace.%p.jsonl"
    r = h.run_rgpu(prog, [server], RGPU_TRACE=str(pattern), RGPU_STATS="1")
    h.assert_pass(r, "buffers", server)
    traces = sorted(tmp_path.glob("trace.*.jsonl"))
    assert len(traces) == 1, traces
    header, records, sessions = h.read_trace(traces[0])
    assert header["rgpu_trace"] == 2 and str(header["pid"]) in traces[0].name, header
    assert "buffers" in header["command"], header
    assert records and all(r["api"] == "opencl" for r in records), records[:5]
    calls = {r["call"] for r in records}
    for call in ("clCreateContext", "clCreateBuffer", "clEnqueueWriteBuffer",
                 "clEnqueueReadBuffer", "clReleaseMemObject"):
        assert call in calls, sorted(calls)
    times = [r["t"] for r in records if r["thread"] == 1]
    assert times == sorted(times), "a thread's calls are in order"
    for rec in records:
        # (The server's time may exceed the wait: it starts on a request while the client is
        # still busy before waiting.)
        assert rec["us"] >= rec["wait_us"] >= 0 and rec["server_us"] >= 0, rec
        assert (rec["waits"] == 0) == (rec["wait_us"] == 0), rec
    # The server says how long it spent on waited requests (Timing frames): a context's
    # creation is a request the server works on.
    created = [rec for rec in records if rec["call"] == "clCreateContext"]
    assert created and all(rec["server_us"] > 0 for rec in created), created
    # Releases never wait (the last reference's release is posted); a blocking read waits and
    # brings bytes back; writes send theirs.
    releases = [rec for rec in records if rec["call"] == "clReleaseMemObject"]
    assert all(rec["waits"] == 0 for rec in releases), releases
    assert any(rec["posted"] >= 1 for rec in releases), releases
    reads = [rec for rec in records if rec["call"] == "clEnqueueReadBuffer" and rec["waits"] > 0]
    assert reads and all(rec["bytes_in"] > 0 for rec in reads), reads[:3]
    assert any(rec["bytes_out"] > 0 for rec in records if rec["call"] == "clEnqueueWriteBuffer")

    # RGPU_STATS=1: the table on stderr, its rows the trace's calls, ending in a total.
    stats = [line for line in r.stderr.splitlines() if line.startswith(("opencl ", "total"))]
    assert stats and stats[-1].startswith("total"), r.stderr[-3000:]
    assert {line[len("opencl "):44].strip() for line in stats[:-1]} == calls
    total_calls = int(stats[-1].split()[1])
    assert total_calls == len(records)

    # rgpu trace FILE: the same table from the file.
    read = h.run([str(h.RGPU), "trace", str(traces[0])], h.base_env())
    assert read.returncode == 0, read.stderr
    table = [line for line in read.stdout.splitlines() if line.startswith(("opencl ", "total"))]
    assert table[-1].split()[1] == str(len(records)), read.stdout
    assert [line[:55] for line in table] == [line[:55] for line in stats]  # names and calls

    # The trace ends with what the server counted of the session: every request the trace
    # shows posted or waited for (and the one asking for the counters), the bytes written.
    assert len(sessions) == 1, sessions
    counters = sessions[0]["counters"]
    sent = sum(rec["posted"] + rec["waits"] for rec in records)
    assert counters["requests"] >= sent, (counters, sent)
    assert counters["replies"] > sum(rec["waits"] for rec in records), counters
    assert counters["bulk_received"] == sum(rec["bytes_out"] for rec in records), counters
    assert counters["bulk_sent"] == sum(rec["bytes_in"] for rec in records), counters
    assert counters["busy_us"] > 0 and counters["errors"] == 0, counters
    assert f"session {sessions[0]['session']}: {counters['requests']} requests" in read.stdout


def test_trace_refuses_what_is_not_a_trace(tmp_path):
    bogus = tmp_path / "bogus.jsonl"
    bogus.write_text("hello\n")
    r = h.run([str(h.RGPU), "trace", str(bogus)], h.base_env())
    assert r.returncode != 0 and "not an rgpu trace" in r.stderr, (r.stdout, r.stderr)


def test_no_trace_without_the_variables(c_program, server):
    r = h.run_rgpu(c_program("buffers"), [server])
    h.assert_pass(r, "buffers", server)
    assert "entry point" not in r.stderr


ATEXIT_PROGRAM = r"""
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
static cl_context ctx;
/* Runs after main returns, when the main thread's thread-locals are already gone (as
   PyTorch's exit handlers release their CUDA context). */
static void at_exit(void) {
    cl_uint n = 0;
    clGetPlatformIDs(0, NULL, &n);
    clReleaseContext(ctx);
    printf("released at exit\n");
}
int main(void) {
    cl_platform_id p[8];
    cl_uint n = 0;
    if (clGetPlatformIDs(8, p, &n) != CL_SUCCESS || n == 0) return 1;
    cl_device_id d;
    if (clGetDeviceIDs(p[0], CL_DEVICE_TYPE_ALL, 1, &d, NULL) != CL_SUCCESS) return 1;
    ctx = clCreateContext(NULL, 1, &d, NULL, NULL, NULL);
    if (!ctx) return 1;
    atexit(at_exit);
    printf("main done\n");
    return 0;
}
"""


def test_calls_at_exit_are_traced_without_harm(server, tmp_path, gcc):
    """Calls from exit handlers (after the thread's locals are destroyed) must neither crash
    the program nor be lost from the statistics."""
    src = tmp_path / "atexit.c"
    src.write_text(ATEXIT_PROGRAM)
    prog = tmp_path / "atexit"
    built = h.run([gcc, "-O2", "-o", str(prog), str(src), "-lOpenCL"], h.base_env())
    assert built.returncode == 0, built.stderr
    trace = tmp_path / "trace.jsonl"
    r = h.run_rgpu(prog, [server], RGPU_TRACE=str(trace), RGPU_STATS="1")
    assert r.returncode == 0, (r.stdout, r.stderr[-3000:])
    assert "released at exit" in r.stdout, r.stdout
    assert "panicked" not in r.stderr, r.stderr[-3000:]
