#!/usr/bin/env python3
"""Numba's CUDA target: a kernel compiled from Python (NVVM, then linked and loaded through the
driver's JIT linker), a saxpy and a shared-memory block reduction, against NumPy.

    python3 tests/cuda/numba_check.py

Prints `CHECK` lines for compare.py, then `PASS numba` or `FAIL numba: why`; exits 77 (`SKIP`)
without Numba's CUDA target.
"""
import sys

from checks import CheckFailed, check, run

try:
    import numba
    import numpy as np
    from numba import cuda, float32

    # Numba's compilers without a GPU (its CPU target, and PTX for the CUDA target): when they
    # fail here (a NumPy newer than this Numba supports), the CUDA target cannot work either.
    numba.njit(lambda v: v + 1)(1)
    cuda.compile_ptx(lambda v: None, (float32[:],))
except Exception as e:  # noqa: BLE001 - any failure here means "Numba does not work here"
    print(f"SKIP numba: Numba cannot compile here: {type(e).__name__}: {e}")
    sys.exit(77)


@cuda.jit
def saxpy(a, x, y, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = a * x[i] + y[i]


@cuda.jit
def block_sums(x, out):
    shared = cuda.shared.array(256, float32)
    i = cuda.grid(1)
    t = cuda.threadIdx.x
    shared[t] = x[i] if i < x.size else 0.0
    cuda.syncthreads()
    s = 128
    while s > 0:
        if t < s:
            shared[t] += shared[t + s]
        cuda.syncthreads()
        s //= 2
    if t == 0:
        out[cuda.blockIdx.x] = shared[0]


def main():
    if not cuda.is_available():
        raise CheckFailed("numba.cuda.is_available() is False")
    n = 1 << 20
    rng = np.random.default_rng(9)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    out = cuda.device_array(n, dtype=np.float32)
    saxpy[(n + 255) // 256, 256](np.float32(2.5), cuda.to_device(x), cuda.to_device(y), out)
    got = out.copy_to_host()
    if not np.allclose(got, 2.5 * x + y, rtol=1e-6, atol=1e-6):
        raise CheckFailed("saxpy differs from NumPy")
    check("saxpy", float(got.astype(np.float64).sum()), float(got[12345]))
    sums = cuda.device_array(n // 256, dtype=np.float32)
    block_sums[n // 256, 256](cuda.to_device(x), sums)
    total = float(sums.copy_to_host().astype(np.float64).sum())
    if abs(total - float(x.astype(np.float64).sum())) > 1e-2:
        raise CheckFailed(f"block sums {total} != {x.astype(np.float64).sum()}")
    check("block_sums", total)


if __name__ == "__main__":
    run("numba", main)
