#!/usr/bin/env bash
# The README's second command (and what CI runs, through .ci/run): installs what is needed,
# builds, and runs every check: rustfmt, clippy, the Rust tests, the generated-code check, the
# C/Python API tests (each starts its own rgpu servers), the example through rgpu, and pyopencl's
# own test suite natively and through rgpu. Runs every step it can even after a failure, prints
# a summary, and exits non-zero if any step failed.
#
# Env: SKIP_SETUP=1 skips scripts/setup.sh; PYOPENCL_SUITE=0 skips pyopencl's suite; CTS=0
#      skips the Khronos OpenCL-CTS groups (built from ../shared/vendor, RGPU_VENDOR_DIR);
#      PYOPENCL_SUITE_ARGS adds arguments to tests/pyopencl/run_suite.py;
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
T0=$SECONDS
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
export RGPU_BUILD_DIR=${RGPU_BUILD_DIR:-$ROOT/target/release}
# PoCL is installed below: a test that finds no OpenCL device fails rather than skips.
export RGPU_REQUIRE_DEVICE=${RGPU_REQUIRE_DEVICE:-1}

NAMES=() STATUS=() TIMES=()
record() { NAMES+=("$1"); STATUS+=("$2"); TIMES+=("$3"); }
# step NAME CMD...: runs CMD, records PASS/FAIL and its time.
step() {
    local name=$1
    shift
    printf '\n======== %s: %s\n' "$name" "$*"
    local t=$SECONDS rc=0
    "$@" || rc=$?
    if [ $rc -eq 0 ]; then
        record "$name" PASS $((SECONDS - t))
    else
        record "$name" "FAIL (exit $rc)" $((SECONDS - t))
    fi
    printf -- '-------- %s: %s in %ss\n' "$name" "${STATUS[-1]}" $((SECONDS - t))
    return $rc
}
skip() { record "$1" "SKIP ($2)" 0; printf '\n======== %s: skipped (%s)\n' "$1" "$2"; }

summary() {
    local failed=0 passed=0 i
    printf '\n================ summary (%ss in all) ================\n' $((SECONDS - T0))
    for i in "${!NAMES[@]}"; do
        printf '%-34s %-16s %6ss\n' "${NAMES[$i]}" "${STATUS[$i]}" "${TIMES[$i]}"
        case ${STATUS[$i]} in PASS) passed=$((passed + 1)) ;; FAIL*) failed=$((failed + 1)) ;; esac
    done
    if [ -f tests/work/pyopencl-results/summary.md ]; then
        echo
        echo "pyopencl suite (native vs rgpu; details in tests/work/pyopencl-results/results.md):"
        grep -E '^\| ' tests/work/pyopencl-results/summary.md || true
    fi
    echo
    echo "steps: $passed passed, $failed failed"
    [ $failed -eq 0 ]
}

# ---------------------------------------------------------------- setup + build
if [ "${SKIP_SETUP:-0}" = 1 ]; then
    skip setup "SKIP_SETUP=1"
elif ! step setup bash scripts/setup.sh; then
    summary
    exit 1
fi
# Rust from rustup and Python from the virtual environment setup.sh made (RGPU_VENV, default
# .venv; `none`: python3 as found) first on PATH: every cargo and python3 below, and every one
# the tests start, is theirs.
CARGO_BIN=${CARGO_HOME:-$HOME/.cargo}/bin
[ -x "$CARGO_BIN/cargo" ] && export PATH="$CARGO_BIN:$PATH"
VENV=${RGPU_VENV:-$ROOT/.venv}
if [ "$VENV" != none ] && [ -x "$VENV/bin/python3" ]; then
    export VIRTUAL_ENV=$VENV PATH="$VENV/bin:$PATH"
fi

built=1
step "cargo build --release" cargo build --release --workspace || built=0
if [ $built = 1 ] && { [ ! -x target/release/rgpu ] || [ ! -f target/release/librgpu_opencl.so ]; }; then
    echo "cargo build succeeded but target/release/rgpu or librgpu_opencl.so is missing"
    STATUS[-1]="FAIL (no binaries)"
    built=0
fi

# ---------------------------------------------------------------- static checks
step "cargo fmt --check" cargo fmt --all -- --check --color never
step "cargo clippy -D warnings" cargo clippy --workspace --all-targets --release -- -D warnings \
    -D clippy::undocumented_unsafe_blocks -D unsafe_op_in_unsafe_fn
step "gen_cuda_api --check" python3 tools/gen_cuda_api.py --check
step "gen_nvml_api --check" python3 tools/gen_nvml_api.py --check
step "gen_nccl_api --check" python3 tools/gen_nccl_api.py --check
if [ -f tools/gen_opencl_api.py ]; then
    step "gen_opencl_api --check" python3 tools/gen_opencl_api.py --check
else
    skip "gen_opencl_api --check" "no tools/gen_opencl_api.py"
fi

# ---------------------------------------------------------------- tests
step "cargo test --release" cargo test --workspace --release

run_api_tests() {
    local rc=0
    python3 -m pytest tests -q -p no:cacheprovider --ignore=tests/work --timeout=600 || rc=$?
    if [ $rc -eq 5 ]; then
        # pytest found no test. Fine only if there is no test file at all.
        if find tests -path tests/work -prune -o -name 'test_*.py' -print | grep -q .; then
            echo "pytest collected no test although test files exist"
            return 5
        fi
        echo "no Python test files yet"
        return 0
    fi
    return $rc
}

run_example() {
    mkdir -p target/examples
    gcc -O2 -Wall -o target/examples/vector_add examples/vector_add.c -lOpenCL -lm || return 1
    python3 - <<'EOF'
import os, re, signal, subprocess, sys, time
b = os.environ["RGPU_BUILD_DIR"]
log = open("target/examples/server.log", "wb")
srv = subprocess.Popen([f"{b}/rgpu", "server", "--listen", "127.0.0.1:0"], stdout=log,
                       stderr=log, start_new_session=True)
addr = None
for _ in range(600):
    m = re.search(rb"rgpu server listening on (\S+)", open("target/examples/server.log", "rb").read())
    if m:
        addr = m.group(1).decode()
        break
    if srv.poll() is not None:
        break
    time.sleep(0.05)
rc = 1
try:
    if addr is None:
        print(open("target/examples/server.log").read())
        print("rgpu server did not start")
    else:
        env = dict(os.environ, EXAMPLE_PLATFORM="rgpu", EXAMPLE_N=str(1 << 22))
        r = subprocess.run([f"{b}/rgpu", "run", "--servers", addr, "--",
                            "target/examples/vector_add"], env=env, timeout=300)
        rc = r.returncode
finally:
    srv.send_signal(signal.SIGTERM)
    try:
        src = srv.wait(20)
    except subprocess.TimeoutExpired:
        srv.kill()
        print("rgpu server ignored SIGTERM for 20 s")
        rc = rc or 1
sys.exit(rc)
EOF
}

if [ $built = 1 ]; then
    step "pytest tests (C/Python API)" run_api_tests
    step "example through rgpu" run_example
    # A benchmark step, not a test: the link emulator against its targets, reported (the
    # figures depend on the machine; the step fails only if the benchmark cannot run).
    step "link emulator (report)" "$RGPU_BUILD_DIR/rgpu" bench link \
        --links "rtt=500us;rtt=5ms;bandwidth=100Mbit;bandwidth=1Gbit;rtt=1ms,bandwidth=1Gbit" \
        --pings 50 --bulk-seconds 0.3 --json target/bench-link.json
    if [ "${PYOPENCL_SUITE:-1}" = 0 ]; then
        skip "pyopencl suite" "PYOPENCL_SUITE=0"
    else
        # shellcheck disable=SC2086
        step "pyopencl suite native vs rgpu" python3 tests/pyopencl/run_suite.py \
            --total-timeout 2400 ${PYOPENCL_SUITE_ARGS:-}
    fi
    if [ "${CTS:-1}" = 0 ]; then
        skip "OpenCL-CTS" "CTS=0"
    elif [ ! -d "${RGPU_VENDOR_DIR:-../shared/vendor}" ]; then
        skip "OpenCL-CTS" "no vendored CTS sources at ${RGPU_VENDOR_DIR:-../shared/vendor}"
    elif step "OpenCL-CTS build" bash scripts/cts-build.sh; then
        step "OpenCL-CTS native vs rgpu" python3 tests/cts/run_cts.py
    fi
else
    skip "pytest tests (C/Python API)" "build failed"
    skip "example through rgpu" "build failed"
    skip "pyopencl suite" "build failed"
    skip "OpenCL-CTS" "build failed"
fi

summary
