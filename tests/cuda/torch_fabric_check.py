#!/usr/bin/env python3
"""PyTorch moving tensors between two GPUs, which through rgpu sit on two servers (the copies
go server to server over rgpu's fabric, and cross-device stream waits between the servers):

- `.to("cuda:1")` of tensors from 4 B to 256 MiB, and back, checked bit for bit;
- copies with `non_blocking=True` on a side stream of each device, ordered by events;
- `copy_` into views (strided destinations), and arithmetic mixing results of both GPUs;
- a two-GPU pipeline (layer 1 on cuda:0, layer 2 on cuda:1) trained for 10 SGD steps.
(`torch.cuda.comm.broadcast` and DataParallel go through NCCL, which rgpu does not serve yet.)

    python3 tests/cuda/torch_fabric_check.py

Prints `CHECK` lines (compared between a native run and one through rgpu by compare.py) and
timings, then `PASS torch_fabric`; needs two GPUs (`SKIP` and exit 77 otherwise).
"""
import faulthandler
import sys
import time

from checks import CheckFailed, check, run

try:
    import torch
except Exception as e:  # noqa: BLE001 - any import failure means "not installed here"
    print(f"SKIP torch_fabric: cannot import torch: {e}")
    sys.exit(77)


def same(what, got, ref):
    if not torch.equal(got.cpu(), ref.cpu()):
        diff = (got.cpu() != ref.cpu()).nonzero()
        raise CheckFailed(f"{what}: {len(diff)} elements differ, first at {diff[0].tolist()}")


def main():
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        print("SKIP torch_fabric: fewer than two GPUs")
        sys.exit(77)
    # A hang shows where it is.
    faulthandler.dump_traceback_later(90, exit=True)
    d0, d1 = torch.device("cuda", 0), torch.device("cuda", 1)
    check("device_count", torch.cuda.device_count())
    g = torch.Generator().manual_seed(7)

    # Plain moves, every size class of the fabric (one chunk, several, striped).
    for n in [1, 1000, 1 << 14, 1 << 18, 1 << 22, 1 << 26]:
        host = torch.randint(-2**31, 2**31 - 1, (n,), generator=g, dtype=torch.int32)
        a = host.to(d0)
        b = a.to(d1)
        same(f"to cuda:1 ({4 * n} B)", b, host)
        c = (b + 1).to(d0)
        same(f"back to cuda:0 ({4 * n} B)", c, host + 1)
        check(f"move_{4 * n}", int(c[-1].item()), int(b.sum(dtype=torch.int64).item() % 1000003))

    # Timed: 256 MiB each way (printed, not compared).
    big = torch.ones(1 << 26, device=d0)
    torch.cuda.synchronize(d0)
    start = time.perf_counter()
    moved = big.to(d1)
    torch.cuda.synchronize(d1)
    seconds = time.perf_counter() - start
    print(f"256 MiB cuda:0 -> cuda:1: {seconds * 1e3:.1f} ms, {256 / 1024 / seconds:.2f} GiB/s")
    check("big_sum", moved.sum().item())

    # Non-blocking copies on side streams, ordered by events across the devices.
    s0, s1 = torch.cuda.Stream(d0), torch.cuda.Stream(d1)
    x = torch.randn(1 << 20, generator=g).to(d0)
    with torch.cuda.stream(s0):
        y = x * 3
        done0 = torch.cuda.Event()
        done0.record(s0)
    with torch.cuda.stream(s1):
        s1.wait_event(done0)
        z = y.to(d1, non_blocking=True)
        w = z.sqrt().abs() + 2
        done1 = torch.cuda.Event()
        done1.record(s1)
    torch.cuda.current_stream(d0).wait_event(done1)
    back = w.to(d0, non_blocking=True)
    torch.cuda.synchronize(d0)
    torch.cuda.synchronize(d1)
    ref = (x.cpu() * 3).sqrt().abs() + 2
    if not torch.allclose(back.cpu(), ref, rtol=1e-6, atol=1e-6, equal_nan=True):
        raise CheckFailed("stream-ordered copies across devices gave other values")
    check("streams", back.nan_to_num().sum().item())

    # Strided destinations and sources.
    m = torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64).to(d0)
    dst = torch.zeros(64, 128, device=d1)
    dst[:, ::2].copy_(m)
    same("strided copy_", dst[:, ::2], m)
    t = m.t().to(d1)
    same("transposed", t, m.t())
    check("strided", dst.sum().item(), t[3, 5].item())

    # A model split over both GPUs, trained for 10 steps.
    torch.manual_seed(3)
    l1 = torch.nn.Linear(256, 512).to(d0)
    l2 = torch.nn.Linear(512, 10).to(d1)
    opt = torch.optim.SGD(list(l1.parameters()) + list(l2.parameters()), lr=0.05)
    data = torch.randn(128, 256, generator=g)
    labels = torch.randint(0, 10, (128,), generator=g)
    losses = []
    for _ in range(10):
        opt.zero_grad()
        hidden = torch.relu(l1(data.to(d0)))
        out = l2(hidden.to(d1))
        loss = torch.nn.functional.cross_entropy(out, labels.to(d1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print("pipeline losses " + " ".join(f"{v:.4f}" for v in losses))
    if not losses[-1] < losses[0]:
        raise CheckFailed(f"the split model did not learn: {losses}")
    check("pipeline", losses[0], losses[-1])


run("torch_fabric", main)
