#!/usr/bin/env bash
# GPUs of two rgpu servers working together, on a GPU machine (two GPUs: each server serves one;
# one GPU: both serve it). From a carried release build:
#   torch_fabric     tests/cuda/torch_fabric_check.py natively (both GPUs) and through rgpu
#                    (a GPU per server), CHECK lines compared: tensors moved between the GPUs,
#                    stream-ordered copies with cross-device event waits, a split model;
#   torch_fabric_pools   the same in pool memory (cudaMallocAsync: no IPC handles);
#   copies, multi_device   the CUDA programs of gpu-check.sh with their devices on two servers;
#   bench_fabric     `rgpu bench fabric`: cross-server copies (IPC and network paths) against
#                    native cudaMemcpyPeer and the raw loopback TCP link, in one run;
#   bench_mpi_ipc, bench_mpi_network   `rgpu bench mpi --api cuda`, a rank per server, direct
#                    transfers device to device (IPC) and over the network (RGPU_MPI_IPC=0).
# Prints PASS/FAIL lines and `N passed, M failed`; tables and JSON/SVG go to $OUT when set.
#
#   RGPU_BUILD_DIR=dist bash scripts/gpu-fabric-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(cd "${RGPU_BUILD_DIR:-target/release}" && pwd)
. scripts/lib/checks.sh
logs_dir fabric-check
keep=${OUT:-$out}
run_timeout=${RGPU_CHECK_TIMEOUT:-150}

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
second=0
[ "$gpus" -ge 2 ] && second=1
echo "GPUs: $gpus (servers on GPU 0 and GPU $second)"
export CUDA_VISIBLE_DEVICES=0
start_server "$out/server1.log"
s1=$server_pid e1=$server_endpoint
export CUDA_VISIBLE_DEVICES=$second
start_server "$out/server2.log"
s2=$server_pid e2=$server_endpoint
unset CUDA_VISIBLE_DEVICES
trap 'kill -TERM $s1 $s2 2>/dev/null; wait $s1 $s2 2>/dev/null' EXIT
servers="$e1,$e2"

# compared NAME COMMAND...: natively (when there are two GPUs), then through both servers.
compared() {
    local name=$1
    shift
    if [ "$gpus" -lt 2 ]; then
        skip "$name: one GPU here, nothing native to compare with"
        return
    fi
    timeout -k 10 "$run_timeout" "$@" >"$out/$name.native.out" 2>&1
    local native=$?
    timeout -k 10 "$run_timeout" "$bin/rgpu" run --servers "$servers" -- "$@" \
        >"$out/$name.rgpu.out" 2>&1
    local remote=$?
    if [ $native -eq 77 ]; then
        skip "$name: $(grep -m1 '^SKIP' "$out/$name.native.out")"
    elif [ $native -ne 0 ]; then
        fail "$name: the native run failed (exit $native)"
        tail_of "$out/$name.native.out"
    elif [ $remote -ne 0 ]; then
        fail "$name: the rgpu run failed (exit $remote)"
        tail_of "$out/$name.rgpu.out" 25
    elif ! python3 tests/cuda/compare.py "$out/$name.native.out" "$out/$name.rgpu.out" \
        >"$out/$name.compare" 2>&1; then
        fail "$name: results differ"
        tail_of "$out/$name.compare"
    else
        pass "$name"
        grep -E "GiB/s|losses|broadcast" "$out/$name.native.out" | sed 's/^/    native: /'
        grep -E "GiB/s|losses|broadcast" "$out/$name.rgpu.out" | sed 's/^/    rgpu:   /'
    fi
}

compared torch_fabric python3 tests/cuda/torch_fabric_check.py
# The same with stream-ordered pool memory (cudaMallocAsync), which has no IPC handle: a copy
# the source's server cannot push is pulled by the destination's.
compared torch_fabric_pools env PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync \
    python3 tests/cuda/torch_fabric_check.py
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
for name in copies multi_device; do
    if "$nvcc" -O2 -o "$out/$name" "tests/cuda/$name.cu" >"$out/$name.build" 2>&1; then
        compared "$name" "$out/$name"
    else
        fail "$name: build failed"
        tail_of "$out/$name.build"
    fi
done

# bench NAME COMMAND...: a benchmark, its table under the status line.
bench() {
    local name=$1
    shift
    if timeout -k 10 "$run_timeout" "$@" >"$out/$name.out" 2>&1; then
        pass "$name"
        grep -v "^measuring\|^starting\|^wrote\|^  [0-9.]* [KMG]\?i\?B x " "$out/$name.out" |
            sed 's/^/    /'
    else
        fail "$name"
        tail_of "$out/$name.out" 30
    fi
}
bench bench_fabric "$bin/rgpu" bench fabric --servers "$servers" --repetitions "${REPS:-5}" \
    --json "$keep/bench-fabric.json" --svg "$keep/bench-fabric.svg"
if [ -n "${SKIP_MPI:-}" ]; then
    skip "bench_mpi: SKIP_MPI is set"
elif bash scripts/build-mpi.sh "$bin" >"$out/build-mpi.log" 2>&1; then
    bench bench_mpi_ipc "$bin/rgpu" bench mpi --api cuda --servers "$servers" \
        --json "$keep/bench-mpi-ipc.json" --svg "$keep/bench-mpi-ipc.svg"
    RGPU_MPI_IPC=0 bench bench_mpi_network "$bin/rgpu" bench mpi --api cuda \
        --servers "$servers" --json "$keep/bench-mpi-network.json" \
        --svg "$keep/bench-mpi-network.svg"
else
    fail "setup: building the MPI interposer"
    tail_of "$out/build-mpi.log"
fi
links=$(cat "$out/server1.log" "$out/server2.log" | grep -c "fabric link opened")
echo "fabric links opened by the servers: $links"
summary
[ $failed -eq 0 ]
