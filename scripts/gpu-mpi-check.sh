#!/usr/bin/env bash
# MPI on CUDA buffers through rgpu, on the GPU machine (its Open MPI is not CUDA-aware, which
# does not matter: librgpu_mpi.so handles device buffers before MPI sees them). Builds the
# interposer and the MPI benchmark here with mpicc (scripts/build-mpi.sh, into the build
# directory), starts two servers on this GPU, then:
#   mpi_cupy_one_server   tests/cuda/mpi_cupy_check.py, 2 ranks whose GPUs are on one server;
#   mpi_cupy_two_servers  the same, each rank's GPU on its own server;
#   mpi_cupy_server_pulls the same with RGPU_MPI_CLIENT_PULL=0 (every direct message is pulled
#                         by the receiver's server, MPI_Waitall's in one batch);
#   bench_one_server      `rgpu bench mpi --api cuda`, both ranks' GPUs on one server (direct
#                         transfers copy device to device through CUDA IPC);
#   bench_two_servers     the same across the two servers with RGPU_MPI_IPC=0 (direct
#                         transfers go server to server over the loopback). Figures only;
#                         SKIP_BENCH=1 leaves them out.
#
#   RGPU_BUILD_DIR=dist bash scripts/gpu-mpi-check.sh
#
# OpenCL headers for the benchmark: CPATH may name a directory holding CL/cl.h.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(cd "${RGPU_BUILD_DIR:-target/release}" && pwd)
. scripts/lib/checks.sh
logs_dir mpi-check
if ! bash scripts/build-mpi.sh "$bin" >"$out/build.log" 2>&1; then
    fail "setup: building the MPI interposer"
    tail_of "$out/build.log"
    summary
    exit 1
fi
start_server "$out/server1.log"
s1=$server_pid e1=$server_endpoint
start_server "$out/server2.log"
s2=$server_pid e2=$server_endpoint
trap 'kill -TERM $s1 $s2 2>/dev/null; wait $s1 $s2 2>/dev/null' EXIT
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
mpi() { timeout -k 10 600 mpirun "${root[@]}" --oversubscribe -np 2 --mca btl self,tcp --mca btl_tcp_if_include lo "$@"; }

check_cupy() {
    local name=$1 servers=$2
    mpi "$bin/rgpu" run --mpi --servers "$servers" -- python3 tests/cuda/mpi_cupy_check.py \
        >"$out/$name.out" 2>&1
    local rc=$?
    if grep -q "^SKIP" "$out/$name.out"; then
        skip "$name: $(grep -m1 '^SKIP' "$out/$name.out")"
    elif [ $rc -eq 0 ] && [ "$(grep -c '^PASS mpi_cupy rank' "$out/$name.out")" = 2 ]; then
        pass "$name"
    else
        fail "$name (exit $rc)"
        tail_of "$out/$name.out"
    fi
}
check_cupy mpi_cupy_one_server "$e1"
check_cupy mpi_cupy_two_servers "$e1,$e2"
RGPU_MPI_CLIENT_PULL=0 check_cupy mpi_cupy_server_pulls "$e1,$e2"
if [ -n "${SKIP_BENCH:-}" ]; then
    summary
    [ $failed -eq 0 ]
    exit
fi

# bench NAME ARGS...: `rgpu bench mpi --api cuda` with ARGS, its table under the status line.
bench() {
    local name=$1
    shift
    if "$bin/rgpu" bench mpi --api cuda --json "$out/$name.json" --svg "$out/$name.svg" "$@" \
        >"$out/$name.out" 2>&1; then
        pass "$name (rgpu bench mpi --api cuda $*)"
        sed 's/^/    /' "$out/$name.out"
    else
        fail "$name"
        tail_of "$out/$name.out" 30
    fi
}
# One server: the ranks' GPUs are on one machine, so direct transfers copy device to device.
bench bench_one_server --servers "$e1"
# Two servers, the IPC shortcut off: direct transfers go server to server over the loopback.
RGPU_MPI_IPC=0 bench bench_two_servers --servers "$e1,$e2"
summary
[ $failed -eq 0 ]
