#!/usr/bin/env bash
# A real SLURM cluster on this one machine, for rgpu's cluster tests: munge, slurmctld and
# three slurmd "nodes", each node a network namespace with its own address on a bridge and a
# UTS namespace with its own host name. n1 is a CPU-only node (partition cpu); n2 and n3 are
# GPU nodes (partition gpu, GRES gpu:pocl:1) whose "GPU" is PoCL's OpenCL device, served per job
# by the rgpu prolog (packaging/slurm/). Debian's slurm-wlm 22.05 and munge, as root.
#
#   bash scripts/slurm-cluster.sh up        # start it (idempotent: a running cluster is kept)
#   bash scripts/slurm-cluster.sh status    # sinfo -N as seen from the cluster
#   bash scripts/slurm-cluster.sh env       # the SLURM_CONF=... line to use it
#   bash scripts/slurm-cluster.sh down      # stop everything, remove namespaces and files
#
# Knobs: RGPU_SLURM_DIR (default /run/rgpu-slurm: config, logs, spool, munge socket, the
# rgpu job state), RGPU_BUILD_DIR (where rgpu is; default target/release), RGPU_SLURM_NET
# (first three octets of the bridge's /24, default 10.77.0; addresses of these namespaces only).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DIR=${RGPU_SLURM_DIR:-/run/rgpu-slurm}
NET=${RGPU_SLURM_NET:-10.77.0}
BIN=$(cd "${RGPU_BUILD_DIR:-target/release}" 2>/dev/null && pwd || echo "$ROOT/target/release")
BRIDGE=rgpu-br
NODES=(n1 n2 n3)
declare -A ADDR=([n1]=$NET.11 [n2]=$NET.12 [n3]=$NET.13)
export SLURM_CONF=$DIR/etc/slurm.conf

say() { printf '[slurm-cluster] %s\n' "$*"; }
die() { say "$*" >&2; exit 1; }

need_packages() {
    local missing=()
    for cmd in slurmctld slurmd munged sinfo; do
        command -v "$cmd" >/dev/null || missing+=("$cmd")
    done
    command -v ip >/dev/null || missing+=(ip)
    command -v unshare >/dev/null || missing+=(unshare)
    [ ${#missing[@]} -eq 0 ] && return
    say "installing slurmctld slurmd slurm-client munge iproute2 (missing: ${missing[*]})"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurmctld slurmd slurm-client munge iproute2 util-linux >/dev/null
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

write_config() {
    mkdir -p "$DIR"/{etc,log,run,spool/ctld,jobs}
    for node in "${NODES[@]}"; do mkdir -p "$DIR/spool/$node"; done
    # The rgpu job state (per-job servers, tokens) is read by job steps as their user.
    chmod 0755 "$DIR" "$DIR/jobs"
    if [ ! -s "$DIR/etc/munge.key" ]; then
        head -c 1024 /dev/urandom >"$DIR/etc/munge.key"
        chmod 0400 "$DIR/etc/munge.key"
    fi
    # The per-job tokens are derived from this secret (root's alone) and the job id, so every
    # node of a job computes the same token without talking to the others.
    if [ ! -s "$DIR/etc/rgpu-slurm.secret" ]; then
        head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$DIR/etc/rgpu-slurm.secret"
        chmod 0400 "$DIR/etc/rgpu-slurm.secret"
    fi
    cat >"$DIR/etc/rgpu-slurm.conf" <<CONF
# Read by the rgpu prolog and epilog (packaging/slurm/rgpu-prolog, rgpu-epilog).
RGPU=$BIN/rgpu
RGPU_SLURM_STATE=$DIR/jobs
RGPU_SLURM_SECRET=$DIR/etc/rgpu-slurm.secret
RGPU_SLURM_LOG=$DIR/log
# Devices each GPU node must serve (the prolog refuses to start a job's server with fewer, and
# the epilog drains the node).
RGPU_SLURM_EXPECT_DEVICES=1
# Server options for the per-job servers.
RGPU_SLURM_SERVER_ARGS="--platform Portable --no-cuda"
CONF
    cat >"$DIR/etc/slurm.conf" <<CONF
# rgpu's test cluster (scripts/slurm-cluster.sh): one machine, nodes in network namespaces.
ClusterName=rgpu-test
SlurmctldHost=rgpuctl($NET.1)
# Ports of their own: the controller listens on every address of this machine.
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/run/munge.socket
CredType=cred/munge
StateSaveLocation=$DIR/spool/ctld
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu,shard
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
# rgpu: a per-job server on each GPU node of a job, started when the job is allocated
# (PrologFlags=Alloc: before any step, so steps on other nodes find it) and stopped after.
Prolog=$ROOT/packaging/slurm/rgpu-prolog
Epilog=$ROOT/packaging/slurm/rgpu-epilog
PrologFlags=Alloc
MailProg=/bin/true
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=n1 NodeAddr=${ADDR[n1]} CPUs=$(nproc) RealMemory=1000 State=UNKNOWN
NodeName=n2 NodeAddr=${ADDR[n2]} CPUs=$(nproc) RealMemory=1000 Gres=gpu:pocl:1,shard:4 State=UNKNOWN
NodeName=n3 NodeAddr=${ADDR[n3]} CPUs=$(nproc) RealMemory=1000 Gres=gpu:pocl:1,shard:4 State=UNKNOWN
PartitionName=cpu Nodes=n1 Default=YES OverSubscribe=YES State=UP
PartitionName=gpu Nodes=n2,n3 OverSubscribe=YES State=UP
CONF
    # slurmd 22.05 starts its cgroup plugin whatever the task and proctrack plugins; it finds
    # the machine's cgroup file systems (nodes enter their network namespace with nsenter,
    # which keeps the mounts, not with `ip netns exec`, which mounts a new /sys).
    cat >"$DIR/etc/cgroup.conf" <<CONF
IgnoreSystemd=yes
CONF
    # The GPU nodes' "GPU" is PoCL's OpenCL device; SLURM's gpu GRES wants a device file per
    # GPU, so each gets a stand-in (nothing binds it: no device cgroup here). Shards let jobs
    # share a GPU: a job with --gres=gpu has it alone, jobs with --gres=shard share it.
    mkdir -p "$DIR/dev"
    touch "$DIR/dev/pocl0"
    cat >"$DIR/etc/gres.conf" <<CONF
NodeName=n[2-3] Name=gpu Type=pocl File=$DIR/dev/pocl0
NodeName=n[2-3] Name=shard Count=4 File=$DIR/dev/pocl0
CONF
}

network_up() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        ip addr add "$NET.1/24" dev "$BRIDGE"
    fi
    ip link set "$BRIDGE" up
    for node in "${NODES[@]}"; do
        local ns=rgpu-$node
        if ! ip netns list | grep -qw "$ns"; then
            ip netns add "$ns"
            ip link add "$ns-h" type veth peer name eth0 netns "$ns"
            ip link set "$ns-h" master "$BRIDGE" up
            ip -n "$ns" addr add "${ADDR[$node]}/24" dev eth0
            ip -n "$ns" link set eth0 up
            ip -n "$ns" link set lo up
        fi
    done
}

daemons_up() {
    if ! pid_alive "$DIR/run/munged.pid"; then
        munged --force --socket="$DIR/run/munge.socket" --key-file="$DIR/etc/munge.key" \
            --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
            --seed-file="$DIR/run/munged.seed"
    fi
    if ! pid_alive "$DIR/run/slurmctld.pid"; then
        # On the bridge's address, under the controller's host name.
        unshare --uts sh -c "hostname rgpuctl && exec slurmctld -c -f '$SLURM_CONF'"
    fi
    for node in "${NODES[@]}"; do
        pid_alive "$DIR/run/slurmd-$node.pid" && continue
        # Its own network (the node's address), host name and mounts (only /sys/fs/cgroup may
        # differ: see cgroup_mounts); the file system is shared.
        nsenter "--net=/run/netns/rgpu-$node" unshare --uts --mount --propagation private \
            sh -c "hostname $node && $(declare -f cgroup_mounts); cgroup_mounts &&
                   exec slurmd -N $node -f '$SLURM_CONF'"
    done
}

# slurmd 22.05 starts its cgroup plugin whatever the task and proctrack plugins, and wants the
# machine's cgroup file systems under /sys/fs/cgroup. A machine's init mounts them; a chroot
# with a fresh sysfs (scripts/fresh-root-check.sh) has none, so the node mounts them (in its
# own mount namespace) as the machine has them: the unified hierarchy, or each v1 hierarchy
# this process is in.
cgroup_mounts() {
    if awk '$2 == "/sys/fs/cgroup" { found = 1 } END { exit !found }' /proc/self/mounts; then
        return 0
    fi
    if grep -qx '0::/.*' /proc/self/cgroup && [ "$(wc -l </proc/self/cgroup)" -eq 1 ]; then
        mount -t cgroup2 none /sys/fs/cgroup
        return
    fi
    mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup || return
    local controllers name
    while IFS=: read -r _ controllers _; do
        [ -n "$controllers" ] || continue
        name=${controllers#name=}
        mkdir -p "/sys/fs/cgroup/$name"
        if [ "$name" != "$controllers" ]; then
            mount -t cgroup -o "none,name=$name" cgroup "/sys/fs/cgroup/$name" || return
        else
            mount -t cgroup -o "$controllers" cgroup "/sys/fs/cgroup/$name" || return
        fi
    done </proc/self/cgroup
}

wait_ready() {
    local deadline=$((SECONDS + 90)) states
    while [ $SECONDS -lt $deadline ]; do
        states=$(sinfo -N -h -o '%N %t' 2>/dev/null | sort -u) || true
        if [ "$(grep -cE ' (idle|mix|alloc)$' <<<"$states")" -eq ${#NODES[@]} ]; then
            return 0
        fi
        sleep 1
    done
    say "nodes not ready after 90 s:"
    echo "$states"
    tail -n 20 "$DIR"/log/slurmctld.log "$DIR"/log/slurmd-*.log >&2
    return 1
}

up() {
    [ "$(id -u)" = 0 ] || die "needs root (namespaces, daemons)"
    need_packages
    write_config
    network_up
    daemons_up
    wait_ready
    say "up: $(sinfo -h -o '%P %D %G' | tr '\n' ';')  (export SLURM_CONF=$SLURM_CONF)"
}

status() {
    [ -f "$SLURM_CONF" ] || die "no cluster here ($DIR)"
    sinfo -N
}

down() {
    [ "$(id -u)" = 0 ] || die "needs root"
    if [ -f "$SLURM_CONF" ] && pid_alive "$DIR/run/slurmctld.pid"; then
        scancel --quiet --full --signal=KILL "--user=$(id -un)" 2>/dev/null || true
        squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null || true
    fi
    # Per-job rgpu servers the epilog did not stop (a killed cluster).
    for pidfile in "$DIR"/jobs/*/servers/*.pid; do
        [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
    done
    for pidfile in "$DIR"/run/slurmd-*.pid "$DIR/run/slurmctld.pid" "$DIR/run/munged.pid"; do
        [ -f "$pidfile" ] || continue
        local pid
        pid=$(cat "$pidfile")
        kill "$pid" 2>/dev/null || continue
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    done
    for node in "${NODES[@]}"; do
        local ns=rgpu-$node
        # Whatever still runs in the node's namespace (job processes, servers).
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
        ip link del "$ns-h" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    rm -rf "$DIR"
    say "down: no daemon, namespace, link or file left"
}

case "${1:-}" in
    up) up ;;
    status) status ;;
    env) echo "export SLURM_CONF=$SLURM_CONF" ;;
    down) down ;;
    *) die "usage: $0 up|status|env|down" ;;
esac
