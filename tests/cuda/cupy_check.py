#!/usr/bin/env python3
"""CuPy on the GPU, checked against NumPy: elementwise arithmetic, reductions (sum, max, mean),
a 512x512 float32 matmul (cuBLAS), a cupy.RawKernel (C++ compiled by NVRTC), a
cupy.ElementwiseKernel and a cupy.ReductionKernel, and seeded random numbers.

    python3 tests/cuda/cupy_check.py

Prints `CHECK <name> <values>` lines (compared between a native run and one through rgpu by
compare.py), then `PASS cupy`, or `FAIL cupy: why` and exit status 1. Without CuPy installed it
prints `SKIP cupy: ...` and exits 77.
"""
import sys

from checks import CheckFailed, check, run

try:
    import numpy as np
    import cupy as cp
except Exception as e:  # noqa: BLE001 - any import failure means "not installed here"
    print(f"SKIP cupy: cannot import cupy/numpy: {e}")
    sys.exit(77)


def expect_close(what, got, ref, rtol, atol):
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        raise CheckFailed(f"{what}: shape {got.shape}, expected {ref.shape}")
    if not np.allclose(got, ref, rtol=rtol, atol=atol):
        err = np.abs(got - ref)
        i = np.unravel_index(np.argmax(err - rtol * np.abs(ref)), err.shape)
        raise CheckFailed(f"{what}: element {i} = {got[i]!r}, expected {ref[i]!r}")


RAW_SOURCE = r"""
extern "C" __global__ void saxpy_sin(const float *x, const float *y, float *out, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + sinf(y[i]);
}
"""


def main():
    dev = cp.cuda.Device(0)
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    print(f"device 0: {name}, cc {dev.compute_capability}, "
          f"{cp.cuda.runtime.getDeviceCount()} device(s), CuPy {cp.__version__}")
    check("device_count", cp.cuda.runtime.getDeviceCount())
    check("compute_capability", int(dev.compute_capability))

    # Inputs made on the host so both sides see identical values.
    n = 1 << 20
    rng = np.random.default_rng(1234)
    a_np = rng.standard_normal(n).astype(np.float32)
    b_np = rng.uniform(0.5, 2.0, n).astype(np.float32)
    a, b = cp.asarray(a_np), cp.asarray(b_np)

    # Elementwise.
    e = cp.sqrt(b) * a + cp.exp(-cp.abs(a)) / b
    a64, b64 = a_np.astype(np.float64), b_np.astype(np.float64)
    e_ref = np.sqrt(b64) * a64 + np.exp(-np.abs(a64)) / b64
    expect_close("elementwise", cp.asnumpy(e), e_ref, rtol=1e-5, atol=1e-6)
    check("elementwise", float(e[0]), float(e[n // 2]), float(e[-1]))

    # Reductions.
    s, mx, mean = float(a.sum()), float(a.max()), float(b.mean())
    expect_close("sum", s, a64.sum(), rtol=1e-4, atol=1e-2)
    expect_close("max", mx, a_np.max(), rtol=0, atol=0)
    expect_close("mean", mean, b64.mean(), rtol=1e-5, atol=0)
    check("reductions", s, mx, mean)
    i_max = int(cp.argmax(a))
    if i_max != int(np.argmax(a_np)):
        raise CheckFailed(f"argmax {i_max}, expected {int(np.argmax(a_np))}")
    check("argmax", i_max)

    # Matmul, float32 through cuBLAS, against float64 on the host.
    m_a = rng.uniform(-1, 1, (512, 512)).astype(np.float32)
    m_b = rng.uniform(-1, 1, (512, 512)).astype(np.float32)
    prod = cp.asnumpy(cp.asarray(m_a) @ cp.asarray(m_b))
    prod_ref = m_a.astype(np.float64) @ m_b.astype(np.float64)
    expect_close("matmul", prod, prod_ref, rtol=1e-4, atol=1e-4)
    check("matmul", prod.astype(np.float64).sum(), prod[0, 0], prod[511, 511], prod[100, 200])

    # RawKernel: compiled by NVRTC, loaded as a module, launched with explicit grid and block.
    raw = cp.RawKernel(RAW_SOURCE, "saxpy_sin")
    out = cp.empty_like(a)
    threads = 256
    raw(((n + threads - 1) // threads,), (threads,), (a, b, out, np.float32(2.5), np.int32(n)))
    cp.cuda.Device().synchronize()
    raw_ref = 2.5 * a64 + np.sin(b64)
    expect_close("RawKernel", cp.asnumpy(out), raw_ref, rtol=1e-5, atol=1e-5)
    check("raw_kernel", float(out.sum()), float(out[12345]))

    # ElementwiseKernel with a scalar parameter.
    ew = cp.ElementwiseKernel("float32 x, float32 y, float32 k", "float32 z",
                              "z = x > 0 ? x * k + y : y - x", "rgpu_check_ew")
    z = ew(a, b, np.float32(3.0))
    z_ref = np.where(a_np > 0, a64 * 3.0 + b64, b64 - a64)
    expect_close("ElementwiseKernel", cp.asnumpy(z), z_ref, rtol=1e-6, atol=1e-6)
    check("elementwise_kernel", float(z.sum()), float(z[777]))

    # ReductionKernel: sum of squares.
    sq = cp.ReductionKernel("float32 x", "float32 y", "x * x", "a + b", "y = a", "0",
                            "rgpu_check_sumsq")
    ssq = float(sq(a))
    expect_close("ReductionKernel", ssq, (a64 * a64).sum(), rtol=1e-4, atol=0)
    check("reduction_kernel", ssq)

    # Seeded random numbers (cuRAND): the same sequence every run.
    cp.random.seed(42)
    r = cp.random.rand(1 << 16, dtype=cp.float32)
    rn = cp.random.standard_normal(1 << 16, dtype=cp.float32)
    r_np = cp.asnumpy(r)
    if not (r_np.min() >= 0.0 and r_np.max() < 1.0):
        raise CheckFailed(f"rand outside [0, 1): {r_np.min()} .. {r_np.max()}")
    if abs(float(r.mean()) - 0.5) > 0.01 or abs(float(rn.std()) - 1.0) > 0.02:
        raise CheckFailed(f"random moments off: mean {float(r.mean())}, std {float(rn.std())}")
    check("random", float(r.sum()), float(r[0]), float(r[-1]), float(rn.sum()))

    # Device-to-device copy, and a strided view back to the host.
    c = a.copy()
    c[::2] = 0
    expect_close("strided", cp.asnumpy(c[1::2]), a_np[1::2], rtol=0, atol=0)
    check("copy", float(c.sum()))

    cp.cuda.Stream.null.synchronize()
    mem = cp.get_default_memory_pool()
    print(f"memory pool: {mem.used_bytes()} bytes used, {mem.total_bytes()} held")


if __name__ == "__main__":
    run("cupy", main)
