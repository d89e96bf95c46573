#!/usr/bin/env bash
# CUDA programs through a TLS connection (with the default striped device-to-host reads), on
# the GPU machine: a local server with a TLS identity, the client pinning its certificate; each
# program's CHECK lines compared with a native run (tests/cuda/compare.py).
#
#   RGPU_BUILD_DIR=dist bash scripts/gpu-tls-check.sh
#
# Prints `PASS <name>` or `FAIL <name>` (with the comparison and the client's errors) per
# program, and exits 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(cd "${RGPU_BUILD_DIR:-target/release}" && pwd)
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
out=$(mktemp -d /tmp/rgpu-tls-check.XXXXXX)
mkdir -p "$out/tls"
"$bin/rgpu" server --listen 127.0.0.1:0 --tls-cert "$out/tls/server.crt" \
    --tls-key "$out/tls/server.key" >"$out/server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null' EXIT
endpoint= fingerprint=
for _ in $(seq 300); do
    endpoint=$(sed -n 's/^rgpu server listening on \([^ ]*\).*/\1/p' "$out/server.log" | head -n1)
    fingerprint=$(sed -n 's/^rgpu server certificate \(sha256:[0-9a-f]*\).*/\1/p' "$out/server.log" | head -n1)
    [ -n "$endpoint" ] && [ -n "$fingerprint" ] && break
    sleep 0.1
done
[ -n "$endpoint" ] && [ -n "$fingerprint" ] || { echo "FAIL setup: no server"; cat "$out/server.log"; exit 1; }
"$nvcc" -O2 -o "$out/copies" tests/cuda/copies.cu
"$nvcc" -O2 -o "$out/async_pinned" tests/cuda/async_pinned.cu
failed=0
for program in "$out/copies" "$out/async_pinned" "python3 tests/cuda/torch_check.py" \
    "python3 tests/cuda/cupy_check.py"; do
    name=$(basename "${program##* }" .py)
    # shellcheck disable=SC2086 # the program and its interpreter, split on purpose
    $program >"$out/$name.native" 2>&1
    # shellcheck disable=SC2086
    RGPU_TLS=on RGPU_TLS_FINGERPRINT=$fingerprint timeout 300 "$bin/rgpu" run \
        --servers "$endpoint" -- $program >"$out/$name.rgpu" 2>"$out/$name.err"
    if python3 tests/cuda/compare.py "$out/$name.native" "$out/$name.rgpu" >"$out/$name.cmp" 2>&1; then
        echo "PASS $name (TLS)"
    else
        echo "FAIL $name (TLS)"
        tail -n 5 "$out/$name.cmp" "$out/$name.err" | sed 's/^/    /'
        failed=1
    fi
done
exit $failed
