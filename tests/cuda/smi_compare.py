#!/usr/bin/env python3
"""Compares `nvidia-smi -q` run natively with the same run through rgpu (one server serving
this machine's GPUs, so both see the same devices), for scripts/gpu-check.sh's `nvidia_smi`
check:

    python3 tests/cuda/smi_compare.py NATIVE_Q RGPU_Q

Each `key : value` line is named by its path of sections (`GPU 00000000:00:06.0 / ECC Errors /
Volatile / DRAM Correctable`). A field is a gap when the native run gives a value and the rgpu
run gives none (`N/A`, `Uninitialized`, `Unknown Error`, `Not Supported`, or no line). Values
that differ (live readings: power, clocks, utilization, memory in use, processes) are not gaps.
Prints every gap, marked `expected` with the reason where KNOWN names it, and exits 1 if any gap
is not expected (or if a run has no GPU sections).
"""

import re
import sys

NO_VALUE = {"N/A", "Uninitialized", "Unknown Error", "Not Supported", "Insufficient Permissions", ""}

# Fields rgpu cannot answer, and why (the README's compatibility table says the same).
PRIVATE = "nvidia-smi reads it through NVML's private export table, which rgpu does not implement"
KNOWN = {
    "GPU Part Number": PRIVATE,
    "Sparse Operation Mode": PRIVATE,
}


def fields(path):
    """{path: value} of an `nvidia-smi -q` output."""
    found, stack = {}, []
    for line in open(path, errors="replace"):
        if not line.strip() or line.startswith("="):
            continue
        indent = len(line) - len(line.lstrip(" "))
        text = line.strip()
        key, sep, value = text.partition(":")
        key = key.strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if text.startswith("GPU 0"):
            stack = [(indent, text)]
            continue
        names = [name for _, name in stack] + [key]
        if sep and value.strip():
            found[" / ".join(names)] = value.strip()
        else:
            found.setdefault(" / ".join(names), "")
            stack.append((indent, key))
    return found


def main(native_path, rgpu_path):
    native, remote = fields(native_path), fields(rgpu_path)
    if not any(k.startswith("GPU ") for k in native) or not any(k.startswith("GPU ") for k in remote):
        print(f"FAIL nvidia_smi: no GPU sections ({native_path}: {len(native)} fields, "
              f"{rgpu_path}: {len(remote)})")
        return 1
    unexpected = 0
    compared = 0
    for key, value in native.items():
        if value in NO_VALUE:
            continue
        compared += 1
        theirs = remote.get(key)
        if theirs is not None and theirs not in NO_VALUE:
            continue
        leaf = key.split(" / ")[-1]
        reason = next((why for name, why in KNOWN.items() if leaf.startswith(name)), "unexpected")
        if reason == "unexpected":
            unexpected += 1
        print(f"gap: {key}: native {value!r}, rgpu {theirs!r} ({reason})")
    print(f"{compared} fields with a native value; {unexpected} unexpected gaps")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
