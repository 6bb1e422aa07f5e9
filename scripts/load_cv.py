#!/usr/bin/env python3
"""Expert-load balance of training runs, from their metrics.jsonl.

Usage: load_cv.py NAME=OUT_DIR [NAME=OUT_DIR ...] [--window 50]

Load CV of a step = coefficient of variation of the per-expert loads of one MoE layer,
std(c) / mean(c) (population std over the E experts of the step's `expert_loads`: pairs routed to
each expert, summed over micro-batches and data ranks), averaged over the MoE layers. Printed per
run: the mean CV over the first and the last `window` steps, the CV at a few steps, and the
held-out loss (`val_loss`) at every evaluation. A markdown table, for README.md.
"""
import json
import math
import os
import sys


def layer_cv(loads):
    n = len(loads)
    mean = sum(loads) / n
    if mean == 0:
        return 0.0
    var = sum((c - mean) ** 2 for c in loads) / n
    return math.sqrt(var) / mean


def read(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    last = {}
    for r in recs:  # a resumed run may repeat steps: the last record of a step counts
        last[r["step"]] = r
    return [last[s] for s in sorted(last)]


def main(argv):
    window = 50
    runs = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--window":
            window = int(argv[i + 1])
            i += 2
            continue
        if "=" not in a:
            sys.exit(f"load_cv.py: expected NAME=OUT_DIR, got {a!r}")
        name, path = a.split("=", 1)
        runs.append((name, path))
        i += 1
    if not runs:
        sys.exit(__doc__)
    rows = []
    for name, path in runs:
        recs = read(path)
        cv = [sum(layer_cv(l) for l in r["expert_loads"]) / len(r["expert_loads"]) for r in recs]
        vals = [(r["step"], r["val_loss"]) for r in recs if "val_loss" in r]
        rows.append((name, recs, cv, vals))
    steps_shown = [1, 100, 200, 300, 400, 500, 600]
    print(f"| run | load CV, steps 1-{window} | load CV, last {window} steps | "
          + " | ".join(f"CV @{s}" for s in steps_shown) + " | held-out loss (final) |")
    print("|---|---|---|" + "---|" * len(steps_shown) + "---|")
    for name, recs, cv, vals in rows:
        by_step = {r["step"]: c for r, c in zip(recs, cv)}
        first = sum(cv[:window]) / min(window, len(cv))
        lastw = sum(cv[-window:]) / min(window, len(cv))
        at = " | ".join(f"{by_step[s]:.3f}" if s in by_step else "-" for s in steps_shown)
        final = f"{vals[-1][1]:.4f}" if vals else "-"
        print(f"| {name} | {first:.3f} | {lastw:.3f} | {at} | **{final}** |")
    print()
    for name, recs, cv, vals in rows:
        print(f"{name}: held-out loss " + ", ".join(f"{s}: {v:.4f}" for s, v in vals))


if __name__ == "__main__":
    main(sys.argv[1:])
