#!/usr/bin/env bash
# Builds rgpu's MPI interposer, librgpu_mpi.so (mpi/rgpu_mpi.c), and the MPI benchmark
# (mpi/rgpu_mpi_bench.c) against this machine's MPI (mpicc, from libopenmpi-dev or the site's
# MPI), into the directory of the other rgpu libraries (default target/release; `rgpu run
# --mpi` and `rgpu bench mpi` look for them there).
#
#   bash scripts/build-mpi.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/release}
mpicc=${MPICC:-mpicc}
if ! command -v "$mpicc" >/dev/null; then
    echo "build-mpi: no $mpicc (install libopenmpi-dev, or set MPICC)" >&2
    exit 1
fi
mkdir -p "$out"
# Not linked against libmpi: the interposer is preloaded into MPI programs, which bring their
# MPI; so a package that ships it depends on no MPI (it still needs one with this mpi.h's ABI:
# sites with another MPI rebuild it, see README). Open MPI's mpicc --showme:compile, MPICH's
# -compile_info give the compile flags; failing both, mpicc links as usual.
if cflags=$("$mpicc" --showme:compile 2>/dev/null) && [ -n "$cflags" ]; then
    # shellcheck disable=SC2086 # flags are words
    ${CC:-cc} -O2 -g -Wall -Wextra -fPIC -shared $cflags -o "$out/librgpu_mpi.so.tmp" \
        mpi/rgpu_mpi.c -ldl -lpthread
else
    "$mpicc" -O2 -g -Wall -Wextra -fPIC -shared -o "$out/librgpu_mpi.so.tmp" mpi/rgpu_mpi.c \
        -ldl -lpthread
fi
mv "$out/librgpu_mpi.so.tmp" "$out/librgpu_mpi.so"
# The benchmark `rgpu bench mpi` runs (OpenCL through the ICD loader; CUDA loaded at run time).
"$mpicc" -O2 -g -Wall -Wextra -o "$out/rgpu_mpi_bench.tmp" mpi/rgpu_mpi_bench.c -Impi \
    -L"$out" -lrgpu_mpi -Wl,-rpath,'$ORIGIN' -lOpenCL -ldl
mv "$out/rgpu_mpi_bench.tmp" "$out/rgpu_mpi_bench"
echo "built $out/librgpu_mpi.so and $out/rgpu_mpi_bench"
