#!/usr/bin/env python3
"""Generates rgpu's OpenCL API tables from the opencl-sys crate (the one list of the API).

Reads, from the opencl-sys source that cargo resolved for rgpu-cl-api:
  src/cl_icd.rs            field order of `_cl_icd_dispatch` (the ICD dispatch table)
  src/*.rs                 `pub type clX_t = Option<unsafe extern "C" fn(args) -> ret>;`
                           and `pub const CL_X: cl_int = -N;` (status codes)

Writes:
  crates/cl-api/src/generated.rs
      `for_each_dispatch_slot!` (every slot as `name(arg: Type, ...) -> Ret;`, in dispatch
      order), `DISPATCH_SLOT_NAMES`, and `ERROR_CODES` (every negative cl_int constant).
  crates/opencl/src/generated_dispatch.rs   (only when the ICD crate exists)
      `DISPATCH`, the ICD's dispatch table, and the exported entry points: those implemented
      under crates/opencl/src/api/ (`pub unsafe extern "C" fn clX`, not exported themselves)
      each wrapped in the boundary guard, and a generated stub for every other slot that
      reports the call and returns CL_INVALID_OPERATION.

Usage:
  tools/gen_opencl_api.py            regenerate the files
  tools/gen_opencl_api.py --check    exit 1 if a checked-in file differs (CI)
Options:
  --icd-dir DIR         the ICD crate to scan and write into (default crates/opencl)
  --opencl-sys-dir DIR  use this opencl-sys source instead of asking cargo metadata
"""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CL_API_DIR = REPO_ROOT / "crates" / "cl-api"
CL_API_OUTPUT = CL_API_DIR / "src" / "generated.rs"
DEFAULT_ICD_DIR = REPO_ROOT / "crates" / "opencl"
ICD_OUTPUT_NAME = "generated_dispatch.rs"

# opencl-sys features rgpu-cl-api enables; they decide which cfg variant of a field is live.
ENABLED_FEATURES = {"CL_VERSION_3_1"}

# Entry points with a vendor suffix are only put in the dispatch table, never exported by
# symbol name: other libraries in the process may export the same extension names.
VENDOR_SUFFIX = re.compile(
    r"(KHR|EXT|INTEL|APPLE|ARM|IMG|QCOM|NV|AMD|ALTERA|POCL|XILINX|MESA)$"
)

RUST_KEYWORDS_IN_TYPES = {"unsafe", "extern", "fn", "mut", "const", "Option", "dyn"}


class GenError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Locating and parsing opencl-sys


def find_opencl_sys_dir():
    """The source directory and version of the opencl-sys package rgpu-cl-api depends on."""
    try:
        raw = subprocess.run(
            ["cargo", "metadata", "--format-version", "1"],
            cwd=REPO_ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        detail = (getattr(err, "stderr", "") or str(err)).strip().splitlines()
        found = find_opencl_sys_in_registry()
        if found:
            return found
        raise GenError(
            f"cargo metadata failed ({detail[0] if detail else ''}) and opencl-sys is not in "
            "the cargo registry cache; run `cargo fetch` or pass --opencl-sys-dir"
        )
    meta = json.loads(raw)
    packages = {pkg["id"]: pkg for pkg in meta["packages"]}
    cl_api_ids = [pid for pid, pkg in packages.items() if pkg["name"] == "rgpu-cl-api"]
    candidates = []
    for node in (meta.get("resolve") or {}).get("nodes", []):
        if node["id"] in cl_api_ids:
            candidates = [
                packages[dep["pkg"]]
                for dep in node["deps"]
                if packages[dep["pkg"]]["name"] == "opencl-sys"
            ]
    if not candidates:
        candidates = [pkg for pkg in packages.values() if pkg["name"] == "opencl-sys"]
    if len(candidates) != 1:
        raise GenError(
            f"expected one opencl-sys package in cargo metadata, found {len(candidates)}"
        )
    return Path(candidates[0]["manifest_path"]).parent, candidates[0]["version"]


def find_opencl_sys_in_registry():
    """Fallback when cargo metadata cannot run (a workspace member mid-edit): the version
    Cargo.lock pins, unpacked in the cargo registry."""
    lock = (REPO_ROOT / "Cargo.lock").read_text() if (REPO_ROOT / "Cargo.lock").exists() else ""
    pinned = re.search(r'name = "opencl-sys"\nversion = "([^"]+)"', lock)
    if not pinned:
        return None
    version = pinned.group(1)
    cargo_home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
    for candidate in sorted((cargo_home / "registry" / "src").glob(f"*/opencl-sys-{version}")):
        if (candidate / "src" / "cl_icd.rs").exists():
            return candidate, version
    return None


def version_of(package_dir):
    manifest = Path(package_dir) / "Cargo.toml"
    text = manifest.read_text() if manifest.exists() else ""
    found = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
    return found.group(1) if found else "(unknown version)"


def strip_line_comments(text):
    return re.sub(r"//[^\n]*", "", text)


def cfg_is_live(cfg):
    """Evaluates `feature = "X"` and `not(feature = "X")` against ENABLED_FEATURES."""
    cfg = cfg.strip()
    negated = re.fullmatch(r"not\((.*)\)", cfg)
    if negated:
        return not cfg_is_live(negated.group(1))
    feature = re.fullmatch(r'feature\s*=\s*"(\w+)"', cfg)
    if feature:
        return feature.group(1) in ENABLED_FEATURES
    raise GenError(f"unsupported cfg in _cl_icd_dispatch: {cfg}")


def parse_dispatch_fields(cl_icd_source):
    """[(field name, field type)] of `_cl_icd_dispatch` in declaration order, live cfgs only."""
    body = re.search(
        r"pub struct _cl_icd_dispatch\s*\{(.*?)\n\}", cl_icd_source, re.DOTALL
    )
    if not body:
        raise GenError("no `pub struct _cl_icd_dispatch` in cl_icd.rs")
    fields = []
    pending_cfg = None
    for line in strip_line_comments(body.group(1)).splitlines():
        line = line.strip()
        if not line:
            continue
        attr = re.fullmatch(r"#\[cfg\((.*)\)\]", line)
        if attr:
            pending_cfg = attr.group(1)
            continue
        field = re.fullmatch(r"pub (\w+): (\w+),", line)
        if not field:
            raise GenError(f"unexpected line in _cl_icd_dispatch: {line}")
        if pending_cfg is None or cfg_is_live(pending_cfg):
            fields.append((field.group(1), field.group(2)))
        pending_cfg = None
    return fields


def split_top_level(text, sep=","):
    """Splits at `sep` outside (), <> and []."""
    parts, depth, current = [], 0, []
    i = 0
    while i < len(text):
        ch = text[i]
        if text.startswith("->", i):
            current.append("->")
            i += 2
            continue
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def normalize_type(text):
    """One canonical spelling of a type: single spaces, no trailing commas in fn arg lists."""
    text = re.sub(r"\s+", " ", text.strip())
    text = re.sub(r"\s*,\s*\)", ")", text)
    text = re.sub(r"\(\s+", "(", text)
    text = re.sub(r"\s+\)", ")", text)
    text = re.sub(r"<\s+", "<", text)
    text = re.sub(r",?\s*>", ">", text)
    return text


def matching_close(text, open_index):
    """Index of the bracket closing the one at open_index (counts (), <>; skips `->`)."""
    depth = 0
    i = open_index
    while i < len(text):
        if text.startswith("->", i):
            i += 2
            continue
        if text[i] in "(<":
            depth += 1
        elif text[i] in ")>":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise GenError("unbalanced brackets in a function type")


class Signature:
    def __init__(self, name, args, ret):
        self.name = name
        self.args = args  # [(name, type)]
        self.ret = ret  # type text, "()" for none

    def __eq__(self, other):
        return (self.name, self.args, self.ret) == (other.name, other.args, other.ret)


def parse_function_types(sources):
    """{type name: Signature} for every `pub type X_t = Option<unsafe extern "C" fn(..)..>;`."""
    found = {}
    pattern = re.compile(r'pub type (\w+_t)\s*=\s*Option<\s*unsafe extern "C" fn\s*\(')
    for file_name, text in sources:
        text = strip_line_comments(text)
        for match in pattern.finditer(text):
            type_name = match.group(1)
            args_open = match.end() - 1
            args_close = matching_close(text, args_open)
            option_close = matching_close(text, text.index("<", match.start()))
            args = []
            for arg in split_top_level(text[args_open + 1 : args_close]):
                arg_name, _, arg_type = arg.partition(":")
                if not arg_type:
                    raise GenError(f"{file_name}: {type_name}: unnamed argument `{arg}`")
                args.append((arg_name.strip(), normalize_type(arg_type)))
            tail = text[args_close + 1 : option_close].strip().rstrip(",").strip()
            ret = normalize_type(tail[2:]) if tail.startswith("->") else "()"
            signature = Signature(type_name[: -len("_t")], args, ret)
            if type_name in found and found[type_name] != signature:
                raise GenError(f"{type_name} is defined twice, differently")
            found[type_name] = signature
    return found


def load_api(opencl_sys_dir):
    """The dispatch slots in order, as Signatures named after their fields."""
    src = Path(opencl_sys_dir) / "src"
    fields = parse_dispatch_fields((src / "cl_icd.rs").read_text())
    sources = [(p.name, p.read_text()) for p in sorted(src.glob("*.rs"))]
    types = parse_function_types(sources)
    slots = []
    for field_name, field_type in fields:
        if field_type not in types:
            raise GenError(
                f"dispatch slot {field_name} has type {field_type}, which is not a "
                f"function pointer type (is a feature missing from ENABLED_FEATURES?)"
            )
        sig = types[field_type]
        slots.append(Signature(field_name, sig.args, sig.ret))
    return slots


def load_error_codes(opencl_sys_dir):
    """[(value, name)] of every negative `cl_int` constant (the status codes), first name kept
    when two share a value, sorted from CL_DEVICE_NOT_FOUND downwards."""
    codes = {}
    pattern = re.compile(r"pub const (CL_\w+): cl_int = (-\d+);")
    for path in sorted((Path(opencl_sys_dir) / "src").glob("*.rs")):
        for name, value in pattern.findall(path.read_text()):
            codes.setdefault(int(value), name)
    return sorted(codes.items(), reverse=True)


def check_cl_api_features():
    """ENABLED_FEATURES must be what crates/cl-api/Cargo.toml asks of opencl-sys."""
    manifest = (CL_API_DIR / "Cargo.toml").read_text()
    dependency = re.search(r"^opencl-sys\s*=\s*\{(.*)\}", manifest, re.MULTILINE)
    features = dependency and re.search(r"features\s*=\s*\[(.*?)\]", dependency.group(1))
    listed = set(re.findall(r'"(\w+)"', features.group(1))) if features else set()
    if listed != ENABLED_FEATURES:
        raise GenError(
            f"crates/cl-api/Cargo.toml enables opencl-sys features {sorted(listed)}, "
            f"this script assumes {sorted(ENABLED_FEATURES)}"
        )


# ---------------------------------------------------------------------------------------------
# Rust output


def qualify_type(type_text, prefix):
    """Prefixes every type name in `type_text`, leaving keywords and the argument names of
    nested fn types (an identifier followed by a single `:`) alone."""

    def qualify(match):
        word = match.group(0)
        rest = type_text[match.end() :]
        is_arg_name = rest.startswith(":") and not rest.startswith("::")
        if word.startswith('"') or word in RUST_KEYWORDS_IN_TYPES or is_arg_name:
            return word
        return prefix + word

    return re.sub(r'"[^"]*"|[A-Za-z_]\w*', qualify, type_text)


def header(opencl_sys_version, what):
    return (
        f"// @generated by tools/gen_opencl_api.py from opencl-sys {opencl_sys_version}: {what}\n"
        "// Do not edit; regenerate with `python3 tools/gen_opencl_api.py`.\n"
    )


def render_cl_api(slots, error_codes, version):
    lines = [header(version, "the OpenCL ICD dispatch table as one list").rstrip("\n")]
    lines += [
        "",
        "/// Calls `$callback!` with every slot of the OpenCL ICD dispatch table",
        "/// (`_cl_icd_dispatch`), in table order, as `name(arg: Type, ...) -> Ret;` (`-> ()` when",
        "/// the function returns nothing). Types are spelled `$crate::types::...`, so they",
        "/// resolve anywhere.",
        "///",
        "/// `for_each_dispatch_slot!(callback)` expands to `callback! { slots }`;",
        "/// `for_each_dispatch_slot!(callback, extra tokens)` expands to",
        "/// `callback! { [extra tokens] slots }`, to pass context (a variable, a type) through.",
        "///",
        "/// ```",
        "/// macro_rules! count_slots {",
        "///     ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {",
        "///         [$(stringify!($name)),*].len()",
        "///     };",
        "/// }",
        "/// let count = rgpu_cl_api::for_each_dispatch_slot!(count_slots);",
        "/// assert_eq!(count, rgpu_cl_api::DISPATCH_SLOT_NAMES.len());",
        "/// ```",
        "#[macro_export]",
        "macro_rules! for_each_dispatch_slot {",
        "    ($callback:ident) => {",
        "        $crate::for_each_dispatch_slot!(@emit $callback [])",
        "    };",
        "    ($callback:ident, $($extra:tt)*) => {",
        "        $crate::for_each_dispatch_slot!(@emit $callback [[$($extra)*]])",
        "    };",
        "    (@emit $callback:ident [$($prefix:tt)*]) => {",
        "        $callback! {",
        "            $($prefix)*",
    ]
    qualified = lambda type_text: qualify_type(type_text, "$crate::types::")
    for slot in slots:
        lines.append(f"            {slot.name}(")
        for i, (arg_name, arg_type) in enumerate(slot.args):
            comma = "," if i + 1 < len(slot.args) else ""
            lines.append(f"                {arg_name}: {qualified(arg_type)}{comma}")
        lines.append(f"            ) -> {qualified(slot.ret)};")
    lines += [
        "        }",
        "    };",
        "}",
        "",
        "/// The names of the dispatch table's slots, in table order.",
        "pub const DISPATCH_SLOT_NAMES: &[&str] = &[",
    ]
    lines += [f'    "{slot.name}",' for slot in slots]
    lines += [
        "];",
        "",
        "/// Every OpenCL status code opencl-sys defines (core and extensions), with its name.",
        "pub const ERROR_CODES: &[(i32, &str)] = &[",
    ]
    lines += [f'    ({value}, "{name}"),' for value, name in error_codes]
    lines += ["];", ""]
    return "\n".join(lines)


def find_implemented(api_dir):
    """{entry point name: module path} for `pub unsafe extern "C" fn cl...` under api/."""
    implemented = {}
    pattern = re.compile(r'pub\s+unsafe\s+extern\s+"C"\s+fn\s+(cl\w+)')
    for path in sorted(Path(api_dir).rglob("*.rs")):
        rel = path.relative_to(api_dir).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "mod":
            parts.pop()
        module = "::".join(["crate", "api"] + parts)
        for name in pattern.findall(strip_line_comments(path.read_text())):
            if name in implemented and implemented[name] != module:
                raise GenError(f"{name} is defined in {implemented[name]} and {module}")
            implemented[name] = module
    return implemented


def failing_with(slot, code):
    """The statements that make `slot` fail with `code` as OpenCL specifies: the status itself,
    or (a handle or pointer result) NULL with the status through errcode_ret when it has one."""
    if slot.ret == "cl_int":
        return [code]
    if slot.ret == "()":
        return []
    if slot.ret.startswith("*") or slot.ret.startswith("cl_"):
        lines = []
        if any(name == "errcode_ret" for name, _ in slot.args):
            lines += [
                "// SAFETY: errcode_ret is the caller's, NULL or valid (OpenCL API contract).",
                f"unsafe {{ set_errcode(errcode_ret, {code}) }};",
            ]
        return lines + ["std::ptr::null_mut()"]
    raise GenError(f"{slot.name}: no failure rule for return type {slot.ret}")


def stub_body(slot):
    """The body of an unimplemented entry point: report, then fail as OpenCL specifies."""
    body = [f'    crate::unsupported::report("{slot.name}");']
    return body + ["    " + line for line in failing_with(slot, "CL_INVALID_OPERATION")]


def panic_value(slot):
    """What an implemented entry point returns when its implementation panics (the boundary's
    `on_panic`): CL_OUT_OF_HOST_MEMORY, as a status or through errcode_ret."""
    lines = failing_with(slot, "CL_OUT_OF_HOST_MEMORY")
    if lines == ["std::ptr::null_mut()"]:
        return "std::ptr::null_mut"  # the function itself (clippy: no redundant closure)
    if len(lines) <= 1:
        return "|| " + (lines[0] if lines else "()")
    return "|| {\n" + "".join(f"        {line}\n" for line in lines) + "    }"


def guarded_entry(slot, module):
    """An implemented entry point as exported and put in the table: its implementation under
    src/api/ run through the one boundary guard (a panic becomes an error, never unwinds into
    C)."""
    lines = [] if VENDOR_SUFFIX.search(slot.name) else ["#[no_mangle]"]
    args = ", ".join(f"{name}: {ty}" for name, ty in slot.args)
    names = ", ".join(name for name, _ in slot.args)
    ret = "" if slot.ret == "()" else f" -> {slot.ret}"
    lines += [
        f"pub unsafe extern \"C\" fn {slot.name}({args}){ret} {{",
        f"    crate::boundary::guard(\"{slot.name}\", {panic_value(slot)}, || {{",
        "        // SAFETY: the caller's arguments, passed on under the same contract.",
        f"        unsafe {{ {module}::{slot.name}({names}) }}",
        "    })",
        "}",
        "",
    ]
    return lines


def render_icd(slots, implemented, version):
    lines = [header(version, "the ICD's dispatch table and stubs").rstrip("\n")]
    lines += [
        "//",
        "// Entry points implemented under src/api/ (`pub unsafe extern \"C\" fn clX`) are",
        "// exported and fill their slot through a wrapper here that runs them in the one boundary",
        "// guard (crate::boundary); every other slot gets a stub below that reports the call once",
        "// and fails with CL_INVALID_OPERATION. Vendor extensions (…KHR, …EXT, …) are not exported",
        "// by name, so they cannot shadow another library's symbols.",
        "#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]",
        "",
        "use rgpu_cl_api::sys::cl_icd::_cl_icd_dispatch;",
        "use rgpu_cl_api::types::*;",
        "",
        "/// The table every object handed to the ICD loader starts with.",
        "pub static DISPATCH: _cl_icd_dispatch = _cl_icd_dispatch {",
    ]
    for slot in slots:
        lines.append(f"    {slot.name}: Some({slot.name}),")
    lines += ["};", ""]
    stubs = [slot for slot in slots if slot.name not in implemented]
    if any(any(n == "errcode_ret" for n, _ in s.args) and s.ret != "cl_int" for s in slots):
        lines += [
            "/// Stores `code` through the caller's `errcode_ret`, which OpenCL allows to be NULL.",
            "///",
            "/// # Safety",
            "/// `errcode_ret` is NULL or points to a writable cl_int.",
            "unsafe fn set_errcode(errcode_ret: *mut cl_int, code: cl_int) {",
            "    if !errcode_ret.is_null() {",
            "        // SAFETY: non-NULL, so writable by this function's contract.",
            "        unsafe { *errcode_ret = code };",
            "    }",
            "}",
            "",
        ]
    for slot in slots:
        if slot.name in implemented:
            lines += guarded_entry(slot, implemented[slot.name])
    for slot in stubs:
        if not VENDOR_SUFFIX.search(slot.name):
            lines.append("#[no_mangle]")
        args = []
        for arg_name, arg_type in slot.args:
            used = arg_name == "errcode_ret" and slot.ret != "cl_int"
            args.append(f"{arg_name if used else '_' + arg_name}: {arg_type}")
        ret = "" if slot.ret == "()" else f" -> {slot.ret}"
        lines.append(f"pub unsafe extern \"C\" fn {slot.name}({', '.join(args)}){ret} {{")
        lines += stub_body(slot)
        lines += ["}", ""]
    return "\n".join(lines)


def rustfmt(text):
    """Formats like `cargo fmt` does, so the checked-in files stay fmt-clean."""
    try:
        result = subprocess.run(
            ["rustfmt", "--edition", "2021", "--emit", "stdout", "--quiet"],
            input=text,
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
        )
    except OSError as err:
        raise GenError(f"cannot run rustfmt: {err}")
    if result.returncode != 0:
        raise GenError(f"rustfmt rejected the generated code:\n{result.stderr}")
    return result.stdout


# ---------------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if a file is out of date")
    parser.add_argument("--icd-dir", type=Path, default=DEFAULT_ICD_DIR)
    parser.add_argument("--opencl-sys-dir", type=Path)
    args = parser.parse_args()

    try:
        check_cl_api_features()
        if args.opencl_sys_dir:
            sys_dir, version = args.opencl_sys_dir, version_of(args.opencl_sys_dir)
        else:
            sys_dir, version = find_opencl_sys_dir()
        slots = load_api(sys_dir)
        error_codes = load_error_codes(sys_dir)

        outputs = [(CL_API_OUTPUT, rustfmt(render_cl_api(slots, error_codes, version)))]
        icd_dir = args.icd_dir.resolve()
        if (icd_dir / "Cargo.toml").exists():
            implemented = find_implemented(icd_dir / "src" / "api")
            icd_code = rustfmt(render_icd(slots, implemented, version))
            outputs.append((icd_dir / "src" / ICD_OUTPUT_NAME, icd_code))
            done = sum(slot.name in implemented for slot in slots)
            print(
                f"{len(slots)} dispatch slots; {done} implemented in {icd_dir.name}/src/api",
                file=sys.stderr,
            )
        else:
            print(f"{icd_dir} has no Cargo.toml: no ICD dispatch table", file=sys.stderr)
    except GenError as err:
        print(f"gen_opencl_api: {err}", file=sys.stderr)
        return 2

    stale = []
    for path, text in outputs:
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(path)
        else:
            path.write_text(text)
            print(f"wrote {os.path.relpath(path, REPO_ROOT)}", file=sys.stderr)
    if stale:
        for path in stale:
            print(f"out of date: {os.path.relpath(path, REPO_ROOT)}", file=sys.stderr)
        print("run `python3 tools/gen_opencl_api.py` and commit the result", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
