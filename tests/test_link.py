"""The link emulator under a real program: `RGPU_LINK` puts every connection of the program's
session (its connection and the data lanes its large buffers open) behind one emulated link,
and the program still computes the right answer. What is checked is what the emulator must do,
not how fast anything is: every waited call lasts at least the link's round trip."""

import subprocess

import rgpu_harness as h


def test_a_program_runs_whole_behind_an_emulated_link(server, gcc, tmp_path):
    example = tmp_path / "vector_add"
    subprocess.run([gcc, "-O2", "-o", str(example), str(h.REPO / "examples" / "vector_add.c"),
                    "-lOpenCL", "-lm"], check=True)
    pattern = tmp_path / "trace.%p.jsonl"
    # 16 MiB buffers: reads and writes this large go over the session's data lanes.
    r = h.run_rgpu(example, [server], EXAMPLE_PLATFORM="rgpu", EXAMPLE_N="4194304",
                   RGPU_LINK="rtt=2ms,bandwidth=2Gbit", RGPU_TRACE=str(pattern))
    assert r.returncode == 0 and "result: OK" in r.stdout, r.describe() + server.log_tail()
    traces = list(tmp_path.glob("trace.*.jsonl"))
    assert len(traces) == 1, traces
    header, records, _ = h.read_trace(traces[0])
    assert header.get("link") == "rtt=2ms,bandwidth=2Gbit", header
    waited = [rec for rec in records if rec["waits"] > 0]
    assert waited, records[:5]
    # A call that waited on the server cannot end sooner than its round trips after it began.
    # (Its whole time, not only the part the trace counts as waiting: on a small machine the
    # emulator's threads can hold the caller up between sending and waiting.)
    for rec in waited:
        assert rec["us"] >= 2000 * rec["waits"], rec
    # The 16 MiB read came back over the link: at 2 Gbit/s that alone is 67 ms.
    reads = [rec for rec in waited if rec["call"] == "clEnqueueReadBuffer"]
    assert reads and max(rec["bytes_in"] for rec in reads) >= 16 << 20, reads
    assert max(rec["wait_us"] for rec in reads) >= 16 * 2**20 * 8 / 2e9 * 1e6, reads
