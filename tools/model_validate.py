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
what is compared by default (--measure calls) is the time inside its traced calls: the span of
the calls (first call's start to last call's end) less the program's own time between them.
The model keeps that time as traced, and in a Python program it varies run to run by more
than a fast link costs (±0.3 s in a 1-6 s span on the H200 host). --measure span compares
whole spans, --measure wall whole-program wall clocks; every row also gives the wall clock
spent outside the traced calls (start-up, exit). Medians of the runs, min beside them.
The prediction is the loopback median plus the change the model predicts. One untimed run
first warms the caches (compiled kernels).

--together N (repeatable) then starts N copies of the case at once on loopback, each traced,
and compares the mean of their spans (median over --repeats such runs) with `rgpu model
--together` on N separate solo traces (contention for the server and its GPU).

Writes OUT/validation.json, OUT/validation.svg (predicted against measured, both relative to
loopback) and prints a Markdown table.
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


def trace_span(pattern, keep=None):
    """The span of the calls in the largest trace a run wrote (pattern has %p), and the part of
    it inside calls, seconds; that trace is moved to `keep` if given, the others removed."""
    folder, name = os.path.split(pattern)
    prefix = name.split("%p")[0]
    best, best_path = [], None
    for entry in sorted(os.listdir(folder)):
        if entry.startswith(prefix):
            path = os.path.join(folder, entry)
            lines = open(path).read().splitlines()
            if len(lines) - 1 > len(best):
                if best_path:
                    os.remove(best_path)
                best, best_path = lines[1:], path
            else:
                os.remove(path)
    # (Lines with `counters` are the servers' counts of the sessions, not calls.)
    records = [r for r in map(json.loads, best) if "counters" not in r]
    if not records:
        sys.exit(f"no trace written at {pattern}")
    if keep:
        os.replace(best_path, keep)
    else:
        os.remove(best_path)
    records.sort(key=lambda r: r["t"])
    start = records[0]["t"]
    span = (max(r["t"] + r["us"] for r in records) - start) / 1e6
    # The program's own time between its calls (across threads: time no call was under way).
    between, covered = 0.0, start
    for r in records:
        between += max(0.0, r["t"] - covered)
        covered = max(covered, r["t"] + r["us"])
    return {"span": span, "calls": span - between / 1e6}


def case_env(env_extra, link, trace):
    env = dict(os.environ)
    env.update(env_extra)
    env.pop("RGPU_LINK", None)
    env.pop("RGPU_TRACE", None)
    if link:
        env["RGPU_LINK"] = link
    if trace:
        env["RGPU_TRACE"] = trace
    return env


def run_once(rgpu, endpoint, env_extra, command, link=None, trace=None, timeout=900):
    env = case_env(env_extra, link, trace)
    start = time.perf_counter()
    done = subprocess.run([rgpu, "run", "--servers", endpoint, "--", *command], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} (link {link}) failed ({done.returncode}):\n"
                 f"{done.stdout[-3000:]}")
    return took


def measure(args, rgpu, endpoint, env, command, link=None, keep=None, walls=None):
    """One run's time: its traced calls' span, or its wall clock (--measure wall); every run
    is traced (the wall clocks go to `walls`), its trace kept at `keep` if given."""
    pattern = os.path.join(args.out, "run.%p.jsonl")
    wall = run_once(rgpu, endpoint, env, command, link=link, trace=pattern)
    times = trace_span(pattern, keep)
    if walls is not None:
        walls.append(wall)
    return wall if args.measure == "wall" else times[args.measure]


def measure_together(args, rgpu, endpoint, env, command, copies, link=None):
    """`copies` runs of the program started at once: each one's span (or wall clock)."""
    procs = []
    for k in range(copies):
        pattern = os.path.join(args.out, f"together{k}.%p.jsonl")
        start = time.perf_counter()
        proc = subprocess.Popen([rgpu, "run", "--servers", endpoint, "--", *command],
                                env=case_env(env, link, pattern), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        procs.append((proc, pattern, start))
    times = []
    for proc, pattern, start in procs:
        out, _ = proc.communicate(timeout=1800)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(f"{' '.join(command)} (together) failed ({proc.returncode}):\n{out[-3000:]}")
        times.append(wall if args.measure == "wall" else trace_span(pattern)[args.measure])
    return times


def predict_together(rgpu, traces, link):
    """Each program's predicted change (s) sharing the server: together minus alone."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([rgpu, "model", *traces, "--together", "--link", link or "rtt=0us",
                        "--json", out.name], check=True, stdout=subprocess.DEVNULL)
        rows = json.load(open(out.name))
    wanted = "traced" if not link else link
    return [r["predicted_s"] - r["traced_s"] for r in rows
            if r.get("together") and r["link"] == wanted]


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
    parser.add_argument("--link", action="append", default=[])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--together", type=int, action="append", default=[],
                        help="also run N copies of each case at once on loopback, each one's "
                             "time predicted from separate solo traces (repeatable: 2, 4)")
    parser.add_argument("--out", default="model-validation")
    parser.add_argument("--measure", choices=["calls", "span", "wall"], default="calls")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rgpu = os.path.abspath(args.rgpu)
    server, endpoint = start_server(rgpu, os.path.join(args.out, "server.log"))
    results = []

    def report(row):
        results.append(row)
        # Written as it goes: a run cut short keeps the rows it finished.
        json.dump(results, open(os.path.join(args.out, "validation.json"), "w"), indent=1)
        print(f"{row['case']:<14} {row['link']:<28} loopback {row['loopback_s']:8.3f} s  "
              f"measured {row['measured_s']:8.3f} s (min {row['measured_min_s']:8.3f})  "
              f"predicted {row['predicted_s']:8.3f} s  error {100 * row['error']:+6.1f}%"
              + (f"  outside calls {row['outside_calls_s']:.3f} s"
                 if "outside_calls_s" in row else ""), flush=True)

    try:
        for case in args.case:
            name, env, command = split_case(case)
            run_once(rgpu, endpoint, env, command)  # warm-up: kernel caches, page cache
            solo_traces = [os.path.join(args.out, f"{name}.solo{k}.trace.jsonl")
                           for k in range(max([args.repeats, *args.together]))]
            walls, base = [], []
            for k, keep in enumerate(solo_traces):
                span = measure(args, rgpu, endpoint, env, command, keep=keep, walls=walls)
                if k < args.repeats:
                    base.append(span)
            measured = statistics.median(base)
            # The wall clock beyond the traced calls (start-up and exit), on loopback.
            base_outside = statistics.median(walls) - statistics.median(base) \
                if args.measure != "wall" else None
            trace = os.path.join(args.out, f"{name}.trace.jsonl")
            os.replace(solo_traces[0], trace)
            solo_traces[0] = trace
            for index, link in enumerate(args.link):
                walls = []
                # The first run's trace is kept (to see where a miss comes from).
                kept = os.path.join(args.out, f"{name}.link{index}.trace.jsonl")
                times = [measure(args, rgpu, endpoint, env, command, link=link, walls=walls,
                                 keep=kept if k == 0 else None)
                         for k in range(args.repeats)]
                median = statistics.median(times)
                predicted = predict(rgpu, trace, link, measured)
                row = {"case": name, "link": link, "measure": args.measure,
                       "loopback_s": measured,
                       "measured_s": median, "measured_min_s": min(times),
                       "runs_s": times, "walls_s": walls, "predicted_s": predicted,
                       "error": (predicted - median) / median}
                if args.measure != "wall":
                    # How much more than on loopback the process spends outside its calls.
                    row["outside_calls_s"] = statistics.median(walls) - median
                    row["loopback_outside_calls_s"] = base_outside
                report(row)
            for copies in args.together:
                changes = predict_together(rgpu, solo_traces[:copies], None)
                runs = [measure_together(args, rgpu, endpoint, env, command, copies)
                        for _ in range(args.repeats)]
                # Each run: the mean over its programs; the median of the runs.
                means = [statistics.mean(r) for r in runs]
                median = statistics.median(means)
                predicted = measured + statistics.mean(changes)
                report({"case": name, "link": f"{copies} together (loopback)",
                        "measure": args.measure, "copies": copies, "loopback_s": measured,
                        "measured_s": median, "measured_min_s": min(means),
                        "runs_s": runs, "predicted_s": predicted,
                        "error": (predicted - median) / median})
    finally:
        server.terminate()
        server.wait()
    json.dump(results, open(os.path.join(args.out, "validation.json"), "w"), indent=1)
    with open(os.path.join(args.out, "validation.svg"), "w") as svg:
        svg.write(plot(results))
    print()
    print("| case | link | loopback s | measured s (median, min) | predicted s | error |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['case']} | {r['link']} | {r['loopback_s']:.3f} | {r['measured_s']:.3f}, "
              f"{r['measured_min_s']:.3f} | {r['predicted_s']:.3f} | "
              f"{100 * r['error']:+.1f}% |")
    return 0


def plot(results):
    """SVG: predicted against measured time relative to loopback (1 = the loopback time), one
    point per row, the diagonal and the ±5 % band; log scales."""
    import math
    w, h, m = 560, 480, 60
    ratios = [(r["measured_s"] / r["loopback_s"], r["predicted_s"] / r["loopback_s"], r)
              for r in results if r["loopback_s"] > 0]
    values = [v for x, y, _ in ratios for v in (x, y)] or [1.0, 2.0]
    lo, hi = math.log(min(values + [1.0]) * 0.95), math.log(max(values) * 1.05)
    scale = lambda v: (math.log(v) - lo) / (hi - lo or 1.0)
    px = lambda v: m + scale(v) * (w - 2 * m)
    py = lambda v: h - m - scale(v) * (h - 2 * m)
    a, b = math.exp(lo), math.exp(hi)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'font-family="sans-serif" font-size="12">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{m}" y="24" font-size="14">Predicted vs measured time (x loopback)</text>',
           f'<line x1="{px(a)}" y1="{py(a)}" x2="{px(b)}" y2="{py(b)}" stroke="gray"/>',
           f'<line x1="{px(a)}" y1="{py(a * 1.05)}" x2="{px(b / 1.05)}" y2="{py(b)}" '
           'stroke="lightgray" stroke-dasharray="4"/>',
           f'<line x1="{px(a * 1.05)}" y1="{py(a)}" x2="{px(b)}" y2="{py(b / 1.05)}" '
           'stroke="lightgray" stroke-dasharray="4"/>',
           f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>',
           f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>',
           f'<text x="{w / 2 - 60}" y="{h - 20}">measured / loopback</text>',
           f'<text x="10" y="{m - 10}">predicted / loopback</text>']
    for tick in [1, 1.5, 2, 3, 5, 10, 20, 50, 100]:
        if a <= tick <= b:
            out.append(f'<text x="{px(tick):.0f}" y="{h - m + 16}" text-anchor="middle">'
                       f'{tick}</text>')
            out.append(f'<text x="{m - 6}" y="{py(tick) + 4:.0f}" text-anchor="end">{tick}</text>')
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]
    cases = list(dict.fromkeys(r["case"] for _, _, r in ratios))
    for x, y, r in ratios:
        color = colors[cases.index(r["case"]) % len(colors)]
        shape = "rect" if "copies" in r else "circle"
        if shape == "circle":
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" fill="{color}">'
                       f'<title>{r["case"]} {r["link"]}</title></circle>')
        else:
            out.append(f'<rect x="{px(x) - 4:.1f}" y="{py(y) - 4:.1f}" width="8" height="8" '
                       f'fill="{color}"><title>{r["case"]} {r["link"]}</title></rect>')
    for i, case in enumerate(cases):
        out.append(f'<text x="{m + 14}" y="{m + 24 + 16 * i}" fill="{colors[i % len(colors)]}">'
                   f'{case}</text>')
    out.append(f'<text x="{w - m - 150}" y="{h - m - 10}">circles: links; squares: '
               'together</text>')
    out.append("</svg>\n")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
