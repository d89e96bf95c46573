#!/usr/bin/env python3
"""JAX on the GPU: a jitted training loop (a two-layer MLP on a fixed synthetic regression set,
40 steps of SGD with momentum through jax.jit, value_and_grad and a lax.scan), a jitted matmul
against NumPy in float64, and device queries.

    python3 tests/cuda/jax_check.py

Prints `CHECK` lines for compare.py, then `PASS jax` or `FAIL jax: why`; exits 77 (`SKIP`)
without a CUDA-enabled JAX.
"""
import os
import sys

from checks import CheckFailed, check, run

# Deterministic reductions, and no preallocation of 75% of the GPU (rgpu would hold it too).
os.environ.setdefault("XLA_FLAGS", "--xla_gpu_deterministic_ops=true")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

try:
    import jax
    import jax.numpy as jnp
    import numpy as np
except Exception as e:  # noqa: BLE001 - any import failure means "not installed here"
    print(f"SKIP jax: cannot import jax: {e}")
    sys.exit(77)


def main():
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as e:
        raise CheckFailed(f"no GPU backend: {e}")
    print(f"jax {jax.__version__}: {len(gpus)} GPU(s): {gpus[0].device_kind}")
    check("device_count", len(gpus))

    rng = np.random.default_rng(42)
    a = rng.standard_normal((512, 512)).astype(np.float32)
    b = rng.standard_normal((512, 512)).astype(np.float32)
    with jax.default_matmul_precision("highest"):
        c = np.asarray(jax.jit(lambda x, y: x @ y)(a, b))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = float(np.max(np.abs(c - ref)))
    if err > 1e-3:
        raise CheckFailed(f"jitted matmul differs from NumPy by {err}")
    check("matmul", float(c.astype(np.float64).sum()), float(c[0, 0]), float(c[511, 511]))

    x = rng.standard_normal((1024, 32)).astype(np.float32)
    w_true = rng.standard_normal((32, 1)).astype(np.float32)
    y = np.tanh(x @ w_true) + 0.1 * x[:, :1]
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    params = {
        "w1": jax.random.normal(k1, (32, 128)) * 0.1, "b1": jnp.zeros(128),
        "w2": jax.random.normal(k2, (128, 1)) * 0.1, "b2": jnp.zeros(1),
    }

    def loss(p, xb, yb):
        h = jax.nn.relu(xb @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - yb) ** 2)

    @jax.jit
    def train(p, xb, yb):
        def step(carry, _):
            p, m = carry
            value, g = jax.value_and_grad(loss)(p, xb, yb)
            m = jax.tree_util.tree_map(lambda mi, gi: 0.9 * mi + gi, m, g)
            p = jax.tree_util.tree_map(lambda pi, mi: pi - 0.05 * mi, p, m)
            return (p, m), value
        m0 = jax.tree_util.tree_map(jnp.zeros_like, p)
        (p, _), losses = jax.lax.scan(step, (p, m0), None, length=40)
        return p, losses

    with jax.default_matmul_precision("highest"):
        params, losses = train(params, jnp.asarray(x), jnp.asarray(y))
        losses = np.asarray(losses)
    print("losses: " + " ".join(f"{v:.4f}" for v in losses[::8]))
    if not np.all(np.isfinite(losses)) or not losses[-1] < losses[0]:
        raise CheckFailed(f"loss did not decrease: {losses[0]} -> {losses[-1]}")
    check("loss", losses[0], losses[20], losses[-1])
    check("params", float(sum(np.abs(np.asarray(v)).sum() for v in params.values())))


if __name__ == "__main__":
    run("jax", main)
