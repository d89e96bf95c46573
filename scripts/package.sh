#!/usr/bin/env bash
# Builds the release packages of rgpu:
#
#   target/debian/rgpu_<version>_<debian arch>.deb           (cargo-deb; see the
#       [package.metadata.deb] section of crates/cli/Cargo.toml): /usr/bin/rgpu, the libraries
#       in the private /usr/lib/rgpu/ (OpenCL, CUDA, NVML, and the MPI interposer built against
#       Open MPI's mpi.h, its source in /usr/share/rgpu/mpi/ for other MPIs), the rgpu-server systemd service, /etc/rgpu/server.toml
#       (loopback only), /etc/default/rgpu-server, and the SLURM prolog and epilog in
#       /usr/lib/rgpu/slurm/ with their example settings in /usr/share/rgpu/slurm/;
#   target/package/rgpu-<version>-<arch>-linux.tar.gz        for other distributions:
#       rgpu-<version>/{bin/rgpu, lib/rgpu/librgpu_{opencl,cuda,nvml,mpi}.so, share/rgpu/mpi/,
#       share/rgpu/{server.toml, rgpu-server.env, rgpu-server.service}, lib/rgpu/slurm/
#       (the SLURM prolog and epilog), share/rgpu/slurm/rgpu-slurm.conf, README.md, INSTALL}
#
# Binaries and libraries are stripped in both (the release profile keeps line tables for the
# developers' backtraces: ~80 MB unstripped, ~9 MB stripped). Both are checked by
# scripts/check-package.sh.
#
#   bash scripts/package.sh                  # cargo build --release, then both packages
#   bash scripts/package.sh --no-build       # package the existing target/release build
#   bash scripts/package.sh --deb-only       # (or --tar-only)
#
# Env: RGPU_DEB_MAINTAINER="Name <address>"  the .deb's Maintainer (default: the placeholder of
#      [package.metadata.deb]); CARGO_DEB_VERSION  the cargo-deb to install when missing.
#
# Needs: cargo (the toolchain rust-toolchain.toml pins), cargo-deb (installed with
# `cargo install cargo-deb --locked` when missing), dpkg-dev (dpkg-shlibdeps, for the .deb's
# Depends) and binutils (strip); run scripts/setup.sh first on a fresh machine. Missing Debian
# packages are apt-get installed when running as root.
set -Eeuo pipefail
trap 'echo "package.sh: FAILED at line $LINENO: $BASH_COMMAND" >&2' ERR

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# cargo-deb 3.x: [package.metadata.deb] as used here (systemd-units with unit-name, revision = "").
CARGO_DEB_VERSION=${CARGO_DEB_VERSION:-3.8.0}
BUILD=1
MAKE_DEB=1
MAKE_TAR=1
while [ $# -gt 0 ]; do
    case $1 in
        --no-build) BUILD=0 ;;
        --deb-only) MAKE_TAR=0 ;;
        --tar-only) MAKE_DEB=0 ;;
        -h | --help) sed -n '2,/^set -E/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "package.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
log() { echo "[package] $*"; }
die() { echo "package.sh: $*" >&2; exit 1; }
cd "$REPO"

CARGO_BIN=${CARGO_HOME:-$HOME/.cargo}/bin
[ -x "$CARGO_BIN/cargo" ] && case ":$PATH:" in *":$CARGO_BIN:"*) ;; *) export PATH="$CARGO_BIN:$PATH" ;; esac
command -v cargo >/dev/null || die "no cargo: run scripts/setup.sh first"

# ---------------------------------------------------------------- tools
apt_missing=()
command -v strip >/dev/null || apt_missing+=(binutils)
command -v "${MPICC:-mpicc}" >/dev/null || apt_missing+=(libopenmpi-dev)
if [ "$MAKE_DEB" = 1 ]; then
    command -v dpkg-shlibdeps >/dev/null || apt_missing+=(dpkg-dev)
fi
if [ ${#apt_missing[@]} -gt 0 ]; then
    [ "$(id -u)" -eq 0 ] || die "missing ${apt_missing[*]}: apt-get install them (as root)"
    log "apt-get install ${apt_missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${apt_missing[@]}" >/dev/null
fi
if [ "$MAKE_DEB" = 1 ]; then
    have=$(cargo deb --version 2>/dev/null | awk '{print $2}') || have=
    case $have in
        3.*) ;;
        *)
            log "cargo install cargo-deb $CARGO_DEB_VERSION${have:+ (found ${have})}"
            cargo install cargo-deb --locked --version "$CARGO_DEB_VERSION"
            ;;
    esac
fi

# ---------------------------------------------------------------- build
VERSION=$(cargo pkgid -p rgpu-cli | sed 's/.*[#@]//')
[[ $VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+ ]] || die "cannot read the version of rgpu-cli ($VERSION)"
ARCH=$(uname -m)
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$TARGET_DIR" ] || TARGET_DIR=$REPO/target
RELEASE=$TARGET_DIR/release
if [ "$BUILD" = 1 ]; then
    log "cargo build --release (rgpu, librgpu_opencl.so, librgpu_cuda.so, librgpu_nvml.so, librgpu_nccl.so)"
    cargo build --release -p rgpu-cli -p rgpu-opencl -p rgpu-cuda -p rgpu-nvml -p rgpu-nccl
    log "MPI interposer (librgpu_mpi.so, against ${MPICC:-mpicc}'s mpi.h)"
    bash scripts/build-mpi.sh "$RELEASE" >/dev/null
fi
for f in rgpu librgpu_opencl.so librgpu_cuda.so librgpu_nvml.so librgpu_nccl.so librgpu_mpi.so; do
    [ -f "$RELEASE/$f" ] || die "no $RELEASE/$f: build it (without --no-build)"
done

# ---------------------------------------------------------------- .deb
if [ "$MAKE_DEB" = 1 ]; then
    log "cargo deb (rgpu $VERSION)"
    # --no-build: cargo-deb would build the rgpu-cli package only, not the three cdylibs of the
    # other workspace members; they were built above. --strip: the release profile has debug = 1.
    maintainer=()
    [ -n "${RGPU_DEB_MAINTAINER:-}" ] && maintainer=(--maintainer "$RGPU_DEB_MAINTAINER")
    cargo deb -p rgpu-cli --no-build --strip "${maintainer[@]}" --output "$TARGET_DIR/debian/"
    DEB=$(ls -t "$TARGET_DIR"/debian/rgpu_"$VERSION"_*.deb | head -n1)
    # The libraries must stay out of ldconfig's directories (librgpu_cuda.so is libcuda.so.1,
    # librgpu_nvml.so libnvidia-ml.so.1, librgpu_nccl.so libnccl.so.2).
    if dpkg-deb -c "$DEB" | awk '{print $6}' |
        grep -E '^\./(usr/)?lib/([^/]+-linux-gnu/)?lib[^/]*\.so' >/dev/null; then
        die "$DEB puts a library in a directory ldconfig scans"
    fi
    log "built $DEB ($(du -h "$DEB" | cut -f1))"
fi

# ---------------------------------------------------------------- tarball
if [ "$MAKE_TAR" = 1 ]; then
    NAME=rgpu-$VERSION
    OUT=$TARGET_DIR/package
    STAGE=$OUT/stage
    TARBALL=$OUT/$NAME-$ARCH-linux.tar.gz
    rm -rf "$STAGE"
    mkdir -p "$STAGE/$NAME/bin" "$STAGE/$NAME/lib/rgpu" "$STAGE/$NAME/share/rgpu"
    install -m 0755 "$RELEASE/rgpu" "$STAGE/$NAME/bin/rgpu"
    install -m 0644 "$RELEASE/librgpu_opencl.so" "$RELEASE/librgpu_cuda.so" "$RELEASE/librgpu_nvml.so" \
        "$RELEASE/librgpu_nccl.so" "$RELEASE/librgpu_mpi.so" "$STAGE/$NAME/lib/rgpu/"
    install -d "$STAGE/$NAME/share/rgpu/mpi"
    install -m 0644 mpi/rgpu_mpi.c mpi/rgpu_mpi.h "$STAGE/$NAME/share/rgpu/mpi/"
    strip --strip-unneeded "$STAGE/$NAME/bin/rgpu" "$STAGE/$NAME/lib/rgpu/"*.so
    install -m 0644 packaging/server.toml packaging/rgpu-server.env "$STAGE/$NAME/share/rgpu/"
    install -d "$STAGE/$NAME/lib/rgpu/slurm" "$STAGE/$NAME/share/rgpu/slurm"
    install -m 0755 packaging/slurm/rgpu-prolog packaging/slurm/rgpu-epilog "$STAGE/$NAME/lib/rgpu/slurm/"
    install -m 0644 packaging/slurm/rgpu-slurm.conf "$STAGE/$NAME/share/rgpu/slurm/"
    # The unit as the INSTALL note below installs rgpu: /usr/local/bin/rgpu.
    sed -e 's|/usr/bin/rgpu |/usr/local/bin/rgpu |' \
        -e "s|file:///usr/share/doc/rgpu/README.md|file:///opt/$NAME/README.md|" packaging/rgpu-server.service \
        >"$STAGE/$NAME/share/rgpu/rgpu-server.service"
    install -m 0644 README.md "$STAGE/$NAME/README.md"
    [ -f LICENSE ] && install -m 0644 LICENSE "$STAGE/$NAME/LICENSE"
    GLIBC=$(objdump -T "$STAGE/$NAME/bin/rgpu" "$STAGE/$NAME/lib/rgpu/"*.so 2>/dev/null |
        grep -o 'GLIBC_[0-9.]*' | sort -t. -k1,1 -k2,2n -k3,3n -u | tail -n1 | sed 's/GLIBC_//')
    cat >"$STAGE/$NAME/INSTALL" <<EOF
rgpu $VERSION for Linux $ARCH (glibc ${GLIBC:-2.34} or newer)

Install (as root) under /opt, with the command on PATH:

  tar -C /opt -xzf $NAME-$ARCH-linux.tar.gz
  ln -sfn /opt/$NAME/bin/rgpu /usr/local/bin/rgpu
  rgpu --version

Keep bin/ and lib/rgpu/ together: rgpu finds librgpu_opencl.so and librgpu_cuda.so in
../lib/rgpu of its own (symlinks resolved) path, or in RGPU_LIBRARY_DIR. Never copy
lib/rgpu/*.so into /usr/lib, /usr/local/lib or any directory ldconfig scans:
librgpu_cuda.so carries the soname libcuda.so.1, librgpu_nvml.so libnvidia-ml.so.1 and
librgpu_nccl.so libnccl.so.2: they would take the place of NVIDIA's driver and NCCL.

Clients need the OpenCL ICD loader (libOpenCL.so.1: ocl-icd-libopencl1 on Debian/Ubuntu,
ocl-icd on Fedora/Arch); servers need it too, plus an OpenCL driver and/or NVIDIA's driver.

The server as a systemd service (user rgpu, config /etc/rgpu/server.toml: loopback only
until you set listen and token_file there):

  groupadd --system rgpu
  useradd --system --gid rgpu --home-dir /var/lib/rgpu --no-create-home \\
      --shell /usr/sbin/nologin rgpu
  for g in video render; do getent group \$g >/dev/null && usermod -aG \$g rgpu; done
  install -d -o root -g rgpu -m 0750 /etc/rgpu
  install -m 0644 /opt/$NAME/share/rgpu/server.toml /etc/rgpu/server.toml
  install -m 0644 /opt/$NAME/share/rgpu/rgpu-server.env /etc/default/rgpu-server
  install -m 0644 /opt/$NAME/share/rgpu/rgpu-server.service /etc/systemd/system/
  systemctl daemon-reload
  systemctl enable --now rgpu-server
  journalctl -u rgpu-server        # "rgpu server listening on 127.0.0.1:7450"

To serve other machines: rgpu token new --group rgpu /etc/rgpu/token, then in
/etc/rgpu/server.toml listen = "0.0.0.0:7450" and token_file = "/etc/rgpu/token",
systemctl restart rgpu-server, and copy the token file to the clients (RGPU_TOKEN_FILE).

Uninstall: systemctl disable --now rgpu-server; rm -rf /opt/$NAME /usr/local/bin/rgpu
/etc/systemd/system/rgpu-server.service /etc/rgpu /etc/default/rgpu-server /var/lib/rgpu
/var/cache/rgpu; userdel rgpu.
EOF
    chmod 0644 "$STAGE/$NAME/INSTALL"
    # Reproducible: sorted names, root-owned, the last commit's time.
    mtime=$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || date +%s)
    tar -C "$STAGE" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$mtime" \
        -cf - "$NAME" | gzip -9n >"$TARBALL.tmp"
    mv "$TARBALL.tmp" "$TARBALL"
    rm -rf "$STAGE"
    log "built $TARBALL ($(du -h "$TARBALL" | cut -f1))"
fi
