#!/usr/bin/env bash
# Builds the Khronos OpenCL-CTS test binaries rgpu runs (tests/cts/run_cts.py) from the pinned
# sources in ../shared/vendor (no network): OpenCL-CTS, OpenCL-Headers, SPIRV-Headers.
#
#   bash scripts/cts-build.sh            # -> target/cts/build/test_conformance/.../test_*
#
# Needs cmake, g++ and the ICD loader's development files (ocl-icd-opencl-dev); setup.sh
# installs them. The build is kept: a second run with the same sources does nothing (it
# rebuilds when a tarball changes). Knobs: RGPU_VENDOR_DIR (default ../shared/vendor),
# RGPU_CTS_DIR (default target/cts), RGPU_CTS_JOBS (default: the number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."
vendor=$(cd "${RGPU_VENDOR_DIR:-../shared/vendor}" && pwd)
dir=${RGPU_CTS_DIR:-target/cts}
jobs=${RGPU_CTS_JOBS:-$(nproc)}
# The groups tests/cts/run_cts.py runs (test_basic only on demand: it takes most of an hour).
targets=(test_api test_compiler test_events test_buffers test_profiling test_computeinfo
         test_commonfns test_basic)

stamp=$(cat "$vendor"/OpenCL-CTS-*.tar.gz "$vendor"/OpenCL-Headers-*.tar.gz \
            "$vendor"/SPIRV-Headers.tar.gz | sha256sum | cut -c1-16)
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
if [ "$(cat "$dir/sources.stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "[cts] unpacking the CTS sources ($stamp)"
    rm -rf "$dir/src" "$dir/build"
    mkdir -p "$dir/src"
    for tarball in "$vendor"/OpenCL-CTS-*.tar.gz "$vendor"/OpenCL-Headers-*.tar.gz \
                   "$vendor"/SPIRV-Headers.tar.gz; do
        tar -xzf "$tarball" -C "$dir/src"
    done
    # The spir test data (zip files) is not in the vendored sources.
    sed -i 's/^\(\s*add_subdirectory( *spir *)\)/# \1  (rgpu: test data not vendored)/' \
        "$dir/src/OpenCL-CTS/test_conformance/CMakeLists.txt"
    echo "$stamp" >"$dir/sources.stamp"
fi
src=$dir/src
# A configuration that did not finish (no Makefile: a missing tool then) is done again.
if [ ! -f "$dir/build/Makefile" ]; then
    echo "[cts] configuring"
    rm -rf "$dir/build"
    cmake -S "$src/OpenCL-CTS" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release \
        -DCL_INCLUDE_DIR="$src/$(basename "$(ls -d "$src"/OpenCL-Headers*)")" \
        -DCL_LIB_DIR=/usr/lib/x86_64-linux-gnu -DOPENCL_LIBRARIES="-lOpenCL -lpthread" \
        -DSPIRV_INCLUDE_DIR="$src/$(basename "$(ls -d "$src"/SPIRV-Headers*)")" \
        -DUSE_CL_EXPERIMENTAL=ON >"$dir/configure.log" 2>&1 ||
        { tail -30 "$dir/configure.log"; exit 1; }
fi
echo "[cts] building ${targets[*]} ($jobs jobs; log: $dir/build.log)"
make -C "$dir/build" -j"$jobs" "${targets[@]}" >"$dir/build.log" 2>&1 ||
    { tail -40 "$dir/build.log"; exit 1; }
for target in "${targets[@]}"; do
    found=$(find "$dir/build/test_conformance" -type f -name "$target" -perm -u+x | head -n1)
    [ -n "$found" ] || { echo "[cts] $target was not built"; exit 1; }
    ln -sf "$found" "$dir/$target"
done
echo "[cts] built: ${targets[*]} (in $dir)"
