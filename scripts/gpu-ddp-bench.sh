#!/usr/bin/env bash
# The PyTorch DDP step through rgpu against native, on a machine with two or more GPUs: two
# `rgpu server`s with one GPU each (so DDP's NCCL runs between the servers' workers), and
# tests/cuda/torch_ddp_check.py run ROUNDS times natively and through rgpu, alternating (so a
# drift of the machine falls on both), each timing STEPS steps after its warm-up. Prints each
# round's step times and ratio, then the lowest and median ratio; the losses of every rgpu
# run are compared with the native run's (tests/cuda/compare.py). Exits 1 when a run fails or
# its losses differ; the ratio is reported, never judged.
#
#   RGPU_BUILD_DIR=dist ROUNDS=3 STEPS=300 bash scripts/gpu-ddp-bench.sh
#
# Knobs: RGPU_BUILD_DIR (default target/release), ROUNDS (default 3), STEPS (default 300),
# PYTHON, RGPU_CHECK_DIR (default a new temporary directory), SERVER_ENV (NAME=VALUE words for
# the servers and the native runs, e.g. "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1").
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${RGPU_BUILD_DIR:-target/release}
out=${RGPU_CHECK_DIR:-$(mktemp -d /tmp/rgpu-ddp-bench.XXXXXX)}
rounds=${ROUNDS:-3}
steps=${STEPS:-300}
python=${PYTHON:-python3}
environment=${SERVER_ENV:-}
mkdir -p "$out"
echo "logs: $out"

# shellcheck source=lib/checks.sh
. scripts/lib/checks.sh

bin=$(cd "$bin" && pwd)
# SERVER_ENV reaches the servers and the native runs (the client's NCCL is rgpu's, which reads
# no NCCL_* setting).
# shellcheck disable=SC2086 # SERVER_ENV is a list of NAME=VALUE words
[ -n "$environment" ] && export $environment
servers=() endpoints=()
stop_servers() { kill -TERM "${servers[@]}" 2>/dev/null; wait "${servers[@]}" 2>/dev/null; }
trap stop_servers EXIT
for gpu in 0 1; do
    CUDA_VISIBLE_DEVICES=$gpu start_server "$out/server$gpu.log"
    servers+=("$server_pid")
    endpoints+=("$server_endpoint")
done
list=$(IFS=,; echo "${endpoints[*]}")

step_ms() { sed -n 's/^DDP step \([0-9.]*\) ms.*$/\1/p' "$1"; }
ratios=()
for round in $(seq "$rounds"); do
    CUDA_VISIBLE_DEVICES=0,1 RGPU_DDP_TIMED_STEPS=$steps timeout 300 \
        "$python" tests/cuda/torch_ddp_check.py >"$out/native$round.out" 2>"$out/native$round.err"
    RGPU_DDP_TIMED_STEPS=$steps timeout 300 "$bin/rgpu" run --servers "$list" -- \
        "$python" tests/cuda/torch_ddp_check.py >"$out/rgpu$round.out" 2>"$out/rgpu$round.err"
    native=$(step_ms "$out/native$round.out") remote=$(step_ms "$out/rgpu$round.out")
    if [ -z "$native" ] || [ -z "$remote" ]; then
        fail "round $round: a run failed"
        tail_of "$out/native$round.out" 4
        tail_of "$out/rgpu$round.out" 4
        tail_of "$out/rgpu$round.err" 8
        continue
    fi
    if ! python3 tests/cuda/compare.py "$out/native$round.out" "$out/rgpu$round.out" \
        >"$out/compare$round.log" 2>&1; then
        fail "round $round: losses differ from native"
        tail_of "$out/compare$round.log"
        continue
    fi
    ratio=$(awk -v a="$native" -v b="$remote" 'BEGIN { printf "%.3f", b / a }')
    ratios+=("$ratio")
    pass "round $round: DDP step native $native ms, rgpu $remote ms, ratio $ratio (losses equal)"
done
if [ ${#ratios[@]} -gt 0 ]; then
    printf '%s\n' "${ratios[@]}" | sort -n | awk -v steps="$steps" '
        { r[NR] = $1 }
        END { printf "DDP step ratio over %d rounds of %d steps: min %s median %s max %s\n",
              NR, steps, r[1], r[int((NR + 1) / 2)], r[NR] }'
fi
summary
[ "$failed" -eq 0 ]
