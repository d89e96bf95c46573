#!/usr/bin/env bash
# NCCL across rgpu servers on a machine with two or more GPUs: two `rgpu server`s, one GPU
# each (CUDA_VISIBLE_DEVICES), so that every communicator's ranks are on different servers and
# NCCL runs between the servers' workers. Each program runs natively on the same GPUs, then
# through `rgpu run` with both servers, and the `CHECK` lines are compared
# (tests/cuda/compare.py):
#
#   nccl_check         one process, ncclCommInitAll over the two GPUs, every collective
#   torch_ddp_check    PyTorch DDP and FSDP, one process per GPU (NCCL backend)
#   torchrun_ddp       the same program started by torchrun (--standalone --nproc_per_node 2)
#   *_sockets          the same through rgpu with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 in the
#                      servers' environment: NCCL's socket transport, standing in for servers on
#                      two hosts (native runs the same way)
#
#   RGPU_BUILD_DIR=dist bash scripts/gpu-nccl-check.sh
#
# Needs nvcc, the machine's NCCL with its header (libnccl2, libnccl-dev), and PyTorch for the
# DDP check. Prints PASS/FAIL/SKIP lines and `N passed, M failed`; exits 1 if any failed.
# Knobs: RGPU_BUILD_DIR (default target/release), RGPU_CHECK_DIR (default a new temporary
# directory), RGPU_CHECK_TIMEOUT (seconds per run, default 300), PYTHON, RGPU_CHECK_RTOL
# (default 1e-4), ONLY.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${RGPU_BUILD_DIR:-target/release}
out=${RGPU_CHECK_DIR:-$(mktemp -d /tmp/rgpu-nccl-check.XXXXXX)}
run_timeout=${RGPU_CHECK_TIMEOUT:-300}
python=${PYTHON:-python3}
rtol=${RGPU_CHECK_RTOL:-1e-4}
mkdir -p "$out/bin"
echo "logs: $out"

# shellcheck source=lib/checks.sh
. scripts/lib/checks.sh

for f in rgpu librgpu_cuda.so librgpu_nccl.so; do
    [ -f "$bin/$f" ] || { fail "setup: $bin/$f not found"; summary; exit 1; }
done
bin=$(cd "$bin" && pwd)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${gpus:-0}" -lt 2 ]; then
    skip "NCCL across servers: this machine has ${gpus:-0} GPU(s), not two"
    summary
    exit 0
fi
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if ! "$nvcc" -O2 -o "$out/bin/nccl_check" tests/cuda/nccl_check.cu -lnccl >"$out/build.log" 2>&1; then
    fail "setup: nccl_check did not build (nvcc, nccl.h, libnccl)"
    tail_of "$out/build.log"
    summary
    exit 1
fi

# run_pair NAME ENVIRONMENT COMMAND...: natively (GPUs 0 and 1) then through servers started
# with ENVIRONMENT (one GPU each), compared.
run_pair() {
    local name=$1 environment=$2
    shift 2
    if ! selected "$name"; then return; fi
    # shellcheck disable=SC2086 # ENVIRONMENT is a list of NAME=VALUE words
    env $environment CUDA_VISIBLE_DEVICES=0,1 timeout -k 10 "$run_timeout" "$@" \
        >"$out/$name.native.out" 2>"$out/$name.native.err"
    local native=$?
    if [ $native -eq 77 ]; then
        skip "$name: $(grep -m1 '^SKIP' "$out/$name.native.out" | cut -c1-200)"
        return
    fi
    local servers=() endpoints=()
    for gpu in 0 1; do
        # shellcheck disable=SC2086
        env $environment CUDA_VISIBLE_DEVICES=$gpu "$bin/rgpu" server --listen 127.0.0.1:0 \
            >"$out/$name.server$gpu.log" 2>&1 &
        servers+=($!)
        local endpoint=""
        for _ in $(seq 300); do
            endpoint=$(sed -n 's/^.*rgpu server listening on \([^ ]*\).*$/\1/p' \
                "$out/$name.server$gpu.log" | head -n1)
            [ -n "$endpoint" ] && break
            sleep 0.1
        done
        endpoints+=("$endpoint")
    done
    local list
    list=$(IFS=,; echo "${endpoints[*]}")
    local t0 t1
    t0=$(date +%s.%N)
    timeout -k 10 "$run_timeout" "$bin/rgpu" run --servers "$list" -- "$@" \
        >"$out/$name.rgpu.out" 2>"$out/$name.rgpu.err"
    local remote=$?
    t1=$(date +%s.%N)
    kill -TERM "${servers[@]}" 2>/dev/null
    wait "${servers[@]}" 2>/dev/null
    if [ $native -ne 0 ]; then
        fail "$name: native run failed (exit $native) $(first_fail "$out/$name.native.out")"
        tail_of "$out/$name.native.err" 8
    elif [ $remote -ne 0 ]; then
        fail "$name: rgpu run failed (exit $remote) $(first_fail "$out/$name.rgpu.out")"
        tail_of "$out/$name.rgpu.out" 8
        tail_of "$out/$name.rgpu.err" 12
    elif ! python3 tests/cuda/compare.py --rtol "$rtol" "$out/$name.native.out" \
        "$out/$name.rgpu.out" >"$out/$name.compare.log" 2>&1; then
        fail "$name: results differ between native and rgpu"
        tail_of "$out/$name.compare.log"
    else
        pass "$name (rgpu $(secs "$t0" "$t1")s) $(grep -h '^DDP step' "$out/$name.native.out" \
            "$out/$name.rgpu.out" 2>/dev/null | sed 's/ over.*//' | paste -sd' ' -)"
    fi
}

sockets="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1"
run_pair nccl_check "" "$out/bin/nccl_check"
run_pair nccl_check_sockets "$sockets" "$out/bin/nccl_check"
run_pair torch_ddp_check "" "$python" tests/cuda/torch_ddp_check.py
run_pair torch_ddp_check_sockets "$sockets" "$python" tests/cuda/torch_ddp_check.py
run_pair torchrun_ddp "" "$python" -m torch.distributed.run --standalone --nproc_per_node 2 \
    tests/cuda/torch_ddp_check.py
summary
[ "$failed" -eq 0 ]
