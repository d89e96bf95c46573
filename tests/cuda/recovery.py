"""The recovery check of scripts/gpu-check.sh: a CUDA driver-API program (ctypes) whose server
is lost and comes back.

    python3 recovery.py   # computes, prints "ready", waits for a line on stdin (meanwhile the
                          # check kills the server and starts it again on the same port), then:
                          # a call on the lost session fails; cuDevicePrimaryCtxReset and a new
                          # primary context, and a new context from cuCtxCreate, compute again
                          # in a new session: "recovery ok"
"""

import ctypes
import sys

cuda = ctypes.CDLL("libcuda.so.1")
SIZE = 1 << 20


def check(rc: int, what: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(rc, ctypes.byref(name))
        raise SystemExit(f"{what} failed: {rc} ({(name.value or b'?').decode()})")


def round_trip(label: str) -> None:
    ptr = ctypes.c_uint64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(SIZE)), f"{label}: cuMemAlloc")
    src = bytes(range(256)) * (SIZE // 256)
    dst = ctypes.create_string_buffer(SIZE)
    check(cuda.cuMemcpyHtoD_v2(ptr, src, ctypes.c_size_t(SIZE)), f"{label}: cuMemcpyHtoD")
    check(cuda.cuMemcpyDtoH_v2(dst, ptr, ctypes.c_size_t(SIZE)), f"{label}: cuMemcpyDtoH")
    assert dst.raw == src, f"{label}: the data came back different"
    check(cuda.cuMemFree_v2(ptr), f"{label}: cuMemFree")
    print(f"{label}: 1 MiB round trip ok", flush=True)


def retain_primary(label: str) -> ctypes.c_void_p:
    ctx = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), f"{label}: primary retain")
    check(cuda.cuCtxSetCurrent(ctx), f"{label}: cuCtxSetCurrent")
    return ctx


check(cuda.cuInit(0), "cuInit")
first = retain_primary("before")
round_trip("before")
print("ready", flush=True)
sys.stdin.readline()

ptr = ctypes.c_uint64()
rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(SIZE))
name = ctypes.c_char_p()
cuda.cuGetErrorName(rc, ctypes.byref(name))
print(f"lost session: cuMemAlloc -> {rc} ({(name.value or b'?').decode()})", flush=True)
assert rc != 0, "a call on the lost session succeeded"

# As after any error that loses a context: reset the primary context, then retain it again.
check(cuda.cuDevicePrimaryCtxRelease_v2(0), "primary release")
check(cuda.cuDevicePrimaryCtxReset_v2(0), "primary reset")
again = retain_primary("after reset")
round_trip("after reset")
print(f"primary context {'renewed' if again.value != first.value else 'kept'}", flush=True)

explicit = ctypes.c_void_p()
check(cuda.cuCtxCreate_v2(ctypes.byref(explicit), 0, 0), "cuCtxCreate")
round_trip("new context")
check(cuda.cuCtxDestroy_v2(explicit), "cuCtxDestroy")
print("recovery ok", flush=True)
