#!/usr/bin/env bash
# Proves the README's Quick start on a machine that has nothing but the clone: builds a fresh
# minimal root with debootstrap (--variant=minbase: no python3, no curl, no gcc), puts a clone of
# this repository at /root/rgpu (--path) in it, and runs there, as root, with a clean environment:
#
#   1. bash scripts/demo.sh          (must pass on the first run)
#   2. bash scripts/test.sh
#   3. bash scripts/setup.sh again, with no network at all (unshare --net): proves that a second
#      run installs nothing and touches no network
#
# each timed, with its log under the results folder, then prints a summary. Exits non-zero if
# any of them failed.
#
#   bash scripts/fresh-root-check.sh                          # Debian 12, the clone at HEAD
#   bash scripts/fresh-root-check.sh --suite trixie           # Debian 13
#   bash scripts/fresh-root-check.sh --suite noble            # Ubuntu 24.04
#   bash scripts/fresh-root-check.sh --worktree               # HEAD plus every uncommitted change
#   bash scripts/fresh-root-check.sh --overlay scripts,.gitignore   # HEAD plus these paths as
#                                                             # they are in the working tree
#
# Options:
#   --suite S       bookworm (default), trixie or noble
#   --ref REF       the commit to clone (default HEAD)
#   --worktree      copy the working tree over the clone (tracked and untracked, not ignored,
#                   files; files deleted in the working tree are deleted)
#   --overlay LIST  copy only these comma-separated paths of the working tree over the clone
#   --keep          keep the root afterwards (default: delete it; the results stay)
#   --fresh         debootstrap again instead of unpacking the cached pristine root
#   --only STEPS    comma-separated subset of demo,test,rerun (default all three, in order)
#   --shell         after the steps, open an interactive shell in the root (implies --keep)
#   --path DIR      where the clone goes in the root (default /root/rgpu, i.e. root's home)
#   --no-host-ca    do not copy the host's extra CA certificates (/usr/local/share/ca-certificates,
#                   e.g. of a TLS-intercepting proxy) into the root
#
# Env: RGPU_FRESH_DIR (default /var/tmp/rgpu-fresh): roots, the cache of pristine roots
#      (cache/<suite>-minbase.tar.gz) and the results (<suite>/results-<time>/);
#      RGPU_FRESH_TIMEOUT (seconds per step, default 5400).
#
# Needs root on a Debian/Ubuntu host (it apt-get installs debootstrap if missing) and the
# privileges to chroot and mount (it runs in its own mount namespace, `unshare --mount`, so every
# mount it makes vanishes when it exits). Debian suites come from deb.debian.org, Ubuntu from
# archive.ubuntu.com (with the Ubuntu archive key, fetched from the Ubuntu archive and checked
# against its pinned fingerprint).
set -Eeuo pipefail
trap 'echo "fresh-root-check.sh: FAILED at line $LINENO: $BASH_COMMAND" >&2' ERR

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SUITE=bookworm
REF=HEAD
COPY=ref
OVERLAY=
KEEP=0
FRESH=0
ONLY=demo,test,rerun
SHELL_AFTER=0
CLONE_PATH=/root/rgpu
HOST_CA=1
HOST_CA_NOTE=none
while [ $# -gt 0 ]; do
    case $1 in
        --suite) SUITE=$2; shift 2 ;;
        --ref) REF=$2; shift 2 ;;
        --worktree) COPY=worktree; shift ;;
        --overlay) COPY=overlay; OVERLAY=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --fresh) FRESH=1; shift ;;
        --only) ONLY=$2; shift 2 ;;
        --shell) SHELL_AFTER=1; KEEP=1; shift ;;
        --no-host-ca) HOST_CA=0; shift ;;
        --path) CLONE_PATH=$2; shift 2 ;;
        -h | --help) sed -n '2,/^set -E/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "fresh-root-check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

log() { echo "[fresh-root] $*"; }
die() { echo "fresh-root-check.sh: $*" >&2; exit 1; }

[[ $CLONE_PATH == /?* ]] || die "--path must be absolute"
case $SUITE in
    bookworm | trixie)
        MIRROR=http://deb.debian.org/debian
        SCRIPT=$SUITE
        DEBOOTSTRAP_ARGS=()
        ;;
    noble)
        MIRROR=http://archive.ubuntu.com/ubuntu
        SCRIPT=noble
        # shellcheck disable=SC2054 # one argument, a comma-separated list
        DEBOOTSTRAP_ARGS=(--components=main,universe)
        ;;
    *) die "unknown suite $SUITE (bookworm, trixie or noble)" ;;
esac

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, chroot, mount)"
command -v unshare >/dev/null && command -v chroot >/dev/null ||
    die "needs unshare and chroot (util-linux, coreutils)"
if ! unshare --mount --fork true 2>/dev/null; then
    die "unshare --mount fails here: no mount namespaces (a container without CAP_SYS_ADMIN?)"
fi

BASE=${RGPU_FRESH_DIR:-/var/tmp/rgpu-fresh}
STEP_TIMEOUT=${RGPU_FRESH_TIMEOUT:-5400}
WORK=$BASE/$SUITE
ROOTFS=$WORK/root
CACHE=$BASE/cache/$SUITE-minbase.tar.gz
RESULTS=$WORK/results-$(date +%Y%m%d-%H%M%S)
mkdir -p "$WORK" "$BASE/cache" "$RESULTS"
log "suite $SUITE; root $ROOTFS; results $RESULTS"

# ---------------------------------------------------------------- host tools
host_missing=()
command -v debootstrap >/dev/null || host_missing+=(debootstrap)
command -v git >/dev/null || host_missing+=(git)
[ "$SUITE" = noble ] && ! command -v gpg >/dev/null && host_missing+=(gpg)
if [ ${#host_missing[@]} -gt 0 ]; then
    log "host: apt-get install ${host_missing[*]} (to build and fill the root)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${host_missing[@]}" >/dev/null
fi

# No mount of a previous run may be left under the root before it is deleted.
assert_unmounted() {
    if awk '{print $5}' /proc/self/mountinfo | grep -q "^$ROOTFS\(/\|$\)"; then
        die "something is still mounted under $ROOTFS; unmount it first"
    fi
}

# ---------------------------------------------------------------- the pristine root
# apt sources as the distributions' own minimal images have them (docker's debian:12,
# debian:13, ubuntu:24.04): the release, its updates and its security updates; Ubuntu with all
# four components, as on an installed Ubuntu (PoCL and clinfo are in universe).
write_sources() {
    local r=$1
    rm -f "$r/etc/apt/sources.list"
    mkdir -p "$r/etc/apt/sources.list.d"
    if [ "$SUITE" = noble ]; then
        cat >"$r/etc/apt/sources.list.d/ubuntu.sources" <<EOF
Types: deb
URIs: http://archive.ubuntu.com/ubuntu/
Suites: noble noble-updates noble-backports
Components: main universe restricted multiverse
Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg

Types: deb
URIs: http://security.ubuntu.com/ubuntu/
Suites: noble-security
Components: main universe restricted multiverse
Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg
EOF
    else
        cat >"$r/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: http://deb.debian.org/debian
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    fi
}

# The Ubuntu archive key, for debootstrap on a Debian host (which has no ubuntu-keyring): the
# ubuntu-keyring package from the Ubuntu archive, of which only the key with the pinned
# fingerprint of "Ubuntu Archive Automatic Signing Key (2018)" is kept.
UBUNTU_ARCHIVE_KEY=F6ECB3762474EDA9D21B7022871920D1991BC93C
ubuntu_keyring() {
    local out=$1 tmp deb
    if [ -f /usr/share/keyrings/ubuntu-archive-keyring.gpg ]; then
        cp /usr/share/keyrings/ubuntu-archive-keyring.gpg "$out"
        return
    fi
    tmp=$(mktemp -d)
    deb=$(curl -fsS "$MIRROR/dists/noble/main/binary-amd64/Packages.gz" | zcat |
        awk '/^Package: ubuntu-keyring$/ {p=1} p && /^Filename:/ {print $2; p=0}') ||
        die "cannot read the package list of $MIRROR (is the Ubuntu archive reachable?)"
    [ -n "$deb" ] || die "no ubuntu-keyring in $MIRROR noble/main"
    curl -fsS -o "$tmp/k.deb" "$MIRROR/$deb" || die "cannot fetch $MIRROR/$deb"
    dpkg-deb -x "$tmp/k.deb" "$tmp/x"
    GNUPGHOME=$tmp/gnupg
    mkdir -m 700 "$GNUPGHOME"
    GNUPGHOME=$GNUPGHOME gpg -q --batch --import "$tmp/x/usr/share/keyrings/ubuntu-archive-keyring.gpg" 2>/dev/null
    GNUPGHOME=$GNUPGHOME gpg -q --batch --export "$UBUNTU_ARCHIVE_KEY" >"$out"
    rm -rf "$tmp"
    [ -s "$out" ] || die "the ubuntu-keyring package holds no key $UBUNTU_ARCHIVE_KEY"
}

T_DEBOOTSTRAP=cached
if [ "$FRESH" = 1 ] || [ ! -s "$CACHE" ]; then
    assert_unmounted
    rm -rf "$WORK/pristine"
    mkdir -p "$WORK/pristine"
    dbs=(debootstrap --variant=minbase "${DEBOOTSTRAP_ARGS[@]}")
    if [ "$SUITE" = noble ]; then
        if ! curl -fsS -o /dev/null -m 30 "$MIRROR/dists/noble/Release"; then
            die "the Ubuntu archive ($MIRROR) is not reachable from here: no Ubuntu 24.04 root"
        fi
        ubuntu_keyring "$WORK/ubuntu-archive-keyring.gpg"
        dbs+=(--keyring="$WORK/ubuntu-archive-keyring.gpg")
        # Debian 12's debootstrap predates noble; every Ubuntu suite uses the "gutsy" script.
        [ -e "/usr/share/debootstrap/scripts/$SCRIPT" ] || SCRIPT=/usr/share/debootstrap/scripts/gutsy
    fi
    log "debootstrap --variant=minbase $SUITE from $MIRROR (log: $RESULTS/debootstrap.log)"
    t=$SECONDS
    if ! "${dbs[@]}" "$SUITE" "$WORK/pristine" "$MIRROR" "$SCRIPT" >"$RESULTS/debootstrap.log" 2>&1; then
        tail -n 30 "$RESULTS/debootstrap.log" >&2
        die "debootstrap of $SUITE failed (log: $RESULTS/debootstrap.log)"
    fi
    T_DEBOOTSTRAP=$((SECONDS - t))s
    write_sources "$WORK/pristine"
    rm -rf "$WORK/pristine/var/cache/apt/archives/"*.deb "$WORK/pristine/var/lib/apt/lists/"* \
        "$WORK/pristine/debootstrap"
    tar -C "$WORK/pristine" --numeric-owner -czpf "$CACHE.tmp" .
    mv "$CACHE.tmp" "$CACHE"
    rm -rf "$WORK/pristine"
    log "debootstrap took $T_DEBOOTSTRAP; pristine root cached as $CACHE"
fi

assert_unmounted
rm -rf "$ROOTFS"
mkdir -p "$ROOTFS"
tar -C "$ROOTFS" --numeric-owner -xzpf "$CACHE"
for b in python3 curl gcc cc cargo rustup; do
    if chroot "$ROOTFS" /bin/sh -c "command -v $b" >/dev/null 2>&1; then
        die "the pristine root has $b: not a fresh root"
    fi
done

# ---------------------------------------------------------------- the clone
CLONE=$ROOTFS$CLONE_PATH
rev=$(git -C "$REPO" rev-parse --verify "$REF^{commit}") || die "no commit $REF in $REPO"
git clone -q --no-hardlinks "$REPO" "$CLONE"
git -C "$CLONE" checkout -q --detach "$rev"
DESC="$REF ($(git -C "$REPO" log -1 --format='%h %s' "$rev" | cut -c1-70))"
overlay() { # NUL-separated paths on stdin, relative to $REPO: copy those that exist, delete the rest
    local f list=() gone=()
    while IFS= read -r -d '' f; do
        if [ -e "$REPO/$f" ] || [ -L "$REPO/$f" ]; then list+=("$f"); else gone+=("$f"); fi
    done
    if [ ${#list[@]} -gt 0 ]; then
        printf '%s\0' "${list[@]}" | tar -C "$REPO" --null -T - -cf - | tar -C "$CLONE" -xf -
    fi
    for f in "${gone[@]}"; do rm -rf "${CLONE:?}/$f"; done
    echo "${#list[@]} copied, ${#gone[@]} deleted"
}
case $COPY in
    worktree)
        n=$(git -C "$REPO" ls-files -z -co --exclude-standard | overlay)
        DESC+=" + the working tree ($n)"
        ;;
    overlay)
        IFS=, read -r -a paths <<<"$OVERLAY"
        n=$( (cd "$REPO" && git ls-files -z -co --exclude-standard -- "${paths[@]}") | overlay)
        DESC+=" + working-tree $OVERLAY ($n)"
        ;;
esac
# A host behind a TLS-intercepting proxy trusts the proxy's CA (here: the certificates in
# /usr/local/share/ca-certificates); the root must too, or no HTTPS download works from it. The
# certificates go where ca-certificates (which setup.sh installs) picks them up, and pip, which
# trusts only its own bundle otherwise, is pointed at the system's (/etc/pip.conf). Nothing else
# of the host is copied. --no-host-ca skips this.
if [ "$HOST_CA" = 1 ] && ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
    mkdir -p "$ROOTFS/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$ROOTFS/usr/local/share/ca-certificates/"
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$ROOTFS/etc/pip.conf"
    HOST_CA_NOTE="the host's extra CA certificates ($(cd /usr/local/share/ca-certificates && ls -- *.crt | paste -sd' ' -)) + /etc/pip.conf pointing pip at the system CA bundle"
    log "root: $HOST_CA_NOTE"
fi
if [ -d "$REPO/../shared" ]; then
    cp -a "$REPO/../shared" "$(dirname "$CLONE")/shared"
    DESC+=" + ../shared"
fi
log "clone: $CLONE_PATH = $DESC"

# ---------------------------------------------------------------- the steps
# Runs in a private mount namespace (the mounts vanish with it). Each step: chroot with a clean
# environment, as a login on a fresh machine would have it, stdin from /dev/null as in CI.
inner() {
    set -uo pipefail
    local rootfs=$1 results=$2 only=$3 timeout_s=$4 shell_after=$5 clone_path=$6
    # The root a mount point of its own, as / is on a machine: `ip netns exec` (the liveness
    # tests) remounts / as a slave, which fails on a plain directory.
    mount --bind "$rootfs" "$rootfs"
    mount -t proc proc "$rootfs/proc"
    mount -t sysfs sys "$rootfs/sys" 2>/dev/null || mount --rbind /sys "$rootfs/sys"
    mount --rbind /dev "$rootfs/dev"
    mount -t tmpfs -o mode=1777 shm "$rootfs/dev/shm"
    rm -f "$rootfs/etc/resolv.conf"
    cp -L /etc/resolv.conf "$rootfs/etc/resolv.conf"
    [ -s "$rootfs/etc/hosts" ] || printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$rootfs/etc/hosts"
    local envv=(env -i HOME=/root USER=root LOGNAME=root SHELL=/bin/bash TERM=dumb
                PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
    local name cmd rc t0 t1 net
    for name in demo test rerun; do
        [[ ",$only," == *",$name,"* ]] || continue
        net=()
        case $name in
            demo) cmd="bash scripts/demo.sh" ;;
            test) cmd="bash scripts/test.sh" ;;
            rerun) cmd="bash scripts/setup.sh"; net=(unshare --net) ;;
        esac
        echo "[fresh-root] $name: $cmd${net:+ (no network)} (log: $results/$name.log)"
        t0=$(date +%s)
        rc=0
        timeout -k 30 "$timeout_s" "${net[@]}" chroot "$rootfs" "${envv[@]}" \
            /bin/bash -c "cd $clone_path && $cmd" </dev/null >"$results/$name.log" 2>&1 || rc=$?
        t1=$(date +%s)
        echo "$name $rc $((t1 - t0))" >>"$results/steps"
        echo "[fresh-root] $name: exit $rc after $((t1 - t0))s"
    done
    if [ "$shell_after" = 1 ]; then
        chroot "$rootfs" "${envv[@]}" /bin/bash -c "cd $clone_path && exec bash -i"
    fi
}
: >"$RESULTS/steps"
unshare --mount --fork bash -c "$(declare -f inner); inner \"\$@\"" inner \
    "$ROOTFS" "$RESULTS" "$ONLY" "$STEP_TIMEOUT" "$SHELL_AFTER" "$CLONE_PATH" || true

# ---------------------------------------------------------------- summary
# Whether the rerun of setup.sh installed anything (it must not).
rerun_note=
if [ -f "$RESULTS/rerun.log" ] && grep -qE '^\[setup\] (apt|installing|creating|pip|rustup)' "$RESULTS/rerun.log"; then
    rerun_note="installed something on the second run"
fi
{
    echo "fresh-root-check: suite $SUITE ($MIRROR), $(date -u '+%Y-%m-%d %H:%M UTC'), host $(nproc) cores"
    echo "clone: $CLONE_PATH = $DESC"
    echo "debootstrap: $T_DEBOOTSTRAP; added to the root: $HOST_CA_NOTE"
    failed=0
    while read -r name rc secs; do
        case $name in
            demo) what="bash scripts/demo.sh" ;;
            test) what="bash scripts/test.sh" ;;
            rerun) what="bash scripts/setup.sh (2nd run, no network)" ;;
        esac
        status=PASS
        if [ "$rc" != 0 ]; then
            status="FAIL (exit $rc)"
            [ "$rc" = 124 ] && status="FAIL (timeout)"
        elif [ "$name" = rerun ] && [ -n "$rerun_note" ]; then
            status="FAIL ($rerun_note)"
        fi
        [ "$status" = PASS ] || failed=$((failed + 1))
        printf '%-44s %-18s %6ss   %s\n' "$what" "$status" "$secs" "$RESULTS/$name.log"
    done <"$RESULTS/steps"
    ran=$(wc -l <"$RESULTS/steps")
    wanted=$(tr , '\n' <<<"$ONLY" | grep -cE '^(demo|test|rerun)$' || true)
    if [ "$ran" -lt "$wanted" ]; then
        echo "only $ran of the $wanted steps ran"
        failed=$((failed + wanted - ran))
    fi
    echo "result: $([ $failed -eq 0 ] && echo PASS || echo "FAIL ($failed failed)")"
} | tee "$RESULTS/summary.txt"

if [ -f "$RESULTS/test.log" ]; then
    sed -n '/^================ summary/,$p' "$RESULTS/test.log" >"$RESULTS/test-summary.txt" || true
fi
if [ "$KEEP" = 1 ]; then
    log "root kept: $ROOTFS (enter: unshare --mount --fork, mount proc/sys/dev, chroot)"
else
    assert_unmounted
    rm -rf "$ROOTFS"
fi
grep -q '^result: PASS' "$RESULTS/summary.txt"
