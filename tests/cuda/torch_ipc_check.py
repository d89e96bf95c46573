#!/usr/bin/env python3
"""CUDA memory shared between processes (CUDA IPC) the way PyTorch's multiprocessing shares it:
a tensor on the GPU put on a `torch.multiprocessing` queue reaches another process as the same
device memory (`cudaIpcGetMemHandle`/`OpenMemHandle`, with an IPC event ordering the
producer's writes before the consumer's reads).

- parent to child: the child reads the parent's tensor and a slice of it (a view at an offset
  into the shared allocation), writes into both in place, and the parent sees the writes;
- child to parent: the child makes a tensor and sends it; the parent reads it while the child
  waits (a producer keeps its memory until the consumer lets go);
- the same tensor to two children at once (one allocation opened by two processes).

    python3 tests/cuda/torch_ipc_check.py

Prints `CHECK` lines for compare.py, then `PASS torch_ipc` or `FAIL torch_ipc: why`; exits 77
(`SKIP`) without a CUDA-enabled PyTorch.
"""
import sys

from checks import CheckFailed, check, run

try:
    import torch
    import torch.multiprocessing as mp
except Exception as e:  # noqa: BLE001 - any import failure means "not installed here"
    print(f"SKIP torch_ipc: cannot import torch: {e}")
    sys.exit(77)
if torch.version.cuda is None:
    print("SKIP torch_ipc: a CPU-only PyTorch")
    sys.exit(77)

N = 1 << 20


def consumer(inbox, outbox, scale):
    """Reads the shared tensors, writes into them in place, answers with what it read."""
    whole, part = inbox.get()
    read = (float(whole.double().sum()), float(part.double().sum()), str(whole.device))
    whole[:16].mul_(scale)
    part.add_(scale)
    torch.cuda.synchronize()
    del whole, part
    outbox.put(read)
    inbox.get()  # the parent's word that it is done


def producer(outbox, done):
    """Makes a tensor on the GPU and sends it; keeps it until the consumer is done."""
    made = torch.linspace(-1.0, 1.0, N, device="cuda") * 3.0
    outbox.put(made)
    done.get()


CHILDREN = []


def main():
    try:
        shared_checks()
    finally:
        # A failed check leaves no child waiting on its queue.
        for child in CHILDREN:
            if child.is_alive():
                child.kill()


def shared_checks():
    ctx = mp.get_context("spawn")
    torch.manual_seed(0)
    base = torch.arange(N, device="cuda", dtype=torch.float32) / N
    # Sharing fails here, at once, where it would fail in the queue's feeder thread (which
    # only prints it, leaving the reader waiting).
    base.untyped_storage()._share_cuda_()

    # Parent to child: a whole tensor and a slice of it.
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=consumer, args=(inbox, outbox, 2.0))
    child.start()
    CHILDREN.append(child)
    inbox.put((base, base[1000:3000]))
    whole_sum, part_sum, where = outbox.get(timeout=60)
    inbox.put("done")
    child.join(timeout=60)
    if child.exitcode != 0:
        raise CheckFailed(f"the consumer exited with {child.exitcode}")
    check("to_child_read", whole_sum, part_sum)
    expected = torch.arange(N, dtype=torch.float32) / N
    expected[:16] *= 2.0
    expected[1000:3000] += 2.0
    got = base.cpu()
    check("to_child_written", float(got.double().sum()), float(got[1000:1004].sum()))
    if not torch.equal(got, expected):
        raise CheckFailed("the child's in-place writes did not reach the parent's tensor")
    print(f"the child saw its tensor on {where}")

    # Child to parent.
    inbox2, done = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=producer, args=(inbox2, done))
    child.start()
    CHILDREN.append(child)
    received = inbox2.get(timeout=60)
    expected = torch.linspace(-1.0, 1.0, N) * 3.0
    got = received.cpu()
    check("from_child", float(got.double().sum()), float(got[:4].sum()), float(got[-4:].sum()))
    if not torch.allclose(got, expected):
        raise CheckFailed("the parent read other values than the child made")
    del received
    done.put("done")
    child.join(timeout=60)
    if child.exitcode != 0:
        raise CheckFailed(f"the producer exited with {child.exitcode}")

    # One tensor to two children at once.
    shared = torch.ones(N, device="cuda")
    queues = [(ctx.Queue(), ctx.Queue()) for _ in range(2)]
    children = [
        ctx.Process(target=consumer, args=(q_in, q_out, 1.0 + k)) for k, (q_in, q_out) in enumerate(queues)
    ]
    for c in children:
        c.start()
        CHILDREN.append(c)
    # Disjoint slices: the children's writes do not race.
    for k, (q_in, _) in enumerate(queues):
        q_in.put((shared[k * 1024:(k + 1) * 1024], shared[4096 + k * 100:4096 + (k + 1) * 100]))
    reads = [q_out.get(timeout=60) for _, q_out in queues]
    for q_in, _ in queues:
        q_in.put("done")
    for c in children:
        c.join(timeout=60)
        if c.exitcode != 0:
            raise CheckFailed(f"a consumer exited with {c.exitcode}")
    check("two_children_read", *[r[0] for r in reads], *[r[1] for r in reads])
    check("two_children_written", float(shared.double().sum()))


if __name__ == "__main__":
    run("torch_ipc", main)
