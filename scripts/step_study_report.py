#!/usr/bin/env python3
"""step_study.sh's report: raw/*.json (moetrain_smpi_step --json) -> points.csv, step_study.svg
and the markdown table. Weak-scaling efficiency = T(smallest world) / T(P) at fixed tokens per
rank, for the simulated step and for the planner's predicted one."""
import csv, glob, json, os, sys

out = sys.argv[1]
pts = sorted((json.load(open(f)) for f in glob.glob(os.path.join(out, "raw", "*.json"))), key=lambda j: j["ranks"])
if not pts:
    sys.exit(f"step_study_report.py: no raw/*.json under {out}")
base, pbase = pts[0]["simulated"]["step_s"], pts[0]["predicted"]["step_s"]
rows = []
for j in pts:
    s, p = j["simulated"], j["predicted"]
    rows.append(dict(ranks=j["ranks"], nodes=j["ranks"] // 8, layout=j["layout"], layout_source=j["layout_source"],
                     tokens_per_rank=j["tokens_per_rank"], step_s=s["step_s"], compute_s=s["compute_s"],
                     a2a_s=s["a2a_s"], p2p_wait_s=s["p2p_wait_s"], allreduce_s=s["allreduce_s"],
                     optimizer_s=s["optimizer_s"], tokens_per_s=s["tokens_per_s"],
                     planner_step_s=p["step_s"], planner_a2a_s=p["a2a_s"], planner_allreduce_s=p["allreduce_s"],
                     planner_allreduce_stage_s=p["allreduce_stage_s"],
                     efficiency=base / s["step_s"], planner_efficiency=pbase / p["step_s"],
                     planner_err=p["step_s"] / s["step_s"] - 1, wrong=j["wrong"], wall_s=j.get("wall_s", "")))
with open(os.path.join(out, "points.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)

print("| ranks | layout (planner's choice) | step (s) | compute | a2a | p2p + bubble | all-reduce | optimizer | "
      "tokens/s | weak-scaling eff. | planner step (s) / eff. | planner vs sim | #wrong | wall (s) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f'| {r["ranks"]} | {r["layout"]} | {r["step_s"]:.3f} | {r["compute_s"]:.3f} | {r["a2a_s"]:.3f} | '
          f'{r["p2p_wait_s"]:.3f} | {r["allreduce_s"]:.3f} | {r["optimizer_s"]:.3f} | {r["tokens_per_s"]:.3g} | '
          f'{100 * r["efficiency"]:.1f}% | {r["planner_step_s"]:.3f} / {100 * r["planner_efficiency"]:.1f}% | '
          f'{100 * r["planner_err"]:+.1f}% | {r["wrong"]} | {r["wall_s"]} |')


def svg(rows):
    W, H, M = 360, 260, 50
    ranks = [r["ranks"] for r in rows]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W + 40}" height="{H + 40}" '
             'font-family="sans-serif" font-size="11">']

    def panel(x0, series, title, ymax, refs=()):
        xs = lambda p: x0 + M + (ranks.index(p) / max(1, len(ranks) - 1)) * (W - M - 10)
        yv = lambda v: 20 + (H - 40) * (1 - v / ymax)
        parts.append(f'<text x="{x0 + M}" y="14">{title}</text>')
        parts.append(f'<line x1="{x0 + M}" y1="{H - 20}" x2="{x0 + W - 10}" y2="{H - 20}" stroke="black"/>')
        parts.append(f'<line x1="{x0 + M}" y1="20" x2="{x0 + M}" y2="{H - 20}" stroke="black"/>')
        for p in ranks:
            parts.append(f'<text x="{xs(p) - 8}" y="{H - 6}">{p}</text>')
        for i in range(5):
            v = ymax * i / 4
            parts.append(f'<text x="{x0 + 4}" y="{yv(v) + 4}">{v:.3g}</text>')
        for v, label in refs:
            parts.append(f'<line x1="{x0 + M}" y1="{yv(v):.1f}" x2="{x0 + W - 10}" y2="{yv(v):.1f}" '
                         'stroke="#999" stroke-dasharray="2,3"/>')
            parts.append(f'<text x="{x0 + W - 90}" y="{yv(v) - 3:.1f}" fill="#777">{label}</text>')
        for key, color, dash in series:
            pts = " ".join(f"{xs(r['ranks']):.1f},{yv(r[key]):.1f}" for r in rows)
            d = ' stroke-dasharray="5,3"' if dash else ""
            parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"{d}/>')
        parts.append(f'<text x="{x0 + W // 2 - 20}" y="{H + 8}">ranks (8 per node)</text>')

    top = max(max(r["step_s"], r["planner_step_s"]) for r in rows) * 1.15
    panel(0, [("step_s", "#1f77b4", False), ("planner_step_s", "#1f77b4", True)], "step time (s), simulated vs planner", top)
    panel(W + 30, [("efficiency", "#d62728", False), ("planner_efficiency", "#d62728", True)],
          "weak-scaling efficiency T(first)/T(P)", 1.1, refs=((0.85, "goal 85%"), (0.73, "Piper 73%")))
    parts.append(f'<text x="{M}" y="{H + 30}">solid: simulated (SMPI, compute injected); dashed: the planner\'s '
                 'prediction of the same step</text></svg>')
    return "\n".join(parts)


open(os.path.join(out, "step_study.svg"), "w").write(svg(rows))
