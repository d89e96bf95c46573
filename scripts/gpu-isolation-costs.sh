#!/usr/bin/env bash
# What a process per session costs, on the GPU machine: the same measurements against a server
# with `--isolation thread` (every session in the listener's process) and with the default
# `--isolation process` (a worker process per session):
#   - session start: a fresh client process, from exec to its first cuMemAlloc done (cuInit,
#     primary context, 1 MiB), median of 7;
#   - GPU memory per session: nvidia-smi's used memory with 4 idle sessions holding a context,
#     minus before, divided by 4;
#   - `rgpu bench cuda --sizes 64M` (bandwidth, small-call latency, launch rate, SGEMM).
#   RGPU_BUILD_DIR=dist bash scripts/gpu-isolation-costs.sh      # results under $OUT or /tmp
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(cd "${RGPU_BUILD_DIR:-target/release}" && pwd)
out=${OUT:-$(mktemp -d)}
python=${PYTHON:-python3}
used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | head -n1; }


for mode in thread process; do
    log=$out/server-$mode.log
    "$bin/rgpu" server --listen 127.0.0.1:0 --isolation $mode >"$log" 2>&1 &
    pid=$!
    endpoint=
    for _ in $(seq 600); do
        endpoint=$(sed -n 's/^rgpu server listening on \([^ ]*\).*/\1/p' "$log" | head -n1)
        [ -n "$endpoint" ] && break
        sleep 0.1
    done
    sleep 2   # the prestarted worker (process mode) is ready
    starts=()
    for _ in 1 2 3 4 5 6 7; do
        t0=$(date +%s.%N)
        ms=$("$bin/rgpu" run --servers "$endpoint" -- "$python" tests/cuda/session_start.py "$t0" | sed -n 's/^start_ms //p')
        starts+=("$ms")
        sleep 0.5
    done
    median=$(printf '%s\n' "${starts[@]}" | sort -n | sed -n 4p)
    before=$(used_mib)
    holders=()
    for _ in 1 2 3 4; do
        "$bin/rgpu" run --servers "$endpoint" -- "$python" tests/cuda/session_start.py "$(date +%s.%N)" 20 >/dev/null &
        holders+=($!)
    done
    sleep 12
    during=$(used_mib)
    wait "${holders[@]}"
    per_session=$(( (during - before) / 4 ))
    echo "$mode: session start median ${median} ms (all: ${starts[*]}); GPU memory per idle session ${per_session} MiB (used $before -> $during MiB with 4)" | tee -a "$out/isolation-costs.txt"
    (cd /tmp && "$bin/rgpu" bench cuda --servers "$endpoint" --sizes 64M --repetitions 7 \
        --json "$out/bench-cuda-$mode.json") >"$out/bench-cuda-$mode.txt" 2>&1
    cat "$out/bench-cuda-$mode.txt"
    kill -TERM $pid; wait $pid
done
