#!/usr/bin/env python3
"""scale_study.sh's report: raw/*.json (moetrain_smpi_a2a --json) -> points.csv, scale_study.svg
and a Markdown table on stdout, with the planner's prediction beside every simulated point.
  scale_study_report.py OUT_DIR PREDICT CAL_OVERHEAD_US TOPK
The planner (PREDICT = moetrain_a2a_predict, plan/time_model.cpp's a2a_seconds) models the rows
of one exchange, so it is compared with the simulated multicast (rows only); the simulated plan
(counts + metadata: two flat collectives in every algorithm) is reported beside it. Its
per-message cost is the simulation's: the overhead is charged once at each end, 2 x overhead."""
import glob, json, os, subprocess, sys

out, predict, cal, topk = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
points = []
for f in sorted(glob.glob(os.path.join(out, "raw", "*.json"))):
    j = json.load(open(f))
    base = os.path.basename(f)[:-5].split("-")       # PLATFORM-nN-ROUTING-oO
    ranks = j["ranks"]
    o = float(base[-1][1:])
    flat = {r["size"]: r for r in j["rows"] if r["algo"] == "flat"}
    for r in j["rows"]:
        f0 = flat.get(r["size"])
        points.append(dict(platform="-".join(base[:-3]), nodes=ranks // 8, ranks=ranks,
                           routing=j["options"]["routing"], overhead_us=o, size=r["size"],
                           algo=r["algo"], exchange_us=r["multicast_us"], plan_us=r["plan_us"],
                           total_us=r["time_us"], inter_node_bytes=r["inter_node_bytes"],
                           msgs_per_rank=r["inter_node_msgs_per_rank"], wrong=r["wrong"],
                           speedup=f0["multicast_us"] / r["multicast_us"] if f0 else float("nan"),
                           byte_ratio=f0["inter_node_bytes"] / max(1, r["inter_node_bytes"]) if f0 else 1))

def planner(pts):
    if not os.access(predict, os.X_OK):
        return
    by_o = {}
    for p in pts:
        by_o.setdefault(p["overhead_us"], []).append(p)
    for o, ps in by_o.items():
        lines = "".join(f'{p["algo"]} {p["ranks"]} {p["ranks"]} {p["size"]} {topk}\n' for p in ps)
        res = subprocess.run([predict, "--cluster", "frontier", "--per-message-us", str(2 * o)],
                             input=lines, capture_output=True, text=True, check=True).stdout.split("\n")
        for p, line in zip(ps, res):
            p["planner_us"] = float(line.split()[-1]) * 1e6
            p["planner_err"] = p["planner_us"] / p["exchange_us"] - 1

planner(points)
cols = ["platform", "nodes", "ranks", "routing", "overhead_us", "size", "algo", "exchange_us", "plan_us",
        "total_us", "speedup", "inter_node_bytes", "byte_ratio", "msgs_per_rank", "wrong", "planner_us",
        "planner_err"]
with open(os.path.join(out, "points.csv"), "w") as f:
    f.write(",".join(cols) + "\n")
    for p in points:
        f.write(",".join(f"{p[c]:.4g}" if isinstance(p.get(c), float) else str(p.get(c, "")) for c in cols) + "\n")

# Markdown table: one row per (nodes, routing, overhead, size), the three algorithms side by side.
keys = sorted({(p["nodes"], p["routing"], p["overhead_us"], p["size"]) for p in points})
print("| nodes | ranks | routing | overhead (us) | bytes/rank | flat (us) | rbd (us) | halo (us) "
      "| rbd / halo speed-up | rbd byte ratio | planner flat / rbd / halo (us) | plan (us) | #wrong |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for k in keys:
    ps = {p["algo"]: p for p in points if (p["nodes"], p["routing"], p["overhead_us"], p["size"]) == k}
    if not all(a in ps for a in ("flat", "rbd", "halo")):
        continue
    fl, rb, ha = ps["flat"], ps["rbd"], ps["halo"]
    pl = " / ".join(f'{ps[a].get("planner_us", float("nan")):.1f}' for a in ("flat", "rbd", "halo"))
    print(f'| {k[0]} | {fl["ranks"]} | {k[1]} | {k[2]:g} | {k[3]} | {fl["exchange_us"]:.1f} | '
          f'{rb["exchange_us"]:.1f} | {ha["exchange_us"]:.1f} | {rb["speedup"]:.2f} / {ha["speedup"]:.2f} | '
          f'{rb["byte_ratio"]:.2f} | {pl} | {fl["plan_us"]:.1f} | '
          f'{sum(ps[a]["wrong"] for a in ps)} |')
bad = [p for p in points if "planner_err" in p and abs(p["planner_err"]) > 0.25]
print(f"\nplanner within 25% of the simulation: {len(points) - len(bad)} of {len(points)} points")

# SVG: time per exchange (left) and speed-up over flat (right) against nodes, one line per
# (algorithm, overhead); uniform routing, the largest size.
def svg(points):
    size = max(p["size"] for p in points)
    sel = [p for p in points if p["routing"] == "uniform" and p["size"] == size]
    nodes = sorted({p["nodes"] for p in sel})
    W, H, M = 360, 260, 50
    colors = {"flat": "#444", "rbd": "#1f77b4", "halo": "#d62728"}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W + 40}" height="{H + 40}" '
             'font-family="sans-serif" font-size="11">']
    def panel(x0, key, title):
        ys = [p[key] for p in sel]
        ymax = max(ys) * 1.1
        ymin = 0
        xs = lambda n: x0 + M + (nodes.index(n) / max(1, len(nodes) - 1)) * (W - M - 10)
        yv = lambda v: 20 + (H - 40) * (1 - (v - ymin) / (ymax - ymin))
        parts.append(f'<text x="{x0 + M}" y="14">{title}</text>')
        parts.append(f'<line x1="{x0 + M}" y1="{H - 20}" x2="{x0 + W - 10}" y2="{H - 20}" stroke="black"/>')
        parts.append(f'<line x1="{x0 + M}" y1="20" x2="{x0 + M}" y2="{H - 20}" stroke="black"/>')
        for n in nodes:
            parts.append(f'<text x="{xs(n) - 4}" y="{H - 6}">{n}</text>')
        for i in range(5):
            v = ymin + (ymax - ymin) * i / 4
            parts.append(f'<text x="{x0 + 4}" y="{yv(v) + 4}">{v:.3g}</text>')
        for a in ("flat", "rbd", "halo"):
            for o in sorted({p["overhead_us"] for p in sel}):
                line = sorted((p["nodes"], p[key]) for p in sel if p["algo"] == a and p["overhead_us"] == o)
                pts = " ".join(f"{xs(n):.1f},{yv(v):.1f}" for n, v in line)
                dash = "" if o > 0 else ' stroke-dasharray="4,3"'
                parts.append(f'<polyline points="{pts}" fill="none" stroke="{colors[a]}" stroke-width="2"{dash}/>')
        parts.append(f'<text x="{x0 + W // 2}" y="{H + 8}">nodes (8 ranks each)</text>')
    panel(0, "exchange_us", f"time per exchange (us), {size} B/rank, uniform")
    panel(W + 30, "speedup", "speed-up over flat")
    parts.append(f'<text x="{M}" y="{H + 30}">flat (grey), rbd (blue), halo (red); solid: calibrated '
                 'per-message overhead, dashed: 0</text></svg>')
    return "\n".join(parts)

if points:
    open(os.path.join(out, "scale_study.svg"), "w").write(svg(points))
