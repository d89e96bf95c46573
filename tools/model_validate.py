#!/usr/bin/env python3
"""Validates the performance model (docs/model.md): for each case, the program's time through an
rgpu server on loopback (untraced, --repeats runs), one traced run, then for each link the
model's prediction from that trace against the program's time measured behind the link
emulator (RGPU_LINK, --repeats runs).

    python3 tools/model_validate.py --rgpu target/release/rgpu \
        --case 'vector_add=EXAMPLE_PLATFORM=rgpu /tmp/vector_add' \
        --case 'launch=/tmp/model_loops rgpu launch 2000 10' \
        --link rtt=50us --link rtt=500us --link rtt=5ms --link bandwidth=1Gbit \
        --link bandwidth=10Gbit --repeats 3 --out /tmp/model-validation

A case is NAME=COMMAND (leading VAR=value words set the environment). Every run is traced, and
what is compared is the span of its traced calls (first call's start to last call's end; the
process's start-up and exit, which vary by more than a small link costs, drop out of both
sides), median of the runs (min beside it); --measure wall compares whole-program wall clocks
instead. The prediction is the loopback median plus the change the model predicts. One untimed run first warms the caches (compiled kernels).
Writes OUT/validation.json and prints a Markdown table.
"""
import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time


def start_server(rgpu, log_path):
    log = open(log_path, "w")
    server = subprocess.Popen([rgpu, "server", "--listen", "127.0.0.1:0"], stdout=log,
                              stderr=subprocess.STDOUT)
    for _ in range(300):
        text = open(log_path).read()
        found = re.search(r"rgpu server listening on ([^ ;\n]+)", text)
        if found:
            return server, found.group(1)
        if server.poll() is not None:
            break
        time.sleep(0.1)
    server.kill()
    sys.exit(f"the server did not start; its log:\n{open(log_path).read()}")


def split_case(text):
    name, _, command = text.partition("=")
    words = shlex.split(command)
    env = {}
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if not name or not words:
        sys.exit(f"--case {text!r}: expected NAME=COMMAND")
    return name, env, words


def trace_span(pattern):
    """The span of the calls in the largest trace a run wrote (pattern has %p), seconds."""
    folder, name = os.path.split(pattern)
    prefix = name.split("%p")[0]
    best = []
    for entry in os.listdir(folder):
        if entry.startswith(prefix):
            lines = open(os.path.join(folder, entry)).read().splitlines()[1:]
            if len(lines) > len(best):
                best = lines
            os.remove(os.path.join(folder, entry))
    records = [json.loads(line) for line in best]
    if not records:
        sys.exit(f"no trace written at {pattern}")
    start = min(r["t"] for r in records)
    return (max(r["t"] + r["us"] for r in records) - start) / 1e6


def run_once(rgpu, endpoint, env_extra, command, link=None, trace=None, timeout=900):
    env = dict(os.environ)
    env.update(env_extra)
    env.pop("RGPU_LINK", None)
    env.pop("RGPU_TRACE", None)
    if link:
        env["RGPU_LINK"] = link
    if trace:
        env["RGPU_TRACE"] = trace
    start = time.perf_counter()
    done = subprocess.run([rgpu, "run", "--servers", endpoint, "--", *command], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} (link {link}) failed ({done.returncode}):\n"
                 f"{done.stdout[-3000:]}")
    return took


def measure(args, rgpu, endpoint, env, command, link=None):
    """One run's time: its traced calls' span, or its wall clock (--measure wall)."""
    pattern = os.path.join(args.out, "run.%p.jsonl")
    wall = run_once(rgpu, endpoint, env, command, link=link,
                    trace=pattern if args.measure == "span" else None)
    return trace_span(pattern) if args.measure == "span" else wall


def predict(rgpu, trace, link, measured):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([rgpu, "model", trace, "--link", link, "--measured", f"{measured:.6f}",
                        "--json", out.name], check=True, stdout=subprocess.DEVNULL)
        rows = json.load(open(out.name))
    return rows[0]["predicted_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rgpu", default="target/release/rgpu")
    parser.add_argument("--case", action="append", required=True)
    parser.add_argument("--link", action="append", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="model-validation")
    parser.add_argument("--measure", choices=["span", "wall"], default="span")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rgpu = os.path.abspath(args.rgpu)
    server, endpoint = start_server(rgpu, os.path.join(args.out, "server.log"))
    results = []
    try:
        for case in args.case:
            name, env, command = split_case(case)
            run_once(rgpu, endpoint, env, command)  # warm-up: kernel caches, page cache
            base = [measure(args, rgpu, endpoint, env, command) for _ in range(args.repeats)]
            measured = statistics.median(base)
            trace = os.path.join(args.out, f"{name}.trace.jsonl")
            if os.path.exists(trace):
                os.remove(trace)
            run_once(rgpu, endpoint, env, command, trace=trace)
            for link in args.link:
                times = [measure(args, rgpu, endpoint, env, command, link=link)
                         for _ in range(args.repeats)]
                median = statistics.median(times)
                predicted = predict(rgpu, trace, link, measured)
                row = {"case": name, "link": link, "measure": args.measure,
                       "loopback_s": measured,
                       "measured_s": median, "measured_min_s": min(times),
                       "runs_s": times, "predicted_s": predicted,
                       "error": (predicted - median) / median}
                results.append(row)
                print(f"{name:<14} {link:<28} loopback {measured:8.3f} s  measured "
                      f"{median:8.3f} s (min {min(times):8.3f})  predicted {predicted:8.3f} s  "
                      f"error {100 * row['error']:+6.1f}%", flush=True)
    finally:
        server.terminate()
        server.wait()
    json.dump(results, open(os.path.join(args.out, "validation.json"), "w"), indent=1)
    print()
    print("| case | link | loopback s | measured s (median, min) | predicted s | error |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['case']} | {r['link']} | {r['loopback_s']:.3f} | {r['measured_s']:.3f}, "
              f"{r['measured_min_s']:.3f} | {r['predicted_s']:.3f} | "
              f"{100 * r['error']:+.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
