"""A program that forks keeps its session: a child forked after the parent opened its rgpu
connections shares the parent's sockets, and nothing it does (using the API, buffering,
exiting with destructors and atexit handlers, or dying) may reach them. Driven by pyopencl
through `rgpu run` against a real server on PoCL: the parent computes, forks children that use
OpenCL (they get errors, never a hang) or simply exit, and computes again, checking results."""

import subprocess
import sys
import textwrap

import rgpu_harness as h

PROGRAM = textwrap.dedent(r"""
    import os, signal, sys
    import numpy as np
    import pyopencl as cl

    platform = [p for p in cl.get_platforms() if p.name == "rgpu"][0]
    ctx = cl.Context(platform.get_devices())
    queue = cl.CommandQueue(ctx)
    prog = cl.Program(ctx, "__kernel void twice(__global float *x) "
                           "{ size_t i = get_global_id(0); x[i] = 2.0f * x[i]; }").build()
    mf = cl.mem_flags

    def compute(n, seed):
        data = np.arange(n, dtype=np.float32) + seed
        buf = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=data)
        prog.twice(queue, (n,), None, buf)
        out = np.empty_like(data)
        cl.enqueue_copy(queue, out, buf)
        queue.finish()
        assert np.array_equal(out, 2 * data), "wrong result"
        return buf

    kept = compute(1 << 16, 1)
    # A write is left pending in the parent's buffers while it forks.
    pending = np.ones(1 << 10, dtype=np.float32)
    cl.enqueue_copy(queue, kept, pending, is_blocking=False)

    def child(action):
        pid = os.fork()
        if pid:
            _, status = os.waitpid(pid, 0)
            return status
        if action == "use":
            # OpenCL in the child: an error, never a hang and never the parent's session.
            try:
                compute(256, 3)
                os._exit(3)
            except Exception as e:
                print("child error:", type(e).__name__, str(e)[:100], flush=True)
                os._exit(0)
        if action == "exit":
            sys.exit(0)  # atexit handlers and object finalizers run (pyopencl releases objects)
        os.kill(os.getpid(), signal.SIGKILL)

    for action in ("use", "exit", "kill", "use"):
        status = child(action)
        if action == "use":
            assert os.waitstatus_to_exitcode(status) == 0, f"child {action}: {status}"
        # The parent's session goes on after each.
        compute(1 << 15, len(action))
    out = np.empty(1 << 10, dtype=np.float32)
    cl.enqueue_copy(queue, out, kept)
    assert np.array_equal(out, pending), "the write pending at fork time was lost"
    print("PASS")
""")


def test_forked_children_leave_the_parents_session_intact(server):
    cmd = h.rgpu_run_cmd([server.endpoint], [sys.executable, "-c", PROGRAM])
    result = subprocess.run(cmd, env=h.base_env(), capture_output=True, text=True, timeout=90)
    assert result.returncode == 0 and "PASS" in result.stdout, (
        f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-4000:]}"
    )
    assert result.stdout.count("child error:") == 2, result.stdout
