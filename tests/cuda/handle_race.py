"""The handle_race check of scripts/gpu-check.sh (through rgpu only: natively, using a destroyed
handle is undefined): threads use an event and a stream while another thread destroys them.

    rgpu run -- python3 handle_race.py   # prints "handles ok" at the end

Every call on a handle returns either the call's own result (the handle was still live) or
CUDA_ERROR_INVALID_HANDLE (it was destroyed; a record that got past the client's check just
before the destroy fails on the server, which reports it at the next synchronizing call),
never anything else, never a crash; a destroyed handle is dead for every later call (a second
destroy too); the context computes afterwards. ctypes releases the
GIL during each call, so the calls of the threads really overlap."""

import ctypes
import threading

cuda = ctypes.CDLL("libcuda.so.1")
INVALID_HANDLE, NOT_READY = 400, 600
ROUNDS, USERS = 50, 4


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise SystemExit(f"{what} failed: {rc}")


check(cuda.cuInit(0), "cuInit")
ctx = ctypes.c_void_p()
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "primary retain")
check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
failures = []


def use(event: ctypes.c_void_p, stream: ctypes.c_void_p, stop: threading.Event) -> None:
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent (user)")
    while not stop.is_set():
        results = (cuda.cuEventRecord(event, stream), cuda.cuEventQuery(event),
                   cuda.cuStreamQuery(stream))
        failures.extend(f"answered {rc}" for rc in results
                        if rc not in (0, NOT_READY, INVALID_HANDLE))


for _ in range(ROUNDS):
    event, stream = ctypes.c_void_p(), ctypes.c_void_p()
    check(cuda.cuEventCreate(ctypes.byref(event), 0), "cuEventCreate")
    check(cuda.cuStreamCreate(ctypes.byref(stream), 0), "cuStreamCreate")
    stop = threading.Event()
    users = [threading.Thread(target=use, args=(event, stream, stop)) for _ in range(USERS)]
    for user in users:
        user.start()
    check(cuda.cuEventDestroy_v2(event), "cuEventDestroy")
    check(cuda.cuStreamDestroy_v2(stream), "cuStreamDestroy")
    # Dead from now on, also for a second destroy (no double free).
    assert cuda.cuEventQuery(event) == INVALID_HANDLE
    assert cuda.cuStreamQuery(stream) == INVALID_HANDLE
    assert cuda.cuEventDestroy_v2(event) == INVALID_HANDLE
    assert cuda.cuStreamDestroy_v2(stream) == INVALID_HANDLE
    stop.set()
    for user in users:
        user.join()
if failures:
    raise SystemExit(f"{len(failures)} wrong answers, e.g. {failures[:3]}")
# A failed record's deferred error, if one is left, is reported once; then the context is
# intact: a round trip through device memory.
rc = cuda.cuCtxSynchronize()
assert rc in (0, INVALID_HANDLE), rc
ptr = ctypes.c_uint64()
check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(4096)), "cuMemAlloc")
src, dst = bytes(range(256)) * 16, ctypes.create_string_buffer(4096)
check(cuda.cuMemcpyHtoD_v2(ptr, src, ctypes.c_size_t(4096)), "cuMemcpyHtoD")
check(cuda.cuMemcpyDtoH_v2(dst, ptr, ctypes.c_size_t(4096)), "cuMemcpyDtoH")
assert dst.raw == src
check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
print(f"handles ok ({ROUNDS} rounds, {USERS} threads using each event and stream)")
