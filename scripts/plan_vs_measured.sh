#!/usr/bin/env bash
# The planner against measured runs on this machine. Calibrates (1, 2, 4, 8 ranks, each right
# before the layouts of that rank count), trains a small
# model in several layouts (1 to 8 ranks; mixes of PP, EP, DP, recomputation), asks
# `moetrain plan --evaluate` for the same layouts, and prints one table:
#   layout | predicted mem | measured mem | err% | predicted step | measured step | err%
# Measured memory: the largest per-stage "total_peak_bytes" (exact high-water mark of parameters,
# gradients, optimizer state, activations, workspace and pipeline buffers) of metrics.jsonl;
# measured step: the median step_time_s after 2 warm-up steps. Limits: memory within 10%, time
# within 25%. Exit status 1 when a layout misses a limit.
# Usage: scripts/plan_vs_measured.sh [MOETRAIN] [WORKDIR]     (about 2 minutes on 2 cores)
# Environment: PLAN_VS_MEASURED_CHECK=memory judges memory only (times are printed, not judged:
# the ctest plan_vs_measured_memory, since timings on a shared CI machine flake);
# PLAN_VS_MEASURED_QUICK=1 calibrates with --quick.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/build/moetrain}"
work="${2:-$root/build/plan_vs_measured}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
# Ahead of other work on the machine when allowed (root): the timings are this job's.
prio=()
if nice -n -10 true 2>/dev/null; then prio=(nice -n -10); fi
mpirun=("${prio[@]}" mpirun --oversubscribe --bind-to none)
model=tiny
check="${PLAN_VS_MEASURED_CHECK:-all}"
quick=()
[ "${PLAN_VS_MEASURED_QUICK:-0}" = 1 ] && quick=(--quick)
seq=128
steps=20
rm -rf "$work"
mkdir -p "$work"
load=$(cut -d' ' -f1 /proc/loadavg)
echo "# $(nproc) cores, load average $load before the runs (timings assume an otherwise idle machine)"

# Layouts: NAME NP LAYOUT GLOBAL_BATCH (sequences; --batch per data rank = global / (dp·ep)).
# One global batch for all: every layout then sees the same data and routes exactly as the
# first (one-process) run, whose expert loads (--loads) give the planner each EP layout's rows.
layouts=(
  "1r-base     1 pp=1,dp=1,ep=1,mb=1,recompute=none,a2a=flat 16"
  "1r-full-mb2 1 pp=1,dp=1,ep=1,mb=2,recompute=full,a2a=flat 16"
  "2r-ep2      2 pp=1,dp=1,ep=2,mb=1,recompute=none,a2a=flat 16"
  "2r-pp2-mb4  2 pp=2,dp=1,ep=1,mb=4,recompute=none,a2a=flat 16"
  "4r-pp2-ep2  4 pp=2,dp=1,ep=2,mb=4,recompute=moe,a2a=flat 16"
  "4r-dp2-ep2  4 pp=1,dp=2,ep=2,mb=2,recompute=full,a2a=flat 16"
  "8r-pp2-ep4  8 pp=2,dp=1,ep=4,mb=4,recompute=moe,a2a=flat 16"
  "8r-pp4-dp2  8 pp=4,dp=2,ep=1,mb=8,recompute=none,a2a=flat 16"
)
# Calibration of each rank count right before its layouts (the machine's load then is the one
# they run under): one rank alone first (kernel tables), then --append per rank count.
calibrated=0
for row in "${layouts[@]}"; do
  read -r name np layout gb <<<"$row"
  if [ "$np" -ne "$calibrated" ]; then
    start=$(date +%s)
    if [ "$np" -eq 1 ]; then
      "${prio[@]}" "$bin" calibrate -o "$work/profile.json" --quiet "${quick[@]}"
    else
      "${mpirun[@]}" -np "$np" "$bin" calibrate --append -o "$work/profile.json" --quiet "${quick[@]}"
    fi
    calibrated=$np
    echo "# calibrate ($np rank(s)): $(( $(date +%s) - start )) s"
  fi
  declare -A kv=()
  IFS=',' read -ra parts <<<"$layout"
  for p in "${parts[@]}"; do kv[${p%%=*}]=${p#*=}; done
  batch=$(( gb / (kv[dp] * kv[ep]) ))
  start=$(date +%s)
  "${mpirun[@]}" -np "$np" "$bin" train --preset "$model" --seq-len "$seq" --steps "$steps" \
    --eval-every 0 --eval-batches 1 --quiet --out "$work/$name" \
    --pp "${kv[pp]}" --dp "${kv[dp]}" --ep "${kv[ep]}" --micro-batches "${kv[mb]}" \
    --recompute "${kv[recompute]}" --a2a "${kv[a2a]}" --batch "$batch"
  echo "# $name: $(( $(date +%s) - start )) s"
  unset kv
done
# Predictions (the profile now holds every rank count; the loads come from 1r-base).
for row in "${layouts[@]}"; do
  read -r name np layout gb <<<"$row"
  "$bin" plan --model "$model" --cluster "$work/profile.json" --evaluate --layout "$layout" \
    --seq-len "$seq" --global-batch "$gb" --loads "$work/1r-base/metrics.jsonl" --json \
    > "$work/$name/predicted.json"
done
echo "# load average after the runs: $(cut -d' ' -f1-3 /proc/loadavg)"

/usr/bin/env python3 - "$work" "$check" "${layouts[@]}" <<'PY'
import json, os, statistics, sys
work, check, rows = sys.argv[1], sys.argv[2], sys.argv[3:]
print(f"\n{'layout':<12} {'ranks':>5}  {'pp dp ep mb recompute':<24} {'pred mem':>10} {'meas mem':>10} {'err%':>6}"
      f"  {'pred step':>10} {'meas step':>10} {'err%':>6}")
bad = 0
for row in rows:
    name, np_, layout, gb = row.split()
    recs = [json.loads(l) for l in open(os.path.join(work, name, "metrics.jsonl"))]
    mem = max(max(s["total_peak_bytes"] for s in r["stages"]) for r in recs)
    step = statistics.median(r["step_time_s"] for r in recs[2:])
    p = json.load(open(os.path.join(work, name, "predicted.json")))
    pm, ps = p["memory"]["peak_bytes"], p["time"]["step_s"]
    em, et = 100 * (pm - mem) / mem, 100 * (ps - step) / step
    ok = abs(em) <= 10 and (check == "memory" or abs(et) <= 25)
    bad += 0 if ok else 1
    l = p["layout"]
    desc = f"{l['pp']:>2} {l['dp']:>2} {l['ep']:>2} {l['micro_batches']:>2} {l['recompute']}"
    print(f"{name:<12} {np_:>5}  {desc:<24} {pm/1e6:>7.2f} MB {mem/1e6:>7.2f} MB {em:>+6.1f}"
          f"  {ps*1e3:>7.1f} ms {step*1e3:>7.1f} ms {et:>+6.1f}{'' if ok else '   <-- outside the limits'}")
limits = "memory within 10% (times not judged)" if check == "memory" else "memory within 10%, step time within 25%"
print(f"\nlimits: {limits}: {len(rows) - bad} of {len(rows)} layouts inside")
sys.exit(1 if bad else 0)
PY
