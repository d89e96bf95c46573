#!/usr/bin/env python3
"""torch.compile (Inductor, Triton kernels loaded from cubin files) on the GPU: a fused
elementwise-and-reduction function and a small MLP's forward and backward, compiled, against
eager mode.

    python3 tests/cuda/torch_compile_check.py

Prints `CHECK` lines for compare.py, then `PASS torch_compile` or `FAIL torch_compile: why`;
exits 77 (`SKIP`) without a CUDA-enabled PyTorch.
"""
import os
import sys
import tempfile

from checks import CheckFailed, check, run

# A fresh Inductor cache: a cached kernel would skip the compile-and-load path under test.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="rgpu-inductor-"))

try:
    import torch
except Exception as e:  # noqa: BLE001 - any import failure means "not installed here"
    print(f"SKIP torch_compile: cannot import torch: {e}")
    sys.exit(77)
if torch.version.cuda is None:
    print("SKIP torch_compile: a CPU-only PyTorch")
    sys.exit(77)


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda", 0)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4096, 1024, generator=g).to(dev)

    def fused(t):
        return (torch.sin(t) * torch.sigmoid(t) + t * t).sum(dim=1)

    eager = fused(x)
    compiled = torch.compile(fused)(x)
    torch.cuda.synchronize()
    if not torch.allclose(eager, compiled, rtol=1e-4, atol=1e-4):
        raise CheckFailed(f"compiled != eager: max diff {(eager - compiled).abs().max().item()}")
    check("fused", compiled.double().sum().item(), compiled[0].item(), compiled[-1].item())

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 512), torch.nn.GELU(),
                                torch.nn.LayerNorm(512), torch.nn.Linear(512, 10)).to(dev)
    cmodel = torch.compile(model)
    out = cmodel(x)
    out.square().mean().backward()
    ref = model(x)
    if not torch.allclose(out, ref, rtol=1e-3, atol=1e-3):
        raise CheckFailed(f"compiled model != eager: {(out - ref).abs().max().item()}")
    grad = model[0].weight.grad
    check("mlp", out.double().sum().item(), grad.double().abs().sum().item())


if __name__ == "__main__":
    run("torch_compile", main)
