#!/usr/bin/env python3
"""Writes four synthetic hours of LLM requests, in Mooncake's trace format (JSON lines:
timestamp in ms, input_length, output_length), for shapes the two real dense hours do not
have: traffic no queue-demand setting was worked out on. Each request's tokens are drawn
from the Azure conversation hour's, so the service times are those of a real service.

  ramp.jsonl    arrivals at random whose rate rises smoothly from 1 to 8 a second over
                half an hour and falls back (a day's rise and fall, compressed)
  steps.jsonl   arrivals at random at 2 a second, tripling to 6 for 8 minutes in every 16
                (a step no autoscaler sees coming: new replicas take a cold start)
  fanout.jsonl  batches arriving at random, 0.5 a second, of a geometric number of
                requests, 8 on average, within 50 ms (an agent fanning out to tools or
                sub-queries: bursts at random, not at regular times as on Mooncake)
  surge.jsonl   arrivals at random at a steady 3 a second for 35 minutes, then doubling
                to 6 over five minutes and staying there (a surge after a quiet spell)

Usage: hack/synth-traces.py [--seed N] TRACES_DIR OUT_DIR
  TRACES_DIR  shared/testdata/traces (the Azure hour's tokens, and the model load
              latencies, linked beside the output for gpuscaler replay)
  OUT_DIR     where the four files go

The same seed writes the same files. Replay them with
  hack/replay-matrix.py --traces ramp=OUT_DIR/ramp.jsonl,steps=OUT_DIR/steps.jsonl,fanout=OUT_DIR/fanout.jsonl,surge=OUT_DIR/surge.jsonl
"""
import csv
import json
import math
import os
import random
import sys

HOUR = 3600.0


def ramp(r):
    peak, t, out = 8.0, 0.0, []
    while True:
        t += r.expovariate(peak)  # thinning: a rate of at most peak, kept in proportion
        if t >= HOUR:
            return out
        if r.random() < (1 + 7 * (0.5 - 0.5 * math.cos(2 * math.pi * t / HOUR))) / peak:
            out.append(t)


def steps(r):
    t, out = 0.0, []
    while True:
        t += r.expovariate(6.0 if int(t // 480) % 2 == 1 else 2.0)
        if t >= HOUR:
            return out
        out.append(t)


def surge(r):
    peak, t, out = 6.0, 0.0, []
    while True:
        t += r.expovariate(peak)  # thinning, as ramp
        if t >= HOUR:
            return out
        if r.random() < (3 + 3 * min(1.0, max(0.0, t - 2100) / 300)) / peak:
            out.append(t)


def fanout(r):
    t, out = 0.0, []
    while True:
        t += r.expovariate(0.5)
        if t >= HOUR:
            return sorted(x for x in out if x < HOUR)
        n = 1
        while r.random() > 1 / 8:
            n += 1
        out += [t + r.uniform(0, 0.05) for _ in range(n)]


def main():
    args = sys.argv[1:]
    seed = 7
    if "--seed" in args:
        i = args.index("--seed")
        seed = int(args[i + 1])
        del args[i:i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    traces, out_dir = args
    with open(os.path.join(traces, "azure-llm-2023-conv.csv")) as f:
        rows = list(csv.reader(f))[1:]
    tokens = [(int(row[1]), int(row[2])) for row in rows]
    os.makedirs(out_dir, exist_ok=True)
    latency = "gentd26-basemodel-load-latency-ms.csv"
    link = os.path.join(out_dir, latency)
    if not os.path.exists(link):
        os.symlink(os.path.abspath(os.path.join(traces, latency)), link)
    for name, shape in (("ramp", ramp), ("steps", steps), ("fanout", fanout), ("surge", surge)):
        r = random.Random(f"{seed}-{name}")
        times = shape(r)
        with open(os.path.join(out_dir, name + ".jsonl"), "w") as f:
            for t in times:
                ctx, gen = r.choice(tokens)
                f.write(json.dumps({"timestamp": int(t * 1000), "input_length": ctx, "output_length": gen}) + "\n")
        print(f"{name}.jsonl: {len(times)} requests", file=sys.stderr)


if __name__ == "__main__":
    main()
