"""A session's start, for scripts/gpu-isolation-costs.sh and scripts/gpu-tls-costs.sh:

    python3 session_start.py T0 [HOLD]   # T0: `date +%s.%N` taken before the process started

cuInit, the primary context, a 1 MiB cuMemAlloc and a synchronize; prints
"start_ms <milliseconds since T0>", then keeps the session HOLD seconds (default 0)."""

import ctypes
import sys
import time

t0 = float(sys.argv[1])
cuda = ctypes.CDLL("libcuda.so.1")
ptr, ctx = ctypes.c_uint64(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)) == 0
assert cuda.cuCtxSynchronize() == 0
print(f"start_ms {(time.time() - t0) * 1000:.1f}", flush=True)
if len(sys.argv) > 2:
    time.sleep(float(sys.argv[2]))
