#!/usr/bin/env bash
# CUDA through rgpu on the GPU machine, from a carried release build: the CUDA test programs
# (tests/cuda/*.cu, built here with nvcc) and the CuPy and PyTorch checks, each run natively and
# then through `rgpu run` against an rgpu server on loopback serving this machine's GPU; the
# `CHECK` lines of the two runs are compared by tests/cuda/compare.py.
#
#   RGPU_BUILD_DIR=dist bash scripts/gpu-check.sh
#   ONLY=vector_add,cupy_check bash scripts/gpu-check.sh     # a subset, by name
#
# The build directory holds rgpu, librgpu_cuda.so, librgpu_nvml.so and librgpu_opencl.so, and
# optionally the
# server's CUDA wire test as server-cuda-tests:
#   cp "$(cargo test --release -p rgpu-server --test cuda --no-run 2>&1 |
#       grep -o 'target/release/deps/cuda-[0-9a-f]*' | head -n1)" dist/server-cuda-tests
#
# Prints one line per program, `PASS <name> (native Xs, rgpu Ys)` or `FAIL <name>: <reason>`
# (the tail of the failing output follows, indented), `SKIP <name>: ...` for a Python check
# whose module is not installed, and last `N passed, M failed`; exits 1 if any failed.
#
# Knobs: RGPU_BUILD_DIR (default target/release), RGPU_CHECK_DIR (binaries and logs; default a
# new temporary directory), RGPU_CHECK_TIMEOUT (seconds per run, default 300), NVCC (default
# nvcc on PATH, else /usr/local/cuda/bin/nvcc), NVCC_FLAGS (default -O2), PYTHON (default
# python3), RGPU_CHECK_RTOL (default 1e-4). Logs are packed into $OUT when that is set.
set -uo pipefail
cd "$(dirname "$0")/.."
# The loopback servers stand in for remote ones: clients stay on TCP rather than move to a
# server's same-host socket (tried on its own below, in the shared-memory part).
export RGPU_SAME_HOST=off
bin=${RGPU_BUILD_DIR:-target/release}
out=${RGPU_CHECK_DIR:-$(mktemp -d /tmp/rgpu-cuda-check.XXXXXX)}
run_timeout=${RGPU_CHECK_TIMEOUT:-300}
python=${PYTHON:-python3}
rtol=${RGPU_CHECK_RTOL:-1e-4}
mkdir -p "$out/bin"
echo "logs: $out"

# shellcheck source=lib/checks.sh
. scripts/lib/checks.sh

# ---- (a) the rgpu build: the CLI, the CUDA driver library and the OpenCL ICD (`rgpu run`
# sets up both for its child, so both must be there).
for f in rgpu librgpu_cuda.so librgpu_nvml.so librgpu_opencl.so; do
    if [ ! -f "$bin/$f" ]; then
        fail "setup: $bin/$f not found (build with cargo build --release, or set RGPU_BUILD_DIR)"
        summary
        exit 1
    fi
done
bin=$(cd "$bin" && pwd)

# The programs: the .cu files, then the Python checks; ONLY picks some by name.
all_names=()
cu_names=()
for src in tests/cuda/*.cu; do
    name=$(basename "$src" .cu)
    all_names+=("$name")
    selected "$name" && cu_names+=("$name")
done
py_names=()
for name in cupy_check torch_check torch_compile_check torch_fft_check jax_check jax_autotune_check \
    numba_check fork_check torch_ipc_check; do
    all_names+=("$name")
    selected "$name" && py_names+=("$name")
done
all_names+=(server_wire session_cleanup sticky_error recovery handle_race nvml nvidia_smi
    shared_memory)
only=${ONLY:-}
for name in ${only//,/ }; do
    [[ " ${all_names[*]} " == *" $name "* ]] ||
        echo "warning: ONLY names an unknown program: $name (known: ${all_names[*]})"
done
any_selected=""
for name in "${all_names[@]}"; do selected "$name" && any_selected=1; done
if [ -z "$any_selected" ]; then
    fail "setup: ONLY=${ONLY:-} selects no program"
    summary
    exit 1
fi

# ---- (b) build the CUDA programs, all at once (nvcc's static cudart; cuBLAS dynamically, with
# an rpath to the toolkit's libraries so no LD_LIBRARY_PATH is needed).
declare -A build_failed=()
if [ ${#cu_names[@]} -gt 0 ]; then
    nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
    if [ ! -x "$nvcc" ]; then
        for name in "${cu_names[@]}"; do build_failed[$name]="no nvcc (set NVCC)"; done
    else
        cuda_lib=$(cd "$(dirname "$nvcc")/.." && pwd)/lib64
        read -r -a nvcc_flags <<<"${NVCC_FLAGS:--O2}"
        for name in "${cu_names[@]}"; do
            libs=()
            [ "$name" = cublas_sgemm ] && libs=(-lcublas -Xlinker -rpath -Xlinker "$cuda_lib")
            # The driver API directly: linked against the toolkit's libcuda stub, resolved at
            # run time to the machine's libcuda.so.1 (rgpu's under `rgpu run`).
            [[ " vmm jit_link pools_attrs graph_queries shareable ipc " == *" $name "* ]] && libs=(-lcuda -L"$cuda_lib/stubs")
            # The machine's NCCL (libnccl-dev's nccl.h); rgpu's libnccl.so.2 under `rgpu run`.
            [ "$name" = nccl_check ] && libs=(-lnccl)
            ("$nvcc" "${nvcc_flags[@]}" -o "$out/bin/$name" "tests/cuda/$name.cu" "${libs[@]}" \
                >"$out/$name.build.log" 2>&1; echo $? >"$out/$name.build.rc") &
        done
        wait
        for name in "${cu_names[@]}"; do
            [ "$(cat "$out/$name.build.rc" 2>/dev/null)" = 0 ] || build_failed[$name]="build failed"
        done
    fi
fi

# ---- (c) the servers, on free loopback ports (port 0: each picks one and logs it). The
# second serves the same GPU again, so that multi_device and copies see two devices on two
# servers.
start_server "$out/server.log"
server=$server_pid
endpoint=$server_endpoint
trap 'kill -TERM $server ${server2:-} 2>/dev/null; wait $server ${server2:-} 2>/dev/null' EXIT
start_server "$out/server2.log"
server2=$server_pid
endpoint2=$server_endpoint
echo "servers: $endpoint (pid $server), $endpoint2 (pid $server2)"
grep -E "CUDA|serving" "$out/server.log" | sed 's/^/    /'

# Sessions the server has seen connect so far.
sessions() { cat "$out"/server*.log | grep -c " connected from "; }

# ---- (d, e) one program: natively, then through rgpu, then the comparison.
# check_one NAME COMMAND... (through the servers in $servers, default the first one)
check_one() {
    local name=$1
    shift
    local t0 t1 t2 native remote before after
    t0=$(date +%s.%N)
    timeout -k 10 "$run_timeout" "$@" >"$out/$name.native.out" 2>"$out/$name.native.err"
    native=$?
    t1=$(date +%s.%N)
    if [ $native -eq 77 ]; then
        skip "$name: $(grep -m1 '^SKIP' "$out/$name.native.out" | sed 's/^SKIP [^:]*: //' | cut -c1-200)"
        return
    fi
    before=$(sessions)
    timeout -k 10 "$run_timeout" "$bin/rgpu" run --servers "${servers:-$endpoint}" -- "$@" \
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
    elif [ $remote -ne 0 ]; then
        local why="exit $remote"
        [ $remote -eq 124 ] || [ $remote -eq 137 ] && why="timed out after ${run_timeout}s"
        fail "$name: rgpu run failed ($why) $(first_fail "$out/$name.rgpu.out")"
        tail_of "$out/$name.rgpu.out" 8
        tail_of "$out/$name.rgpu.err" 12
    elif [ "$after" -le "$before" ]; then
        # It passed, but not through rgpu: the program loaded some other libcuda.so.1.
        fail "$name: no session reached the server: the rgpu run did not use rgpu's libcuda.so.1"
    elif ! python3 tests/cuda/compare.py --rtol "$rtol" "$out/$name.native.out" \
        "$out/$name.rgpu.out" >"$out/$name.compare.log" 2>&1; then
        fail "$name: results differ between native and rgpu"
        tail_of "$out/$name.compare.log"
    else
        pass "$name (native $(secs "$t0" "$t1")s, rgpu $(secs "$t1" "$t2")s)"
    fi
}

for name in "${cu_names[@]}"; do
    if [ -n "${build_failed[$name]:-}" ]; then
        fail "$name: ${build_failed[$name]}"
        tail_of "$out/$name.build.log"
        continue
    fi
    if [ "$name" = multi_device ] || [ "$name" = copies ]; then
        # Every GPU of every server is a device of the program: twice this machine's GPUs
        # here (copies between the halves are copies across servers).
        servers="$endpoint,$endpoint2" check_one "$name" "$out/bin/$name"
        gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
        if [ -f "$out/$name.rgpu.out" ] && ! grep -q "^devices $((2 * ${gpus:-1}))$" "$out/$name.rgpu.out"; then
            fail "$name: the program did not see the two servers' devices"
        fi
    else
        check_one "$name" "$out/bin/$name"
    fi
done
for name in "${py_names[@]}"; do
    check_one "$name" "$python" "tests/cuda/$name.py"
done

# ---- shared memory: programs whose copies use page-locked memory, through a server on a Unix
# socket of this host (the client attaches shared rings; page-locked allocations are shared
# with the server, which copies in place). Each must match its native run, and the server
# must say the client attached shared memory.
if selected shared_memory; then
    socket_dir=$(mktemp -d /tmp/rgpu-shm-check.XXXXXX)
    start_server "$out/server-unix.log" "unix:$socket_dir/rgpu.sock"
    server_unix=$server_pid
    for name in large_copies async_pinned copies streams_events vector_add torch_check; do
        if [ -x "$out/bin/$name" ]; then
            servers="unix:$socket_dir/rgpu.sock" check_one "${name}_shm" "$out/bin/$name"
        elif [ -f "tests/cuda/$name.py" ]; then
            servers="unix:$socket_dir/rgpu.sock" check_one "${name}_shm" "$python" "tests/cuda/$name.py"
        fi
    done
    # A 1 MiB ring: every large copy wraps it and waits for room, both ways.
    if [ -x "$out/bin/large_copies" ]; then
        RGPU_SHARED_RING_MB=1 servers="unix:$socket_dir/rgpu.sock" \
            check_one large_copies_shm_small_ring "$out/bin/large_copies"
    fi
    if ! grep -q "shared memory attached" "$out/server-unix.log"; then
        fail "shared_memory: no client attached shared memory to the Unix-socket server"
    fi
    # A client naming the TCP server on this host moves to its same-host socket.
    if [ -x "$out/bin/async_pinned" ]; then
        RGPU_SAME_HOST=on check_one async_pinned_same_host "$out/bin/async_pinned"
        if ! grep -q "shared memory attached" "$out/server.log"; then
            fail "shared_memory: the TCP server's same-host client attached no shared memory"
        fi
    fi
    kill -TERM "$server_unix" 2>/dev/null
    wait "$server_unix" 2>/dev/null
    rm -rf "$socket_dir"
fi

# ---- the server's CUDA requests straight over the wire (crates/server/tests/cuda.rs: linear
# and pitched 3D copies through the staging buffers), when the build directory carries that
# test's binary as server-cuda-tests (see the build line at the top).
if selected server_wire && [ -x "$bin/server-cuda-tests" ]; then
    if timeout -k 10 "$run_timeout" "$bin/server-cuda-tests" --test-threads=1 \
        >"$out/server_wire.out" 2>&1; then
        pass "server_wire ($(grep -m1 -o '[0-9]* passed' "$out/server_wire.out"))"
    else
        fail "server_wire: the server's CUDA wire tests failed"
        tail_of "$out/server_wire.out" 20
    fi
fi

# ---- session cleanup: a client killed while holding 2 GiB of GPU memory; once the server has
# seen it go, the GPU's memory use is back where it was.
gpu_used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | head -n1; }
if selected session_cleanup && command -v nvidia-smi >/dev/null; then
    before_mib=$(gpu_used_mib)
    timeout -k 10 "$run_timeout" "$bin/rgpu" run --servers "$endpoint" -- "$python" -c '
import ctypes, os, signal
cuda = ctypes.CDLL("libcuda.so.1")
ptr, ctx = ctypes.c_uint64(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(2 << 30)) == 0
assert cuda.cuMemsetD8_v2(ptr, 1, ctypes.c_size_t(2 << 30)) == 0 and cuda.cuCtxSynchronize() == 0
print("holding", flush=True)
os.kill(os.getpid(), signal.SIGKILL)' >"$out/session_cleanup.out" 2>&1
    held_mib=$(gpu_used_mib)
    after_mib=$held_mib
    for _ in $(seq 100); do
        after_mib=$(gpu_used_mib)
        [ "$after_mib" -le $((before_mib + 64)) ] && break
        sleep 0.1
    done
    if ! grep -q holding "$out/session_cleanup.out"; then
        fail "session_cleanup: the client did not get its memory"
        tail_of "$out/session_cleanup.out"
    elif [ "$after_mib" -le $((before_mib + 64)) ]; then
        pass "session_cleanup (GPU memory used: $before_mib MiB before, $after_mib MiB after the killed client)"
    else
        fail "session_cleanup: GPU memory used $before_mib MiB before, still $after_mib MiB 10 s after the client was killed"
    fi
fi

# ---- sticky errors stay in their session: a healthy CuPy client holds GPU memory while another
# client's kernel writes to an illegal address (which poisons a CUDA context for good); the
# healthy one then computes correctly, and so does a client that starts afterwards. Each
# session has a worker process of its own, so the lost context is the bad client's alone.
if selected sticky_error && "$python" -c "import cupy" >/dev/null 2>&1; then
    fifo=$out/sticky_error.fifo
    rm -f "$fifo" && mkfifo "$fifo"
    timeout -k 10 "$run_timeout" "$bin/rgpu" run --servers "$endpoint" -- \
        "$python" tests/cuda/sticky_error.py healthy <"$fifo" >"$out/sticky_healthy.out" 2>&1 &
    healthy_pid=$!
    exec {fifo_fd}>"$fifo"
    for _ in $(seq 600); do grep -q ready "$out/sticky_healthy.out" && break; sleep 0.1; done
    timeout -k 10 "$run_timeout" "$bin/rgpu" run --servers "$endpoint" -- \
        "$python" tests/cuda/sticky_error.py bad >"$out/sticky_bad.out" 2>&1
    echo go >&"$fifo_fd"
    exec {fifo_fd}>&-
    wait $healthy_pid
    healthy_rc=$?
    timeout -k 10 "$run_timeout" "$bin/rgpu" run --servers "$endpoint" -- \
        "$python" tests/cuda/sticky_error.py after >"$out/sticky_after.out" 2>&1
    after_rc=$?
    bad_line=$(grep -m1 "^bad got" "$out/sticky_bad.out" | cut -c1-160)
    if [ $healthy_rc -ne 0 ] || ! grep -q "healthy ok" "$out/sticky_healthy.out"; then
        fail "sticky_error: the healthy client failed beside the bad one (exit $healthy_rc)"
        tail_of "$out/sticky_healthy.out"
    elif [ $after_rc -ne 0 ] || ! grep -q "healthy ok" "$out/sticky_after.out"; then
        fail "sticky_error: a client started after the bad one failed (exit $after_rc)"
        tail_of "$out/sticky_after.out"
    elif ! grep -q "^bad got .*[Ii]llegal" "$out/sticky_bad.out"; then
        fail "sticky_error: the bad client did not get its illegal-address error"
        tail_of "$out/sticky_bad.out"
    else
        pass "sticky_error (${bad_line}; the healthy client and a new one computed correctly)"
    fi
fi

# ---- recovery: a server lost (its listener killed; its workers then end their sessions) and
# started again on the same port. The program's next call on the lost session fails; after
# cuDevicePrimaryCtxReset its primary context, and a context from cuCtxCreate, compute in a
# new session. The client's log names the lost server.
if selected recovery; then
    start_server "$out/server3.log"
    server3=$server_pid
    endpoint3=$server_endpoint
    fifo=$out/recovery.fifo
    rm -f "$fifo" && mkfifo "$fifo"
    timeout -k 10 "$run_timeout" "$bin/rgpu" run --servers "$endpoint3" -- \
        "$python" tests/cuda/recovery.py <"$fifo" >"$out/recovery.out" 2>&1 &
    client_pid=$!
    exec {fifo_fd}>"$fifo"
    for _ in $(seq 600); do grep -q ready "$out/recovery.out" && break; sleep 0.1; done
    kill -KILL $server3
    wait $server3 2>/dev/null
    sleep 1
    start_server "$out/server3-again.log" "$endpoint3"
    server3=$server_pid
    echo go >&"$fifo_fd"
    exec {fifo_fd}>&-
    wait $client_pid
    recovery_rc=$?
    kill -TERM $server3
    wait $server3
    lost_line=$(grep -m1 "^lost session" "$out/recovery.out")
    if [ $recovery_rc -ne 0 ] || ! grep -q "recovery ok" "$out/recovery.out"; then
        fail "recovery: the program did not compute again after the restart (exit $recovery_rc)"
        tail_of "$out/recovery.out"
    elif ! grep -q "$endpoint3" "$out/recovery.out"; then
        fail "recovery: the client's messages do not name the lost server $endpoint3"
        tail_of "$out/recovery.out"
    else
        pass "recovery (${lost_line}; $(grep -m1 '^primary context' "$out/recovery.out"), and a new context, computed in a new session)"
    fi
fi

# ---- handle_race: threads use an event and a stream while another destroys them (through
# rgpu only: natively that is undefined). Each call answers its own result or
# CUDA_ERROR_INVALID_HANDLE, a dead handle stays dead, nothing crashes.
if selected handle_race; then
    timeout -k 10 "$run_timeout" "$bin/rgpu" run --servers "$endpoint" -- \
        "$python" tests/cuda/handle_race.py >"$out/handle_race.out" 2>&1
    race_rc=$?
    if [ $race_rc -ne 0 ] || ! grep -q "^handles ok" "$out/handle_race.out"; then
        fail "handle_race: exit $race_rc"
        tail_of "$out/handle_race.out"
    else
        pass "handle_race ($(grep -m1 '^handles ok' "$out/handle_race.out" | sed 's/^handles ok //'))"
    fi
fi

# ---- nvml: rgpu's libnvidia-ml.so.1 with two servers serving this machine's GPUs. Natively
# NVML shows this machine's GPUs (N); through rgpu, nvidia-smi -L and pynvml list both servers'
# devices (2N), with this machine's UUIDs, and torch.cuda.device_count() (which counts through
# NVML) says 2N as well.
if selected nvml; then
    nvml_servers="$endpoint,$endpoint2"
    native_uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null | sort -u | tr '\n' ' ' | sed 's/ $//')
    native_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    want=$((2 * (native_gpus > 0 ? native_gpus : 1)))
    timeout -k 10 "$run_timeout" "$bin/rgpu" run --servers "$nvml_servers" -- nvidia-smi -L \
        >"$out/nvml_smi.out" 2>&1
    smi_rc=$?
    timeout -k 10 "$run_timeout" "$python" tests/cuda/nvml_check.py >"$out/nvml.native.out" 2>&1
    native_rc=$?
    timeout -k 10 "$run_timeout" "$bin/rgpu" run --servers "$nvml_servers" -- \
        "$python" tests/cuda/nvml_check.py >"$out/nvml.rgpu.out" 2>&1
    rgpu_rc=$?
    smi_gpus=$(grep -c "^GPU [0-9]" "$out/nvml_smi.out")
    smi_uuids=$(grep -o "UUID: GPU-[0-9a-f-]*" "$out/nvml_smi.out" | sed 's/UUID: //' | sort -u | tr '\n' ' ')
    nvml_count=$(sed -n 's/^nvml count //p' "$out/nvml.rgpu.out")
    nvml_uuids=$(awk '/^nvml device/ {print $5}' "$out/nvml.rgpu.out" | sort -u | tr '\n' ' ')
    torch_count=$(sed -n 's/^torch count //p' "$out/nvml.rgpu.out")
    native_count=$(sed -n 's/^nvml count //p' "$out/nvml.native.out")
    if [ $native_rc -eq 77 ]; then
        skip "nvml: $(sed 's/^SKIP [^:]*: //' "$out/nvml.native.out" | head -n1)"
    elif [ $smi_rc -ne 0 ] || [ "$smi_gpus" != "$want" ]; then
        fail "nvml: rgpu run -- nvidia-smi -L listed $smi_gpus GPUs, not $want (exit $smi_rc)"
        tail_of "$out/nvml_smi.out"
    elif [ -n "$native_uuid" ] && [ "$smi_uuids" != "$native_uuid " ]; then
        fail "nvml: nvidia-smi -L through rgpu shows UUIDs $smi_uuids; this GPU is $native_uuid"
        tail_of "$out/nvml_smi.out"
    elif [ $rgpu_rc -ne 0 ] || [ "$nvml_count" != "$want" ]; then
        fail "nvml: pynvml through rgpu counted ${nvml_count:-nothing}, not $want (exit $rgpu_rc)"
        tail_of "$out/nvml.rgpu.out"
    elif [ -n "$native_uuid" ] && [ "$nvml_uuids" != "$native_uuid " ]; then
        fail "nvml: pynvml through rgpu shows UUIDs $nvml_uuids; this GPU is $native_uuid"
        tail_of "$out/nvml.rgpu.out"
    elif [ -n "$torch_count" ] && [ "$torch_count" != "$want" ]; then
        fail "nvml: torch.cuda.device_count() through rgpu is $torch_count, not $want"
        tail_of "$out/nvml.rgpu.out"
    elif grep -q "^nvml processes mine" "$out/nvml.native.out" &&
        ! grep -q "^nvml processes mine" "$out/nvml.rgpu.out"; then
        fail "nvml: the process list through rgpu does not show this program (natively it does)"
        tail_of "$out/nvml.rgpu.out"
    else
        pass "nvml (nvidia-smi -L and pynvml: $want GPUs through rgpu, $native_count natively; UUIDs $native_uuid; torch ${torch_count:-not installed}; $(grep -m1 '^nvml processes' "$out/nvml.rgpu.out"))"
    fi
fi

# ---- nvidia_smi: nvidia-smi's default table, -q and topo -m natively and through rgpu with the
# first server (this machine's GPUs, as natively). -q is compared field by field
# (tests/cuda/smi_compare.py: a field with a native value and none through rgpu fails unless
# named there with its reason); the table must come out, and topo -m's outcome is reported.
if selected nvidia_smi; then
    if ! command -v nvidia-smi >/dev/null; then
        skip "nvidia_smi: no nvidia-smi on this machine"
    else
        smi_rcs=""
        for form in table q topo; do
            args=()
            [ $form = q ] && args=(-q)
            [ $form = topo ] && args=(topo -m)
            timeout -k 10 60 nvidia-smi "${args[@]}" >"$out/smi_$form.native" 2>&1
            native_rc=$?
            timeout -k 10 60 "$bin/rgpu" run --servers "$endpoint" -- nvidia-smi "${args[@]}" \
                >"$out/smi_$form.rgpu" 2>"$out/smi_$form.rgpu.err"
            smi_rcs="$smi_rcs $form:$native_rc/$?"
        done
        "$python" tests/cuda/smi_compare.py "$out/smi_q.native" "$out/smi_q.rgpu" >"$out/smi_compare.out" 2>&1
        compare_rc=$?
        table_gpus=$(grep -c "^| *[0-9]\+ .*|.*|" "$out/smi_table.rgpu")
        native_table_gpus=$(grep -c "^| *[0-9]\+ .*|.*|" "$out/smi_table.native")
        topo=$(grep -m1 -i "failed" "$out/smi_topo.rgpu" || echo "matrix printed")
        if [ $compare_rc -ne 0 ]; then
            fail "nvidia_smi: -q through rgpu lacks fields natively answered (exit status native/rgpu:$smi_rcs)"
            tail_of "$out/smi_compare.out" 20
        elif [ "$table_gpus" != "$native_table_gpus" ]; then
            fail "nvidia_smi: the table through rgpu shows $table_gpus GPU rows, natively $native_table_gpus"
            tail_of "$out/smi_table.rgpu" 20
        else
            pass "nvidia_smi (-q: $(tail -n1 "$out/smi_compare.out"); $(grep -c '(nvidia-smi reads' "$out/smi_compare.out") named gaps; table: $table_gpus GPUs; topo -m: $topo; exit status native/rgpu:$smi_rcs)"
        fi
    fi
fi

# ---- (f) stop the servers; one that died during the checks is a failure too.
for pid in $server $server2; do
    if ! kill -0 $pid 2>/dev/null; then
        wait $pid
        fail "server $pid: exited during the checks (status $?); logs in $out"
        continue
    fi
    kill -TERM $pid
    for _ in $(seq 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
    if kill -0 $pid 2>/dev/null; then
        echo "server $pid did not stop within 10 s of SIGTERM; killing it"
        kill -KILL $pid
    fi
    wait $pid 2>/dev/null
done
trap - EXIT

if [ -n "${OUT:-}" ]; then
    tar czf "$OUT/gpu-cuda-check-logs.tar.gz" -C "$out" --exclude=bin . 2>/dev/null
fi
summary
[ $failed -eq 0 ]
