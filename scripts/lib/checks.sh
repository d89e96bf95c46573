# What the GPU-machine check scripts share (sourced by the scripts/gpu-*.sh that check and measure):
# PASS/FAIL/SKIP lines and their count, log tails, timing, ONLY selection, and starting an
# rgpu server on a free loopback port. The caller sets `bin` (the build directory) first.

passed=0
failed=0
skipped=0
pass() { echo "PASS $*"; passed=$((passed + 1)); }
fail() { echo "FAIL $*"; failed=$((failed + 1)); }
skip() { echo "SKIP $*"; skipped=$((skipped + 1)); }
summary() {
    local line="$passed passed, $failed failed"
    [ $skipped -gt 0 ] && line+=", $skipped skipped"
    echo "$line"
}
# The last lines of a log, indented under the status line.
tail_of() { tail -n "${2:-15}" "$1" 2>/dev/null | sed 's/^/    /'; }
# Seconds between two `date +%s.%N` stamps, one decimal.
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
# The first FAIL line of an output, shortened.
first_fail() { grep -m1 '^FAIL' "$1" | cut -c1-200; }
# Whether NAME is selected by ONLY (a comma-separated list; empty selects all).
selected() { [ -z "${ONLY:-}" ] || [[ ",$ONLY," == *",$1,"* ]]; }

# start_server LOG [ADDR]: starts a server logging to LOG (listening on ADDR, default a free
# loopback port); sets server_pid and server_endpoint, or reports why not and exits.
start_server() {
    "$bin/rgpu" server --listen "${2:-127.0.0.1:0}" >"$1" 2>&1 &
    server_pid=$!
    server_endpoint=""
    for _ in $(seq 600); do
        server_endpoint=$(sed -n 's/^.*rgpu server listening on \([^ ]*\).*$/\1/p' "$1" | head -n1)
        [ -n "$server_endpoint" ] && return 0
        kill -0 $server_pid 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 $server_pid 2>/dev/null; then
        fail "setup: the rgpu server did not report listening within 60 s; its log:"
    else
        fail "setup: the rgpu server exited before listening; its log:"
    fi
    tail_of "$1"
    summary
    exit 1
}

# logs_dir NAME: makes a fresh logs directory for this run (/tmp/rgpu-NAME.XXXXXX), says where,
# and sets `out` to it.
logs_dir() {
    out=$(mktemp -d "/tmp/rgpu-$1.XXXXXX")
    echo "logs: $out"
}
