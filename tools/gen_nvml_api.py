#!/usr/bin/env python3
"""Generates the exports of rgpu's drop-in libnvidia-ml.so.1 (crates/nvml) from one list.

Inputs:
  crates/nvml/data/nvml-symbols.txt   every function NVIDIA's libnvidia-ml.so.1 exports, one per
                                      line: the union of driver 535's exports and the functions
                                      nvml.h of CUDA 13.5 declares (old tools call names a new
                                      header dropped, e.g. nvidia-smi 535 nvmlDeviceGetTemperature)
  crates/nvml/src/api/*.rs            the implemented entry points
                                      (`pub unsafe fn nvmlX(...) -> nvmlReturn_t`)
  crates/nvml/src/**/*.rs             entry points exported by hand (`extern "C" fn nvmlX` under
                                      `#[no_mangle]`: nvmlErrorString, nvmlInternalGetExportTable)

Writes crates/nvml/src/generated_exports.rs: each implemented entry point exported with its
parameters through `boundary::guard` (a panic returns NVML_ERROR_UNKNOWN), and for every other
symbol of the list a stub that returns NVML_ERROR_NOT_SUPPORTED and logs its name once. The
stubs take no parameters: on the C ABIs rgpu builds for the caller owns its arguments, so a
function that ignores them may declare none.

The functions forwarded to the servers' own NVML come from one more list,
  crates/protocol/data/nvml-forwarded.txt   one function a line: its name, then one token per
                                      parameter shape (see rgpu_protocol::nvml::Param), made
                                      from nvml.h by --forwarding; the client exports each
                                      (not implemented by hand) as a call of crate::forward,
                                      and the server calls only what it lists.

Usage:
  tools/gen_nvml_api.py                regenerate
  tools/gen_nvml_api.py --check        exit 1 if the checked-in file differs (CI)
  tools/gen_nvml_api.py --forwarding nvml.h
        remake the forwarding list from a header (needs a C compiler for the struct sizes)
  tools/gen_nvml_api.py --import nvml.h symbols.txt
        refresh the list from a header (pip package nvidia-nvml-dev) and the output of
        `nm -D --defined-only libnvidia-ml.so.1 | awk '{print $3}'` (a driver's library)
"""

import argparse
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CRATE = REPO_ROOT / "crates" / "nvml"
SYMBOLS_FILE = CRATE / "data" / "nvml-symbols.txt"
API_DIR = CRATE / "src" / "api"
OUTPUT = CRATE / "src" / "generated_exports.rs"
FORWARDED_FILE = REPO_ROOT / "crates" / "protocol" / "data" / "nvml-forwarded.txt"

IMPLEMENTED = re.compile(r"pub unsafe fn (nvml\w+)\(([^()]*)\) -> nvmlReturn_t \{")
BY_HAND = re.compile(r"#\[no_mangle\]\s*pub (?:unsafe )?extern \"C\" fn (nvml\w+)")


def load_symbols():
    return [line.strip() for line in SYMBOLS_FILE.read_text().splitlines() if line.strip()]


def find_implemented():
    found = {}
    for path in sorted(API_DIR.glob("*.rs")):
        for name, params in IMPLEMENTED.findall(path.read_text()):
            found[name] = " ".join(params.split()).rstrip(",")
    return found


def find_by_hand():
    names = set()
    for path in sorted((CRATE / "src").rglob("*.rs")):
        if path != OUTPUT:
            names |= set(BY_HAND.findall(path.read_text()))
    return names


def argument_names(params):
    return [p.split(":")[0].strip() for p in params.split(",") if p.strip()]


def load_forwarded():
    """{name: [token]} of the forwarding table."""
    table = {}
    for line in FORWARDED_FILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, *tokens = line.split()
            table[name] = tokens
    return table


# The C parameters of each forwarding token (crate::forward reads them as numbers).
TOKEN_TYPES = {
    "D": ["nvmlDevice_t"],
    "P": ["nvmlDevice_t"],
    "u": ["c_uint"],
    "U": ["u64"],
    "o": ["*mut c_void"],
    "s": ["*mut c_char", "c_uint"],
    "c": ["*mut c_uint", "*mut c_void"],
    "k": ["c_uint", "*mut c_void"],
}


def forwarding_export(name, tokens):
    types = [t for token in tokens for t in TOKEN_TYPES[token[0]]]
    params = ", ".join(f"a{i}: {t}" for i, t in enumerate(types))
    raw = ", ".join(f"a{i}" if t == "u64" else f"a{i} as u64" for i, t in enumerate(types))
    return [
        "#[no_mangle]",
        f"pub unsafe extern \"C\" fn {name}({params}) -> nvmlReturn_t {{",
        f"    // SAFETY: the caller keeps {name}'s contract (nvml.h), whose shapes the",
        "    // forwarding table states.",
        f"    guard(\"{name}\", || unsafe {{ forward(\"{name}\", &[{raw}]) }})",
        "}",
        "",
    ]


def render(symbols, implemented, by_hand):
    forwarded = load_forwarded()
    missing = sorted(set(implemented) - set(symbols))
    if missing:
        raise SystemExit(f"implemented but not in {SYMBOLS_FILE.name}: {', '.join(missing)}")
    out = [
        "// @generated by tools/gen_nvml_api.py from crates/nvml/data/nvml-symbols.txt,",
        "// crates/protocol/data/nvml-forwarded.txt and crates/nvml/src/api/; do not edit.",
        "//! Every symbol NVIDIA's libnvidia-ml.so.1 exports: the implemented entry points through",
        "//! the panic guard, then the getters forwarded to the servers' NVML (crate::forward),",
        "//! the others NOT_SUPPORTED stubs.",
        "",
        "#![allow(clippy::too_many_arguments)]",
        "",
        "use std::ffi::{c_char, c_int, c_uint, c_void};",
        "",
        "use crate::api;",
        "use crate::boundary::{guard, not_supported};",
        "use crate::forward::forward;",
        "use crate::types::*;",
        "",
    ]
    for name in symbols:
        if name in by_hand:
            continue
        if name in implemented:
            params = implemented[name]
            args = ", ".join(argument_names(params))
            out += [
                "#[no_mangle]",
                f"pub unsafe extern \"C\" fn {name}({params}) -> nvmlReturn_t {{",
                f"    // SAFETY: the caller keeps {name}'s contract, which the implementation states.",
                f"    guard(\"{name}\", || unsafe {{ api::{name}({args}) }})",
                "}",
                "",
            ]
        elif name in forwarded:
            out += forwarding_export(name, forwarded[name])
        else:
            out += [
                "#[no_mangle]",
                f"pub extern \"C\" fn {name}() -> nvmlReturn_t {{",
                f"    not_supported(\"{name}\")",
                "}",
                "",
            ]
    out += [
        "/// Every exported symbol, by name (for tests).",
        "pub const EXPORTS: &[&str] = &[",
        *[f"    \"{name}\"," for name in symbols],
        "];",
        "",
        "/// The implemented entry points, by name (for tests).",
        "pub const IMPLEMENTED: &[&str] = &[",
        *[f"    \"{name}\"," for name in symbols if name in implemented or name in by_hand],
        "];",
        "",
        "/// The entry points forwarded to the servers' NVML, by name (for tests).",
        "pub const FORWARDED: &[&str] = &[",
        *[f"    \"{name}\"," for name in symbols
          if name in forwarded and name not in implemented and name not in by_hand],
        "];",
    ]
    return rustfmt("\n".join(out) + "\n")


def rustfmt(text):
    try:
        return subprocess.run(
            ["rustfmt", "--edition", "2021", "--emit", "stdout"],
            input=text, capture_output=True, text=True, check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        raise SystemExit(f"rustfmt failed: {err}")


def import_lists(header, exports):
    names = set()
    text = Path(header).read_text()
    names |= set(re.findall(r"^(?:nvmlReturn_t|const char\s*\*?)\s+DECLDIR\s+\*?(nvml\w+)", text, re.M))
    names |= {line.split()[-1] for line in Path(exports).read_text().splitlines()
              if line.strip().startswith("nvml") or " nvml" in line}
    SYMBOLS_FILE.write_text("".join(f"{n}\n" for n in sorted(n for n in names if n.startswith("nvml"))))
    print(f"{SYMBOLS_FILE}: {len(names)} symbols")


# What --forwarding leaves out although its shape could travel: other sessions' and users'
# processes on the server (process lists, accounting, encoder and FBC sessions); the server's
# CPUs and memory nodes (affinity, NUMA), which mean nothing to the caller's machine; and
# numbering, which is the client's own (handles, counts, indexes, minor numbers).
NOT_FORWARDED = re.compile(
    r"Process|AccountingPids|AccountingStats|Sessions|Affinity|Numa|GetHandle|GetCount|GetIndex"
    r"|GetMinorNumber|Set"
    # two arrays of one count (pageCount), which one token cannot say
    r"|^nvmlDeviceGetRetiredPages_v2$")
FORWARDED_NAMES = re.compile(
    r"^nvml(Device(\w*Get|Is|OnSameBoard|ValidateInforom)|SystemGet)")
# Where the names mislead the shapes above: a count that is a plain value, not an array's.
# And a text without its length (NVML_GSP_FIRMWARE_VERSION_BUF_SIZE bytes).
SHAPE_OVERRIDES = {
    "nvmlDeviceGetEncoderStats": "D o4 o4 o4",
    "nvmlDeviceGetGspFirmwareVersion": "D o64",
}
INT32 = {"unsigned int", "int", "unsigned", "unsigned short", "short", "unsigned char", "char"}
INT64 = {"unsigned long long", "long long", "unsigned long", "long"}


def header_types(text):
    """nvml.h's enums, scalar typedefs and handle (pointer) typedefs."""
    enums = set(re.findall(r"typedef\s+enum\s*\w*\s*\{[^}]*\}\s*(\w+)\s*;", text, re.S))
    scalars = {name: base for base, name in re.findall(
        r"typedef\s+((?:unsigned\s+)?(?:long\s+long|long|int|short|char))\s+(\w+)\s*;", text)}
    handles = set(re.findall(r"typedef\s+struct\s+\w+\s*\*\s*(\w+)\s*;", text))
    # A struct holding a pointer (the caller's array) cannot travel: the server's NVML would
    # write through the client's address. Such structs count as handles here, as do structs
    # holding them.
    bodies = dict((alias, body) for body, alias in re.findall(
        r"typedef\s+(?:struct|union)\s*\w*\s*\{((?:[^{}]|\{[^{}]*\})*)\}\s*(\w+)\s*;", text, re.S))
    pointerful = {alias for alias, body in bodies.items() if "*" in body}
    renamed = dict((alias, base) for base, alias in re.findall(r"typedef\s+(\w+)\s+(\w+)\s*;", text))
    while True:
        more = {alias for alias, body in bodies.items() if alias not in pointerful
                and any(re.search(rf"\b{p}\b", body) for p in pointerful)}
        more |= {alias for alias, base in renamed.items()
                 if base in pointerful and alias not in pointerful}
        if not more:
            break
        pointerful |= more
    return enums, scalars, handles | pointerful


def forwarding_shapes(text):
    """(name, [(kind, C type)]) for each getter whose parameters take a shape that travels."""
    enums, scalars, handles = header_types(text)
    found = []
    for name, params in re.findall(r"nvmlReturn_t\s+DECLDIR\s+(nvml\w+)\s*\(([^)]*)\)\s*;", text, re.S):
        if not FORWARDED_NAMES.match(name) or NOT_FORWARDED.search(name):
            continue
        parts = [" ".join(p.replace("const", " ").split()) for p in params.split(",")]
        if parts == ["void"]:
            parts = []
        parsed = []
        for part in parts:
            m = re.match(r"^(.*?)\s*(\**)\s*(\w+)$", part)
            if not m:
                parsed = None
                break
            parsed.append((m.group(1).strip(), len(m.group(2)), m.group(3)))
        if parsed is None:
            continue
        if name in SHAPE_OVERRIDES:
            found.append((name, SHAPE_OVERRIDES[name]))
            continue
        shape = classify(parsed, enums, scalars, handles)
        # A device query names its device first (a drain-state query names a PCI address).
        on_device = shape and shape[0][0] == "D"
        if shape is not None and (on_device or name.startswith("nvmlSystemGet")):
            found.append((name, shape))
    return found


def classify(params, enums, scalars, handles):
    """The tokens of one parameter list, with the C types whose sizes they need; None if a
    parameter cannot travel (a handle other than the device, a pointer to a pointer, ...)."""
    shape, i = [], 0
    devices = 0
    pointers = [p for p in params if p[1] > 0]
    while i < len(params):
        base, stars, pname = params[i]
        following = params[i + 1] if i + 1 < len(params) else None
        base = scalars.get(base, base)
        if base == "nvmlDevice_t" and stars == 0:
            if devices != i:  # the devices come first
                return None
            shape.append(("D" if devices == 0 else "P", None))
            devices += 1
        elif stars == 0:
            if base in handles:
                return None
            if base in INT64:
                shape.append(("U", None))
            elif base in INT32 or base in enums:
                counted = following and following[1] == 1 and following[0] not in ("char", "void")
                if counted and re.search(r"(count|size)$", pname, re.I):
                    shape.append(("k", following[0]))
                    i += 1
                else:
                    shape.append(("u", None))
            else:
                return None
        elif stars == 1:
            if base == "char":
                if not (following and following[1] == 0 and scalars.get(following[0], following[0]) in INT32):
                    return None
                shape.append(("s", None))
                i += 1
            elif base in handles or base == "void" or base == "nvmlDevice_t":
                return None
            elif (base == "unsigned int" and re.search(r"count$", pname, re.I) and following
                  and following[1] == 1 and following[0] not in ("char", "void")
                  and following[0] not in handles and following[0] != "nvmlDevice_t"):
                shape.append(("c", following[0]))
                i += 1
            elif re.search(r"count|size|length", pname, re.I) and len(pointers) > 1:
                return None  # maybe the size of another pointer's array: a shape not known here
            else:
                shape.append(("o", base))
        else:
            return None
        i += 1
    return shape


def sizes_of(header, types):
    """sizeof each C type, from a program compiled against the header."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "sizes.c"
        lines = ["#include <stdio.h>", f'#include "{Path(header).resolve()}"', "int main(void) {"]
        lines += [f'    printf("%zu\\n", sizeof({t}));' for t in types]
        src.write_text("\n".join(lines + ["    return 0;", "}", ""]))
        exe = Path(tmp) / "sizes"
        subprocess.run(["cc", "-o", str(exe), str(src)], check=True)
        out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    return dict(zip(types, (int(n) for n in out)))


def import_forwarding(header):
    text = Path(header).read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    shapes = forwarding_shapes(text)
    types = sorted({t for _, shape in shapes if not isinstance(shape, str)
                    for _, t in shape if t})
    sizes = sizes_of(header, types)
    lines = []
    for name, shape in sorted(shapes):
        if isinstance(shape, str):
            lines.append(f"{name} {shape}")
            continue
        tokens = [kind + (str(sizes[t]) if t else "") for kind, t in shape]
        # One query carries at most 64 KiB (rgpu_protocol::nvml::FORWARD_MAX_BYTES).
        if all(sizes.get(t, 0) <= 64 << 10 for _, t in shape if t):
            lines.append(" ".join([name] + tokens))
    FORWARDED_FILE.parent.mkdir(parents=True, exist_ok=True)
    FORWARDED_FILE.write_text(
        "# The NVML getters rgpu forwards to a server's own NVML: a name, then a token per\n"
        "# parameter (rgpu_protocol::nvml::Param). Made by tools/gen_nvml_api.py --forwarding\n"
        "# from nvml.h; do not edit.\n" + "".join(f"{line}\n" for line in lines))
    print(f"{FORWARDED_FILE}: {len(lines)} functions")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--import", dest="import_", nargs=2, metavar=("NVML_H", "SYMBOLS"))
    parser.add_argument("--forwarding", metavar="NVML_H")
    args = parser.parse_args()
    if args.forwarding:
        import_forwarding(args.forwarding)
    if args.import_:
        import_lists(*args.import_)
    text = render(load_symbols(), find_implemented(), find_by_hand())
    if args.check:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT} is out of date: run tools/gen_nvml_api.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
