#!/usr/bin/env python3
"""Generates rgpu's CUDA driver API tables: one list of the driver API drives the client's
exports, its cuGetProcAddress table, and the server's native function table.

Inputs:
  crates/cuda-api/data/driver-symbols.txt   every symbol the real libcuda.so.1 exports (CUDA 13.0,
                                            driver 580), one per line
  crates/cuda-api/data/proc-versions.txt    `name version symbol [ptds]`: which exported symbol
                                            cuGetProcAddress(name, version, flags) hands out
  cudarc's src/driver/sys/mod.rs            the Rust signature of every function (cuda-13000)
  crates/cuda/src/api/**/*.rs               the entry points the client implements
                                            (`pub unsafe extern "C" fn cuX`)

Writes:
  crates/cuda-api/src/generated.rs   `for_each_driver_function!` (name and parameters of every
                                     function), `PROC_VERSIONS`, `RESULT_NAMES`
  crates/cuda/src/generated_exports.rs   a stub for every symbol the client does not implement
                                     (reports NOT_SUPPORTED and logs its name once) and
                                     `EXPORTS`, every exported symbol by name

Usage:
  tools/gen_cuda_api.py                 regenerate
  tools/gen_cuda_api.py --check         exit 1 if a checked-in file differs (CI)
  tools/gen_cuda_api.py --import-driver cudaTypedefs.h symbols.txt
        refresh the two data files from a CUDA toolkit's cudaTypedefs.h and the output of
        `nm -D --defined-only libcuda.so.1 | awk '{print $3}'` (run on a machine with CUDA)
"""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
API_DIR = REPO_ROOT / "crates" / "cuda-api"
SYMBOLS_FILE = API_DIR / "data" / "driver-symbols.txt"
VERSIONS_FILE = API_DIR / "data" / "proc-versions.txt"
API_OUTPUT = API_DIR / "src" / "generated.rs"
CLIENT_DIR = REPO_ROOT / "crates" / "cuda"
CLIENT_OUTPUT = CLIENT_DIR / "src" / "generated_exports.rs"
CUDA_FEATURE = "cuda-13000"


class GenError(Exception):
    pass


def find_cudarc_dir():
    try:
        raw = subprocess.run(
            ["cargo", "metadata", "--format-version", "1"],
            cwd=REPO_ROOT, check=True, capture_output=True, text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        raise GenError(f"cargo metadata failed: {err}; run `cargo fetch` first")
    meta = json.loads(raw)
    found = [p for p in meta["packages"] if p["name"] == "cudarc"]
    if len(found) != 1:
        raise GenError(f"expected one cudarc package in cargo metadata, found {len(found)}")
    return Path(found[0]["manifest_path"]).parent, found[0]["version"]


def live(cfg_lines):
    """Whether a declaration preceded by these #[cfg(...)] lines exists for CUDA_FEATURE."""
    for cfg in cfg_lines:
        features = re.findall(r'feature = "([\w-]+)"', cfg)
        versions = [f for f in features if f.startswith("cuda-")]
        if not versions:
            continue
        negated = cfg.startswith("#[cfg(not(")
        present = CUDA_FEATURE in versions
        if present == negated:
            return False
    return True


def parse_cudarc(sys_source):
    """name -> parameter list text, for every `pub unsafe fn cuX(...) -> CUresult`."""
    functions = {}
    lines = sys_source.splitlines()
    cfgs = []
    for line in lines:
        if line.startswith("#[cfg("):
            cfgs.append(line)
            continue
        match = re.match(r"pub unsafe fn (cu\w+)\((.*)\) -> CUresult \{$", line)
        if match and live(cfgs):
            functions[match.group(1)] = match.group(2)
        cfgs = []
    enums = parse_enums(lines)
    results = {value: name for name, value in enums.get("cudaError_enum", [])}
    if not functions or not results:
        raise GenError("no driver functions or CUresult values found in cudarc's sys module")
    return functions, results, enums


def parse_enums(lines):
    """enum name -> [(variant, value)] for every `pub enum` live for CUDA_FEATURE."""
    enums = {}
    cfgs = []
    current = None
    for line in lines:
        if current is not None:
            if line.startswith("}"):
                current = None
                continue
            variant = re.match(r"\s+(\w+) = (\d+),", line)
            if variant:
                enums[current].append((variant.group(1), int(variant.group(2))))
            continue
        if line.startswith("#["):
            if line.startswith("#[cfg("):
                cfgs.append(line)
            continue
        match = re.match(r"pub enum (\w+) \{$", line)
        if match and live(cfgs):
            current = match.group(1)
            enums[current] = []
        cfgs = []
    return enums


def base_symbol(symbol):
    return re.sub(r"_(ptds|ptsz)$", "", symbol)


# Older versions of entry points that programs still call by these names (cudarc binds only
# each function's newest version); parameters as cuda.h of CUDA 12/13 declares them.
LEGACY_SIGNATURES = {
    "cuCtxCreate_v2": "pctx: *mut CUcontext, flags: ::core::ffi::c_uint, dev: CUdevice",
    "cuCtxCreate_v3": "pctx: *mut CUcontext, paramsArray: *mut CUexecAffinityParam, "
                      "numParams: ::core::ffi::c_int, flags: ::core::ffi::c_uint, dev: CUdevice",
    "cuDeviceGetUuid": "uuid: *mut CUuuid, dev: CUdevice",
    "cuDevicePrimaryCtxRelease": "dev: CUdevice",
    "cuDevicePrimaryCtxReset": "dev: CUdevice",
    "cuDevicePrimaryCtxSetFlags": "dev: CUdevice, flags: ::core::ffi::c_uint",
    "cuEventElapsedTime": "pMilliseconds: *mut f32, hStart: CUevent, hEnd: CUevent",
    "cuGraphGetEdges": "hGraph: CUgraph, from: *mut CUgraphNode, to: *mut CUgraphNode, "
                       "numEdges: *mut usize",
    "cuGraphInstantiate": "phGraphExec: *mut CUgraphExec, hGraph: CUgraph, "
                          "phErrorNode: *mut CUgraphNode, logBuffer: *mut ::core::ffi::c_char, "
                          "bufferSize: usize",
    "cuGraphInstantiate_v2": "phGraphExec: *mut CUgraphExec, hGraph: CUgraph, "
                             "phErrorNode: *mut CUgraphNode, logBuffer: *mut ::core::ffi::c_char, "
                             "bufferSize: usize",
    "cuGraphAddKernelNode": "phGraphNode: *mut CUgraphNode, hGraph: CUgraph, "
                            "dependencies: *const CUgraphNode, numDependencies: usize, "
                            "nodeParams: *const CUDA_KERNEL_NODE_PARAMS_v1",
    "cuGraphKernelNodeSetParams": "hNode: CUgraphNode, nodeParams: *const CUDA_KERNEL_NODE_PARAMS_v1",
    "cuGraphKernelNodeGetParams": "hNode: CUgraphNode, nodeParams: *mut CUDA_KERNEL_NODE_PARAMS_v1",
    "cuGraphExecKernelNodeSetParams": "hGraphExec: CUgraphExec, hNode: CUgraphNode, "
                                      "nodeParams: *const CUDA_KERNEL_NODE_PARAMS_v1",
    "cuGraphAddDependencies": "hGraph: CUgraph, from: *const CUgraphNode, to: *const CUgraphNode, "
                              "numDependencies: usize",
    "cuGraphRemoveDependencies": "hGraph: CUgraph, from: *const CUgraphNode, "
                                 "to: *const CUgraphNode, numDependencies: usize",
    "cuGraphNodeGetDependencies": "hNode: CUgraphNode, dependencies: *mut CUgraphNode, "
                                  "numDependencies: *mut usize",
    "cuGraphNodeGetDependentNodes": "hNode: CUgraphNode, dependentNodes: *mut CUgraphNode, "
                                    "numDependentNodes: *mut usize",
    "cuGraphAddNode": "phGraphNode: *mut CUgraphNode, hGraph: CUgraph, "
                      "dependencies: *const CUgraphNode, numDependencies: usize, "
                      "nodeParams: *mut CUgraphNodeParams",
    "cuGraphExecUpdate": "hGraphExec: CUgraphExec, hGraph: CUgraph, hErrorNode_out: *mut CUgraphNode, "
                         "updateResult_out: *mut CUgraphExecUpdateResult",
    "cuStreamGetCaptureInfo": "hStream: CUstream, captureStatus_out: *mut CUstreamCaptureStatus, "
                              "id_out: *mut cuuint64_t",
    "cuStreamUpdateCaptureDependencies": "hStream: CUstream, dependencies: *mut CUgraphNode, "
                                         "numDependencies: usize, flags: ::core::ffi::c_uint",
    "cuEventDestroy": "hEvent: CUevent",
    "cuStreamDestroy": "hStream: CUstream",
    "cuIpcOpenMemHandle": "pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, "
                          "Flags: ::core::ffi::c_uint",
    "cuGetProcAddress": "symbol: *const ::core::ffi::c_char, pfn: *mut *mut ::core::ffi::c_void, "
                        "cudaVersion: ::core::ffi::c_int, flags: cuuint64_t",
    "cuStreamBeginCapture": "hStream: CUstream",
    "cuMemPrefetchAsync": "devPtr: CUdeviceptr, count: usize, dstDevice: CUdevice, hStream: CUstream",
    "cuMemAdvise": "devPtr: CUdeviceptr, count: usize, advice: CUmem_advise, device: CUdevice",
    "cuLinkCreate": "numOptions: ::core::ffi::c_uint, options: *mut CUjit_option, "
                    "optionValues: *mut *mut ::core::ffi::c_void, stateOut: *mut CUlinkState",
    "cuLinkAddData": "state: CUlinkState, type_: CUjitInputType, data: *mut ::core::ffi::c_void, "
                     "size: usize, name: *const ::core::ffi::c_char, numOptions: ::core::ffi::c_uint, "
                     "options: *mut CUjit_option, optionValues: *mut *mut ::core::ffi::c_void",
    "cuLinkAddFile": "state: CUlinkState, type_: CUjitInputType, path: *const ::core::ffi::c_char, "
                     "numOptions: ::core::ffi::c_uint, options: *mut CUjit_option, "
                     "optionValues: *mut *mut ::core::ffi::c_void",
    "cuStreamGetCaptureInfo_v2": "hStream: CUstream, captureStatus_out: *mut CUstreamCaptureStatus, "
                                 "id_out: *mut cuuint64_t, graph_out: *mut CUgraph, "
                                 "dependencies_out: *mut *const CUgraphNode, "
                                 "numDependencies_out: *mut usize",
}


def signature_of(symbol, functions):
    """The parameters of `symbol` (or of the entry point it is a per-thread variant of); None
    when unknown ("" is a function without parameters)."""
    for name in (symbol, base_symbol(symbol)):
        for table in (functions, LEGACY_SIGNATURES):
            if table.get(name) is not None:
                return table[name]
    return None


def import_driver(typedefs_path, symbols_path):
    """Refreshes the data files from cudaTypedefs.h and libcuda's symbol list."""
    symbols = sorted({s.strip() for s in Path(symbols_path).read_text().split() if s.startswith("cu")})
    pfns = {}
    for name, version, ptds in re.findall(
        r"PFN_(cu\w+?)_v(\d+)(_ptds|_ptsz)?\)", Path(typedefs_path).read_text()
    ):
        pfns.setdefault((name, bool(ptds)), set()).add(int(version))
    rows = []
    unmatched = []
    for (name, ptds), versions in sorted(pfns.items()):
        variants = [
            s for s in symbols
            if re.fullmatch(re.escape(name) + r"(_v\d+)?" + ("(_ptds|_ptsz)" if ptds else ""), s)
        ]
        variants.sort(key=lambda s: int((re.search(r"_v(\d+)", s[len(name):]) or [0, 1])[1]))
        versions = sorted(versions)
        if not variants:
            unmatched.append(name)
            continue
        if len(variants) < len(versions):
            # Older versions than the oldest exported symbol fall to it.
            variants = [variants[0]] * (len(versions) - len(variants)) + variants
        for version, symbol in zip(versions, variants[len(variants) - len(versions):]):
            rows.append(f"{name} {version} {symbol}{' ptds' if ptds else ''}")
    SYMBOLS_FILE.write_text("\n".join(symbols) + "\n")
    VERSIONS_FILE.write_text("\n".join(rows) + "\n")
    print(f"{len(symbols)} symbols, {len(rows)} versioned names; no exported symbol for: "
          f"{' '.join(unmatched) or 'none'}", file=sys.stderr)


# Where the driver's answer does not follow from cudaTypedefs.h: from CUDA 12.0 on,
# cuGetProcAddress("cuGraphInstantiate") hands out cuGraphInstantiateWithFlags (cuda.h maps the
# name so), not the older cuGraphInstantiate_v2.
PROC_OVERRIDES = [("cuGraphInstantiate", 12000, "cuGraphInstantiateWithFlags", False)]


def load_data():
    symbols = [s for s in SYMBOLS_FILE.read_text().split() if s]
    versions = []
    for line in VERSIONS_FILE.read_text().splitlines():
        parts = line.split()
        versions.append((parts[0], int(parts[1]), parts[2], len(parts) > 3))
    return symbols, versions


def find_implemented(api_dir):
    implemented = set()
    for path in sorted(Path(api_dir).rglob("*.rs")):
        implemented |= set(re.findall(r'pub unsafe fn (cu\w+)', path.read_text()))
    return implemented


def header(what, cudarc_version):
    return (
        f"// @generated by tools/gen_cuda_api.py from the driver symbol list in crates/cuda-api/data "
        f"and cudarc {cudarc_version} ({CUDA_FEATURE}).\n// {what}\n// Do not edit by hand: "
        "change the generator or its inputs and rerun it.\n\n"
    )


# Enums whose values arrive as integers (from the wire or a caller) and must be checked before
# they become Rust enums: `(cudarc enum, conversion function)`.
CHECKED_ENUMS = [
    ("CUdevice_attribute_enum", "device_attribute"),
    ("CUfunction_attribute_enum", "function_attribute"),
    ("CUlimit_enum", "limit"),
    ("CUpointer_attribute_enum", "pointer_attribute"),
    ("CUfunc_cache_enum", "func_cache"),
    ("cudaError_enum", "result"),
]


def render_api(symbols, functions, versions, results, enums, cudarc_version):
    out = [header("The CUDA driver API as rgpu knows it.", cudarc_version)]
    out.append("use crate::sys::*;\n\n")
    out.append(
        "/// Calls `$m! { name(param: Type, ...); ... }` with every driver function of the list\n"
        "/// that has a known signature (each returns `CUresult`).\n"
        "#[macro_export]\nmacro_rules! for_each_driver_function {\n    ($m:ident) => {\n"
        "        $m! {\n"
    )
    for symbol in symbols:
        params = signature_of(symbol, functions)
        if params is None:
            continue
        out.append(f"            {symbol}({params});\n")
    out.append("        }\n    };\n}\n\n")
    out.append(
        "/// `(name, version, symbol, per-thread-stream)`: cuGetProcAddress(name, version) hands out\n"
        "/// the symbol of the highest version not above the one asked for. Sorted by name, version.\n"
        f"pub const PROC_VERSIONS: &[(&str, u32, &str, bool)] = &[\n"
    )
    for name, version, symbol, ptds in sorted(versions + PROC_OVERRIDES):
        out.append(f'    ("{name}", {version}, "{symbol}", {"true" if ptds else "false"}),\n')
    out.append("];\n\n")
    for enum, function in CHECKED_ENUMS:
        variants = [(n, v) for n, v in enums[enum] if not n.endswith("_MAX") and not n.endswith("_FORCE_DWORD")]
        out.append(f"/// Every value of `{enum}` this build knows, ascending.\n")
        out.append(f"pub const {function.upper()}_VALUES: &[u32] = &[{', '.join(str(v) for _, v in sorted(variants, key=lambda x: x[1]))}];\n\n")
        out.append(f"/// `{enum}` from its integer value; `None` for a value this build does not know.\n")
        out.append(f"pub fn {function}(value: u32) -> Option<{enum}> {{\n    Some(match value {{\n")
        seen = set()
        for name, value in enums[enum]:
            if value in seen:
                continue
            seen.add(value)
            out.append(f"        {value} => {enum}::{name},\n")
        out.append("        _ => return None,\n    })\n}\n\n")
    out.append("/// The name of every `CUresult` value, sorted by value.\n")
    out.append("pub const RESULT_NAMES: &[(CUresult, &str)] = &[\n")
    for value, name in sorted(results.items()):
        out.append(f'    (CUresult::{name}, "{name}"),\n')
    out.append("];\n")
    return "".join(out)


def split_params(params):
    """`a: T, b: *mut U` -> ["a: T", "b: *mut U"] (no parameter type contains a comma)."""
    return [p for p in (part.strip() for part in params.split(",")) if p]


def c_abi_params(params, enum_names):
    """The parameters as the C caller passes them: an enum (or a pointer to one) is its 32-bit
    integer, since a caller may pass a value the Rust enum lacks (an invalid enum value is
    undefined behavior)."""
    out = []
    for name, ty in (p.split(":", 1) for p in split_params(params)):
        ty = re.sub(r"\b(\w+)\b", lambda m: "u32" if m.group(1) in enum_names else m.group(1), ty)
        out.append((name.strip(), ty.strip()))
    return out


def render_client(symbols, functions, implemented, enums, aliases, cudarc_version):
    enum_names = set(enums) | {name[: -len("_enum")] for name in enums if name.endswith("_enum")}
    enum_names |= {alias for alias, target in aliases if target in enum_names}
    out = [header("The client's exported symbols: every driver symbol, with the signature the "
                  "driver declares,\n// running rgpu's implementation through the C boundary "
                  "(boundary.rs), or reporting it unsupported.", cudarc_version)]
    out.append(
        "#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]\n\n"
        "use rgpu_cuda_api::sys::*;\n\n"
        "use crate::boundary::guard;\n"
        "use crate::unsupported::not_supported;\n\n"
    )
    missing = sorted(s for s in implemented if signature_of(s, functions) is None)
    if missing:
        raise GenError(f"implemented without a known signature (add to LEGACY_SIGNATURES): {missing}")
    for symbol in sorted(set(symbols) | implemented):
        base = base_symbol(symbol)
        params = signature_of(symbol, functions)
        # A per-thread-default-stream variant of an implemented entry point: rgpu runs a
        # program's default streams as the legacy default stream (stricter ordering, same
        # results), so the variant is the entry point itself.
        target = symbol if symbol in implemented else base if base in implemented else None
        if target is None or params is None:
            out.append(
                f"#[no_mangle]\npub unsafe extern \"C\" fn {symbol}() -> CUresult {{\n"
                f"    not_supported(\"{symbol}\")\n}}\n\n"
            )
            continue
        typed = c_abi_params(params, enum_names)
        decl = ", ".join(f"{name}: {ty}" for name, ty in typed)
        args = ", ".join(name for name, _ in typed)
        out.append(
            f"#[no_mangle]\npub unsafe extern \"C\" fn {symbol}({decl}) -> CUresult {{\n"
            f"    // SAFETY: the caller's arguments, as the driver API specifies them.\n"
            f"    guard(\"{symbol}\", || unsafe {{ crate::api::{target}({args}) }})\n}}\n\n"
        )
    exported = sorted(set(symbols) | implemented)
    out.append(
        "/// The address of an exported entry point.\n"
        "#[derive(Clone, Copy, Debug)]\n"
        "pub struct EntryPoint(pub *const ());\n"
        "// SAFETY: function addresses are immutable and valid from every thread.\n"
        "unsafe impl Sync for EntryPoint {}\n"
        "// SAFETY: as for Sync: an address to call, the same from any thread.\n"
        "unsafe impl Send for EntryPoint {}\n\n"
        "/// Every exported driver symbol and its address, sorted by name (cuGetProcAddress and\n"
        "/// the coverage test look names up here).\n"
        f"pub static EXPORTS: [(&str, EntryPoint); {len(exported)}] = [\n"
    )
    for symbol in exported:
        # Qualified: cudarc's wrappers of the same names are in scope through `sys::*`.
        out.append(f'    ("{symbol}", EntryPoint(self::{symbol} as *const ())),\n')
    out.append("];\n")
    return "".join(out)


def rustfmt(text):
    result = subprocess.run(
        ["rustfmt", "--edition", "2021", "--emit", "stdout", "--quiet"],
        input=text, capture_output=True, text=True, cwd=REPO_ROOT,
    )
    if result.returncode != 0:
        raise GenError(f"rustfmt rejected the generated code:\n{result.stderr}")
    return result.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--import-driver", nargs=2, metavar=("TYPEDEFS_H", "SYMBOLS_TXT"))
    args = parser.parse_args()
    try:
        if args.import_driver:
            import_driver(*args.import_driver)
        symbols, versions = load_data()
        cudarc_dir, cudarc_version = find_cudarc_dir()
        sys_source = (cudarc_dir / "src" / "driver" / "sys" / "mod.rs").read_text()
        functions, results, enums = parse_cudarc(sys_source)
        aliases = re.findall(r"^pub type (\w+) = (\w+);", sys_source, re.M)
        aliases += [(alias, target) for target, alias in
                    re.findall(r"^pub use self::(\w+) as (\w+);", sys_source, re.M)]
        outputs = [(API_OUTPUT, rustfmt(render_api(symbols, functions, versions, results, enums, cudarc_version)))]
        if (CLIENT_DIR / "Cargo.toml").exists():
            implemented = find_implemented(CLIENT_DIR / "src" / "api")
            outputs.append((CLIENT_OUTPUT, rustfmt(render_client(symbols, functions, implemented, enums, aliases, cudarc_version))))
            print(f"{len(symbols)} driver symbols; {len(implemented & set(symbols))} implemented "
                  f"in crates/cuda/src/api", file=sys.stderr)
        unknown = [s for s in symbols if signature_of(s, functions) is None]
        if unknown:
            print(f"{len(unknown)} symbols without a cudarc signature (exported as stubs only): "
                  f"{' '.join(unknown[:12])}{' ...' if len(unknown) > 12 else ''}", file=sys.stderr)
    except GenError as err:
        print(f"gen_cuda_api: {err}", file=sys.stderr)
        return 2
    stale = []
    for path, text in outputs:
        if path.exists() and path.read_text() == text:
            continue
        if args.check:
            stale.append(path)
        else:
            path.write_text(text)
            print(f"wrote {os.path.relpath(path, REPO_ROOT)}", file=sys.stderr)
    for path in stale:
        print(f"out of date: {os.path.relpath(path, REPO_ROOT)}; run tools/gen_cuda_api.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
