#!/usr/bin/env python3
"""Expert-load balance of training runs, per window of steps, and a plot of it.

Usage: balance_summary.py [--window 100] [--svg OUT.svg] NAME=OUT_DIR [NAME=OUT_DIR ...]

For each step of a run's metrics.jsonl, per MoE layer: load CV = std/mean of the E per-expert
loads (`expert_loads`: pairs routed to each expert, summed over micro-batches and data ranks;
population std, as scripts/load_cv.py) and max/mean (the busiest expert's load / the mean).
Both are averaged over the MoE layers, then over each window of steps (1-100, 101-200, ...).
Prints a markdown table (one row per window, a CV, max/mean and held-out loss column group per
run: the held-out loss is the `val_loss` evaluated at the window's last step, if any), then the
final held-out loss of each run. --svg writes per-step CV against step, one line per run.
Standard library only (no matplotlib).
"""
import json
import math
import os
import sys

from load_cv import layer_cv, read  # the same CV and the same record de-duplication


def layer_max_over_mean(loads):
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean > 0 else 1.0


def per_step(recs, stat):
    return [sum(stat(l) for l in r["expert_loads"]) / len(r["expert_loads"]) for r in recs]


class Run:
    def __init__(self, name, out_dir):
        self.name = name
        if not os.path.isfile(os.path.join(out_dir, "metrics.jsonl")):
            sys.exit(f"balance_summary.py: {name}={out_dir}: no metrics.jsonl there (a moetrain train --out folder?)")
        recs = [r for r in read(out_dir) if r.get("expert_loads")]
        if not recs:
            sys.exit(f"balance_summary.py: {out_dir}/metrics.jsonl: no expert_loads in any line")
        self.steps = [r["step"] for r in recs]
        self.cv = per_step(recs, layer_cv)
        self.max_mean = per_step(recs, layer_max_over_mean)
        self.val = {r["step"]: r["val_loss"] for r in recs if "val_loss" in r}

    def window(self, lo, hi):
        idx = [i for i, s in enumerate(self.steps) if lo <= s <= hi]
        if not idx:
            return None
        cv = sum(self.cv[i] for i in idx) / len(idx)
        mm = sum(self.max_mean[i] for i in idx) / len(idx)
        return cv, mm, self.val.get(hi)


def table(runs, window):
    last = max(max(r.steps) for r in runs)
    head = "| steps | " + " | ".join(f"{r.name} CV | {r.name} max/mean | {r.name} held-out" for r in runs) + " |"
    lines = [head, "|---|" + "---|---|---|" * len(runs)]
    for lo in range(1, last + 1, window):
        hi = min(lo + window - 1, last)
        cells = []
        for r in runs:
            w = r.window(lo, hi)
            if w is None:
                cells += ["-", "-", "-"]
                continue
            cells += [f"{w[0]:.3f}", f"{w[1]:.2f}", f"{w[2]:.4f}" if w[2] is not None else "-"]
        lines.append(f"| {lo}-{hi} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def svg(runs, path, smooth=10):
    """Per-step CV (light) and its trailing `smooth`-step mean (bold) against step."""
    W, H, L, R, T, B = 720, 420, 60, 20, 30, 50
    xmax = max(max(r.steps) for r in runs)
    top = max(max(r.cv) for r in runs)
    tick = 0.1 if top <= 0.8 else 0.2 if top <= 2 else 0.5
    n_ticks = max(1, math.ceil(top / tick - 1e-9))
    ymax = n_ticks * tick  # a round top
    x = lambda s: L + (W - L - R) * s / xmax
    y = lambda v: T + (H - T - B) * (1 - v / ymax)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="14">Expert load CV per step '
           f'(mean over MoE layers; bold: {smooth}-step mean)</text>']
    for i in range(0, n_ticks + 1):
        v = tick * i
        out.append(f'<line x1="{L}" x2="{W - R}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{L - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.1f}</text>')
    for s in range(0, xmax + 1, 100):
        out.append(f'<line x1="{x(s):.1f}" x2="{x(s):.1f}" y1="{T}" y2="{H - B}" stroke="#eee"/>')
        out.append(f'<text x="{x(s):.1f}" y="{H - B + 16}" text-anchor="middle">{s}</text>')
    out.append(f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="none" stroke="black"/>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">step</text>')
    out.append(f'<text x="16" y="{(T + H - B) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {(T + H - B) / 2})">load CV (std/mean over experts)</text>')
    for k, r in enumerate(runs):
        c = COLOURS[k % len(COLOURS)]
        raw = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in zip(r.steps, r.cv))
        out.append(f'<polyline points="{raw}" fill="none" stroke="{c}" stroke-opacity="0.25" stroke-width="1"/>')
        mean = [sum(r.cv[max(0, i - smooth + 1):i + 1]) / (i + 1 - max(0, i - smooth + 1)) for i in range(len(r.cv))]
        pts = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in zip(r.steps, mean))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="2"/>')
        ly = T + 18 + 18 * k
        out.append(f'<line x1="{W - R - 230}" x2="{W - R - 205}" y1="{ly - 4}" y2="{ly - 4}" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{W - R - 198}" y="{ly}">{r.name}</text>')
    out.append("</svg>")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main(argv):
    window, svg_path, runs = 100, None, []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--window", "--svg"):
            if i + 1 >= len(argv):
                sys.exit(f"balance_summary.py: {a} needs a value")
            if a == "--window":
                window = int(argv[i + 1])
                if window < 1:
                    sys.exit(f"balance_summary.py: --window must be >= 1, got {window}")
            else:
                svg_path = argv[i + 1]
            i += 2
            continue
        if "=" not in a:
            sys.exit(f"balance_summary.py: expected NAME=OUT_DIR, got {a!r}")
        name, path = a.split("=", 1)
        runs.append(Run(name, path))
        i += 1
    if not runs:
        sys.exit(__doc__)
    print(table(runs, window))
    print()
    for r in runs:
        final = max(r.val) if r.val else None
        print(f"{r.name}: final held-out loss " + (f"{r.val[final]:.4f} (step {final})" if final else "-"))
    if svg_path:
        svg(runs, svg_path)
        print(f"plot: {svg_path}")


if __name__ == "__main__":
    main(sys.argv[1:])
