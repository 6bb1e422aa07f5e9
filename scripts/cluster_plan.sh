#!/usr/bin/env bash
# The planner against a real network (issue 39, item 5): `moetrain calibrate` measures this
# machine's kernels (one rank, on the host) and then, run on a scripts/cluster.sh cluster of
# 2 nodes x 2 ranks at RATE, its links (p2p inside and between nodes, all-reduce, the four
# exchanges at the cluster's own topology); `moetrain train` runs training layouts on the same
# cluster; `moetrain plan --evaluate` predicts each from the profile. One table:
#   layout | predicted a2a | measured a2a | err% | predicted step | measured step | err%
# Measured: the medians over steps 3.. of time_s.all_to_all (the slowest stage's exchange time, as
# the planner's stage a2a) and step_time_s. Goal: both within 25%.
#   scripts/cluster_plan.sh [OUT]     (default out/cluster_plan; about 5 minutes)
# Environment: RATE (200mbit), STEPS (12), MODEL (tiny), SEQ (128), GLOBAL_BATCH (16).
set -euo pipefail
source "$(dirname "$0")/cluster_lib.sh" cluster_plan "${1:-}"  # root, out, bin, cluster
RATE="${RATE:-200mbit}"; STEPS="${STEPS:-12}"; MODEL="${MODEL:-tiny}"; SEQ="${SEQ:-128}"; GB="${GLOBAL_BATCH:-16}"
export OPENBLAS_NUM_THREADS=1
rm -rf "$out"; mkdir -p "$out"
name="cp$$"; name="${name:0:8}"
trap '"$cluster" down --name "$name" >/dev/null 2>&1 || true' EXIT
echo "# $(nproc) cores, load average $(cut -d' ' -f1 /proc/loadavg) before the runs"

# Layouts on 2 nodes x 2 ranks: NAME LAYOUT (the global batch is the same for all).
layouts=(
  "ep4     pp=1,dp=1,ep=4,mb=1,recompute=none,a2a=flat"
  "ep4-rbd pp=1,dp=1,ep=4,mb=1,recompute=none,a2a=rbd"
  "ep2dp2  pp=1,dp=2,ep=2,mb=1,recompute=none,a2a=flat"
  "pp2ep2  pp=2,dp=1,ep=2,mb=4,recompute=none,a2a=flat"
)
t0=$SECONDS
"$bin" calibrate -o "$out/profile.json" --quiet
echo "# calibrate, 1 rank on the host: $((SECONDS - t0)) s"
"$cluster" up 2 2 --name "$name" --rate "$RATE" >/dev/null
t0=$SECONDS
"$cluster" run --name "$name" -- "$bin" calibrate --append -o "$out/profile.json" --quiet
echo "# calibrate, 2 nodes x 2 ranks at $RATE: $((SECONDS - t0)) s"
# One process first: its expert loads give the planner every layout's rows (the same data).
"$bin" train --preset "$MODEL" --seq-len "$SEQ" --steps "$STEPS" --eval-every 0 --eval-batches 1 --quiet \
  --batch "$GB" --out "$out/one"
for row in "${layouts[@]}"; do
  read -r lname layout <<<"$row"
  declare -A kv=()
  IFS=',' read -ra parts <<<"$layout"
  for p in "${parts[@]}"; do kv[${p%%=*}]=${p#*=}; done
  t0=$SECONDS
  "$cluster" run --name "$name" -- "$bin" train --preset "$MODEL" --seq-len "$SEQ" --steps "$STEPS" \
    --eval-every 0 --eval-batches 1 --quiet --out "$out/$lname" --pp "${kv[pp]}" --dp "${kv[dp]}" \
    --ep "${kv[ep]}" --micro-batches "${kv[mb]}" --recompute "${kv[recompute]}" --a2a "${kv[a2a]}" \
    --batch $((GB / (kv[dp] * kv[ep])))
  echo "# $lname on the cluster: $((SECONDS - t0)) s"
  "$bin" plan --model "$MODEL" --cluster "$out/profile.json" --evaluate --layout "$layout" --seq-len "$SEQ" \
    --global-batch "$GB" --loads "$out/one/metrics.jsonl" --json > "$out/$lname/predicted.json"
  unset kv
done
echo "# load average after the runs: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$out" "${layouts[@]}" <<'PY'
import json, os, statistics, sys
out, rows = sys.argv[1], sys.argv[2:]
prof = json.load(open(os.path.join(out, "profile.json")))
print(f"# profile: {prof['ranks_per_node']} ranks/node, {prof['nodes']} nodes; inter-node "
      f"{prof['links']['inter_node']['bandwidth'] / 1e6:.1f} MB/s, {prof['links']['inter_node']['latency'] * 1e6:.0f} us; intra-node "
      f"{prof['links']['intra_node']['bandwidth'] / 1e6:.0f} MB/s, {prof['links']['intra_node']['latency'] * 1e6:.0f} us")
print(f"\n| layout | pp dp ep mb a2a | predicted a2a | measured a2a | err | predicted step | measured step | err |")
print("|---|---|---|---|---|---|---|---|")
bad = 0
for row in rows:
    name, layout = row.split()
    recs = [json.loads(l) for l in open(os.path.join(out, name, "metrics.jsonl")) if '"step_time_s"' in l]
    step = statistics.median(r["step_time_s"] for r in recs[2:])
    a2a = statistics.median(r["time_s"]["all_to_all"] for r in recs[2:])
    p = json.load(open(os.path.join(out, name, "predicted.json")))
    ps, pa = p["time"]["step_s"], p["time"]["a2a_s"]  # M x the slowest stage's exchange, as measured
    ea, es = 100 * (pa - a2a) / a2a, 100 * (ps - step) / step
    bad += abs(ea) > 25 or abs(es) > 25
    l = p["layout"]
    print(f"| {name} | {l['pp']} {l['dp']} {l['ep']} {l['micro_batches']} {l['a2a']} | {pa * 1e3:.1f} ms | {a2a * 1e3:.1f} ms | "
          f"{ea:+.0f}% | {ps * 1e3:.0f} ms | {step * 1e3:.0f} ms | {es:+.0f}% |")
print(f"\ngoal: exchange and step within 25%: {len(rows) - bad} of {len(rows)} layouts inside")
PY
