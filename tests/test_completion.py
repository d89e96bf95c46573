"""Completion of commands answered where the program is: after a `clFinish` or a
`clWaitForEvents` returns, the server has already told the client the final status of every
command event that wait implies (an `EventsFinal` frame before the wait's reply), so querying or
waiting for those events sends nothing. Counted from the call trace: a call that sent a request
shows it as posted or waited."""

import re

import rgpu_harness as h


def test_queries_of_completed_commands_send_nothing(c_program, server, tmp_path):
    pattern = tmp_path / "trace.%p.jsonl"
    r = h.run_rgpu(c_program("completion"), [server], RGPU_TRACE=str(pattern))
    h.assert_pass(r, "completion", server)
    traces = list(tmp_path.glob("trace.*.jsonl"))
    assert len(traces) == 1, traces
    _, records, _ = h.read_trace(traces[0])
    records.sort(key=lambda rec: rec["t"])
    finish = next(i for i, rec in enumerate(records) if rec["call"] == "clFinish")
    assert records[finish]["waits"] == 1, records[finish]
    after = records[finish + 1:]
    queries = [rec for rec in after if rec["call"] == "clGetEventInfo"]
    polls = int(re.search(r"^polls (\d+)$", r.stderr, re.M).group(1))
    assert len(queries) == 4 * 32 + 32 + polls, (len(queries), polls)
    sent = [rec for rec in queries[:4 * 32 + 32] if rec["waits"] or rec["posted"]]
    assert not sent, sent[:3]
    # Polling the long kernel: each poll of a running command asks (a status answered from
    # earlier knowledge could show a command running before the one it waits for completes).
    polled = queries[4 * 32 + 32:]
    assert polls >= 1 and all(rec["waits"] == 1 for rec in polled[:-1]), polled[:3]
    # The first clWaitForEvents (after clFinish) is answered here; the second waits once for
    # the last of the second batch of kernels.
    waits = [rec for rec in after if rec["call"] == "clWaitForEvents"]
    assert [(rec["waits"], rec["posted"]) for rec in waits] == [(0, 0), (1, 0)], waits
