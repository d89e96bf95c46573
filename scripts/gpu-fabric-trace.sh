#!/usr/bin/env bash
# One fabric measurement with both servers logging at debug level (microsecond timestamps), for
# finding where a cross-server copy spends its time: two servers (a GPU each where there are
# two), `rgpu bench fabric` at the sizes given, the servers' logs packed into $OUT (or the
# logs directory printed).
#
#   RGPU_BUILD_DIR=dist SIZES=64K REPS=1 bash scripts/gpu-fabric-trace.sh
#
# MPI_SIZES=65536 adds `rgpu bench mpi --api cuda` at those bandwidth sizes (8 B latency),
# a rank per server, through the same servers (MPIRUN_ARGS: mpirun's arguments instead of the
# bench's). SIZES=none leaves out the fabric benchmark; RGPU_LOG=info quiets the servers.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(cd "${RGPU_BUILD_DIR:-target/release}" && pwd)
. scripts/lib/checks.sh
logs_dir fabric-trace
second=0
[ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ] && second=1
export RGPU_LOG=${RGPU_LOG:-debug}
CUDA_VISIBLE_DEVICES=0 start_server "$out/server1.log"
s1=$server_pid e1=$server_endpoint
CUDA_VISIBLE_DEVICES=$second start_server "$out/server2.log"
s2=$server_pid e2=$server_endpoint
unset RGPU_LOG
trap 'kill -TERM $s1 $s2 2>/dev/null; wait $s1 $s2 2>/dev/null' EXIT
# The client logs too (its own file): what the program waited for, and when.
[ "${SIZES:-}" = none ] || RGPU_LOG=debug timeout -k 5 "${RGPU_CHECK_TIMEOUT:-120}" "$bin/rgpu" bench fabric --servers "$e1,$e2" \
    --sizes "${SIZES:-64K}" --repetitions "${REPS:-1}" --latency-copies "${LATENCY_COPIES:-20}" \
    --json "$out/bench-fabric.json" --svg "$out/bench-fabric.svg" 2>"$out/client.log" | tail -20
[ "${SIZES:-}" = none ] || grep -v ' DEBUG\]\| TRACE\]' "$out/client.log" | tail -20
if [ -n "${MPI_SIZES:-}" ]; then
    if bash scripts/build-mpi.sh "$bin" >"$out/build-mpi.log" 2>&1; then
        # The ranks log at debug too (MPI_LOG: another level), into bench-mpi.out.
        RGPU_LOG=${MPI_LOG:-debug} timeout -k 5 "${RGPU_CHECK_TIMEOUT:-120}" "$bin/rgpu" bench mpi --api cuda \
            --servers "$e1,$e2" --latency-sizes 8 --bandwidth-sizes "$MPI_SIZES" \
            --iterations "${MPI_ITERATIONS:-20}" --json "$out/bench-mpi.json" \
            ${MPIRUN_ARGS:+--mpirun-args "$MPIRUN_ARGS"} \
            --svg "$out/bench-mpi.svg" >"$out/bench-mpi.out" 2>&1
        grep -v "^measuring\| DEBUG\]" "$out/bench-mpi.out" | tail -20
    else
        echo "FAIL building the MPI interposer"
        tail -20 "$out/build-mpi.log"
    fi
fi
kill -TERM $s1 $s2 2>/dev/null
wait $s1 $s2 2>/dev/null
trap - EXIT
if [ -n "${OUT:-}" ]; then
    tar -C "$out" -czf "$OUT/fabric-trace.tar.gz" . && echo "packed into $OUT/fabric-trace.tar.gz"
fi
