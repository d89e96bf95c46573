#!/usr/bin/env bash
# The SLURM per-job flow on the GPU machine, where no SLURM runs: rgpu's real prolog and epilog
# (packaging/slurm) start and stop a per-job `rgpu server` bound to one of the machine's GPUs,
# and the job's steps (`rgpu run` with SLURM_JOB_ID set, no servers or token written) run a
# CUDA program and PyTorch through it. What slurmctld would answer the prolog (`scontrol show
# job -d`: the job's GPU indices; `show node`: its address) comes from a stand-in `scontrol`
# on PATH; its `update` (a drain) is recorded, so the epilog's verdict is visible.
#
#   RGPU_BUILD_DIR=dist bash scripts/gpu-job-check.sh       # JOB_GPU=1 on a two-GPU machine
#
# Checks, each printed as PASS/FAIL: the job's server serves exactly the job's GPU (PyTorch
# counts 1 device whose UUID is that GPU's, also when the machine has more); a CUDA program
# gives the native results; a step killed while holding GPU memory leaves the GPU's memory at
# its level before the job (the epilog's nvidia-smi check passes, nothing drained); a job
# whose server finds fewer devices than configured has its node drained with the reason.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(cd "${RGPU_BUILD_DIR:-target/release}" && pwd)
work=${RGPU_CHECK_DIR:-$(mktemp -d /tmp/rgpu-job-check.XXXXXX)}
gpu=${JOB_GPU:-0}
python=${PYTHON:-python3}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
mkdir -p "$work/shim" "$work/state" "$work/log"
passed=0
failed=0
pass() { echo "PASS $*"; passed=$((passed + 1)); }
fail() { echo "FAIL $*"; failed=$((failed + 1)); }

# What slurmctld knows of job $job: one node, gpu1, at 127.0.0.1, holding GPU $gpu.
cat >"$work/shim/scontrol" <<EOF
#!/bin/sh
case "\$1 \$2" in
"show job") printf 'JobId=%s JobName=check\n   Nodes=gpu1 CPU_IDs=0 Mem=0 GRES=gpu:h100:1(IDX:$gpu)\n' "\$4" ;;
"show node") echo "NodeName=gpu1 Arch=x86_64 NodeAddr=127.0.0.1 NodeHostName=gpu1" ;;
"show hostnames") echo "\$3" ;;
update*) echo "\$*" >>"$work/drains" ;;
*) echo "scontrol stand-in: \$*" >&2; exit 1 ;;
esac
EOF
chmod +x "$work/shim/scontrol"
head -c 32 /dev/urandom | base64 >"$work/secret"
# The prolog sets a PATH of its own, then reads its settings: the stand-in goes first there.
cat >"$work/rgpu-slurm.conf" <<EOF
PATH=$work/shim:\$PATH
RGPU=$bin/rgpu
RGPU_SLURM_STATE=$work/state
RGPU_SLURM_SECRET=$work/secret
RGPU_SLURM_LOG=$work/log
RGPU_SLURM_EXPECT_DEVICES=${EXPECT_DEVICES:-1}
EOF
# The prolog and epilog run with slurmd's environment: the node, the job, the settings.
slurmd_env() {
    env RGPU_SLURM_CONF="$work/rgpu-slurm.conf" SLURMD_NODENAME=gpu1 \
        SLURM_JOB_ID="$1" SLURM_JOB_USER=root SLURM_JOB_UID=0 "${@:2}"
}
# A job step: only the job id and where job state lives.
step() { env SLURM_JOB_ID="$1" RGPU_SLURM_STATE="$work/state" "$bin/rgpu" run -- "${@:2}"; }

uuid=$(nvidia-smi -i "$gpu" --query-gpu=uuid --format=csv,noheader)
echo "job GPU: index $gpu, $uuid (machine: $(nvidia-smi -L | wc -l) GPUs)"
"$nvcc" -O2 -o "$work/vector_add" tests/cuda/vector_add.cu || fail "nvcc vector_add"

# ---- job 4242: a CUDA program and PyTorch through the job's server.
job=4242
slurmd_env $job packaging/slurm/rgpu-prolog
echo "prolog: $(cat "$work/state/$job/servers/gpu1" 2>/dev/null)"
"$work/vector_add" >"$work/native.out" 2>&1
step $job "$work/vector_add" >"$work/rgpu.out" 2>&1
if [ -s "$work/native.out" ] && $python tests/cuda/compare.py "$work/native.out" "$work/rgpu.out" >"$work/compare.out" 2>&1; then
    pass "vector_add in job $job equals native"
else
    fail "vector_add in job $job"; tail -n 8 "$work/rgpu.out" "$work/compare.out" | sed 's/^/    /'
fi
torch_probe='import torch
n = torch.cuda.device_count()
p = torch.cuda.get_device_properties(0)
x = torch.randn(2048, 2048, device="cuda"); y = (x @ x).sum().item()
print("devices", n, "uuid", "GPU-" + str(p.uuid), "name", p.name, "matmul", "%.3f" % y)'
step $job $python -c "$torch_probe" >"$work/torch.out" 2>&1
cat "$work/torch.out" | tail -n 3
if grep -q "^devices 1 uuid $uuid " "$work/torch.out"; then
    pass "PyTorch in job $job sees exactly the job's GPU ($uuid)"
else
    fail "PyTorch in job $job: expected 1 device, $uuid"
fi
# A step killed while it holds 8 GiB on the GPU; then the job ends.
step $job $python -c 'import torch, time
x = torch.empty(8 << 30, dtype=torch.uint8, device="cuda"); print("holding", flush=True); time.sleep(600)' \
    >"$work/killed.out" 2>&1 &
holder=$!
for _ in $(seq 300); do grep -q holding "$work/killed.out" && break; sleep 0.2; done
echo "during the step: $(nvidia-smi -i "$gpu" --query-gpu=memory.used --format=csv,noheader)"
kill -9 $holder
wait $holder 2>/dev/null
baseline=$(cat "$work/state/$job/servers/gpu1.memory" 2>/dev/null)
slurmd_env $job packaging/slurm/rgpu-epilog
echo "before the job: $baseline MiB; after the epilog: $(nvidia-smi -i "$gpu" --query-gpu=memory.used --format=csv,noheader)"
if grep -q holding "$work/killed.out" && [ ! -s "$work/drains" ] && [ ! -e "$work/state/$job" ]; then
    pass "job $job killed mid-step: memory back, node not drained, job state removed"
else
    fail "job $job epilog: drains: $(cat "$work/drains" 2>/dev/null); state: $(ls -R "$work/state/$job" 2>&1 | head -5)"
fi

# ---- job 4243: the node should serve 2 devices; the job's server finds 1: drained.
sed -i 's/^RGPU_SLURM_EXPECT_DEVICES=.*/RGPU_SLURM_EXPECT_DEVICES=2/' "$work/rgpu-slurm.conf"
slurmd_env 4243 packaging/slurm/rgpu-prolog
slurmd_env 4243 packaging/slurm/rgpu-epilog
if grep -q "State=DRAIN Reason=rgpu: found 1" "$work/drains" 2>/dev/null; then
    pass "a node with fewer devices than configured is drained: $(grep -o 'Reason=.*' "$work/drains")"
else
    fail "missing device: drains: $(cat "$work/drains" 2>/dev/null)"
fi
echo "$passed passed, $failed failed"
[ -n "${OUT:-}" ] && tar czf "$OUT/job-check.tgz" -C "$work" . 2>/dev/null
[ $failed -eq 0 ]
