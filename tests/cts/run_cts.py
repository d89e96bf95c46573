#!/usr/bin/env python3
"""Khronos OpenCL-CTS groups, natively and through rgpu against the same device, compared sub-test
by sub-test.

    python3 tests/cts/run_cts.py                      # the CI groups, a local server on PoCL
    python3 tests/cts/run_cts.py --groups test_basic  # on demand (most of an hour)
    python3 tests/cts/run_cts.py --results            # also write docs/cts-results.md
    python3 tests/cts/run_cts.py --groups test_basic --jobs 12   # sub-tests 12 at a time

The binaries come from `bash scripts/cts-build.sh` (target/cts). Each group runs once natively
(the platform whose name contains RGPU_TEST_NATIVE, default "Portable") and once through
`rgpu run` (the rgpu platform) against an rgpu server started here on the same machine
(`--servers` names others). The CTS writes each sub-test's result to a JSON file
(CL_CONFORMANCE_RESULTS_FILENAME); a run that ends without one (a crash, a timeout) is run again
one sub-test at a time, so a crash is pinned to its sub-test. With `--jobs N` every sub-test
runs as a process of its own from the start, N at a time (for a machine with cores to spare:
PoCL compiles each kernel on one core).

A sub-test that passes natively and not through rgpu is a regression, unless
tests/cts/known-differences.txt lists it (`group/sub-test  reason`). Exit status 1 on any
regression not listed; results in tests/work/cts-results/ (results.md, one JSON and log per
run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import rgpu_harness as h  # noqa: E402

CI_GROUPS = ["test_api", "test_compiler", "test_events", "test_buffers", "test_profiling",
             "test_computeinfo", "test_commonfns"]
# Seconds one group's whole run may take, where the default is too short: test_basic runs
# most of an hour on 2 cores (natively, then as long again through rgpu).
GROUP_TIMEOUTS = {"test_basic": 4200}
KNOWN = HERE / "known-differences.txt"
OUT = h.WORK / "cts-results"
DOC = h.REPO / "docs" / "cts-results.md"

PLATFORMS = """
import ctypes, sys
cl = ctypes.CDLL("libOpenCL.so.1")
n = ctypes.c_uint()
cl.clGetPlatformIDs(0, None, ctypes.byref(n))
ids = (ctypes.c_void_p * n.value)()
cl.clGetPlatformIDs(n.value, ids, None)
for p in ids:
    name = ctypes.create_string_buffer(256)
    cl.clGetPlatformInfo(ctypes.c_void_p(p), 0x0902, 256, name, None)
    print(name.value.decode())
"""


def platform_index(cmd_prefix: list[str], want: str) -> int:
    """The index (clGetPlatformIDs order) of the platform whose name contains `want`, as a
    program started with `cmd_prefix` sees them."""
    r = subprocess.run(cmd_prefix + [sys.executable, "-c", PLATFORMS], env=h.base_env(),
                       capture_output=True, text=True, timeout=120)
    names = r.stdout.splitlines()
    for i, name in enumerate(names):
        if want.lower() in name.lower():
            return i
    raise SystemExit(f"no platform named like '{want}' among {names} ({r.stderr.strip()})")


def list_subtests(binary: Path) -> list[str]:
    r = subprocess.run([str(binary), "--list"], env=h.base_env(), capture_output=True,
                       text=True, timeout=120, cwd=binary.parent)
    names = []
    for line in (r.stdout + r.stderr).splitlines():
        if line.startswith("\t") and line.strip():
            names.append(line.strip())
    return names


def run_once(cmd: list[str], env: dict, log: Path, results: Path, timeout: float,
             cwd: Path) -> tuple[dict[str, str] | None, str]:
    """Runs a CTS binary; its sub-tests' results, or None when it wrote none, and why."""
    results.unlink(missing_ok=True)
    env = dict(env, CL_CONFORMANCE_RESULTS_FILENAME=str(results))
    started = time.monotonic()
    with open(log, "w") as out:
        try:
            proc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=timeout, cwd=cwd)
            status = f"exit {proc.returncode}"
            if proc.returncode < 0:
                status = f"killed by signal {-proc.returncode}"
        except subprocess.TimeoutExpired:
            status = f"timed out after {timeout:.0f} s"
    elapsed = time.monotonic() - started
    try:
        data = json.loads(results.read_text())
        return data.get("results", {}), f"{status} in {elapsed:.0f} s"
    except (OSError, ValueError):
        return None, f"{status} in {elapsed:.0f} s, no results file"


def run_group(group: str, binary: Path, how: str, prefix: list[str], platform: int,
              timeout: float, retry: bool = True, jobs: int = 1) -> tuple[dict[str, str], str]:
    """All sub-tests of `group`, run as `how` ("native" or "rgpu")."""
    env = h.base_env(CL_PLATFORM_INDEX=str(platform), CL_DEVICE_INDEX="0")
    if jobs > 1:
        started = time.monotonic()
        results = run_each(group, binary, how, prefix, env, timeout, jobs)
        return results, f"{len(results)} sub-tests, {jobs} at a time, in " \
                        f"{time.monotonic() - started:.0f} s"
    log = OUT / f"{group}-{how}.log"
    results, status = run_once(prefix + [str(binary)], env, log, OUT / f"{group}-{how}.json",
                               timeout, binary.parent)
    if results is not None:
        return results, status
    if not retry:
        return {}, status
    # No results: one sub-test at a time, so that a crash is pinned to its sub-test.
    print(f"  {how}: {status}; running its sub-tests one at a time", flush=True)
    return run_each(group, binary, how, prefix, env, timeout, 1), status + " (then one at a time)"


def run_each(group: str, binary: Path, how: str, prefix: list[str], env: dict, timeout: float,
             jobs: int) -> dict[str, str]:
    """Every sub-test of `group` as a process of its own, `jobs` at a time; a sub-test that
    wrote no result crashed."""
    def one(name: str) -> tuple[str, str]:
        found, why = run_once(prefix + [str(binary), name], env,
                              OUT / f"{group}-{how}-{name}.log",
                              OUT / f"{group}-{how}-{name}.json", max(timeout / 4, 120),
                              binary.parent)
        if found is None or name not in found:
            print(f"    {how} {name}: {why}", flush=True)
            return name, "crash"
        return name, found[name]

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return dict(pool.map(one, list_subtests(binary)))


def load_known() -> dict[str, str]:
    known = {}
    if KNOWN.exists():
        for line in KNOWN.read_text().splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, reason = line.partition(" ")
            known[key] = reason.strip()
    return known


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", default=",".join(CI_GROUPS),
                        help="comma-separated CTS groups (default: the CI groups)")
    parser.add_argument("--cts-dir", default=str(h.REPO / "target" / "cts"),
                        help="where scripts/cts-build.sh put the binaries")
    parser.add_argument("--servers", help="rgpu servers to use instead of a local one")
    parser.add_argument("--timeout", type=float,
                        help="seconds one group's run may take (default 1200; test_basic "
                             f"{GROUP_TIMEOUTS['test_basic']})")
    parser.add_argument("--no-retry", action="store_true",
                        help="do not run a group that ended without results again one "
                             "sub-test at a time")
    parser.add_argument("--jobs", type=int, default=1,
                        help="run each sub-test as a process of its own, this many at a time")
    parser.add_argument("--results", action="store_true",
                        help=f"also write {DOC.relative_to(h.REPO)}")
    args = parser.parse_args()

    groups = [g for g in args.groups.split(",") if g]
    cts = Path(args.cts_dir)
    missing = [g for g in groups if not (cts / g).exists()]
    if missing:
        print(f"CTS binaries missing in {cts}: {', '.join(missing)} "
              "(run `bash scripts/cts-build.sh`)")
        return 2
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)

    server = None
    if args.servers:
        servers = args.servers
    else:
        server = h.Server()
        servers = server.endpoint
    try:
        rgpu_prefix = [str(h.RGPU), "run", "--servers", servers, "--"]
        native_index = platform_index([], h.NATIVE_PLATFORM)
        rgpu_index = platform_index(rgpu_prefix, "rgpu")
        known = load_known()
        rows, regressions, crashes = [], [], []
        for group in groups:
            binary = (cts / group).resolve()
            print(f"[cts] {group}", flush=True)
            timeout = args.timeout or GROUP_TIMEOUTS.get(group, 1200)
            native, native_status = run_group(group, binary, "native", [], native_index,
                                              timeout, not args.no_retry, args.jobs)
            print(f"  native: {native_status}", flush=True)
            remote, remote_status = run_group(group, binary, "rgpu", rgpu_prefix, rgpu_index,
                                              timeout, not args.no_retry, args.jobs)
            print(f"  rgpu:   {remote_status}", flush=True)
            count = lambda res, what: sum(1 for v in res.values() if v == what)  # noqa: E731
            group_regressions = []
            for name, result in sorted(native.items()):
                theirs = remote.get(name, "missing")
                if result == "pass" and theirs != "pass":
                    key = f"{group}/{name}"
                    reason = known.get(key)
                    group_regressions.append((key, theirs, reason))
                    if reason is None:
                        regressions.append(f"{key}: {theirs} through rgpu")
            for name, result in remote.items():
                if result == "crash" and native.get(name) != "crash":
                    crashes.append(f"{group}/{name}")
            listed = sum(1 for _, _, reason in group_regressions if reason is not None)
            rows.append((group, len(native), count(native, "pass"), count(native, "fail"),
                         count(native, "skip"), count(remote, "pass"), count(remote, "fail"),
                         count(remote, "skip"), count(remote, "crash"),
                         len(group_regressions) - listed, listed))
            for key, theirs, reason in group_regressions:
                note = f"known: {reason}" if reason else "REGRESSION"
                print(f"  {key}: passes natively, {theirs} through rgpu ({note})", flush=True)
    finally:
        if server is not None:
            server.stop()

    header = ("| group | sub-tests | native pass | native fail | native skip | rgpu pass | "
              "rgpu fail | rgpu skip | rgpu crash | regressions | known differences |\n"
              "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
    body = "".join("| " + " | ".join(str(v) for v in row) + " |\n" for row in rows)
    totals = [sum(row[i] for row in rows) for i in range(1, len(rows[0]))] if rows else []
    body += "| **total** | " + " | ".join(str(t) for t in totals) + " |\n"
    try:
        device = h.native_device_names()
    except (AssertionError, OSError):
        device = []
    text = (f"Khronos OpenCL-CTS (vendored commit b8f8906c) on "
            f"{', '.join(device) or 'the native device'}: natively, and through rgpu against "
            f"the same device (`python3 tests/cts/run_cts.py --groups {','.join(groups)}`).\n\n"
            + header + body)
    if known:
        text += "\nKnown differences (tests/cts/known-differences.txt):\n\n"
        text += "".join(f"- `{k}`: {v}\n" for k, v in sorted(known.items()))
    (OUT / "results.md").write_text(text)
    print(header + body, end="")
    if args.results:
        DOC.write_text("# OpenCL-CTS: native vs rgpu\n\n" + text)
    if regressions or crashes:
        print("[cts] sub-tests that pass natively and not through rgpu (not in "
              f"{KNOWN.relative_to(h.REPO)}):")
        for line in regressions:
            print(f"  {line}")
        for line in crashes:
            print(f"  {line}: crashed through rgpu")
        return 1
    print("[cts] no regression through rgpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
