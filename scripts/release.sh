#!/usr/bin/env bash
# Makes the files a release of rgpu publishes, checked, in target/release-files/:
#
#   rgpu_<version>_<debian arch>.deb          Debian 12+ and Ubuntu 24.04+ (scripts/package.sh)
#   rgpu-<version>-<arch>-linux.tar.gz        other distributions (glibc of the build machine)
#   SHA256SUMS                                `sha256sum -c SHA256SUMS` checks both
#   RELEASE.md                                version, wire protocol, commit, what was checked
#
# Before writing them it checks: the work tree is clean and, when HEAD carries a tag v*, the
# tag is the crates' version; the .deb passes scripts/check-package.sh (a fresh Debian 12 root:
# install, unit, server as the rgpu user, purge); the tarball, unpacked elsewhere, runs
# `bin/rgpu --version` with the version and protocol of this build and finds its libraries
# relative to itself (`rgpu run` hands a program lib/rgpu/librgpu_cuda.so).
#
#   bash scripts/release.sh                 # build, package, check, write the files
#   bash scripts/release.sh --allow-dirty   # from a work tree with changes (not for a release)
#   bash scripts/release.sh --no-deb-check  # skip check-package.sh (it needs root, debootstrap)
#
# Needs what scripts/package.sh needs (run scripts/setup.sh first), and root for the .deb check.
set -Eeuo pipefail
trap 'echo "release.sh: FAILED at line $LINENO: $BASH_COMMAND" >&2' ERR

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ALLOW_DIRTY=0
DEB_CHECK=1
while [ $# -gt 0 ]; do
    case $1 in
        --allow-dirty) ALLOW_DIRTY=1 ;;
        --no-deb-check) DEB_CHECK=0 ;;
        -h | --help) sed -n '2,/^set -E/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "release.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
log() { echo "[release] $*"; }
die() { echo "release.sh: $*" >&2; exit 1; }
cd "$REPO"
CARGO_BIN=${CARGO_HOME:-$HOME/.cargo}/bin
[ -x "$CARGO_BIN/cargo" ] && case ":$PATH:" in *":$CARGO_BIN:"*) ;; *) export PATH="$CARGO_BIN:$PATH" ;; esac
command -v cargo >/dev/null || die "no cargo: run scripts/setup.sh first"

# ---------------------------------------------------------------- what is released
COMMIT=unknown
DIRTY=""
if command -v git >/dev/null && git rev-parse --git-dir >/dev/null 2>&1; then
    COMMIT=$(git rev-parse --short=12 HEAD)
    if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
        [ "$ALLOW_DIRTY" = 1 ] || die "the work tree has changes: commit them (or --allow-dirty)"
        DIRTY=" (with uncommitted changes)"
    fi
fi
VERSION=$(cargo pkgid -p rgpu-cli | sed 's/.*[#@]//')
[[ $VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+ ]] || die "cannot read the version of rgpu-cli ($VERSION)"
if [ "$COMMIT" != unknown ]; then
    for tag in $(git tag --points-at HEAD 'v*'); do
        [ "$tag" = "v$VERSION" ] || die "HEAD is tagged $tag but the crates say $VERSION"
    done
fi

# ---------------------------------------------------------------- build and package
bash scripts/package.sh
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$TARGET_DIR" ] || TARGET_DIR=$REPO/target
ARCH=$(uname -m)
DEB=$(ls -t "$TARGET_DIR"/debian/rgpu_"$VERSION"_*.deb | head -n1)
TARBALL=$TARGET_DIR/package/rgpu-$VERSION-$ARCH-linux.tar.gz
[ -f "$DEB" ] && [ -f "$TARBALL" ] || die "package.sh made no $DEB or $TARBALL"
SPEAKS=$("$TARGET_DIR/release/rgpu" --version)

# ---------------------------------------------------------------- checks
checked=()
if [ "$DEB_CHECK" = 1 ]; then
    log "scripts/check-package.sh --deb $(basename "$DEB")"
    bash scripts/check-package.sh --deb "$DEB"
    checked+=("the .deb passed scripts/check-package.sh (fresh Debian 12 root: install, unit, server as rgpu, purge)")
fi
UNPACKED=$(mktemp -d "${TMPDIR:-/tmp}/rgpu-release.XXXXXX")
trap 'rm -rf "$UNPACKED"' EXIT
tar -C "$UNPACKED" -xzf "$TARBALL"
UNPACKED_RGPU=$UNPACKED/rgpu-$VERSION/bin/rgpu
got=$(env -u RGPU_LIBRARY_DIR "$UNPACKED_RGPU" --version)
[ "$got" = "$SPEAKS" ] || die "the tarball's rgpu says '$got', the build '$SPEAKS'"
# (No server is needed: `rgpu run` sets the program up and says that none is reachable.)
handed=$(env -u RGPU_LIBRARY_DIR RGPU_SERVERS=127.0.0.1:1 "$UNPACKED_RGPU" run -- \
    sh -c 'readlink -f "${LD_LIBRARY_PATH%%:*}/libcuda.so.1"' 2>/dev/null)
[ "$handed" = "$(readlink -f "$UNPACKED/rgpu-$VERSION/lib/rgpu/librgpu_cuda.so")" ] ||
    die "the unpacked rgpu hands programs '$handed', not its own lib/rgpu/librgpu_cuda.so"
checked+=("the tarball, unpacked elsewhere, runs \`bin/rgpu --version\` ($got) and hands programs its own lib/rgpu/librgpu_cuda.so")

# ---------------------------------------------------------------- the files
FILES=$TARGET_DIR/release-files
rm -rf "$FILES"
mkdir -p "$FILES"
cp "$DEB" "$TARBALL" "$FILES/"
(cd "$FILES" && sha256sum -- *.deb *.tar.gz >SHA256SUMS)
GLIBC=$(sed -n 's/.*(glibc \([0-9.]*\) or newer).*/\1/p' "$UNPACKED/rgpu-$VERSION/INSTALL" | head -n1)
{
    echo "# rgpu $VERSION"
    echo
    echo "- \`rgpu --version\`: $SPEAKS; clients and servers must speak the same protocol."
    echo "- Built from commit $COMMIT$DIRTY on $(. /etc/os-release && echo "$PRETTY_NAME") ($ARCH)."
    echo "- \`$(basename "$DEB")\`: Debian 12+ and Ubuntu 24.04+ (\`sudo apt install ./$(basename "$DEB")\`)."
    echo "- \`$(basename "$TARBALL")\`: other distributions with glibc ${GLIBC:-of the build machine} or newer (INSTALL inside)."
    echo "- \`SHA256SUMS\`: \`sha256sum -c SHA256SUMS\`."
    echo
    echo "Checked before writing these files:"
    echo
    for c in "${checked[@]}"; do echo "- $c"; done
} >"$FILES/RELEASE.md"
log "release files in $FILES:"
(cd "$FILES" && ls -l && cat SHA256SUMS)
