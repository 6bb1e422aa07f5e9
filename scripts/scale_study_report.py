#!/usr/bin/env python3
"""scale_study.sh's report: raw/*.json (moetrain_smpi_a2a --json) -> points.csv, one SVG per
(platform, size) and a Markdown table on stdout, with the planner's prediction beside every point.
  scale_study_report.py OUT_DIR PREDICT CAL_OVERHEAD_US TOPK
Any exchange names in the JSON are reported (flat first, as the speed-up's reference).
The planner (PREDICT = moetrain_a2a_predict, plan/time_model.cpp's a2a_seconds) models the rows
of one exchange, so it is compared with the simulated multicast (rows only); its plan
(a2a_plan_seconds: counts + metadata, flat collectives for flat and rbd, by rails for halo and
rbd-halo) is compared with the simulated plan. Its
per-message cost is the simulation's: the overhead is charged once at each end, 2 x overhead.
Its bytes are the hottest node's per rank (max_node_recv_rows / 8 rows, all algorithms the same):
the simulated node pools its NICs, so the node's ejection link binds, and under skewed routing
that is several times the mean."""
import glob, json, math, os, subprocess, sys

out, predict, cal, topk = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
RPN = 8  # ranks per simulated node (gen_platform.py)


def load(out):
    points = []
    for f in sorted(glob.glob(os.path.join(out, "raw", "*.json"))):
        j = json.load(open(f))
        base = os.path.basename(f)[:-5].split("-")       # PLATFORM-nN-ROUTING-oO
        ranks, o = j["ranks"], float(base[-1][1:])
        flat = {r["size"]: r for r in j["rows"] if r["algo"] == "flat"}
        for r in j["rows"]:
            f0 = flat.get(r["size"])
            rows_per_rank = r["count"] * topk
            points.append(dict(
                platform="-".join(base[:-3]), nodes=ranks // RPN, ranks=ranks, routing=j["options"]["routing"],
                experts=j["options"]["experts"], hidden=j["options"]["hidden"], overhead_us=o, size=r["size"],
                algo=r["algo"], exchange_us=r["multicast_us"], plan_us=r["plan_us"], total_us=r["time_us"],
                pairs=rows_per_rank,
                inter_node_bytes=r["inter_node_bytes"], msgs_per_rank=r["inter_node_msgs_per_rank"],
                wrong=r["wrong"], rows_checked=j["options"]["check_rows"],
                surf_precision=r.get("surf_precision", float("nan")), wall_s=r.get("wall_s", ""),
                hot_node_factor=r.get("max_node_recv_rows", rows_per_rank * RPN) / (rows_per_rank * RPN),
                hot_rank_factor=r.get("max_rank_recv_rows", rows_per_rank) / rows_per_rank,
                speedup=f0["multicast_us"] / r["multicast_us"] if f0 else float("nan"),
                byte_ratio=f0["inter_node_bytes"] / max(1, r["inter_node_bytes"]) if f0 else float("nan")))
    return points


def planner(pts):
    """planner_us per point; one predictor call per (platform, overhead, algorithm): an exchange
    the planner does not model leaves its columns empty."""
    if not os.access(predict, os.X_OK):
        return
    groups = {}
    for p in pts:
        groups.setdefault((p["platform"], p["overhead_us"], p["algo"]), []).append(p)
    for (platform, o, algo), ps in groups.items():
        lines = "".join(f'{algo} {p["ranks"]} {p["ranks"]} {p["size"] * p["hot_node_factor"]:.0f} {topk} '
                        f'{p["pairs"]}\n' for p in ps)
        res = subprocess.run([predict, "--cluster", platform, "--per-message-us", str(2 * o)],
                             input=lines, capture_output=True, text=True)
        if res.returncode != 0:
            print(f"scale_study_report: no planner figure for {algo} on {platform}: {res.stderr.strip()}",
                  file=sys.stderr)
            continue
        for p, line in zip(ps, res.stdout.split("\n")):
            fields = line.split()
            p["planner_us"] = float(fields[5]) * 1e6
            p["planner_err"] = p["planner_us"] / p["exchange_us"] - 1
            p["planner_plan_us"] = float(fields[6]) * 1e6
            p["planner_plan_err"] = p["planner_plan_us"] / p["plan_us"] - 1


def algo_order(points):
    seen = []
    for p in points:
        if p["algo"] not in seen:
            seen.append(p["algo"])
    return sorted(seen, key=lambda a: (a != "flat", seen.index(a)))


def write_csv(points):
    cols = ["platform", "nodes", "ranks", "routing", "experts", "hidden", "overhead_us", "size", "algo",
            "exchange_us", "plan_us", "total_us", "speedup", "inter_node_bytes", "byte_ratio", "msgs_per_rank",
            "wrong", "rows_checked", "hot_node_factor", "hot_rank_factor", "planner_us", "planner_err",
            "surf_precision", "wall_s", "planner_plan_us", "planner_plan_err"]
    with open(os.path.join(out, "points.csv"), "w") as f:
        f.write(",".join(cols) + "\n")
        for p in points:
            f.write(",".join(f"{p[c]:.4g}" if isinstance(p.get(c), float) else str(p.get(c, "")) for c in cols)
                    + "\n")


def table(points, algos):
    """One row per (platform, nodes, routing, overhead, size), the exchanges side by side."""
    keys = sorted({(p["platform"], p["size"], p["routing"], p["overhead_us"], p["nodes"]) for p in points},
                  key=lambda k: (k[0] != "frontier", k[0], k[1], k[2] != "uniform", -k[3], k[4]))
    others = [a for a in algos if a != "flat"]
    print("| platform | nodes | ranks | routing | overhead (us) | bytes/rank | "
          + " | ".join(f"{a} (us)" for a in algos) + " | speed-up " + " / ".join(others)
          + " | rbd byte ratio | planner " + " / ".join(algos) + " (us) | planner error | plan " + " / ".join(algos)
          + " (us) | planner's plan (us), error | speed-up with plan " + " / ".join(others) + " | #wrong | wall (s) |")
    print("|" + "---|" * (15 + len(algos)))
    for k in keys:
        ps = {p["algo"]: p for p in points if (p["platform"], p["size"], p["routing"], p["overhead_us"], p["nodes"]) == k}
        if "flat" not in ps:
            continue
        fl = ps["flat"]
        cell = lambda a, f: f(ps[a]) if a in ps else "-"
        times = " | ".join(cell(a, lambda p: f'{p["exchange_us"]:.1f}') for a in algos)
        sp = " / ".join(cell(a, lambda p: f'{p["speedup"]:.2f}') for a in others)
        pl = " / ".join(cell(a, lambda p: f'{p.get("planner_us", float("nan")):.1f}') for a in algos)
        errs = [ps[a]["planner_err"] for a in ps if "planner_err" in ps[a]]
        err = f"{100 * min(errs):+.0f}..{100 * max(errs):+.0f}%" if errs else "-"
        rb = cell("rbd", lambda p: f'{p["byte_ratio"]:.2f}')
        plans = " / ".join(cell(a, lambda p: f'{p["plan_us"]:.1f}') for a in algos)
        pplans = " / ".join(cell(a, lambda p: f'{p.get("planner_plan_us", float("nan")):.1f}') for a in algos)
        perrs = [ps[a]["planner_plan_err"] for a in ps if "planner_plan_err" in ps[a]]
        if perrs:
            pplans += f", {100 * min(perrs):+.0f}..{100 * max(perrs):+.0f}%"
        sp_total = " / ".join(cell(a, lambda p: f'{fl["total_us"] / p["total_us"]:.2f}') for a in others)
        wrong = str(sum(p["wrong"] for p in ps.values())) + ("" if fl["rows_checked"] else " (origins)")
        print(f'| {k[0]} | {k[4]} | {fl["ranks"]} | {k[2]} | {k[3]:g} | {k[1]} | {times} | {sp} | {rb} | {pl} | '
              f'{err} | {plans} | {pplans} | {sp_total} | {wrong} | {fl["wall_s"]} |')
    bad = [p for p in points if "planner_err" in p and abs(p["planner_err"]) > 0.25]
    n = sum(1 for p in points if "planner_err" in p)
    print(f"\nplanner within 25% of the simulation: {n - len(bad)} of {n} points")
    for p in bad:
        print(f'  outside: {p["platform"]} {p["nodes"]} nodes {p["routing"]} o {p["overhead_us"]:g} {p["size"]} '
              f'{p["algo"]}: {p["exchange_us"]:.1f} simulated, {p["planner_us"]:.1f} planned ({100 * p["planner_err"]:+.0f}%)')
    bad = [p for p in points if "planner_plan_err" in p and abs(p["planner_plan_err"]) > 0.25]
    n = sum(1 for p in points if "planner_plan_err" in p)
    print(f"planner's plan within 25% of the simulated plan: {n - len(bad)} of {n} points")
    for p in bad:
        print(f'  outside: {p["platform"]} {p["nodes"]} nodes {p["routing"]} o {p["overhead_us"]:g} {p["size"]} '
              f'{p["algo"]}: plan {p["plan_us"]:.1f} simulated, {p["planner_plan_us"]:.1f} planned '
              f'({100 * p["planner_plan_err"]:+.0f}%)')


COLORS = ["#444", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]


def svg(sel, algos, title):
    """Time per exchange (left) and speed-up over flat (right) against nodes, one line per
    (algorithm, overhead)."""
    nodes = sorted({p["nodes"] for p in sel})
    W, H, M = 360, 260, 50
    color = {a: COLORS[i % len(COLORS)] for i, a in enumerate(algos)}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W + 40}" height="{H + 40}" '
             'font-family="sans-serif" font-size="11">']

    def panel(x0, key, ptitle):
        ys = [p[key] for p in sel if not math.isnan(p[key])]
        if not ys:  # e.g. no flat run among the points: no speed-up to draw
            return
        ymax, ymin = max(ys) * 1.1, 0
        xs = lambda n: x0 + M + (nodes.index(n) / max(1, len(nodes) - 1)) * (W - M - 10)
        yv = lambda v: 20 + (H - 40) * (1 - (v - ymin) / (ymax - ymin))
        parts.append(f'<text x="{x0 + M}" y="14">{ptitle}</text>')
        parts.append(f'<line x1="{x0 + M}" y1="{H - 20}" x2="{x0 + W - 10}" y2="{H - 20}" stroke="black"/>')
        parts.append(f'<line x1="{x0 + M}" y1="20" x2="{x0 + M}" y2="{H - 20}" stroke="black"/>')
        for n in nodes:
            parts.append(f'<text x="{xs(n) - 4}" y="{H - 6}">{n}</text>')
        for i in range(5):
            v = ymin + (ymax - ymin) * i / 4
            parts.append(f'<text x="{x0 + 4}" y="{yv(v) + 4}">{v:.3g}</text>')
        for a in algos:
            for o in sorted({p["overhead_us"] for p in sel}):
                line = sorted((p["nodes"], p[key]) for p in sel if p["algo"] == a and p["overhead_us"] == o)
                pts = " ".join(f"{xs(n):.1f},{yv(v):.1f}" for n, v in line)
                dash = "" if o > 0 else ' stroke-dasharray="4,3"'
                parts.append(f'<polyline points="{pts}" fill="none" stroke="{color[a]}" stroke-width="2"{dash}/>')
        parts.append(f'<text x="{x0 + W // 2}" y="{H + 8}">nodes (8 ranks each)</text>')

    panel(0, "exchange_us", f"time per exchange (us), {title}")
    panel(W + 30, "speedup", "speed-up over flat")
    legend = ", ".join(f'{a} ({color[a]})' for a in algos)
    parts.append(f'<text x="{M}" y="{H + 30}">{legend}; solid: calibrated per-message overhead, dashed: 0</text></svg>')
    return "\n".join(parts)


points = load(out)
planner(points)
write_csv(points)
algos = algo_order(points)
table(points, algos)
for platform in sorted({p["platform"] for p in points}):
    for size in sorted({p["size"] for p in points if p["platform"] == platform}):
        sel = [p for p in points if p["platform"] == platform and p["size"] == size and p["routing"] == "uniform"]
        if len({p["nodes"] for p in sel}) > 1:
            name = f"scale_study-{platform}-{size // 1024}K.svg"
            open(os.path.join(out, name), "w").write(
                svg(sel, algos, f"{platform}, {size // 1024} KiB/rank, uniform"))
