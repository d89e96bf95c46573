#!/usr/bin/env bash
# One fabric measurement with both servers logging at debug level (microsecond timestamps), for
# finding where a cross-server copy spends its time: two servers (a GPU each where there are
# two), `rgpu bench fabric` at the sizes given, the servers' logs packed into $OUT (or the
# logs directory printed).
#
#   RGPU_BUILD_DIR=dist SIZES=64K REPS=1 bash scripts/gpu-fabric-trace.sh
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(cd "${RGPU_BUILD_DIR:-target/release}" && pwd)
. scripts/lib/checks.sh
out=$(mktemp -d /tmp/rgpu-fabric-trace.XXXXXX)
echo "logs: $out"
second=0
[ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ] && second=1
export RGPU_LOG=debug
CUDA_VISIBLE_DEVICES=0 start_server "$out/server1.log"
s1=$server_pid e1=$server_endpoint
CUDA_VISIBLE_DEVICES=$second start_server "$out/server2.log"
s2=$server_pid e2=$server_endpoint
unset RGPU_LOG
trap 'kill -TERM $s1 $s2 2>/dev/null; wait $s1 $s2 2>/dev/null' EXIT
# The client logs too (its own file): what the program waited for, and when.
RGPU_LOG=debug timeout -k 5 "${RGPU_CHECK_TIMEOUT:-120}" "$bin/rgpu" bench fabric --servers "$e1,$e2" \
    --sizes "${SIZES:-64K}" --repetitions "${REPS:-1}" --latency-copies "${LATENCY_COPIES:-20}" \
    --json "$out/bench-fabric.json" --svg "$out/bench-fabric.svg" 2>"$out/client.log" | tail -20
grep -v ' DEBUG \| TRACE ' "$out/client.log" | tail -20
kill -TERM $s1 $s2 2>/dev/null
wait $s1 $s2 2>/dev/null
trap - EXIT
if [ -n "${OUT:-}" ]; then
    tar -C "$out" -czf "$OUT/fabric-trace.tar.gz" . && echo "packed into $OUT/fabric-trace.tar.gz"
fi
