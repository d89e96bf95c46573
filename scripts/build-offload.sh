#!/usr/bin/env bash
# Builds the directive-based test programs (tests/offload: OpenACC and OpenMP target offload)
# with Debian 12's GCC 12 nvptx offload compiler, into a small self-contained folder to carry
# to the GPU machine, where scripts/gpu-offload-check.sh runs them natively and through rgpu.
#
#   bash scripts/build-offload.sh                 # -> offload-dist/
#   OFFLOAD_DIST=/tmp/od OFFLOAD_ISA=sm_75 bash scripts/build-offload.sh
#   HOST_CHECK=1 bash scripts/build-offload.sh    # also runs small builds here (host fallback)
#
# Needs (Debian 12): gcc-12, gcc-12-offload-nvptx (pulls nvptx-tools, newlib-nvptx) and
# libgomp-plugin-nvptx1:
#   apt-get install -y gcc-12-offload-nvptx libgomp-plugin-nvptx1
# No CUDA toolkit is needed: the device code is PTX (GCC's nvptx backend, -misa=$OFFLOAD_ISA,
# default sm_80 = PTX ISA 7.0; GCC 12 knows nothing newer), embedded in each binary and
# JIT-compiled by the driver (for sm_90 on an H100/H200) when libgomp's nvptx plugin links it
# with cuLinkCreate/cuLinkAddData/cuLinkComplete and loads it with cuModuleLoadData.
#
# Output:
#   offload-dist/bin/{acc_matmul,acc_jacobi,acc_reduce,omp_target}  (stripped; DT_RPATH
#       $ORIGIN/../lib, so they use the libgomp below, not the GPU machine's own, and libgomp
#       finds its plugin there too: glibc searches the executable's DT_RPATH for dlopen)
#   offload-dist/lib/libgomp.so.1, libgomp-plugin-nvptx.so.1   (GCC 12's, stripped; they
#       need only glibc >= 2.34; the plugin dlopens libcuda.so.1, found on LD_LIBRARY_PATH,
#       which is where `rgpu run` puts rgpu's)
#   offload-dist/BUILDINFO  (compiler, flags, PTX target, sizes)
set -euo pipefail
cd "$(dirname "$0")/.."
dist=${OFFLOAD_DIST:-offload-dist}
isa=${OFFLOAD_ISA:-sm_80}
cc=${CC:-gcc-12}
libdir=/usr/lib/x86_64-linux-gnu

missing=()
command -v "$cc" >/dev/null || missing+=("$cc")
command -v x86_64-linux-gnu-accel-nvptx-none-gcc-12 >/dev/null || missing+=(gcc-12-offload-nvptx)
[ -e $libdir/libgomp-plugin-nvptx.so.1 ] || missing+=(libgomp-plugin-nvptx1)
if [ ${#missing[@]} -gt 0 ]; then
    echo "missing: ${missing[*]} (apt-get install -y gcc-12-offload-nvptx libgomp-plugin-nvptx1)" >&2
    exit 1
fi

rm -rf "$dist"
mkdir -p "$dist/bin" "$dist/lib"
# -no-pie: GCC 12's offload table object is not PIC (a PIE gets DT_TEXTREL warnings).
common=(-O2 -no-pie -Wall -Wno-unknown-pragmas -Itests/offload
    "-foffload-options=nvptx-none=-misa=$isa -lm"
    -Wl,--disable-new-dtags,-rpath,'$ORIGIN/../lib')

build() { # build NAME MODEL-FLAG [EXTRA...]
    local name=$1 model=$2
    shift 2
    echo "building $name ($model, nvptx -misa=$isa)"
    "$cc" "${common[@]}" "$model" -foffload=nvptx-none "$@" \
        -o "$dist/bin/$name" "tests/offload/$name.c" -lm
}
build acc_matmul -fopenacc
build acc_jacobi -fopenacc
build acc_reduce -fopenacc
build omp_target -fopenmp
strip "$dist"/bin/*

# The runtime: GCC 12's libgomp and its nvptx plugin (they must be the same version).
cp -L $libdir/libgomp.so.1 "$dist/lib/libgomp.so.1"
cp -L $libdir/libgomp-plugin-nvptx.so.1 "$dist/lib/libgomp-plugin-nvptx.so.1"
strip --strip-unneeded "$dist"/lib/*.so.1

# Everything the binaries need beyond glibc must be in lib/.
for f in "$dist"/bin/* "$dist"/lib/*; do
    for need in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        case $need in
        libc.so.6 | libm.so.6 | ld-linux-x86-64.so.2) ;;
        *) [ -e "$dist/lib/$need" ] || { echo "error: $f needs $need, not in $dist/lib" >&2; exit 1; } ;;
        esac
    done
done
glibc_max=$(objdump -T "$dist"/bin/* "$dist"/lib/* | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n1)

{
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
    echo "compiler: $("$cc" --version | head -n1); offload: $(dpkg-query -W -f='${Package} ${Version}' gcc-12-offload-nvptx 2>/dev/null)"
    echo "runtime: libgomp1 $(dpkg-query -W -f='${Version}' libgomp1 2>/dev/null), libgomp-plugin-nvptx1 $(dpkg-query -W -f='${Version}' libgomp-plugin-nvptx1 2>/dev/null)"
    echo "flags: ${common[*]} {-fopenacc|-fopenmp} -foffload=nvptx-none"
    echo "newest glibc symbol version needed: $glibc_max"
    for f in "$dist"/bin/*; do
        echo "$(basename "$f"): PTX $(strings "$f" | grep -m1 '^\.version') $(strings "$f" | grep -m1 '^\.target'), $(stat -c %s "$f") bytes"
    done
} >"$dist/BUILDINFO"
cat "$dist/BUILDINFO"
du -sh "$dist"

# Optionally: small builds run here, where there is no GPU (libgomp falls back to the host),
# to check the programs' logic and output.
if [ -n "${HOST_CHECK:-}" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    for name in acc_matmul acc_jacobi acc_reduce omp_target; do
        model=-fopenacc
        [ "$name" = omp_target ] && model=-fopenmp
        "$cc" "${common[@]}" "$model" -foffload=nvptx-none -DN=256 -DITERS=200 \
            -o "$tmp/$name" "tests/offload/$name.c" -lm
        if "$tmp/$name" >"$tmp/$name.out" 2>&1 && grep -q "^PASS $name" "$tmp/$name.out"; then
            echo "host check: PASS $name ($(grep -c '^CHECK' "$tmp/$name.out") CHECK lines)"
        else
            echo "host check: FAIL $name"
            sed 's/^/    /' "$tmp/$name.out"
            exit 1
        fi
    done
fi
