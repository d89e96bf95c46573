#!/usr/bin/env python3
"""PyTorch on the GPU: device queries, tensor ops checked against the CPU, a 1024x1024 float32
matmul (TF32 off) against a float64 CPU reference, and a small MLP (64-256-256-10) trained for
20 Adam steps on a fixed synthetic data set.

    python3 tests/cuda/torch_check.py

Prints `CHECK <name> <values>` lines (compared between a native run and one through rgpu by
compare.py), then `PASS torch`, or `FAIL torch: why` and exit status 1. Without PyTorch (or
with a CPU-only build) it prints `SKIP torch: ...` and exits 77.
"""
import math
import os
import sys

from checks import CheckFailed, check, run

# Deterministic cuBLAS workspaces, so both runs train bit-identically; must precede CUDA init.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

try:
    import torch
except Exception as e:  # noqa: BLE001 - any import failure means "not installed here"
    print(f"SKIP torch: cannot import torch: {e}")
    sys.exit(77)
if torch.version.cuda is None:
    print(f"SKIP torch: torch {torch.__version__} is a CPU-only build")
    sys.exit(77)


def expect_close(what, got, ref, rtol, atol):
    got = got.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    if got.shape != ref.shape:
        raise CheckFailed(f"{what}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}")
    if not torch.allclose(got, ref, rtol=rtol, atol=atol):
        excess = (got - ref).abs() - rtol * ref.abs()
        i = int(excess.flatten().argmax())
        raise CheckFailed(f"{what}: flat element {i} = {got.flatten()[i].item()!r}, "
                          f"expected {ref.flatten()[i].item()!r}")


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)

    if not torch.cuda.is_available():
        raise CheckFailed("torch.cuda.is_available() is False")
    count = torch.cuda.device_count()
    name = torch.cuda.get_device_name(0)
    cap = torch.cuda.get_device_capability(0)
    props = torch.cuda.get_device_properties(0)
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}): {count} device(s); "
          f"device 0: {name}, cc {cap[0]}.{cap[1]}, {props.multi_processor_count} SMs, "
          f"{props.total_memory / 2**30:.1f} GiB")
    check("device_count", count)
    check("device_capability", cap[0], cap[1])
    check("sm_count", props.multi_processor_count)
    dev = torch.device("cuda", 0)

    # Tensor ops: inputs made on the CPU, computed on both sides.
    g = torch.Generator().manual_seed(1234)
    x_cpu = torch.randn(1 << 20, generator=g)
    y_cpu = torch.rand(1 << 20, generator=g) + 0.5
    x, y = x_cpu.to(dev), y_cpu.to(dev)
    e = torch.sqrt(y) * x + torch.exp(-x.abs()) / y
    x64, y64 = x_cpu.double(), y_cpu.double()
    e_ref = torch.sqrt(y64) * x64 + torch.exp(-x64.abs()) / y64
    expect_close("elementwise", e, e_ref, rtol=1e-5, atol=1e-6)
    check("elementwise", e[0].item(), e[1 << 19].item(), e[-1].item())
    s, mx, mean = x.sum().item(), x.max().item(), y.mean().item()
    expect_close("sum", torch.tensor(s), x_cpu.double().sum(), rtol=1e-4, atol=1e-2)
    expect_close("max", torch.tensor(mx), x_cpu.max(), rtol=0, atol=0)
    expect_close("mean", torch.tensor(mean), y_cpu.double().mean(), rtol=1e-5, atol=0)
    check("reductions", s, mx, mean)
    sorted_x, _ = torch.sort(x[:4096])
    expect_close("sort", sorted_x, torch.sort(x_cpu[:4096])[0], rtol=0, atol=0)
    cs = torch.cumsum(y[:1000], 0)
    expect_close("cumsum", cs, torch.cumsum(y_cpu[:1000].double(), 0), rtol=1e-5, atol=1e-4)
    check("sort_cumsum", sorted_x[0].item(), sorted_x[-1].item(), cs[-1].item())
    # On-device random numbers (Philox) from a fixed seed.
    torch.cuda.manual_seed(7)
    r = torch.rand(1 << 16, device=dev)
    if not (0.0 <= r.min().item() and r.max().item() < 1.0 and abs(r.mean().item() - 0.5) < 0.01):
        raise CheckFailed(f"torch.rand on cuda looks wrong: mean {r.mean().item()}")
    check("cuda_rand", r.sum().item(), r[0].item())

    # Matmul, float32 without TF32, against float64 on the CPU.
    a_cpu = torch.rand(1024, 1024, generator=g) * 2 - 1
    b_cpu = torch.rand(1024, 1024, generator=g) * 2 - 1
    c = a_cpu.to(dev) @ b_cpu.to(dev)
    torch.cuda.synchronize()
    c_ref = a_cpu.double() @ b_cpu.double()
    expect_close("matmul", c, c_ref, rtol=1e-4, atol=1e-4)
    check("matmul", c.double().sum().item(), c[0, 0].item(), c[1023, 1023].item(),
          c[100, 200].item())

    # A small MLP trained with Adam on a fixed synthetic classification set.
    torch.manual_seed(0)
    data_x = torch.randn(512, 64)
    true_w = torch.randn(64, 10)
    data_y = (data_x @ true_w).argmax(dim=1)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    ).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    xb, yb = data_x.to(dev), data_y.to(dev)
    losses = []
    for step in range(20):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    print("losses: " + " ".join(f"{v:.4f}" for v in losses))
    if not all(math.isfinite(v) for v in losses):
        raise CheckFailed(f"loss is not finite: {losses}")
    if not losses[19] < losses[0]:
        raise CheckFailed(f"loss did not decrease: {losses[0]} -> {losses[19]}")
    check("loss", losses[0], losses[10], losses[19])
    with torch.no_grad():
        params = [p.detach().double() for p in model.parameters()]
        check("param_checksum", sum(p.sum().item() for p in params),
              sum(p.abs().sum().item() for p in params))
        acc = (model(xb).argmax(dim=1) == yb).double().mean().item()
    check("train_accuracy", acc)

    torch.cuda.synchronize()
    print(f"memory: {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB peak allocated")


if __name__ == "__main__":
    run("torch", main)
