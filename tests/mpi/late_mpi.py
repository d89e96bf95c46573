"""A program that opens libmpi at run time, privately, after rgpu's preloaded interposer, as
Python's mpi4py does (tests/test_mpi.py runs it with 2 ranks under `rgpu run --mpi`): the
interposer must load (no reference to Open MPI's objects bound at load time) and its MPI calls
work (it finds the MPI library the program opened).
Rank 0 sends 100000 bytes from host memory, rank 1 receives and checks them. Prints
`PASS late_mpi rank R`."""

import ctypes
import ctypes.util
import sys

# Privately (RTLD_LOCAL), as an extension module's dependency is.
mpi = ctypes.CDLL(ctypes.util.find_library("mpi"), mode=ctypes.RTLD_LOCAL)
# The program's own scope: the preloaded interposer's MPI functions come first there.
program = ctypes.CDLL(None)


def handle(name):
    return ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(mpi, name)))


world, byte = handle("ompi_mpi_comm_world"), handle("ompi_mpi_byte")
assert program.MPI_Init(None, None) == 0
rank = ctypes.c_int()
assert program.MPI_Comm_rank(world, ctypes.byref(rank)) == 0
n = 100000
pattern = bytes(k * 7 % 251 for k in range(n))
buffer = ctypes.create_string_buffer(n)
if rank.value == 0:
    ctypes.memmove(buffer, pattern, n)
    assert program.MPI_Send(buffer, n, byte, 1, 7, world) == 0
else:
    status = ctypes.create_string_buffer(256)
    assert program.MPI_Recv(buffer, n, byte, 0, 7, world, status) == 0
    if buffer.raw != pattern:
        print(f"FAIL late_mpi rank {rank.value}: the bytes differ", flush=True)
        sys.exit(1)
assert program.MPI_Finalize() == 0
print(f"PASS late_mpi rank {rank.value}", flush=True)
