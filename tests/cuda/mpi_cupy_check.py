"""MPI on CuPy device arrays through rgpu (scripts/gpu-mpi-check.sh runs it with 2 ranks under
`rgpu run --mpi`): mpi4py hands the arrays' device pointers to MPI, librgpu_mpi.so recognises
them as rgpu device memory and moves them. Checks device -> device, device -> host and
host -> device Send/Recv of odd sizes, Isend/Irecv with Waitall (small messages, then direct
ones of 64 KiB to 1.7 MB), Sendrecv, Bcast, Allreduce (sum of float32 and float64), Reduce,
Allgather (and in place), and an Allreduce whose ranks mix device and host buffers, every
result compared on the host. On ranks with distinct GPUs the collectives run on the servers'
NCCL; where NCCL cannot be made (two ranks on one GPU) they are staged.
Prints `PASS mpi_cupy rank R`, or `FAIL mpi_cupy rank R: why` and exits 1."""

import sys

import numpy as np

try:
    import cupy as cp
    from mpi4py import MPI
except ImportError as e:
    print(f"SKIP mpi_cupy: {e}")
    sys.exit(77)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
peer = rank ^ 1


def fail(why):
    print(f"FAIL mpi_cupy rank {rank}: {why}", flush=True)
    comm.Abort(1)


def expect(cond, why):
    if not cond:
        fail(why)


cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
for n in (1, 7, 4099, 1_000_003, 16 << 20):
    mine = cp.arange(n, dtype=cp.uint8) * (rank + 3)
    want = (np.arange(n, dtype=np.uint64) * (peer + 3) % 256).astype(np.uint8)
    got = cp.zeros(n, dtype=cp.uint8)
    if rank % 2 == 0:
        comm.Send(mine, dest=peer, tag=1)                        # device -> device
        comm.Send(mine, dest=peer, tag=2)                        # device -> host
        comm.Recv(got, source=peer, tag=3)                       # host -> device
        expect(np.array_equal(cp.asnumpy(got), want), f"host -> device, {n} bytes")
    else:
        comm.Recv(got, source=peer, tag=1)
        expect(np.array_equal(cp.asnumpy(got), want), f"device -> device, {n} bytes")
        host = np.zeros(n, dtype=np.uint8)
        comm.Recv(host, source=peer, tag=2)
        expect(np.array_equal(host, want), f"device -> host, {n} bytes")
        comm.Send(cp.asnumpy(mine), dest=peer, tag=3)

# Many at once.
outs = [cp.full(1000 * k + 3, rank * 10 + k, dtype=cp.int32) for k in range(16)]
ins = [cp.zeros(1000 * k + 3, dtype=cp.int32) for k in range(16)]
requests = [comm.Irecv(ins[k], source=peer, tag=100 + k) for k in range(16)]
requests += [comm.Isend(outs[k], dest=peer, tag=100 + k) for k in range(16)]
MPI.Request.Waitall(requests)
for k in range(16):
    expect(bool((ins[k] == peer * 10 + k).all()), f"Isend/Irecv message {k}")

# Many large ones at once: direct transfers, which MPI_Waitall pulls in one go (the smaller by
# the receiving process, the larger by the servers, side by side).
sizes = [(64 << 10) + k * 150_001 for k in range(12)]
outs = [cp.full(n // 4, rank * 100 + k, dtype=cp.int32) for k, n in enumerate(sizes)]
ins = [cp.zeros(n // 4, dtype=cp.int32) for n in sizes]
requests = [comm.Irecv(ins[k], source=peer, tag=200 + k) for k in range(len(sizes))]
requests += [comm.Isend(outs[k], dest=peer, tag=200 + k) for k in range(len(sizes))]
MPI.Request.Waitall(requests)
for k, n in enumerate(sizes):
    expect(bool((ins[k] == peer * 100 + k).all()), f"Isend/Irecv of {n // 4 * 4} bytes ({k})")

# A ring.
send = cp.full(12345, rank, dtype=cp.float64)
recv = cp.zeros(12345, dtype=cp.float64)
comm.Sendrecv(send, dest=(rank + 1) % size, recvbuf=recv, source=(rank - 1) % size)
expect(bool((recv == (rank - 1) % size).all()), "Sendrecv")

# Collectives.
data = cp.arange(2_000_001, dtype=cp.float32) if rank == 0 else cp.zeros(2_000_001, dtype=cp.float32)
comm.Bcast(data, root=0)
expect(bool((data == cp.arange(2_000_001, dtype=cp.float32)).all()), "Bcast")
f = cp.arange(100_003, dtype=cp.float32) * (rank + 1)
fr = cp.zeros_like(f)
comm.Allreduce(f, fr, op=MPI.SUM)
d = cp.arange(100_003, dtype=cp.float64) * 0.5 * (rank + 1)
comm.Allreduce(MPI.IN_PLACE, d, op=MPI.SUM)
factor = size * (size + 1) / 2
expect(bool((fr == cp.arange(100_003, dtype=cp.float32) * factor).all()), "Allreduce float32")
expect(bool((d == cp.arange(100_003, dtype=cp.float64) * 0.5 * factor).all()), "Allreduce float64")

# Reduce (int32 maximum to rank 0), Allgather (and in place), a Bcast of int64: on device
# buffers of every rank these run on the servers' NCCL (where it works: ranks on distinct GPUs).
x = cp.arange(50_001, dtype=cp.int32) * (rank + 1)
xr = cp.zeros_like(x)
comm.Reduce(x, xr if rank == 0 else None, op=MPI.MAX, root=0)
if rank == 0:
    expect(bool((xr == cp.arange(50_001, dtype=cp.int32) * size).all()), "Reduce int32 max")
part = cp.full(30_000, rank + 1, dtype=cp.float64)
gathered = cp.zeros(30_000 * size, dtype=cp.float64)
comm.Allgather(part, gathered)
expect(all(bool((gathered[r * 30_000:(r + 1) * 30_000] == r + 1).all()) for r in range(size)),
       "Allgather")
gathered = cp.zeros(30_000 * size, dtype=cp.float64)
gathered[rank * 30_000:(rank + 1) * 30_000] = rank + 7
comm.Allgather(MPI.IN_PLACE, gathered)
expect(all(bool((gathered[r * 30_000:(r + 1) * 30_000] == r + 7).all()) for r in range(size)),
       "Allgather in place")
big = cp.arange(300_000, dtype=cp.int64) * 3 if rank == 1 else cp.zeros(300_000, dtype=cp.int64)
comm.Bcast(big, root=1)
expect(bool((big == cp.arange(300_000, dtype=cp.int64) * 3).all()), "Bcast int64 from rank 1")
# Ranks that mix device and host buffers in one call: staged on every rank.
mine = cp.full(1000, rank + 1, dtype=cp.float32) if rank == 0 else np.full(1000, rank + 1, np.float32)
out = cp.zeros_like(mine) if rank == 0 else np.zeros_like(mine)
comm.Allreduce(mine, out, op=MPI.SUM)
expect(float(out[0]) == factor and float(out[-1]) == factor, "Allreduce of device and host buffers")

comm.Barrier()
print(f"PASS mpi_cupy rank {rank}", flush=True)
