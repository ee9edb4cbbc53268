#!/usr/bin/env python3
"""Runs the Azure LLM replay over many conditions and checks issue 14's frontier target in
each: for every gpuscaler-backlog point (queueTarget 4..64), the least GPU-hours of a
gpuscaler (queue-demand) point with no worse p99 wait, as a ratio of the backlog point's
(1.000 or less: matched).

Usage: hack/frontier-matrix.py [--holdout] [BIN] [TRACE]
  BIN    the gpuscaler binary (default bin/gpuscaler)
  TRACE  the Azure LLM trace (default ../shared/testdata/traces/azure-llm-2023-conv.csv)

Without --holdout: seeds 1-3 at service speeds x0.5, x1 and x2, and each half of the
hour at each speed (15 runs), the conditions the metric was chosen on. With --holdout:
seeds 4-6 at x0.75 and x1.5, and the halves at those speeds (10 runs), which no choice
was made on. Each replay takes about a second; two run at a time."""
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

HALVES = (("h1", ["--to", "30m"]), ("h2", ["--from", "30m"]))


def conditions(holdout):
    speeds, seeds = (("0.75", "1.5"), (4, 5, 6)) if holdout else (("0.5", "1", "2"), (1, 2, 3))
    runs = [(f"x{s} seed {n}", ["--service-speed", s, "--seed", str(n)]) for s in speeds for n in seeds]
    runs += [(f"x{s} {h}", ["--service-speed", s] + a) for s in speeds for h, a in HALVES]
    return runs


def replay(binary, trace, label, args, out_dir):
    out = os.path.join(out_dir, label.replace(" ", "_") + ".json")
    subprocess.run([binary, "replay", "--quiet", "--format", "azure-llm", "--trace", trace, "--json", out] + args,
                   check=True, capture_output=True)
    with open(out) as f:
        frontiers = json.load(f)["frontiers"]
    ratios = []
    for b in frontiers["gpuscaler-backlog"]:
        ok = [q["gpu_hours"] for q in frontiers["gpuscaler"] if q["wait_p99_s"] <= b["wait_p99_s"] + 1e-9]
        ratios.append(min(ok) / b["gpu_hours"] if ok else float("inf"))
    settings = [b["setting"].split("=")[1] for b in frontiers["gpuscaler-backlog"]]
    return label, settings, ratios


def main():
    args = sys.argv[1:]
    holdout = "--holdout" in args
    args = [a for a in args if a != "--holdout"]
    binary = args[0] if args else "bin/gpuscaler"
    trace = args[1] if len(args) > 1 else "../shared/testdata/traces/azure-llm-2023-conv.csv"
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda r: replay(binary, trace, r[0], r[1], tmp), conditions(holdout)))
    settings = results[0][1]
    print("run          " + " ".join(f"q{s:<5}" for s in settings) + "  unmatched  best saving")
    missing, points, excess = 0, 0, 0.0
    for label, _, ratios in results:
        unmatched = sum(r > 1 + 1e-9 for r in ratios)
        missing += unmatched > 0
        points += unmatched
        excess += sum(r - 1 for r in ratios if 1 < r < float("inf"))
        print(f"{label:12s} " + " ".join(f"{r:6.3f}" for r in ratios) + f"  {unmatched:9d}  {1 - min(ratios):.0%}")
    print(f"runs with a backlog point unmatched: {missing} of {len(results)}; points unmatched: {points}; "
          f"summed excess GPU-hours ratio: {excess:.3f}")


if __name__ == "__main__":
    main()
