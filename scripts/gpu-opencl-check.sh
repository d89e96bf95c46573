#!/usr/bin/env bash
# OpenCL through rgpu on the GPU machine, from a carried release build: the API-group test
# programs natively on NVIDIA OpenCL and through an rgpu server (loopback) serving it, then
# `rgpu bench opencl` against the same device. Prints one PASS/FAIL line per program and mode.
#
#   RGPU_BUILD_DIR=dist bash scripts/gpu-opencl-check.sh      (results also under $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${RGPU_BUILD_DIR:-target/release}
out=${OUT:-/tmp/rgpu-gpu-check}
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

failed=0
for src in tests/opencl/*.c; do
    name=$(basename "$src" .c)
    [ "$name" = stress_write ] && continue
    gcc -O2 -I"$inc" -Itests/opencl -DCL_TARGET_OPENCL_VERSION=300 "$src" "$libcl" -lm \
        -o "$out/bin/$name" 2>"$out/$name.build.log" || { echo "FAIL $name build"; failed=1; continue; }
    for mode in native rgpu; do
        if [ $mode = native ]; then
            RGPU_TEST_PLATFORM=NVIDIA timeout 300 "$out/bin/$name" >"$out/$name.$mode.log" 2>&1
        else
            RGPU_TEST_PLATFORM=rgpu RGPU_TEST_EXPECT_SERVER=127.0.0.1:$port timeout 300 \
                "$bin/rgpu" run --servers 127.0.0.1:$port -- "$out/bin/$name" >"$out/$name.$mode.log" 2>&1
        fi
        if [ $? -eq 0 ]; then echo "PASS $name $mode"; else echo "FAIL $name $mode: $(grep -m1 FAIL "$out/$name.$mode.log")"; failed=1; fi
    done
done

"$bin/rgpu" bench opencl --device-filter NVIDIA --json "$out/bench-opencl-nvidia.json" | tee "$out/bench-opencl-nvidia.txt"
exit $failed
