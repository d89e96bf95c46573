#!/usr/bin/env python3
"""Compares the CHECK lines of a native run and a run through rgpu.

    compare.py NATIVE_OUT RGPU_OUT [--rtol 1e-4] [--atol 1e-6]

Each output holds lines `CHECK <name> <v1> [<v2> ...]` (other lines are ignored). Both must
hold the same names in the same order, each with the same number of values, and every pair of
values must agree: |a - b| <= atol, or |a - b| <= rtol * max(|a|, |b|) (NaN matches NaN, an
infinity only itself). Both outputs must also hold a line starting with `PASS `. Prints each
mismatch; exit status 0 when everything matches, 1 otherwise, 2 on bad usage.
"""
import argparse
import math
import sys


def parse(path):
    """The (name, values, line number) of every CHECK line, and whether a PASS line was seen."""
    checks, passed = [], False
    with open(path, errors="replace") as f:
        for number, line in enumerate(f, 1):
            words = line.split()
            if not words:
                continue
            if words[0] == "PASS":
                passed = True
            elif words[0] == "CHECK" and len(words) >= 2:
                values = []
                for w in words[2:]:
                    try:
                        values.append(float(w))
                    except ValueError:
                        values.append(w)  # kept as text: must then match exactly
                checks.append((words[1], values, number))
    return checks, passed


def agree(a, b, rtol, atol):
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    diff = abs(a - b)
    return diff <= atol or diff <= rtol * max(abs(a), abs(b))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("native")
    ap.add_argument("rgpu")
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--atol", type=float, default=1e-6)
    args = ap.parse_args()

    native, native_pass = parse(args.native)
    remote, remote_pass = parse(args.rgpu)
    problems = []
    if not native_pass:
        problems.append(f"no PASS line in the native output ({args.native})")
    if not remote_pass:
        problems.append(f"no PASS line in the rgpu output ({args.rgpu})")
    if not native:
        problems.append("no CHECK lines in the native output")

    native_names = [c[0] for c in native]
    remote_names = [c[0] for c in remote]
    if native_names != remote_names:
        missing = [n for n in native_names if n not in remote_names]
        extra = [n for n in remote_names if n not in native_names]
        first = next((i for i, (a, b) in enumerate(zip(native_names, remote_names)) if a != b),
                     min(len(native_names), len(remote_names)))
        problems.append(f"CHECK names differ: native has {len(native_names)} lines, rgpu "
                        f"{len(remote_names)}, first difference at CHECK line {first + 1}; "
                        f"missing in rgpu: {missing or '-'}; only in rgpu: {extra or '-'}")
    # Pair by position where the names match, so one extra line does not hide the rest.
    remote_by_name = {}
    for name, values, number in remote:
        remote_by_name.setdefault(name, []).append((values, number))
    compared = 0
    for name, values, number in native:
        if not remote_by_name.get(name):
            continue
        other, other_number = remote_by_name[name].pop(0)
        if len(values) != len(other):
            problems.append(f"CHECK {name}: {len(values)} values natively (line {number}), "
                            f"{len(other)} through rgpu (line {other_number})")
            continue
        for i, (a, b) in enumerate(zip(values, other)):
            compared += 1
            if not agree(a, b, args.rtol, args.atol):
                rel = ""
                if not isinstance(a, str) and not isinstance(b, str) and max(abs(a), abs(b)):
                    rel = f", relative difference {abs(a - b) / max(abs(a), abs(b)):.3g}"
                problems.append(f"CHECK {name}[{i}]: native {a!r}, rgpu {b!r}{rel}")

    for p in problems:
        print(f"mismatch: {p}")
    if problems:
        return 1
    print(f"compare: {len(native)} CHECK lines, {compared} values agree (rtol {args.rtol:g}, "
          f"atol {args.atol:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
