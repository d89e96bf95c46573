#!/usr/bin/env bash
# OpenCL through rgpu on the GPU machine, from a carried release build: the API-group test
# programs natively on NVIDIA OpenCL and through an rgpu server (loopback) serving it, then
# `rgpu bench opencl` against the same device. Prints one PASS/FAIL line per program and mode.
#
#   RGPU_BUILD_DIR=dist bash scripts/gpu-opencl-check.sh
#
# A program may fail natively where NVIDIA answers differently from what the test expects (the
# tests were written against PoCL); what counts is that rgpu passes wherever native passes. Logs
# go to $RGPU_CHECK_DIR (default /tmp/rgpu-gpu-check), packed into $OUT when that is set.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${RGPU_BUILD_DIR:-target/release}
out=${RGPU_CHECK_DIR:-/tmp/rgpu-gpu-check}
mkdir -p "$out/bin"
# NVIDIA's ICD file is missing in containers.
[ -f /etc/OpenCL/vendors/nvidia.icd ] || echo libnvidia-opencl.so.1 > /etc/OpenCL/vendors/nvidia.icd

inc=""
for dir in /usr/include /usr/local/cuda/include; do
    [ -f "$dir/CL/cl.h" ] && inc=$dir && break
done
libcl=/usr/lib/x86_64-linux-gnu/libOpenCL.so.1
[ -n "$inc" ] || { echo "FAIL no OpenCL headers"; exit 1; }

port=7460
"$bin/rgpu" server --listen 127.0.0.1:$port --platform NVIDIA 2>"$out/server.log" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 100); do grep -q "listening on" "$out/server.log" && break; sleep 0.1; done

regressions=0
summary=()
for src in tests/opencl/*.c; do
    name=$(basename "$src" .c)
    # Helpers of the robustness and isolation tests, not API groups.
    case $name in stress_write | isolation) continue ;; esac
    if ! gcc -O2 -I"$inc" -Itests/opencl -DCL_TARGET_OPENCL_VERSION=300 "$src" "$libcl" -lm \
        -o "$out/bin/$name" 2>"$out/$name.build.log"; then
        summary+=("FAIL $name: build"); regressions=1; continue
    fi
    RGPU_TEST_PLATFORM=NVIDIA timeout 300 "$out/bin/$name" >"$out/$name.native.log" 2>&1
    native=$?
    RGPU_TEST_PLATFORM=rgpu RGPU_TEST_EXPECT_SERVER=127.0.0.1:$port timeout 300 \
        "$bin/rgpu" run --servers 127.0.0.1:$port -- "$out/bin/$name" >"$out/$name.rgpu.log" 2>&1
    remote=$?
    first_fail() { grep -m1 FAIL "$1" | cut -c1-200; }
    # VERDICT lines: what the implementation answered where the API leaves it the choice;
    # rgpu must answer the same.
    # (Compared as far as the native run got.)
    verdicts=$(grep -c '^VERDICT' "$out/$name.native.log")
    if ! diff <(grep '^VERDICT' "$out/$name.native.log") \
        <(grep '^VERDICT' "$out/$name.rgpu.log" | head -n "$verdicts") >"$out/$name.verdicts.diff"; then
        summary+=("FAIL $name rgpu: answers differ from the implementation's: $(head -c 300 "$out/$name.verdicts.diff" | tr '\n' ' ')")
        regressions=1
        continue
    fi
    if [ $remote -eq 0 ]; then
        summary+=("PASS $name rgpu (native: $([ $native -eq 0 ] && echo PASS || echo "FAIL $(first_fail "$out/$name.native.log")"))")
    elif [ $native -ne 0 ]; then
        summary+=("SAME $name: fails natively too; native: $(first_fail "$out/$name.native.log"); rgpu: $(first_fail "$out/$name.rgpu.log")")
    else
        summary+=("FAIL $name rgpu (native PASS): $(first_fail "$out/$name.rgpu.log")"); regressions=1
    fi
done

"$bin/rgpu" bench opencl --device-filter NVIDIA --json "$out/bench-opencl-nvidia.json" >"$out/bench-opencl-nvidia.txt" 2>&1
cat "$out/bench-opencl-nvidia.txt" | sed -n '/^native:/,$p'
printf '%s\n' "${summary[@]}"
if [ -n "${OUT:-}" ]; then
    cp "$out/bench-opencl-nvidia.json" "$out/bench-opencl-nvidia.txt" "$OUT/" 2>/dev/null
    tar czf "$OUT/gpu-check-logs.tar.gz" -C "$out" --exclude=bin . 2>/dev/null
fi
exit $regressions
