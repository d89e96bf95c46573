#!/usr/bin/env bash
# What TLS costs, on the GPU machine: `rgpu bench cuda` against one local server (a worker
# process per session, the default), with the client in plaintext (RGPU_TLS=off) and in TLS 1.3
# (RGPU_TLS=on, the server's certificate pinned), alternating off/on/off/on so that drift of
# the machine shows as spread rather than as a difference. Loopback is the worst case for TLS:
# the link is faster than any network, so the encryption's cost is all there is to see.
#   RGPU_BUILD_DIR=dist bash scripts/gpu-tls-costs.sh        # results under $OUT or /tmp
#   CONFIGS="off on on:unstriped off:striped" ROUNDS=2 ...    # which client settings, in turn
# Also measured: the session start (exec to first cuMemAlloc done) with and without TLS.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(cd "${RGPU_BUILD_DIR:-target/release}" && pwd)
out=${OUT:-$(mktemp -d)}
python=${PYTHON:-python3}
rounds=${ROUNDS:-2}

log=$out/server.log
"$bin/rgpu" server --listen 127.0.0.1:0 --tls-cert "$out/tls/server.crt" \
    --tls-key "$out/tls/server.key" >"$log" 2>&1 &
pid=$!
endpoint=
for _ in $(seq 600); do
    endpoint=$(sed -n 's/^rgpu server listening on \([^ ]*\).*/\1/p' "$log" | head -n1)
    [ -n "$endpoint" ] && break
    sleep 0.1
done
fingerprint=$(sed -n 's/^rgpu server certificate \(sha256:[0-9a-f]*\).*/\1/p' "$log" | head -n1)
[ -n "$endpoint" ] && [ -n "$fingerprint" ] || { cat "$log"; exit 1; }
export RGPU_TLS_FINGERPRINT=$fingerprint
sleep 2

for tls in off on; do
    starts=()
    for _ in 1 2 3 4 5 6 7; do
        t0=$(date +%s.%N)
        ms=$(RGPU_TLS=$tls "$bin/rgpu" run --servers "$endpoint" -- "$python" tests/cuda/session_start.py "$t0" |
            sed -n 's/^start_ms //p')
        starts+=("$ms")
        sleep 0.3
    done
    median=$(printf '%s\n' "${starts[@]}" | sort -n | sed -n 4p)
    echo "RGPU_TLS=$tls: session start median ${median} ms (all: ${starts[*]})" | tee -a "$out/tls-costs.txt"
done

# Each configuration is RGPU_TLS's value, optionally with `:striped` or `:unstriped`
# (RGPU_STRIPED_READS on or off; by default reads are striped over the data lanes in TLS only).
for round in $(seq "$rounds"); do
    for config in ${CONFIGS:-off on}; do
        tls=${config%%:*}
        case $config in
            *:striped) striped=on ;;
            *:unstriped) striped=off ;;
            *) striped=auto ;;
        esac
        name=bench-cuda-tls-${config/:/-}-$round
        (cd /tmp && RGPU_TLS=$tls RGPU_STRIPED_READS=$striped "$bin/rgpu" bench cuda \
            --servers "$endpoint" --sizes 1M,64M --repetitions 7 --json "$out/$name.json") \
            >"$out/$name.txt" 2>&1
        echo "== RGPU_TLS=$tls RGPU_STRIPED_READS=$striped, round $round" | tee -a "$out/tls-costs.txt"
        tee -a "$out/tls-costs.txt" <"$out/$name.txt"
    done
done
grep -c "(TLS)" "$log" | sed 's/^/sessions in TLS (server log): /' | tee -a "$out/tls-costs.txt"
kill -TERM $pid
wait $pid
