#!/usr/bin/env bash
# What call tracing costs (a benchmark, not a test): tools/bench/call_rate.c through rgpu
# against a local server (PoCL or any OpenCL device), ROUNDS times each with tracing off,
# RGPU_STATS=1, and RGPU_TRACE=FILE, in turn. Prints ns per call of clSetKernelArg (answered in
# the client) and of an empty kernel's launch (posted), each round, then min/median per mode.
#
#   RGPU_BUILD_DIR=target/release ROUNDS=3 CALLS=100000 bash scripts/trace-overhead.sh
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(cd "${RGPU_BUILD_DIR:-target/release}" && pwd)
rounds=${ROUNDS:-3}
calls=${CALLS:-100000}
work=$(mktemp -d /tmp/rgpu-trace-overhead.XXXXXX)
trap 'kill $server 2>/dev/null; rm -rf "$work"' EXIT
gcc -O2 -o "$work/call_rate" tools/bench/call_rate.c -lOpenCL || exit 1
"$bin/rgpu" server --listen 127.0.0.1:0 >"$work/server.log" 2>&1 &
server=$!
endpoint=""
for _ in $(seq 300); do
    endpoint=$(sed -n 's/^.*rgpu server listening on \([^ ;]*\).*$/\1/p' "$work/server.log" | head -n1)
    [ -n "$endpoint" ] && break
    sleep 0.1
done
[ -n "$endpoint" ] || { cat "$work/server.log"; exit 1; }
run_mode() {
    case $1 in
        off) "$bin/rgpu" run --servers "$endpoint" -- "$work/call_rate" rgpu "$calls" ;;
        stats) RGPU_STATS=1 "$bin/rgpu" run --servers "$endpoint" -- "$work/call_rate" rgpu "$calls" 2>/dev/null ;;
        trace) RGPU_TRACE="$work/trace.jsonl" "$bin/rgpu" run --servers "$endpoint" -- "$work/call_rate" rgpu "$calls" ;;
    esac
}
for round in $(seq "$rounds"); do
    for mode in off stats trace; do
        run_mode $mode | awk -v m=$mode -v r="$round" '{ print m, r, $1, $2 }'
    done
done | tee "$work/all.txt"
echo "min / median ns per call over $rounds rounds:"
for mode in off stats trace; do
    for what in set_arg_ns launch_ns; do
        awk -v m=$mode -v w=$what '$1 == m && $3 == w { print $4 }' "$work/all.txt" | sort -n |
            awk -v m=$mode -v w=$what '{ v[NR] = $1 } END { printf "%-6s %-11s %8.1f %8.1f\n", m, w, v[1], v[int((NR + 1) / 2)] }'
    done
done
