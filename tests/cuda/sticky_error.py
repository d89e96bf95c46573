"""The sticky-error isolation check of scripts/gpu-check.sh, one role per run:

    python3 sticky_error.py healthy   # holds GPU memory, prints "ready", waits for a line on
                                      # stdin, then computes on the GPU: "healthy ok"
    python3 sticky_error.py bad       # a kernel writes to an illegal address: the context is
                                      # lost (a sticky error); prints "bad got <error>"

Through one rgpu server, the bad client's error must stay in its own session: the healthy
client, started before it, still computes correctly after it, and so does a client started
after it."""

import sys

import cupy as cp

N = 1 << 20


def healthy(wait: bool) -> None:
    a = cp.arange(N, dtype=cp.int64)
    cp.cuda.Device().synchronize()
    if wait:
        print("ready", flush=True)
        sys.stdin.readline()
    total = int((a * 2).sum())
    assert total == N * (N - 1), total
    print("healthy ok", flush=True)


def bad() -> None:
    kernel = cp.RawKernel(r'''
extern "C" __global__ void scribble(int *unused) {
    *(volatile int *)0x10 = 1;   // an illegal address: the context's error is sticky
}''', "scribble")
    kernel((1,), (1,), (cp.zeros(1, dtype=cp.int32),))
    try:
        cp.cuda.Device().synchronize()
        print("bad got no error", flush=True)
    except Exception as exc:  # cupy_backends.cuda.api.runtime.CUDARuntimeError
        print(f"bad got {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    role = sys.argv[1] if len(sys.argv) > 1 else "healthy"
    if role == "bad":
        bad()
    else:
        healthy(wait=role == "healthy")
