#!/usr/bin/env python3
"""A CUDA program that forks: PyTorch DataLoader workers (forked after the parent initialized
CUDA; they only prepare batches on the CPU) while the parent trains on the GPU, and a forked
child that calls the driver itself (it gets an error, as NVIDIA's driver gives a child forked
after CUDA was initialized; the parent's session is untouched), then the parent computes on.

    python3 tests/cuda/fork_check.py

Prints `CHECK` lines for compare.py, then `PASS fork` or `FAIL fork: why`; exits 77 (`SKIP`)
without a CUDA-enabled PyTorch.
"""
import ctypes
import os
import sys

from checks import CheckFailed, check, run

try:
    import torch
    from torch.utils.data import DataLoader, Dataset
except Exception as e:  # noqa: BLE001 - any import failure means "not installed here"
    print(f"SKIP fork: cannot import torch: {e}")
    sys.exit(77)
if torch.version.cuda is None:
    print("SKIP fork: a CPU-only PyTorch")
    sys.exit(77)


class Squares(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        x = torch.full((64,), float(i % 17) / 17.0)
        return x, (x * x).sum()


def main():
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 1)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Squares(), batch_size=32, num_workers=2,
                        multiprocessing_context="fork")
    losses = []
    for epoch in range(2):
        for x, y in loader:
            x, y = x.to(dev), y.to(dev)
            loss = ((model(x).squeeze(1) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    check("loss", losses[0], losses[-1])

    # A child that calls the driver directly.
    pid = os.fork()
    if pid == 0:
        cuda = ctypes.CDLL("libcuda.so.1")
        ptr = ctypes.c_uint64()
        status = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20))
        os._exit(0 if status != 0 else 1)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise CheckFailed("a forked child allocated GPU memory through its parent's context")
    print("forked child: its driver call failed, as it should")

    x = torch.arange(1 << 20, device=dev, dtype=torch.int64)
    total = (x * 2).sum().item()
    check("after_fork", total)
    if total != (1 << 20) * ((1 << 20) - 1):
        raise CheckFailed(f"the parent's result after the fork is wrong: {total}")


if __name__ == "__main__":
    run("fork", main)
