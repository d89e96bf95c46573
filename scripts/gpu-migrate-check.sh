#!/bin/bash
# Live migration on a GPU machine (docs/migration.md): tests/opencl/migrate.c moved between two
# rgpu servers on this machine's OpenCL devices, three times by the program itself and once by
# the operator (`rgpu migrate`); prints each move's pause and PASS/FAIL.
#
#   RGPU_BUILD_DIR=dist bash scripts/gpu-migrate-check.sh   (PLATFORM=Portable: PoCL, anywhere)
#
# Knobs: RGPU_BUILD_DIR (rgpu and its libraries; default target/release), PROGRAM (the built
# test program; default tests/work/migrate, which the test suite builds), PLATFORM (the
# servers' platform filter; default NVIDIA, whose ICD is registered here if missing).
set -u
cd "$(dirname "$0")/.."
bin=${RGPU_BUILD_DIR:-target/release}
program=${PROGRAM:-tests/work/migrate}
platform=${PLATFORM:-NVIDIA}
[ -x "$bin/rgpu" ] && [ -x "$program" ] || { echo "FAIL: need $bin/rgpu and $program"; exit 1; }
if [ "$platform" = NVIDIA ] && [ ! -e /etc/OpenCL/vendors/nvidia.icd ] && [ -w /etc/OpenCL/vendors ]; then
    echo libnvidia-opencl.so.1 > /etc/OpenCL/vendors/nvidia.icd
fi
logs=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$logs"' EXIT
"$bin/rgpu" server --platform "$platform" --listen 127.0.0.1:0 > "$logs/x.log" 2>&1 &
"$bin/rgpu" server --platform "$platform" --listen 127.0.0.1:0 > "$logs/y.log" 2>&1 &
endpoint() {
    for _ in $(seq 100); do
        local at; at=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$1" | head -n1 | cut -d' ' -f3)
        [ -n "$at" ] && { echo "$at"; return; }
        sleep 0.1
    done
}
from=$(endpoint "$logs/x.log"); to=$(endpoint "$logs/y.log")
[ -n "$from" ] && [ -n "$to" ] || { echo "FAIL: servers did not start"; cat "$logs"/*.log; exit 1; }
export RGPU_SAME_HOST=off RGPU_TEST_PLATFORM=rgpu RGPU_TEST_MIGRATE_FROM=$from RGPU_TEST_MIGRATE_TO=$to
failed=0
for i in 1 2 3; do
    out=$("$bin/rgpu" run --servers "$from" -- "$program" 2>&1)
    echo "$out" | grep -E "^moved" || true
    echo "$out" | grep -q "^PASS migrate" && echo "PASS move $i (by the program)" || { echo "FAIL move $i"; echo "$out" | tail -5; failed=1; }
done
out=$( (sleep 3; "$bin/rgpu" migrate --from "$from" --to "$to" > "$logs/migrate.txt"; echo go) |
    RGPU_TEST_MIGRATE_BY=operator "$bin/rgpu" run --servers "$from" -- "$program" 2>&1)
cat "$logs/migrate.txt"
echo "$out" | grep -q "^PASS migrate" && echo "PASS move 4 (by the operator)" || { echo "FAIL move 4"; echo "$out" | tail -5; failed=1; }
exit $failed
