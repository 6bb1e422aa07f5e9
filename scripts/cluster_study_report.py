#!/usr/bin/env python3
"""scripts/cluster_study.sh's report: OUT/raw/r<round>-n<nodes>-<rate>.json (bench a2a --json on
the cluster) and OUT/raw/simgrid-n<nodes>-<rate>.json (moetrain_smpi_a2a on the netns platform) ->
OUT/cluster_study.csv (one row per nodes x rate x size x algorithm: every round's time, the median,
the spread, the speed-up over flat, SimGrid's time and the ratio measured/SimGrid),
OUT/cluster_study.md (the table) and OUT/cluster_study.svg (time per exchange against size at each
rate, measured medians solid, SimGrid dashed).
  cluster_study_report.py OUT"""
import glob, json, math, os, re, statistics, sys

out = sys.argv[1]
ALGOS = ["flat", "rbd", "halo", "rbd-halo"]
COLORS = {"flat": "#444444", "rbd": "#d62728", "halo": "#1f77b4", "rbd-halo": "#2ca02c"}
RATE_ORDER = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def rate_key(r):
    m = re.fullmatch(r"(\d+)(bit|kbit|mbit|gbit)", r)
    return float("inf") if r == "unlimited" else int(m[1]) * RATE_ORDER[m[2]]


def load_json(path):
    with open(path) as f:
        return json.load(f)


meas = {}  # (nodes, rate, size, algo) -> [time_us per round]
info = {}  # same key -> row of the last round (bytes, wrong)
wrong = 0
for path in sorted(glob.glob(os.path.join(out, "raw", "r*-n*-*.json"))):
    m = re.fullmatch(r"r(\d+)-n(\d+)-(.+)\.json", os.path.basename(path))
    if not m:
        continue
    j = load_json(path)
    for row in j["rows"]:
        key = (int(m[2]), m[3], row["size"], row["algo"])
        meas.setdefault(key, []).append(row["time_us"])
        info[key] = row
        wrong += row["wrong"]
sim = {}
for path in glob.glob(os.path.join(out, "raw", "simgrid-n*-*.json")):
    m = re.fullmatch(r"simgrid-n(\d+)-(.+)\.json", os.path.basename(path))
    for row in load_json(path)["rows"]:
        sim[(int(m[1]), m[2], row["size"], row["algo"])] = row["time_us"]

points = []
for key in sorted(meas, key=lambda k: (k[0], rate_key(k[1]), k[2], ALGOS.index(k[3]))):
    n, rate, size, algo = key
    t = meas[key]
    med = statistics.median(t)
    flat = statistics.median(meas.get((n, rate, size, "flat"), [math.nan]))
    s = sim.get(key, math.nan)
    points.append(dict(nodes=n, rate=rate, size=size, algo=algo, rounds=t, median_us=med,
                       spread_pct=100 * (max(t) - min(t)) / med if med > 0 else math.nan,
                       speedup=flat / med if med > 0 else math.nan, simgrid_us=s,
                       sim_speedup=sim.get((n, rate, size, "flat"), math.nan) / s if s > 0 else math.nan,
                       measured_over_sim=med / s if s > 0 else math.nan,
                       inter_node_bytes=info[key]["inter_node_bytes"], wrong=info[key]["wrong"]))

with open(os.path.join(out, "cluster_study.csv"), "w") as f:
    f.write("nodes,ranks_per_node,rate,size_bytes,algo,rounds_us,median_us,spread_pct,speedup_vs_flat,"
            "simgrid_us,simgrid_speedup_vs_flat,measured_over_simgrid,inter_node_bytes,wrong\n")
    for p in points:
        f.write(f"{p['nodes']},2,{p['rate']},{p['size']},{p['algo']},{' '.join(f'{x:.0f}' for x in p['rounds'])},"
                f"{p['median_us']:.0f},{p['spread_pct']:.1f},{p['speedup']:.3f},{p['simgrid_us']:.0f},"
                f"{p['sim_speedup']:.3f},{p['measured_over_sim']:.3f},{p['inter_node_bytes']},{p['wrong']}\n")


def size_text(b):
    return f"{b // 1048576} MiB" if b >= 1048576 else f"{b // 1024} KiB"


def fmt_ms(us):
    return "n/a" if math.isnan(us) else f"{us / 1000:.2f}"


lines = ["| nodes | link | size | algorithm | median ms | spread | × flat | SimGrid ms | SimGrid × flat | measured / SimGrid |",
         "|---|---|---|---|---|---|---|---|---|---|"]
for p in points:
    lines.append(f"| {p['nodes']} | {p['rate']} | {size_text(p['size'])} | {p['algo']} | {fmt_ms(p['median_us'])} | "
                 f"{p['spread_pct']:.0f}% | {p['speedup']:.2f} | {fmt_ms(p['simgrid_us'])} | "
                 f"{'n/a' if math.isnan(p['sim_speedup']) else format(p['sim_speedup'], '.2f')} | "
                 f"{'n/a' if math.isnan(p['measured_over_sim']) else format(p['measured_over_sim'], '.2f')} |")
rounds = max((len(p["rounds"]) for p in points), default=0)
lines.append("")
lines.append(f"{len(points)} points, {rounds} rounds each; #wrong summed over every row of every round: {wrong}.")
with open(os.path.join(out, "cluster_study.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))


def svg():
    """One panel per (nodes, rate): time per exchange against size, log-log."""
    panels = sorted({(p["nodes"], p["rate"]) for p in points}, key=lambda k: (k[0], rate_key(k[1])))
    sizes = sorted({p["size"] for p in points})
    if not panels or len(sizes) < 2:
        return ""
    W, H, M, cols = 300, 220, 46, 4
    rows = (len(panels) + cols - 1) // cols
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{cols * W + 20}" height="{rows * H + 50}" '
             'font-family="sans-serif" font-size="10">']
    for i, (n, rate) in enumerate(panels):
        x0, y0 = (i % cols) * W + 10, (i // cols) * H + 10
        sel = [p for p in points if p["nodes"] == n and p["rate"] == rate]
        ys = [v for p in sel for v in (p["median_us"], p["simgrid_us"]) if v > 0 and not math.isnan(v)]
        lo, hi = math.log10(min(ys) / 1.5), math.log10(max(ys) * 1.5)
        xs = lambda s: x0 + M + (math.log(s / sizes[0]) / math.log(sizes[-1] / sizes[0])) * (W - M - 20)
        yv = lambda v: y0 + 20 + (H - 60) * (1 - (math.log10(v) - lo) / (hi - lo))
        parts.append(f'<text x="{x0 + M}" y="{y0 + 12}">{n} nodes x 2 ranks, {rate}</text>')
        parts.append(f'<line x1="{x0 + M}" y1="{y0 + H - 40}" x2="{x0 + W - 20}" y2="{y0 + H - 40}" stroke="black"/>')
        parts.append(f'<line x1="{x0 + M}" y1="{y0 + 20}" x2="{x0 + M}" y2="{y0 + H - 40}" stroke="black"/>')
        for s in sizes:
            parts.append(f'<text x="{xs(s) - 12}" y="{y0 + H - 28}">{size_text(s)}</text>')
        for e in range(math.ceil(lo), math.floor(hi) + 1):
            parts.append(f'<text x="{x0 + 2}" y="{yv(10 ** e) + 3}">{10 ** e / 1000:g} ms</text>')
        for a in ALGOS:
            for key, dash in (("median_us", ""), ("simgrid_us", ' stroke-dasharray="4,3"')):
                line = sorted((p["size"], p[key]) for p in sel if p["algo"] == a and p[key] > 0)
                if len(line) > 1:
                    pts = " ".join(f"{xs(s):.1f},{yv(v):.1f}" for s, v in line)
                    parts.append(f'<polyline points="{pts}" fill="none" stroke="{COLORS[a]}" stroke-width="1.5"{dash}/>')
    legend = ", ".join(f"{a} ({COLORS[a]})" for a in ALGOS)
    parts.append(f'<text x="20" y="{rows * H + 35}">time per exchange (median of the rounds, slowest rank) against '
                 f'bytes per rank; solid measured, dashed SimGrid; {legend}</text></svg>')
    return "\n".join(parts)


with open(os.path.join(out, "cluster_study.svg"), "w") as f:
    f.write(svg())
print(f"wrote {out}/cluster_study.csv, cluster_study.md, cluster_study.svg")
