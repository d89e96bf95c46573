#!/usr/bin/env bash
# The README's first command. On a fresh Debian/Ubuntu machine: installs what is needed
# (scripts/setup.sh), builds rgpu, starts a local `rgpu server` (it serves PoCL on the CPU, or the
# machine's GPU if it has one), runs an ordinary OpenCL program (examples/vector_add.c) natively
# and through rgpu, and prints both results and times. Stops the server at the end.
#
# Env: EXAMPLE_N (elements, default 16777216), SKIP_SETUP=1 (skip scripts/setup.sh),
#      RGPU_DEMO_LISTEN (default 127.0.0.1:0, i.e. a free port).
set -Eeuo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
say() { printf '\n==> %s\n' "$*"; }

if [ "${SKIP_SETUP:-0}" != 1 ]; then
    say "installing prerequisites (scripts/setup.sh)"
    bash scripts/setup.sh
fi
# Rust from rustup and Python from the virtual environment setup.sh made (RGPU_VENV, default
# .venv; `none`: python3 as found) first on PATH: every cargo and python3 below is theirs.
CARGO_BIN=${CARGO_HOME:-$HOME/.cargo}/bin
[ -x "$CARGO_BIN/cargo" ] && export PATH="$CARGO_BIN:$PATH"
VENV=${RGPU_VENV:-$ROOT/.venv}
if [ "$VENV" != none ] && [ -x "$VENV/bin/python3" ]; then
    export VIRTUAL_ENV=$VENV PATH="$VENV/bin:$PATH"
fi

say "building rgpu (cargo build --release)"
cargo build --release --quiet
BIN=$ROOT/target/release
for f in rgpu librgpu_opencl.so; do
    [ -e "$BIN/$f" ] || { echo "demo.sh: $BIN/$f was not built" >&2; exit 1; }
done

say "building the example (examples/vector_add.c)"
mkdir -p target/examples
gcc -O2 -o target/examples/vector_add examples/vector_add.c -lOpenCL -lm
EXAMPLE=$ROOT/target/examples/vector_add

say "starting a local rgpu server"
LOG=$ROOT/target/demo-server.log
: >"$LOG"
"$BIN/rgpu" server --listen "${RGPU_DEMO_LISTEN:-127.0.0.1:0}" >"$LOG" 2>&1 &
SERVER_PID=$!
stop_server() {
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$SERVER_PID" 2>/dev/null || true
    fi
}
trap stop_server EXIT
ADDR=
for _ in $(seq 300); do
    ADDR=$(sed -n 's/^rgpu server listening on \([^ ]*\).*/\1/p' "$LOG" | head -n1)
    [ -n "$ADDR" ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$ADDR" ]; then
    echo "demo.sh: the rgpu server did not start; its log:" >&2
    cat "$LOG" >&2
    exit 1
fi
echo "rgpu server pid $SERVER_PID listening on $ADDR (log: ${LOG#"$ROOT"/})"

say "devices the server offers (rgpu devices)"
RGPU_SERVERS=$ADDR "$BIN/rgpu" devices || echo "(rgpu devices failed; continuing)"

# Warm PoCL's kernel cache so that neither timed run pays the first compile.
EXAMPLE_N=4096 "$EXAMPLE" >/dev/null 2>&1 || true

say "running the example natively"
NATIVE_OUT=$("$EXAMPLE") || { echo "$NATIVE_OUT"; echo "demo.sh: native run failed" >&2; exit 1; }
echo "$NATIVE_OUT"

say "running the same program through rgpu: rgpu run --servers $ADDR -- $EXAMPLE"
REMOTE_OUT=$(EXAMPLE_PLATFORM=rgpu "$BIN/rgpu" run --servers "$ADDR" -- "$EXAMPLE") \
    || { echo "$REMOTE_OUT"; echo "demo.sh: run through rgpu failed" >&2; exit 1; }
echo "$REMOTE_OUT"

t_native=$(sed -n 's/^elapsed_ms: //p' <<<"$NATIVE_OUT")
t_remote=$(sed -n 's/^elapsed_ms: //p' <<<"$REMOTE_OUT")
say "summary"
row() { # run output
    printf '%-7s %10s ms   %-6s %s / %s\n' "$1" "$(sed -n 's/^elapsed_ms: //p' <<<"$2")" \
        "$(sed -n 's/^result: \([A-Z]*\).*/\1/p' <<<"$2")" \
        "$(sed -n 's/^platform: //p' <<<"$2")" "$(sed -n 's/^device: *//p' <<<"$2")"
}
printf '%-7s %13s   %-6s %s\n' run elapsed result "platform / device"
row native "$NATIVE_OUT"
row rgpu "$REMOTE_OUT"
awk -v n="$t_native" -v r="$t_remote" \
    'BEGIN { if (n > 0) printf "remote/native time ratio: %.2f\n", r / n }'
stop_server
trap - EXIT
echo "server stopped"
