#!/usr/bin/env python3
"""JAX with XLA's GEMM autotuner at work: a two-layer MLP (1024x256 -> 512 -> 10) whose loss
and gradients `jax.grad` computes under `jax.jit`, at JAX's default matmul precision, so XLA
autotunes its GEMM fusions (cuBLAS against its own Triton kernels, run and timed on the GPU)
before the first step (through rgpu, every profiled config used to fail and XLA gave up). The
loss and gradients must agree with NumPy in float64 to TF32's accuracy; the autotuner's dumped
results are printed.

    python3 tests/cuda/jax_autotune_check.py

Prints `CHECK` lines for compare.py (the NumPy reference, which does not depend on which
kernels won), then `PASS jax_autotune` or
`FAIL jax_autotune: why`; exits 77 (`SKIP`) without a CUDA-enabled JAX.
"""
import os
import sys
import tempfile

from checks import CheckFailed, check, run

# The autotuner's choices, written where this check can read them.
DUMP = os.path.join(tempfile.mkdtemp(prefix="jax-autotune-"), "autotune.textproto")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_gpu_dump_autotune_results_to={DUMP}"
)
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

try:
    import jax
    import jax.numpy as jnp
    import numpy as np
except Exception as e:  # noqa: BLE001 - any import failure means "not installed here"
    print(f"SKIP jax_autotune: cannot import jax: {e}")
    sys.exit(77)


def reference(params, x, labels):
    """Loss and gradients of the same MLP in float64 NumPy."""
    w1, b1, w2, b2 = (np.asarray(params[k], np.float64) for k in ("w1", "b1", "w2", "b2"))
    x = x.astype(np.float64)
    pre = x @ w1 + b1
    h = np.maximum(pre, 0)
    logits = h @ w2 + b2
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    n = x.shape[0]
    loss = -log_softmax[np.arange(n), labels].mean()
    d_logits = np.exp(log_softmax)
    d_logits[np.arange(n), labels] -= 1
    d_logits /= n
    grads = {"w2": h.T @ d_logits, "b2": d_logits.sum(axis=0)}
    d_pre = (d_logits @ w2.T) * (pre > 0)
    grads["w1"] = x.T @ d_pre
    grads["b1"] = d_pre.sum(axis=0)
    return loss, grads


def main():
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as e:
        raise CheckFailed(f"no GPU backend: {e}")
    print(f"jax {jax.__version__}: {gpus[0].device_kind}")

    rng = np.random.default_rng(7)
    x = rng.standard_normal((1024, 256)).astype(np.float32)
    labels = rng.integers(0, 10, size=1024)
    params = {
        "w1": (rng.standard_normal((256, 512)) * 0.05).astype(np.float32),
        "b1": np.zeros(512, np.float32),
        "w2": (rng.standard_normal((512, 10)) * 0.05).astype(np.float32),
        "b2": np.zeros(10, np.float32),
    }

    def loss_fn(p, xb, yb):
        h = jax.nn.relu(xb @ p["w1"] + p["b1"])
        logits = h @ p["w2"] + p["b2"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), yb[:, None], axis=1))

    step = jax.jit(jax.value_and_grad(loss_fn))
    loss, grads = step(params, jnp.asarray(x), jnp.asarray(labels))
    loss = float(loss)
    grads = {k: np.asarray(v, np.float64) for k, v in grads.items()}

    ref_loss, ref_grads = reference(params, x, labels)
    # TF32 GEMMs (JAX's default precision on this GPU) keep about three significant digits.
    if abs(loss - ref_loss) > 1e-2 * abs(ref_loss):
        raise CheckFailed(f"loss {loss} against {ref_loss} in float64")
    for name, ref in ref_grads.items():
        err = np.linalg.norm(grads[name] - ref) / max(np.linalg.norm(ref), 1e-12)
        if not err < 2e-2:
            raise CheckFailed(f"gradient {name} differs from float64 by {err:.3g} (relative)")

    # What the autotuner chose (the dump's format varies between XLA's autotuners).
    dump = open(DUMP).read() if os.path.exists(DUMP) else ""
    print(f"autotuning results: {len(dump)} bytes, {dump.count('entries {')} entries")
    print("\n".join(dump.splitlines()[:12]))
    check("loss", ref_loss)
    check("grads", *(float(np.abs(ref).sum()) for ref in ref_grads.values()))


if __name__ == "__main__":
    run("jax_autotune", main)
