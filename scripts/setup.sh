#!/usr/bin/env bash
# Installs everything rgpu needs to build, run its demo and pass its tests, on a Debian or Ubuntu
# machine that may have nothing yet (a minimal Debian 12/13 or Ubuntu 24.04 root has no python3,
# no curl, no gcc):
#
#   - Debian packages: PoCL (a CPU OpenCL driver), the OpenCL ICD loader and headers, clinfo,
#     gcc, g++, make, cmake and spirv-tools (the Khronos CTS), iproute2 + nftables (the
#     liveness tests), SLURM, munge and Open MPI (the cluster tests), python3 with its venv module,
#     ca-certificates (and curl when rustup is needed);
#   - Python: a virtual environment at .venv in the repository (git-ignored) holding numpy,
#     pytest, pyopencl, ...; the system Python is left alone. scripts/demo.sh and scripts/test.sh
#     put .venv/bin first on PATH, so every `python3` they and the tests start is the venv's;
#   - Rust: the toolchain rust-toolchain.toml pins, through rustup (installed into ~/.cargo when
#     missing, or when the only cargo is a distribution's of another version).
#
# Idempotent: it checks first and installs only what is missing (a second run installs nothing
# and touches no network). Non-interactive. Runs as root (CI), through sudo, or as a user with
# sudo (only apt-get needs it; the venv and rustup then belong to the user).
#
# Env: RGPU_VENV     the virtual environment (default <repo>/.venv; a relative path is relative
#                    to the repository); `none` uses the
#                    interpreter below as it is (then its packages must be installable by pip:
#                    not a distribution's "externally managed" python);
#      RGPU_PYTHON   the interpreter that makes the venv (default: PYTHON, else python3);
#      RGPU_SYSTEM_CARGO=1  accept the cargo on PATH even if it is not the pinned version.
set -Eeuo pipefail
trap 'echo "setup.sh: FAILED at line $LINENO: $BASH_COMMAND" >&2' ERR

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"   # a relative RGPU_VENV is relative to the repository, as in demo.sh and test.sh
PYOPENCL_VERSION=2026.1.4
BASE_PYTHON=${RGPU_PYTHON:-${PYTHON:-python3}}
VENV=${RGPU_VENV:-$REPO/.venv}
CARGO_BIN=${CARGO_HOME:-$HOME/.cargo}/bin
log() { echo "[setup] $*"; }
die() { echo "setup.sh: $*" >&2; exit 1; }

# One setup at a time per clone (two test.sh started together would both build .venv).
if command -v flock >/dev/null 2>&1 && mkdir -p "$REPO/target" 2>/dev/null &&
   { exec 9>>"$REPO/target/.setup.lock"; } 2>/dev/null; then
    if ! flock -n 9; then
        log "waiting for another scripts/setup.sh of this clone to finish"
        flock 9
    fi
fi

# ---------------------------------------------------------------- privileges
if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo -n)
else
    SUDO=()
fi

is_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# ---------------------------------------------------------------- what is needed (no network)
# Python: nothing from apt if the venv is there and works; else an interpreter that can make one.
venv_ok() { [ -x "$VENV/bin/python3" ] && "$VENV/bin/python3" -m pip --version >/dev/null 2>&1; }
py_apt=()
if [ "$VENV" = none ]; then
    command -v "$BASE_PYTHON" >/dev/null 2>&1 || [ "$BASE_PYTHON" != python3 ] || py_apt=(python3)
elif ! venv_ok; then
    if ! command -v "$BASE_PYTHON" >/dev/null 2>&1; then
        [ "$BASE_PYTHON" = python3 ] || die "RGPU_PYTHON/PYTHON=$BASE_PYTHON: no such interpreter"
        py_apt=(python3 python3-venv)
    elif [[ "$(readlink -f "$(command -v "$BASE_PYTHON")")" == /usr/bin/* ]]; then
        # The distribution's python3: `-m venv` needs python3-venv (ensurepip and the pip wheel
        # the venv bootstraps its own pip from; Debian's python3 has neither, nor pip).
        # Other interpreters (pyenv, /usr/local, conda) carry their own ensurepip.
        is_installed python3-venv || py_apt=(python3-venv)
    fi
fi

# Rust: the channel rust-toolchain.toml pins; rustup is needed unless the cargo on PATH is it.
CHANNEL=$(sed -n 's/^[[:space:]]*channel[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' \
    "$REPO/rust-toolchain.toml" 2>/dev/null | head -n1)
CHANNEL=${CHANNEL:-stable}
[ -x "$CARGO_BIN/cargo" ] && case ":$PATH:" in *":$CARGO_BIN:"*) ;; *) export PATH="$CARGO_BIN:$PATH" ;; esac
# Whether "rustc X.Y.Z" is the pinned channel (a version channel like 1.99.1 or 1.99).
rust_is_pinned() { [[ $1 == "$CHANNEL" || $1 == "$CHANNEL".* ]] || ! [[ $CHANNEL =~ ^[0-9]+\.[0-9]+ ]]; }
need_rustup=0
if command -v rustup >/dev/null 2>&1; then
    :
elif command -v cargo >/dev/null 2>&1; then
    have=$(rustc --version 2>/dev/null | awk '{print $2}' || true)
    if rust_is_pinned "$have"; then
        :
    elif [ "${RGPU_SYSTEM_CARGO:-0}" = 1 ]; then
        log "Rust: keeping $(command -v cargo) (rustc ${have:-?}) although rust-toolchain.toml pins $CHANNEL (RGPU_SYSTEM_CARGO=1)"
    else
        log "Rust: $(command -v cargo) is rustc ${have:-?}, not the $CHANNEL that rust-toolchain.toml pins (its clippy/rustfmt would judge the code differently);"
        log "      installing rustup into ${CARGO_BIN%/bin}, whose cargo comes first on PATH (RGPU_SYSTEM_CARGO=1 keeps the system one)"
        need_rustup=1
    fi
else
    log "Rust: no cargo on this machine: rustup will install the pinned $CHANNEL"
    need_rustup=1
fi

# ---------------------------------------------------------------- Debian packages
# group: "packages|why"
APT_GROUPS=(
    "pocl-opencl-icd ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-headers clinfo|OpenCL: PoCL (an OpenCL driver for the CPU, what the local rgpu server serves without a GPU), the ICD loader, headers for the C tests and the example, clinfo"
    "gcc libc6-dev|C compiler and C library headers: the linker cargo uses, the crates' build scripts, the C tests and the example"
    "ca-certificates|TLS certificates: cargo (crates.io), pip (PyPI) and rustup download over HTTPS"
    "iproute2 nftables|the liveness tests (tests/test_liveness.py, as root) cut a veth link to a network namespace with nftables rules"
    "cmake|pip needs it to prepare pyopencl's source package, whose test/ folder is pyopencl's own test suite; the Khronos OpenCL-CTS builds with it"
    "g++ make spirv-tools|the Khronos OpenCL-CTS (C++), built from the vendored sources by scripts/cts-build.sh with cmake and make; its test_compiler assembles SPIR-V test kernels (spirv-as)"
    "openmpi-bin libopenmpi-dev|the cluster and MPI tests' ranks (Debian's Open MPI, mpirun), and mpicc with mpi.h for rgpu's MPI interposer (scripts/build-mpi.sh)"
    "slurmctld slurmd slurm-client munge|the cluster tests (tests/test_slurm.py, as root) run a real SLURM cluster on this machine (scripts/slurm-cluster.sh, daemons of its own; the packages' services need an /etc/slurm/slurm.conf, which is not written)"
)
if [ ${#py_apt[@]} -gt 0 ]; then
    APT_GROUPS+=("${py_apt[*]}|Python 3 and its venv module: the tests and tools are Python; their packages go into a virtual environment ($VENV), which gets its own pip (the distribution's python3 has none)")
fi
if [ $need_rustup = 1 ]; then
    APT_GROUPS+=("curl|to download rustup, the Rust installer")
fi
missing=()
for g in "${APT_GROUPS[@]}"; do
    gm=()
    for p in ${g%%|*}; do is_installed "$p" || gm+=("$p"); done
    if [ ${#gm[@]} -gt 0 ]; then
        log "installing ${gm[*]} (apt) -- ${g#*|}"
        missing+=("${gm[@]}")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 ||
        die "missing packages ${missing[*]} and no apt-get (not Debian/Ubuntu?); install them yourself"
    if [ "$(id -u)" -ne 0 ]; then
        [ ${#SUDO[@]} -gt 0 ] || die "need root or sudo to install ${missing[*]}"
        if ! sudo -n true 2>/dev/null; then
            log "sudo needs a password (for apt-get); asking once"
            sudo -v
        fi
    fi
    aptlog=$(mktemp)
    apt_get=("${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600)
    log "apt-get update (output only on failure)"
    if ! "${apt_get[@]}" update -qq >"$aptlog" 2>&1; then
        cat "$aptlog" >&2
        die "apt-get update failed (output above)"
    fi
    unavailable=()
    for p in "${missing[@]}"; do
        apt-cache show --no-all-versions "$p" >/dev/null 2>&1 || unavailable+=("$p")
    done
    if [ ${#unavailable[@]} -gt 0 ]; then
        msg="apt knows no package ${unavailable[*]}."
        if grep -qi ubuntu /etc/os-release 2>/dev/null; then
            msg+=" On Ubuntu, PoCL and clinfo are in the 'universe' component: enable it"
            msg+=" (add universe to 'Components:' in /etc/apt/sources.list.d/ubuntu.sources, or"
            msg+=" sudo add-apt-repository universe) and run this again."
        fi
        die "$msg"
    fi
    log "apt-get install --no-install-recommends ${missing[*]} (can take minutes; output only on failure)"
    if ! "${apt_get[@]}" install -y -qq --no-install-recommends "${missing[@]}" >"$aptlog" 2>&1; then
        cat "$aptlog" >&2
        die "apt-get install failed (output above)"
    fi
    rm -f "$aptlog"
else
    log "Debian packages: all present"
fi

# An ICD must be registered, else the loader lists no platform.
if ! ls /etc/OpenCL/vendors/*.icd >/dev/null 2>&1; then
    die "no /etc/OpenCL/vendors/*.icd after installing pocl-opencl-icd"
fi

# ---------------------------------------------------------------- Rust
if [ $need_rustup = 1 ]; then
    log "installing rustup into ${CARGO_BIN%/bin} (the Rust toolchain installer; it also adds ${CARGO_BIN%/bin}/env to your shell profile)"
    init=$(mktemp)
    # sh.rustup.rs serves static.rust-lang.org/rustup/rustup-init.sh; the second is the fallback
    # where only static.rust-lang.org is reachable.
    if ! curl --proto '=https' --tlsv1.2 -sSf -o "$init" https://sh.rustup.rs 2>/dev/null; then
        log "sh.rustup.rs unreachable; fetching the same script from static.rust-lang.org"
        curl --proto '=https' --tlsv1.2 -sSf -o "$init" https://static.rust-lang.org/rustup/rustup-init.sh ||
            die "cannot download rustup's installer from sh.rustup.rs or static.rust-lang.org (network? a proxy whose CA is not trusted?)"
    fi
    # (It would warn about a cargo of the distribution; that was said above.)
    RUSTUP_INIT_SKIP_PATH_CHECK=yes sh "$init" -y -q --default-toolchain none --profile minimal
    rm -f "$init"
    export PATH="$CARGO_BIN:$PATH"
    command -v rustup >/dev/null 2>&1 || die "rustup was installed but is not in $CARGO_BIN"
fi
if command -v rustup >/dev/null 2>&1; then
    toolchains=$(rustup toolchain list 2>/dev/null || true)
    if ! grep -q "^$CHANNEL-" <<<"$toolchains"; then
        log "installing Rust $CHANNEL with clippy and rustfmt (rustup toolchain install; pinned by rust-toolchain.toml)"
        rustup toolchain install "$CHANNEL" --profile minimal -c clippy -c rustfmt
    else
        installed=$(rustup component list --toolchain "$CHANNEL" --installed 2>/dev/null || true)
        for comp in clippy rustfmt; do
            if ! grep -q "^$comp" <<<"$installed"; then
                log "installing $comp for Rust $CHANNEL (rustup component add)"
                rustup component add --toolchain "$CHANNEL" "$comp"
            fi
        done
    fi
    # Outside the repository (no rust-toolchain.toml) cargo needs a default toolchain.
    if ! default=$(rustup default 2>&1) || grep -qi 'no default' <<<"$default"; then
        log "rustup default $CHANNEL (there was no default toolchain)"
        rustup default "$CHANNEL" >/dev/null 2>&1
    fi
fi
cargo_version=$(cd "$REPO" && cargo --version) || die "cargo does not run in $REPO"
log "Rust: $cargo_version ($(cd "$REPO" && command -v cargo))"
if [[ $CHANNEL =~ ^[0-9]+\.[0-9]+ ]] && ! [[ $cargo_version == "cargo $CHANNEL"* ]] &&
   [ "${RGPU_SYSTEM_CARGO:-0}" != 1 ]; then
    die "cargo in $REPO is '$cargo_version', not the $CHANNEL that rust-toolchain.toml pins" \
        "(RUSTUP_TOOLCHAIN set? another cargo before $CARGO_BIN on PATH?)"
fi

# ---------------------------------------------------------------- Python
if [ "$VENV" = none ]; then
    PY=$BASE_PYTHON
    command -v "$PY" >/dev/null 2>&1 || die "no $PY"
elif venv_ok; then
    PY=$VENV/bin/python3
else
    if [ -e "$VENV" ]; then
        log "recreating the virtual environment $VENV (it is there but its python or pip does not run)"
        "$BASE_PYTHON" -m venv --clear "$VENV"
    else
        log "creating the virtual environment $VENV ($BASE_PYTHON -m venv): the Python packages of the tests go there, not into the system Python"
        "$BASE_PYTHON" -m venv "$VENV"
    fi
    PY=$VENV/bin/python3
    venv_ok || die "$VENV was made but its pip does not run"
fi

# name-as-imported  pip requirement
PY_PKGS=(
    "numpy numpy"
    "pytest pytest"
    "pytest_timeout pytest-timeout"
    "pyopencl pyopencl==$PYOPENCL_VERSION"
    "mako mako"                             # pyopencl's optional templating (pyopencl.array etc.)
    "scikit_build_core scikit-build-core"   # only to download pyopencl's sdist (its tests)
    "nanobind nanobind"                     # idem
    "pynvml nvidia-ml-py"                   # NVIDIA's NVML bindings: tests/test_nvml.py drives rgpu's NVML with them
)
py_missing=()
for entry in "${PY_PKGS[@]}"; do
    mod=${entry%% *}
    req=${entry#* }
    if [ "$mod" = pyopencl ]; then
        have=$("$PY" -c 'import importlib.metadata as m; print(m.version("pyopencl"))' 2>/dev/null || true)
        [ "$have" = "$PYOPENCL_VERSION" ] && continue
    elif "$PY" -c "import $mod" >/dev/null 2>&1; then
        continue
    fi
    py_missing+=("$req")
done
if [ ${#py_missing[@]} -gt 0 ]; then
    log "installing ${py_missing[*]} (pip, into $("$PY" -c 'import sys; print(sys.prefix)')) -- the Python tests, pyopencl and its test suite"
    "$PY" -m pip install -q --disable-pip-version-check "${py_missing[@]}" || {
        if [ "$VENV" = none ]; then
            die "pip could not install into $PY (a distribution's externally managed python?); use the default venv (unset RGPU_VENV)"
        fi
        die "pip install failed"
    }
else
    log "Python packages: all present ($("$PY" -c 'import sys; print(sys.prefix)'))"
fi

# ---------------------------------------------------------------- sanity
n=$(clinfo -l 2>/dev/null | grep -c '^Platform' || true)
if [ "$n" -lt 1 ]; then
    clinfo -l >&2 || true
    die "clinfo lists no OpenCL platform (PoCL not working?)"
fi
"$PY" -c 'import pyopencl as cl; assert cl.get_platforms()' ||
    die "pyopencl ($PY) sees no OpenCL platform"
log "ready: $(clinfo -l | grep '^Platform' | sed 's/^Platform #[0-9]*: //' | paste -sd, -); python: $PY"
