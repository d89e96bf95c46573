#!/usr/bin/env python3
"""Data-parallel training with PyTorch's NCCL backend, one process per GPU, as `torchrun`
starts it: DistributedDataParallel on a small MLP, then FullyShardedDataParallel on the same
model (all-gathers and reduce-scatters). Every rank sees the same data, so the losses are the
single-GPU ones and equal across ranks; rank 0 reports them.

The ranks use one GPU each: every distinct GPU the process sees (by UUID: two rgpu servers on
one machine show each GPU twice), or the devices in `RGPU_DDP_DEVICES` ("0,3": with two
servers of two GPUs each, one GPU of each server, so the ranks' NCCL runs between servers).
The time of a DDP step (after warm-up, over `RGPU_DDP_TIMED_STEPS` steps, default 20) is
printed, not compared; scripts/gpu-ddp-bench.sh compares it with native.

    python3 tests/cuda/torch_ddp_check.py
    torchrun --nproc_per_node 2 tests/cuda/torch_ddp_check.py   # ranks started by torchrun

Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous in the environment) each rank
uses the LOCAL_RANK-th chosen GPU and rank 0 reports.
Prints `CHECK` lines for compare.py, then `PASS torch_ddp` or `FAIL torch_ddp: why`; exits 77
(`SKIP`) without a CUDA-enabled PyTorch.
"""
import os
import queue
import socket
import sys
import time

from checks import CheckFailed, check, run

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except Exception as e:  # noqa: BLE001 - any import failure means "not installed here"
    print(f"SKIP torch_ddp: cannot import torch: {e}")
    sys.exit(77)
if torch.version.cuda is None:
    print("SKIP torch_ddp: a CPU-only PyTorch")
    sys.exit(77)

STEPS = 12
TIMED = int(os.environ.get("RGPU_DDP_TIMED_STEPS", "20"))


def devices():
    listed = os.environ.get("RGPU_DDP_DEVICES")
    if listed:
        return [int(d) for d in listed.split(",")]
    seen, chosen = set(), []
    for d in range(torch.cuda.device_count()):
        uuid = str(torch.cuda.get_device_properties(d).uuid)
        if uuid not in seen:
            seen.add(uuid)
            chosen.append(d)
    return chosen


def model(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    ).to(device)


def train(net, data, target, steps):
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(data), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return [float(x) for x in losses]


def rank_main(rank, world, device_index, port, results):
    """One rank: DDP then FSDP. `port` is the rendezvous's (None: torchrun set it up)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.nn.parallel import DistributedDataParallel as DDP

    if port is not None:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
    device = torch.device("cuda", device_index)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    generator = torch.Generator().manual_seed(1)
    data = torch.randn(1024, 256, generator=generator).to(device)
    target = torch.randint(0, 10, (1024,), generator=generator).to(device)

    ddp = DDP(model(device), device_ids=[device.index])
    ddp_losses = train(ddp, data, target, STEPS)
    torch.cuda.synchronize()
    start = time.perf_counter()
    train(ddp, data, target, TIMED)
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - start) / TIMED * 1000

    fsdp = FSDP(model(device), device_id=device)
    fsdp_losses = train(fsdp, data, target, STEPS // 2)

    # The ranks agree: each rank's last loss, summed.
    last = torch.tensor([ddp_losses[-1]], device=device)
    dist.all_reduce(last)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        results.put((ddp_losses, fsdp_losses, float(last) / world, step_ms))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawned_ranks(chosen):
    """Starts one process per chosen GPU and returns rank 0's results."""
    world = len(chosen)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=rank_main, args=(rank, world, chosen[rank], port, results))
        for rank in range(world)
    ]
    for p in procs:
        p.start()
    try:
        found = results.get(timeout=240)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    for p in procs:
        if p.exitcode != 0:
            raise CheckFailed(f"a rank exited with {p.exitcode}")
    return world, chosen, found


def torchrun_rank(chosen):
    """This process is one of torchrun's ranks; returns rank 0's results (None elsewhere)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    if local >= len(chosen):
        raise CheckFailed(f"local rank {local} but {len(chosen)} distinct GPUs")
    results = queue.SimpleQueue()
    rank_main(rank, world, chosen[local], None, results)
    if rank != 0:
        return None
    return world, chosen[: int(os.environ["LOCAL_WORLD_SIZE"])], results.get()


def main():
    if "LOCAL_RANK" in os.environ:
        reported = torchrun_rank(devices())
        if reported is None:
            sys.exit(0)  # rank 0 reports
    else:
        reported = spawned_ranks(devices())
    world, chosen, (ddp_losses, fsdp_losses, mean_last, step_ms) = reported
    check("world", world)
    check("ddp_losses", *ddp_losses)
    check("fsdp_losses", *fsdp_losses)
    if abs(mean_last - ddp_losses[-1]) > 1e-4 * abs(ddp_losses[-1]):
        raise CheckFailed(f"the ranks' losses differ: mean {mean_last}, rank 0 {ddp_losses[-1]}")
    print(f"DDP step {step_ms:.3f} ms over {world} GPUs {chosen}")


if __name__ == "__main__":
    run("torch_ddp", main)
