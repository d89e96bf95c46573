#!/usr/bin/env bash
# The acceptance check of the Debian package: installs target/debian/rgpu_*.deb into a fresh
# Debian 12 root (debootstrap --variant=minbase, no systemd running) and checks, one PASS/FAIL
# line each:
#
#   1. `apt-get install ./rgpu_*.deb` into the fresh root succeeds (dependencies resolved from
#      the archive; maintainer scripts run without systemd); the files are where they belong,
#      the libraries outside every directory ldconfig scans, the conffiles registered; the user
#      and group rgpu exist, /etc/rgpu is root:rgpu 0750, the unit is enabled and nothing is
#      started;
#   2. a reinstall (postinst as on an upgrade) with /run/systemd/system present and a
#      policy-rc.d that forbids starting services (as in image builds) succeeds and starts
#      nothing;
#   3. with systemd installed in the root (not running): `systemd-analyze verify` of the unit
#      passes, and `systemd-analyze security --offline` rates it OK or better (the score is
#      printed);
#   4. `rgpu server --config /etc/rgpu/server.toml` as the user rgpu (setpriv, with the
#      unit's environment, in a network namespace of its own so no other server on this
#      machine is in the way) prints `rgpu server listening on 127.0.0.1:7450`; with PoCL in
#      the root, `rgpu devices` lists PoCL's device through it; `rgpu run` hands programs
#      /usr/lib/rgpu/librgpu_cuda.so as libcuda.so.1; SIGTERM stops the server cleanly;
#   5. `apt-get remove` leaves the conffiles and masks the unit; `apt-get purge` leaves no rgpu
#      process and no file (the system user rgpu stays, as Debian policy has it);
#   6. where systemd-nspawn can boot the root (systemd running, own network): `apt-get install`
#      enables and starts rgpu-server.service, which logs the listening line to the journal,
#      runs as rgpu, serves PoCL's device (and a kernel, in its sandbox) and is restarted when
#      killed; `apt-get purge` stops it and leaves no process, no unit and no file.
#
#   bash scripts/check-package.sh                  # bash scripts/package.sh --deb-only first
#   bash scripts/check-package.sh --deb FILE.deb   # check this package, build nothing
#
# Options:
#   --deb FILE   the package to check (default: build it with scripts/package.sh --deb-only)
#   --no-pocl    do not install PoCL in the root (skips the `rgpu devices` check)
#   --fresh      debootstrap again instead of unpacking the cached pristine root
#   --keep       keep the root afterwards (default: delete it)
#   --boot       stage 6 is a must (installs systemd-container for systemd-nspawn if missing;
#                a root that does not boot is a FAIL); default: run it where systemd-nspawn is
#                installed and boots the root, else say SKIP
#   --no-boot    skip stage 6
#
# Env: RGPU_PKGCHECK_DIR (default /var/tmp/rgpu-pkgcheck): the root, the pristine root's cache
#      (cache/bookworm-minbase.tar.gz; a cache of scripts/fresh-root-check.sh in
#      /var/tmp/rgpu-fresh/cache is used when there is no own one) and the downloaded .debs
#      (apt-archives/, so reruns download nothing).
#
# Needs root on a Debian/Ubuntu host with debootstrap (apt-get installed when missing) and the
# privileges to unshare mount, PID and network namespaces: every mount and every process of the
# check lives in them and is gone when the check ends. Exits non-zero if any check failed.
set -Eeuo pipefail
trap 'echo "check-package.sh: FAILED at line $LINENO: $BASH_COMMAND" >&2' ERR

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
DEB=
POCL=1
FRESH=0
KEEP=0
BOOT=auto
while [ $# -gt 0 ]; do
    case $1 in
        --deb) DEB=$2; shift ;;
        --no-pocl) POCL=0 ;;
        --fresh) FRESH=1 ;;
        --keep) KEEP=1 ;;
        --boot) BOOT=1 ;;
        --no-boot) BOOT=0 ;;
        -h | --help) sed -n '2,/^set -E/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "check-package.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
log() { echo "[check-package] $*"; }
die() { echo "check-package.sh: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, chroot, namespaces)"
unshare --mount --pid --fork --net true 2>/dev/null ||
    die "cannot unshare mount, PID and network namespaces here (a container without CAP_SYS_ADMIN?)"
command -v ip >/dev/null || die "needs ip (iproute2) to bring up the server's loopback"

BASE=${RGPU_PKGCHECK_DIR:-/var/tmp/rgpu-pkgcheck}
ROOTFS=$BASE/root
CACHE=$BASE/cache/$SUITE-minbase.tar.gz
SHARED_CACHE=/var/tmp/rgpu-fresh/cache/$SUITE-minbase.tar.gz
ARCHIVES=$BASE/apt-archives
mkdir -p "$BASE/cache" "$ARCHIVES/partial"

# ---------------------------------------------------------------- the package
if [ -z "$DEB" ]; then
    log "building the package: bash scripts/package.sh --deb-only"
    bash "$REPO/scripts/package.sh" --deb-only
    DEB=$(ls -t "$REPO"/target/debian/rgpu_*.deb | head -n1)
fi
[ -f "$DEB" ] || die "no package $DEB"
DEB=$(readlink -f "$DEB")
log "package: $DEB ($(du -h "$DEB" | cut -f1); $(dpkg-deb -f "$DEB" Package Version Architecture | paste -sd' '))"

# ---------------------------------------------------------------- the fresh root
assert_unmounted() {
    if awk '{print $5}' /proc/self/mountinfo | grep -q "^$ROOTFS\(/\|$\)"; then
        die "something is still mounted under $ROOTFS; unmount it first"
    fi
}
write_sources() {
    rm -f "$1/etc/apt/sources.list"
    mkdir -p "$1/etc/apt/sources.list.d"
    cat >"$1/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
}
if [ "$FRESH" = 0 ] && [ ! -s "$CACHE" ] && [ -s "$SHARED_CACHE" ]; then
    CACHE=$SHARED_CACHE
fi
if [ "$FRESH" = 1 ] || [ ! -s "$CACHE" ]; then
    CACHE=$BASE/cache/$SUITE-minbase.tar.gz
    if ! command -v debootstrap >/dev/null; then
        log "host: apt-get install debootstrap"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
    fi
    assert_unmounted
    rm -rf "$BASE/pristine"
    mkdir -p "$BASE/pristine"
    log "debootstrap --variant=minbase $SUITE (log: $BASE/debootstrap.log)"
    if ! debootstrap --variant=minbase "$SUITE" "$BASE/pristine" "$MIRROR" >"$BASE/debootstrap.log" 2>&1; then
        tail -n 20 "$BASE/debootstrap.log" >&2
        die "debootstrap failed"
    fi
    write_sources "$BASE/pristine"
    rm -rf "$BASE/pristine/var/cache/apt/archives/"*.deb "$BASE/pristine/var/lib/apt/lists/"* \
        "$BASE/pristine/debootstrap"
    tar -C "$BASE/pristine" --numeric-owner -czpf "$CACHE.tmp" .
    mv "$CACHE.tmp" "$CACHE"
    rm -rf "$BASE/pristine"
fi
assert_unmounted
rm -rf "$ROOTFS"
mkdir -p "$ROOTFS"
tar -C "$ROOTFS" --numeric-owner -xzpf "$CACHE"
write_sources "$ROOTFS"
log "root: $ROOTFS (from $CACHE)"
if chroot "$ROOTFS" dpkg-query -W systemd >/dev/null 2>&1; then
    die "the pristine root has systemd installed: not the root this check wants"
fi

mkdir -p "$ROOTFS/root/check"
cp "$DEB" "$ROOTFS/root/check/"
DEB_IN_ROOT=/root/check/$(basename "$DEB")

# ---------------------------------------------------------------- the checks (in the root)
cat >"$ROOTFS/root/check/inner.sh" <<'INNER'
#!/bin/bash
# Runs inside the root (chroot). $1: the stage; $2: the package's path in the root.
set -uo pipefail
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8
STAGE=$1 DEB=$2 POCL=$3
RESULTS=/root/check/results
pass() { echo "PASS  $*"; echo "PASS  $*" >>"$RESULTS"; }
fail() { echo "FAIL  $*"; echo "FAIL  $*" >>"$RESULTS"; }
info() { echo "      $*"; }
check() { # check "what" command...: PASS if the command succeeds
    local what=$1; shift
    if "$@"; then pass "$what"; else fail "$what"; fi
}
apt_quiet() { # apt-get with its output in a log, shown on failure
    local log=/root/check/apt-$(date +%s%N).log
    if apt-get -y -o Dpkg::Use-Pty=0 "$@" >"$log" 2>&1; then return 0; fi
    tail -n 25 "$log" | sed 's/^/      | /'
    return 1
}
rgpu_procs() { # PIDs whose command is rgpu (this PID namespace only: /proc is its own)
    local p
    for p in /proc/[0-9]*; do
        [ "$(cat "$p/comm" 2>/dev/null)" = rgpu ] && echo "${p#/proc/}"
    done
    return 0
}
FILES=(/usr/bin/rgpu /usr/lib/rgpu/librgpu_opencl.so /usr/lib/rgpu/librgpu_cuda.so
       /usr/lib/rgpu/librgpu_nvml.so /usr/lib/rgpu/librgpu_nccl.so /usr/lib/rgpu/librgpu_mpi.so
       /usr/share/rgpu/mpi/rgpu_mpi.c
       /etc/rgpu/server.toml /etc/default/rgpu-server /lib/systemd/system/rgpu-server.service
       /usr/share/doc/rgpu/copyright /usr/lib/rgpu/slurm/rgpu-prolog
       /usr/lib/rgpu/slurm/rgpu-epilog /usr/share/rgpu/slurm/rgpu-slurm.conf)
UNIT=/lib/systemd/system/rgpu-server.service
WANTS=/etc/systemd/system/multi-user.target.wants/rgpu-server.service

files_in_place() {
    local f ok=0
    for f in "${FILES[@]}"; do [ -e "$f" ] || { info "missing: $f"; ok=1; }; done
    [ -x /usr/bin/rgpu ] || ok=1
    return $ok
}
outside_ldconfig() {
    # No library of the package in a directory ldconfig scans, and no libcuda.so.1 in its cache.
    ! dpkg -L rgpu | grep -E '^/(usr/)?lib/([^/]+-linux-gnu/)?lib[^/]*\.so' &&
    ! ldconfig -p | grep -E 'libcuda|librgpu'
}
user_ok() {
    local pw
    pw=$(getent passwd rgpu) || { info "no user rgpu"; return 1; }
    info "user: $pw; groups: $(id -nG rgpu)"
    IFS=: read -r _ _ uid gid _ home shell <<<"$pw"
    [ "$uid" -lt 1000 ] && [ "$home" = /var/lib/rgpu ] && [ "$shell" = /usr/sbin/nologin ] &&
        [ "$(getent group rgpu | cut -d: -f3)" = "$gid" ] &&
        { ! getent group video >/dev/null || id -nG rgpu | grep -qw video; } &&
        { ! getent group render >/dev/null || id -nG rgpu | grep -qw render; }
}
etc_rgpu_ok() {
    local s
    s=$(stat -c '%U:%G %a' /etc/rgpu)
    info "/etc/rgpu: $s"
    [ "$s" = "root:rgpu 750" ]
}
conffiles_ok() {
    local c
    c=$(dpkg-query -W -f='${Conffiles}' rgpu)
    grep -q ' /etc/rgpu/server.toml ' <<<"$c" && grep -q ' /etc/default/rgpu-server ' <<<"$c"
}
default_config_ok() {
    # Loopback only and no token: the active settings are listen = "127.0.0.1:7450" and the
    # TLS key pair's place in the service's state directory, nothing else.
    local active expected
    active=$(grep -Ev '^[[:space:]]*(#|$)' /etc/rgpu/server.toml)
    info "active settings of /etc/rgpu/server.toml: $active"
    expected=$(printf '%s\n' 'listen = "127.0.0.1:7450"' \
        'tls_cert = "/var/lib/rgpu/tls/server.crt"' 'tls_key = "/var/lib/rgpu/tls/server.key"')
    [ "$(sort <<<"$active")" = "$(sort <<<"$expected")" ]
}
nothing_running() {
    local pids
    pids=$(rgpu_procs)
    [ -z "$pids" ] || { info "rgpu processes: $pids"; return 1; }
}

case $STAGE in
install)
    echo "== 1. apt-get install $DEB into the fresh root (no systemd)"
    check "apt-get update" apt_quiet update
    before=$(wc -l </var/log/dpkg.log)
    check "apt-get install ./$(basename "$DEB") (fresh root, no systemd installed or running)" \
        apt_quiet install "$DEB"
    info "installed: $(dpkg-query -W -f='${Package} ${Version} ${Status}' rgpu 2>&1);" \
        "with it: $(tail -n +$((before + 1)) /var/log/dpkg.log | awk '$3 == "install" {print $4}' |
            grep -v '^rgpu:' | paste -sd' ')"
    check "files in place (${FILES[*]})" files_in_place
    check "libraries outside ldconfig's directories, no libcuda in its cache" outside_ldconfig
    check "conffiles registered: /etc/rgpu/server.toml, /etc/default/rgpu-server" conffiles_ok
    check "default config: loopback only, no token" default_config_ok
    check "system user and group rgpu (home /var/lib/rgpu, nologin, in video/render where they exist)" user_ok
    check "/etc/rgpu is root:rgpu 0750" etc_rgpu_ok
    check "rgpu-server.service enabled ($WANTS)" test -L "$WANTS"
    check "nothing started by the installation" nothing_running
    check "rgpu --version runs: $(/usr/bin/rgpu --version 2>&1)" eval '/usr/bin/rgpu --version >/dev/null'

    echo "== 2. reinstall with /run/systemd/system present and policy-rc.d forbidding starts"
    # The group render (udev makes it on a real system; a minbase root has none): the
    # postinst of the reinstallation must add rgpu to it.
    getent group render >/dev/null || groupadd --system render
    mkdir -p /run/systemd/system
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    check "apt-get install --reinstall (postinst as on an upgrade; policy-rc.d: 101)" \
        apt_quiet install --reinstall "$DEB"
    rm -f /usr/sbin/policy-rc.d
    rmdir /run/systemd/system /run/systemd 2>/dev/null || true
    check "files in place, /etc/rgpu unchanged" eval 'files_in_place && etc_rgpu_ok >/dev/null'
    check "user rgpu unchanged, now in the group render too" eval 'user_ok && id -nG rgpu | grep -qw render'
    check "nothing started by the reinstallation" nothing_running

    echo "== 3. the unit, with systemd installed in the root (not running)"
    extra=(systemd)
    [ "$POCL" = 1 ] && extra+=(pocl-opencl-icd)
    check "apt-get install ${extra[*]}" apt_quiet install --no-install-recommends "${extra[@]}"
    verify=$(systemd-analyze verify "$UNIT" 2>&1); rc=$?
    [ -z "$verify" ] || info "systemd-analyze verify: $verify"
    check "systemd-analyze verify $UNIT" test "$rc" = 0 -a -z "$verify"
    security=$(systemd-analyze security --offline=true "$UNIT" 2>&1 | tail -n1)
    info "systemd-analyze security --offline=true: $security"
    check "systemd-analyze security: exposure OK or better" eval 'grep -Eq " (SAFE|OK) " <<<"$security"'
    ;;
server)
    echo "== 4. rgpu server --config /etc/rgpu/server.toml as the user rgpu"
    # What systemd gives the service: User=rgpu with its groups, the environment file, the
    # unit's Environment= and its cache directory (CacheDirectory=rgpu).
    install -d -o rgpu -g rgpu -m 0750 /var/cache/rgpu
    unit_env=$(sed -n 's/^Environment=//p' "$UNIT")
    log=/root/check/server.log
    # shellcheck disable=SC2086
    setpriv --reuid=rgpu --regid=rgpu --init-groups --no-new-privs \
        env -i PATH=/usr/bin:/bin HOME=/var/lib/rgpu USER=rgpu LOGNAME=rgpu $unit_env \
        sh -c 'set -a; [ -r /etc/default/rgpu-server ] && . /etc/default/rgpu-server; set +a;
               umask 027; exec /usr/bin/rgpu server --config /etc/rgpu/server.toml' \
        >"$log" 2>&1 </dev/null &
    server=$!
    for _ in $(seq 1 300); do
        grep -q 'rgpu server listening on' "$log" && break
        kill -0 "$server" 2>/dev/null || break
        sleep 0.1
    done
    sed 's/^/      | /' "$log"
    check "the server prints 'rgpu server listening on 127.0.0.1:7450'" \
        grep -q 'rgpu server listening on 127.0.0.1:7450' "$log"
    check "the server runs as user rgpu" \
        eval '[ "$(stat -c %U /proc/$server)" = rgpu ]'
    if [ "$POCL" = 1 ]; then
        devices=$(timeout 120 /usr/bin/rgpu devices 2>&1); rc=$?
        sed 's/^/      | /' <<<"$devices"
        check "rgpu devices lists PoCL's device through the server" \
            eval '[ "$rc" = 0 ] && grep -q "127.0.0.1:7450" <<<"$devices"'
    else
        info "rgpu devices: skipped (--no-pocl)"
    fi
    cuda=$(/usr/bin/rgpu run -- sh -c 'readlink "${LD_LIBRARY_PATH%%:*}/libcuda.so.1"' 2>&1)
    info "rgpu run: libcuda.so.1 -> $cuda"
    check "rgpu run gives programs /usr/lib/rgpu/librgpu_cuda.so as libcuda.so.1" \
        test "$cuda" = /usr/lib/rgpu/librgpu_cuda.so
    nvml=$(/usr/bin/rgpu run -- sh -c 'readlink "${LD_LIBRARY_PATH%%:*}/libnvidia-ml.so.1"' 2>&1)
    info "rgpu run: libnvidia-ml.so.1 -> $nvml"
    check "rgpu run gives programs /usr/lib/rgpu/librgpu_nvml.so as libnvidia-ml.so.1" \
        test "$nvml" = /usr/lib/rgpu/librgpu_nvml.so
    nccl=$(/usr/bin/rgpu run -- sh -c 'readlink "${LD_PRELOAD%%:*}"' 2>&1)
    info "rgpu run: preloaded libnccl.so.2 -> $nccl"
    check "rgpu run preloads /usr/lib/rgpu/librgpu_nccl.so as libnccl.so.2" \
        test "$nccl" = /usr/lib/rgpu/librgpu_nccl.so
    kill -TERM "$server" 2>/dev/null
    if ! timeout 30 tail --pid="$server" -f /dev/null; then
        info "still running 30 s after SIGTERM: SIGKILL"
        kill -KILL "$server" 2>/dev/null
    fi
    rc=0
    wait "$server" || rc=$?
    tail -n 2 "$log" | sed 's/^/      | /'
    check "SIGTERM stops the server cleanly (exit status $rc)" test "$rc" = 0
    ;;
uninstall)
    echo "== 5. apt-get remove, then apt-get purge"
    check "nothing running before the removal" nothing_running
    check "apt-get remove rgpu" apt_quiet remove rgpu
    check "after remove: program and libraries gone" \
        eval '[ ! -e /usr/bin/rgpu ] && [ ! -e /usr/lib/rgpu ] && [ ! -e '"$UNIT"' ]'
    check "after remove: conffiles kept" test -f /etc/rgpu/server.toml -a -f /etc/default/rgpu-server
    check "after remove: unit masked (deb-systemd-helper)" \
        eval '[ "$(readlink /etc/systemd/system/rgpu-server.service)" = /dev/null ]'
    check "apt-get purge rgpu" apt_quiet purge rgpu
    check "after purge: no rgpu process" nothing_running
    left=()
    for f in "${FILES[@]}" /usr/lib/rgpu /usr/share/doc/rgpu /etc/rgpu /var/lib/rgpu /var/cache/rgpu \
        "$WANTS" /etc/systemd/system/rgpu-server.service \
        /var/lib/systemd/deb-systemd-helper-enabled/rgpu-server.service.dsh-also \
        /var/lib/systemd/deb-systemd-helper-enabled/multi-user.target.wants/rgpu-server.service \
        /var/lib/systemd/deb-systemd-helper-masked/rgpu-server.service; do
        if [ -e "$f" ] || [ -L "$f" ]; then left+=("$f"); fi
    done
    [ ${#left[@]} = 0 ] || info "left: ${left[*]}"
    check "after purge: no file of the package left" test ${#left[@]} = 0
    check "after purge: dpkg knows no rgpu" eval '! dpkg-query -W -f="\${Status}" rgpu 2>/dev/null | grep -q installed'
    if getent passwd rgpu >/dev/null; then
        info "the system user rgpu stays (Debian policy: system users are not removed on purge)"
    fi
    ;;
boot)
    echo "== 6. the root booted with systemd (systemd-nspawn): install, the service, purge"
    check "apt-get install ./$(basename "$DEB") (systemd running)" apt_quiet install "$DEB"
    for _ in $(seq 1 100); do
        journalctl -b -u rgpu-server 2>/dev/null | grep -q 'rgpu server listening on 127.0.0.1:7450' && break
        sleep 0.1
    done
    info "rgpu-server.service: $(systemctl is-enabled rgpu-server 2>&1), $(systemctl is-active rgpu-server 2>&1)"
    check "the installation enabled and started rgpu-server.service" \
        eval 'systemctl is-enabled --quiet rgpu-server && systemctl is-active --quiet rgpu-server'
    journalctl -b -u rgpu-server --no-pager -o cat 2>&1 | tail -n 8 | sed 's/^/      | /'
    check "journal: 'rgpu server listening on 127.0.0.1:7450'" \
        eval 'journalctl -b -u rgpu-server -o cat | grep -q "rgpu server listening on 127.0.0.1:7450"'
    main=$(systemctl show -p MainPID --value rgpu-server)
    check "the service runs as user rgpu (main PID $main)" \
        eval '[ "$main" != 0 ] && [ "$(stat -c %U /proc/$main)" = rgpu ]'
    if [ "$POCL" = 1 ]; then
        devices=$(timeout 120 /usr/bin/rgpu devices 2>&1); rc=$?
        sed 's/^/      | /' <<<"$devices"
        check "rgpu devices lists PoCL's device through the service" \
            eval '[ "$rc" = 0 ] && grep -q "127.0.0.1:7450" <<<"$devices"'
        # Buffers and a kernel built (PoCL's LLVM) and run inside the service's sandbox.
        bench=$(cd /tmp && timeout 300 /usr/bin/rgpu bench opencl --servers 127.0.0.1:7450 \
            --sizes 512K --repetitions 1 --json /tmp/bench.json 2>&1); rc=$?
        grep -E 'kernel launch|512.0 KiB' <<<"$bench" | sed 's/^/      | /'
        check "a kernel runs through the sandboxed service (rgpu bench opencl)" test "$rc" = 0
    fi
    systemctl kill -s KILL --kill-whom=main rgpu-server
    for _ in $(seq 1 100); do
        [ "$(systemctl show -p NRestarts --value rgpu-server)" = 1 ] &&
            systemctl is-active --quiet rgpu-server && break
        sleep 0.1
    done
    check "killed, the service is restarted (Restart=on-failure)" \
        eval '[ "$(systemctl show -p NRestarts --value rgpu-server)" = 1 ] && systemctl is-active --quiet rgpu-server'
    check "apt-get purge rgpu (systemd running: prerm stops the service)" apt_quiet purge rgpu
    check "after purge: no rgpu process" nothing_running
    check "after purge: systemd knows no rgpu-server.service" \
        eval '! systemctl cat rgpu-server.service >/dev/null 2>&1 && ! systemctl is-active --quiet rgpu-server'
    left=()
    for f in "${FILES[@]}" /usr/lib/rgpu /etc/rgpu /var/lib/rgpu /var/cache/rgpu /run/rgpu "$WANTS"; do
        if [ -e "$f" ] || [ -L "$f" ]; then left+=("$f"); fi
    done
    [ ${#left[@]} = 0 ] || info "left: ${left[*]}"
    check "after purge: no file of the package left" test ${#left[@]} = 0
    ;;
esac
INNER
chmod 755 "$ROOTFS/root/check/inner.sh"

# Every mount and process below lives in private namespaces: the mounts vanish and every
# process is killed when the check ends.
outer() {
    set -uo pipefail
    local root=$1 deb=$2 pocl=$3 archives=$4
    mount -t proc proc "$root/proc"
    mount -t sysfs sys "$root/sys" 2>/dev/null || mount --rbind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs -o mode=1777 shm "$root/dev/shm"
    mount -t tmpfs -o mode=755 run "$root/run"
    mount --bind "$archives" "$root/var/cache/apt/archives"
    rm -f "$root/etc/resolv.conf"
    cp -L /etc/resolv.conf "$root/etc/resolv.conf"
    [ -s "$root/etc/hosts" ] || printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
    local envv=(env -i HOME=/root USER=root LOGNAME=root TERM=dumb
                PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
    chroot "$root" "${envv[@]}" /root/check/inner.sh install "$deb" "$pocl" </dev/null
    # The server gets a network namespace of its own (only its loopback, up): port 7450 of
    # this machine may be taken, and nothing outside can reach it.
    unshare --net bash -c 'ip link set lo up && exec "$@"' net \
        chroot "$root" "${envv[@]}" /root/check/inner.sh server "$deb" "$pocl" </dev/null
    chroot "$root" "${envv[@]}" /root/check/inner.sh uninstall "$deb" "$pocl" </dev/null
    return 0
}
: >"$ROOTFS/root/check/results"
unshare --mount --pid --fork --kill-child bash -c "$(declare -f outer); outer \"\$@\"" outer \
    "$ROOTFS" "$DEB_IN_ROOT" "$POCL" "$ARCHIVES" || true

# ---------------------------------------------------------------- booted with systemd
# Stage 6: the root (now with systemd, PoCL and the user rgpu, without rgpu) booted as a
# container with its own network; the check runs in it through nsenter.
boot_stage() {
    local log=$BASE/nspawn.log nspawn init='' state rc=0
    assert_unmounted
    systemd-nspawn -D "$ROOTFS" -M rgpu-pkgcheck --register=no --keep-unit --private-network \
        --console=pipe -b </dev/null >"$log" 2>&1 &
    nspawn=$!
    for _ in $(seq 1 150); do
        init=$(pgrep -P "$nspawn" -x systemd | head -n1) || true
        [ -n "$init" ] && break
        kill -0 "$nspawn" 2>/dev/null || break
        sleep 0.2
    done
    local enter=(nsenter -t "${init:-0}" -a env -i HOME=/root LC_ALL=C.UTF-8 SYSTEMD_COLORS=0
                 TERM=dumb PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
    state=
    [ -n "$init" ] && state=$(timeout 120 "${enter[@]}" systemctl is-system-running --wait 2>&1) || true
    if [ "$state" = running ] || [ "$state" = degraded ]; then
        log "booted with systemd-nspawn ($state)"
        "${enter[@]}" /root/check/inner.sh boot "$DEB_IN_ROOT" "$POCL" </dev/null || rc=$?
        "${enter[@]}" systemctl poweroff >/dev/null 2>&1 || true
    else
        tail -n 15 "$log" | sed 's/^/      | /'
        if [ "$BOOT" = 1 ]; then
            echo "FAIL  boot the root with systemd-nspawn (state: ${state:-no init})" | tee -a "$ROOTFS/root/check/results"
        else
            echo "SKIP  stage 6: systemd-nspawn could not boot the root here (state: ${state:-no init})"
        fi
    fi
    if ! timeout 60 tail --pid="$nspawn" -f /dev/null; then
        kill -TERM "$nspawn" 2>/dev/null; sleep 2; kill -KILL "$nspawn" 2>/dev/null || true
    fi
    wait "$nspawn" 2>/dev/null || true
    return $rc
}
if [ "$BOOT" = 1 ] && ! command -v systemd-nspawn >/dev/null; then
    log "host: apt-get install systemd-container (systemd-nspawn, for --boot)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd-container >/dev/null
fi
if [ "$BOOT" = 0 ]; then
    log "stage 6 (booted with systemd) skipped: --no-boot"
elif ! command -v systemd-nspawn >/dev/null; then
    log "stage 6 (booted with systemd) skipped: no systemd-nspawn on this host (--boot installs systemd-container)"
else
    boot_stage || true
fi

# ---------------------------------------------------------------- summary
passed=$(grep -c '^PASS' "$ROOTFS/root/check/results" || true)
failed=$(grep -c '^FAIL' "$ROOTFS/root/check/results" || true)
echo
echo "check-package: $(basename "$DEB") in a fresh Debian 12 root: $passed passed, $failed failed"
grep '^FAIL' "$ROOTFS/root/check/results" || true
if [ "$KEEP" = 0 ]; then
    assert_unmounted
    rm -rf "$ROOTFS"
else
    log "root kept: $ROOTFS"
fi
[ "$failed" = 0 ] && [ "$passed" -gt 0 ]
