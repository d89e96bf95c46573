#!/usr/bin/env bash
# Installs everything rgpu needs to build, run its demo and pass its tests on a fresh
# Debian/Ubuntu machine: PoCL (a CPU OpenCL driver) + the ocl-icd loader + headers + clinfo + gcc,
# Rust (via rustup, only if cargo is missing), and the Python packages of the test suites.
#
# Idempotent: it checks first and installs only what is missing (a second run does nothing and
# touches no network). Non-interactive. Runs as root (CI) or through sudo otherwise.
# Any failure stops it with a message (set -e + the ERR trap).
#
# Env: PYTHON (default python3) is the interpreter whose packages are checked/installed.
set -Eeuo pipefail
trap 'echo "setup.sh: FAILED at line $LINENO: $BASH_COMMAND" >&2' ERR

PYTHON=${PYTHON:-python3}
PYOPENCL_VERSION=2026.1.4
log() { echo "[setup] $*"; }

# ---------------------------------------------------------------- privileges
if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo -n)
    if ! sudo -n true 2>/dev/null; then
        log "sudo needs a password; asking once"
        sudo -v
    fi
else
    SUDO=()
fi

# ---------------------------------------------------------------- Debian packages
# cmake: only so that `pip download` can prepare the metadata of pyopencl's sdist (whose
# test/ folder tests/pyopencl/run_suite.py runs); scikit-build-core looks for it.
APT_PKGS=(pocl-opencl-icd ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-headers clinfo gcc
          ca-certificates curl cmake)
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    APT_PKGS+=(python3)
fi
if command -v "$PYTHON" >/dev/null 2>&1 && ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
    APT_PKGS+=(python3-pip)
fi
missing=()
for p in "${APT_PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "setup.sh: missing packages ${missing[*]} and no apt-get (not Debian/Ubuntu?)" >&2
        exit 1
    fi
    if [ "$(id -u)" -ne 0 ] && [ ${#SUDO[@]} -eq 0 ]; then
        echo "setup.sh: need root or sudo to install ${missing[*]}" >&2
        exit 1
    fi
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    aptlog=$(mktemp)
    if ! { "${SUDO[@]}" apt-get update -qq &&
           "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
               apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$aptlog" 2>&1; then
        cat "$aptlog" >&2
        rm -f "$aptlog"
        echo "setup.sh: apt-get failed (output above)" >&2
        exit 1
    fi
    rm -f "$aptlog"
else
    log "Debian packages: all present"
fi

# An ICD must be registered, else the loader lists no platform.
if ! ls /etc/OpenCL/vendors/*.icd >/dev/null 2>&1; then
    echo "setup.sh: no /etc/OpenCL/vendors/*.icd after installing pocl-opencl-icd" >&2
    exit 1
fi

# ---------------------------------------------------------------- Rust
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
    log "cargo missing: installing Rust with rustup"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
        | sh -s -- -y -q --profile minimal --component clippy,rustfmt
    export PATH="$HOME/.cargo/bin:$PATH"
fi
if command -v rustup >/dev/null 2>&1; then
    for comp in clippy rustfmt; do
        if ! cargo "${comp/rustfmt/fmt}" --version >/dev/null 2>&1; then
            log "rustup component add $comp"
            rustup component add "$comp" >/dev/null
        fi
    done
fi
log "$(cargo --version)"

# ---------------------------------------------------------------- Python packages
# name-as-imported  pip requirement
PY_PKGS=(
    "numpy numpy"
    "pytest pytest"
    "pytest_timeout pytest-timeout"
    "pyopencl pyopencl==$PYOPENCL_VERSION"
    "mako mako"                             # pyopencl's optional templating (pyopencl.array etc.)
    "scikit_build_core scikit-build-core"   # only to download pyopencl's sdist (its tests)
    "nanobind nanobind"                     # idem
)
py_missing=()
for entry in "${PY_PKGS[@]}"; do
    mod=${entry%% *}
    req=${entry#* }
    if [ "$mod" = pyopencl ]; then
        have=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("pyopencl"))' 2>/dev/null || true)
        [ "$have" = "$PYOPENCL_VERSION" ] && continue
    elif "$PYTHON" -c "import $mod" >/dev/null 2>&1; then
        continue
    fi
    py_missing+=("$req")
done
if [ ${#py_missing[@]} -gt 0 ]; then
    log "pip install ${py_missing[*]}"
    pip_cmd=("$PYTHON" -m pip install -q --disable-pip-version-check)
    # A distribution's own python (PEP 668 "externally managed") refuses plain installs.
    if "$PYTHON" -c 'import sys, sysconfig, os; p=os.path.join(sysconfig.get_paths()["stdlib"], "EXTERNALLY-MANAGED"); sys.exit(0 if os.path.exists(p) and sys.prefix == sys.base_prefix else 1)'; then
        pip_cmd+=(--break-system-packages)
    fi
    if [ "$(id -u)" -ne 0 ] && ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.prefix != sys.base_prefix else 1)' \
        && [ ! -w "$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" ]; then
        pip_cmd+=(--user)
    fi
    "${pip_cmd[@]}" "${py_missing[@]}"
else
    log "Python packages: all present"
fi

# ---------------------------------------------------------------- sanity
n=$(clinfo -l 2>/dev/null | grep -c '^Platform' || true)
if [ "$n" -lt 1 ]; then
    echo "setup.sh: clinfo lists no OpenCL platform (PoCL not working?)" >&2
    clinfo -l >&2 || true
    exit 1
fi
"$PYTHON" -c 'import pyopencl as cl; assert cl.get_platforms()' \
    || { echo "setup.sh: pyopencl sees no OpenCL platform" >&2; exit 1; }
log "ready: $(clinfo -l | grep '^Platform' | sed 's/^Platform #[0-9]*: //' | paste -sd, -)"
