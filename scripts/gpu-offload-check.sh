#!/usr/bin/env bash
# Directive-based programs through rgpu on the GPU machine: the OpenACC and OpenMP target
# offload programs of tests/offload, built on Debian 12 with GCC 12's nvptx offload compiler
# by scripts/build-offload.sh and carried here with their runtime (GCC 12's libgomp and its
# nvptx plugin, in $OFFLOAD_DIR/lib; the binaries find them through their DT_RPATH). Each
# program runs natively (this machine's libcuda.so.1) and then through `rgpu run` against an
# rgpu server on loopback serving this machine's GPU; the `CHECK` lines of the two runs are
# compared by tests/cuda/compare.py and their `TIME` lines shown side by side.
#
#   OFFLOAD_DIR=offload-dist RGPU_BUILD_DIR=dist bash scripts/gpu-offload-check.sh
#   ONLY=acc_jacobi,omp_target OFFLOAD_DIR=offload-dist RGPU_BUILD_DIR=dist bash scripts/gpu-offload-check.sh
#
# Prints one line per program, `PASS <name> (native Xs, rgpu Ys)` or `FAIL <name>: <reason>`
# (the tail of the failing output follows, indented), then its TIME lines as
# `    <what>: native X ms, rgpu Y ms`, and last `N passed, M failed`; exits 1 if any failed.
# libgomp's nvptx plugin disables offloading quietly (the regions then run on the host) when
# dlopen("libcuda.so.1"), a dlsym, cuInit or cuDeviceGetCount fails. So both runs get
# ACC_DEVICE_TYPE=nvidia (OpenACC then fails loudly: "device type nvidia not supported") and
# OMP_TARGET_OFFLOAD=MANDATORY (GCC 12 still falls back when the plugin reports no device),
# every program prints `CHECK offloaded 0|1` from inside a region (compared like the others),
# and the native run must report `CHECK offloaded 1`.
# The first selected program is run once more each way with GOMP_DEBUG=1 (libgomp's and the
# plugin's trace: device attributes, PTX link/JIT, every launch's dimensions, copies): the logs
# are <name>.gomp_debug.{native,rgpu}.log, summarized after its PASS/FAIL line.
#
# Knobs: OFFLOAD_DIR (default offload-dist), RGPU_BUILD_DIR (default target/release),
# RGPU_CHECK_DIR (logs; default a new temporary directory), RGPU_CHECK_TIMEOUT (seconds per
# run, default 300), RGPU_CHECK_RTOL (default 1e-4), GOMP_DEBUG_RUN (0 skips the GOMP_DEBUG
# runs). Logs are packed into $OUT when that is set.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${RGPU_BUILD_DIR:-target/release}
odir=${OFFLOAD_DIR:-offload-dist}
out=${RGPU_CHECK_DIR:-$(mktemp -d /tmp/rgpu-offload-check.XXXXXX)}
run_timeout=${RGPU_CHECK_TIMEOUT:-300}
rtol=${RGPU_CHECK_RTOL:-1e-4}
mkdir -p "$out"
echo "logs: $out"

# shellcheck source=lib/checks.sh
. scripts/lib/checks.sh

# ---- (a) the rgpu build and the offload folder.
for f in rgpu librgpu_cuda.so librgpu_opencl.so; do
    if [ ! -f "$bin/$f" ]; then
        fail "setup: $bin/$f not found (build with cargo build --release, or set RGPU_BUILD_DIR)"
        summary
        exit 1
    fi
done
for f in lib/libgomp.so.1 lib/libgomp-plugin-nvptx.so.1; do
    if [ ! -f "$odir/$f" ]; then
        fail "setup: $odir/$f not found (build with scripts/build-offload.sh, or set OFFLOAD_DIR)"
        summary
        exit 1
    fi
done
bin=$(cd "$bin" && pwd)
odir=$(cd "$odir" && pwd)
[ -f "$odir/BUILDINFO" ] && sed 's/^/    /' "$odir/BUILDINFO"

# The programs: the known ones first, in this order (the first gets the GOMP_DEBUG runs),
# then any other binary in $odir/bin.
names=()
all_names=()
for prog in acc_matmul acc_jacobi acc_reduce omp_target $(ls "$odir/bin"); do
    [ -x "$odir/bin/$prog" ] || continue
    [[ " ${all_names[*]} " == *" $prog "* ]] && continue
    all_names+=("$prog")
    selected "$prog" && names+=("$prog")
done
only=${ONLY:-}
for name in ${only//,/ }; do
    [[ " ${all_names[*]} " == *" $name "* ]] ||
        echo "warning: ONLY names an unknown program: $name (known: ${all_names[*]})"
done
if [ ${#names[@]} -eq 0 ]; then
    fail "setup: no programs selected in $odir/bin (ONLY=${ONLY:-})"
    summary
    exit 1
fi

# ---- (b) the server, on a free loopback port (port 0: it picks one and logs it).
start_server "$out/server.log"
server=$server_pid
endpoint=$server_endpoint
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null' EXIT
echo "server: $endpoint (pid $server)"
grep -E "CUDA|serving" "$out/server.log" | sed 's/^/    /'

sessions() { grep -c " connected from " "$out/server.log"; }

# No silent host fallback, in either run.
export ACC_DEVICE_TYPE=nvidia OMP_TARGET_OFFLOAD=MANDATORY

# The TIME lines of both runs, side by side.
times_side_by_side() {
    awk '
        FNR == 1 { file++ }
        $1 == "TIME" {
            key = $3
            if (file == 1) { order[++n] = key; nat[key] = $4 } else { rg[key] = $4 }
        }
        END {
            for (i = 1; i <= n; i++) {
                k = order[i]
                r = (k in rg) ? rg[k] " ms" : "-"
                ratio = (k in rg && nat[k] > 0) ? sprintf(" (x%.2f)", rg[k] / nat[k]) : ""
                printf "    %-26s native %10.3f ms, rgpu %s%s\n", k ":", nat[k], r, ratio
            }
        }' "$1" "$2"
}

# A summary of a GOMP_DEBUG log: the device the plugin saw, the PTX link (JIT) time, the
# launches and their dimensions.
gomp_debug_summary() {
    local log=$1 label=$2
    [ -f "$log" ] || return
    echo "    GOMP_DEBUG ($label): $(wc -l <"$log") lines, $log"
    grep -m1 -E "Link complete" "$log" | sed 's/^/      /'
    grep -m2 -E "warp_size=|default dimensions" "$log" | sed 's/^/      /'
    grep -E "kernel .*: launch" "$log" | sed -E 's/0x[0-9a-f]+/ADDR/g' | sort | uniq -c |
        sort -rn | head -n 6 | sed 's/^/      /'
}

# ---- (c) one program: natively, then through rgpu, then the comparison.
check_one() {
    local name=$1 prog=$odir/bin/$1
    local t0 t1 t2 native remote before after
    t0=$(date +%s.%N)
    timeout -k 10 "$run_timeout" "$prog" >"$out/$name.native.out" 2>"$out/$name.native.err"
    native=$?
    t1=$(date +%s.%N)
    before=$(sessions)
    timeout -k 10 "$run_timeout" "$bin/rgpu" run --servers "$endpoint" -- "$prog" \
        >"$out/$name.rgpu.out" 2>"$out/$name.rgpu.err"
    remote=$?
    t2=$(date +%s.%N)
    after=$(sessions)

    if [ $native -ne 0 ]; then
        local why="exit $native"
        [ $native -eq 124 ] || [ $native -eq 137 ] && why="timed out after ${run_timeout}s"
        fail "$name: native run failed ($why) $(first_fail "$out/$name.native.out")"
        tail_of "$out/$name.native.out" 8
        tail_of "$out/$name.native.err" 8
    elif ! grep -q "^CHECK offloaded 1$" "$out/$name.native.out"; then
        fail "$name: the native run did not offload (no GPU for libgomp's nvptx plugin?)"
        tail_of "$out/$name.native.out" 8
        tail_of "$out/$name.native.err" 8
    elif [ $remote -ne 0 ]; then
        local why="exit $remote"
        [ $remote -eq 124 ] || [ $remote -eq 137 ] && why="timed out after ${run_timeout}s"
        fail "$name: rgpu run failed ($why) $(first_fail "$out/$name.rgpu.out")"
        tail_of "$out/$name.rgpu.out" 8
        tail_of "$out/$name.rgpu.err" 12
    elif [ "$after" -le "$before" ]; then
        fail "$name: no session reached the server: the rgpu run did not use rgpu's libcuda.so.1"
    elif ! python3 tests/cuda/compare.py --rtol "$rtol" "$out/$name.native.out" \
        "$out/$name.rgpu.out" >"$out/$name.compare.log" 2>&1; then
        fail "$name: results differ between native and rgpu"
        tail_of "$out/$name.compare.log"
    else
        pass "$name (native $(secs "$t0" "$t1")s, rgpu $(secs "$t1" "$t2")s)"
    fi
    grep -m1 "^device " "$out/$name.native.out" | sed 's/^/    native /'
    grep -m1 "^device " "$out/$name.rgpu.out" | sed 's/^/    rgpu   /'
    [ -f "$out/$name.rgpu.out" ] && times_side_by_side "$out/$name.native.out" "$out/$name.rgpu.out"
}

first=1
for name in "${names[@]}"; do
    check_one "$name"
    if [ -n "$first" ] && [ "${GOMP_DEBUG_RUN:-1}" != 0 ]; then
        # The runtime's own trace, once per way (stderr; the PTX source is in it too).
        GOMP_DEBUG=1 timeout -k 10 "$run_timeout" "$odir/bin/$name" \
            >"$out/$name.gomp_debug.native.out" 2>"$out/$name.gomp_debug.native.log"
        GOMP_DEBUG=1 timeout -k 10 "$run_timeout" "$bin/rgpu" run --servers "$endpoint" -- \
            "$odir/bin/$name" >"$out/$name.gomp_debug.rgpu.out" 2>"$out/$name.gomp_debug.rgpu.log"
        gomp_debug_summary "$out/$name.gomp_debug.native.log" native
        gomp_debug_summary "$out/$name.gomp_debug.rgpu.log" rgpu
        first=""
    fi
done

# ---- (d) stop the server; one that died during the checks is a failure too.
if ! kill -0 $server 2>/dev/null; then
    wait $server
    fail "server $server: exited during the checks (status $?); logs in $out"
else
    kill -TERM $server
    for _ in $(seq 100); do kill -0 $server 2>/dev/null || break; sleep 0.1; done
    if kill -0 $server 2>/dev/null; then
        echo "server $server did not stop within 10 s of SIGTERM; killing it"
        kill -KILL $server
    fi
    wait $server 2>/dev/null
fi
trap - EXIT

if [ -n "${OUT:-}" ]; then
    tar czf "$OUT/gpu-offload-check-logs.tar.gz" -C "$out" . 2>/dev/null
fi
summary
[ $failed -eq 0 ]
