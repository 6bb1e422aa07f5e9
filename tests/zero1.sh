#!/usr/bin/env bash
# ZeRO-1 (`train --zero1`, src/parallel/zero1.h) against one process and against the same layout
# without it, 20 steps of test-moe / test-moe4 (global batch 8, as tests/parity.sh):
#  1. parity: every logged loss (loss, ce_loss, aux_loss, grad_norm, val_loss) and every final
#     weight within 1e-5 relative of the one-process run, for DP2, EP2xDP2 and PP2xDP2 --zero1
#     (and --zero1 on one process, where it is a no-op);
#  2. bit for bit: where the summation order is the same, --zero1 gives the same bits as the run
#     without it (losses and final weights); grad_norm is summed over slices instead of whole
#     tensors, so it is compared to 1e-12 relative instead;
#  3. memory (metrics.jsonl "optimizer_bytes", exact): each rank's AdamW state is its group's
#     share: the ranks of a data group hold together exactly what one rank holds without ZeRO, and
#     no two differ by more than 8 bytes per span; each stage's measured high-water mark drops by
#     exactly the bytes saved; `moetrain plan --evaluate ... --zero1` predicts the measured
#     per-stage peak within 5% and prints a train command carrying --zero1;
#  4. checkpoints hold full logical tensors: a --zero1 checkpoint resumes without --zero1 and on
#     one process, and a plain checkpoint resumes with --zero1, giving the uninterrupted run's
#     steps 11-20 (bit for bit where the layouts' summation orders agree, else 1e-5).
# Usage: zero1.sh MOETRAIN CORPUS WORKDIR
set -euo pipefail
bin="$1"
corpus="$2"
work="$3"
common=(train --steps 20 --seq-len 32 --eval-every 10 --eval-batches 1 --quiet --data "$corpus"
        --lr 3e-3 --warmup 5)
source "$(dirname "$0")/layout_runs.sh"  # run NAME NP ARGS...
scratch "$work"  # tests/lib.sh: the work folder, emptied
m=(--preset test-moe --checkpoint.every 10)
run single 1 "${m[@]}" --batch 8
run single-z 1 "${m[@]}" --batch 8 --zero1
run dp2 2 "${m[@]}" --batch 4 --dp 2
run dp2-z 2 "${m[@]}" --batch 4 --dp 2 --zero1
# DP = 1 with EP 2: accepted; the experts stay whole, the replicated tensors split over the 2 EP ranks.
run ep2 2 "${m[@]}" --batch 4 --ep 2 --topo.ranks-per-node 2
run ep2-z 2 "${m[@]}" --batch 4 --ep 2 --topo.ranks-per-node 2 --zero1
run ep2dp2 4 "${m[@]}" --batch 2 --ep 2 --dp 2 --topo.ranks-per-node 4
run ep2dp2-z 4 "${m[@]}" --batch 2 --ep 2 --dp 2 --topo.ranks-per-node 4 --zero1
p=(--preset test-moe4 --micro-batches 4)
run pp.single 1 "${p[@]}" --batch 8
run pp.pp2dp2 4 "${p[@]}" --batch 4 --pp 2 --dp 2
run pp.pp2dp2-z 4 "${p[@]}" --batch 4 --pp 2 --dp 2 --zero1
# Resume at step 10: --zero1 checkpoint without --zero1 (DP2 and one process), plain with --zero1.
run res.dp2-z-to-dp2 2 "${m[@]}" --batch 4 --dp 2 --resume "$work/dp2-z/checkpoints/step-10"
run res.dp2-z-to-single 1 "${m[@]}" --batch 8 --resume "$work/dp2-z/checkpoints/step-10"
run res.dp2-to-dp2-z 2 "${m[@]}" --batch 4 --dp 2 --zero1 --resume "$work/dp2/checkpoints/step-10"
run res.ep2dp2-z-to-ep2dp2-z 4 "${m[@]}" --batch 2 --ep 2 --dp 2 --topo.ranks-per-node 4 --zero1 \
  --resume "$work/ep2dp2-z/checkpoints/step-10"
run res.ep2dp2-z-to-ep2dp2 4 "${m[@]}" --batch 2 --ep 2 --dp 2 --topo.ranks-per-node 4 \
  --resume "$work/ep2dp2-z/checkpoints/step-10"

# The planner's prediction for the same layouts: a CPU cluster (fused attention as the CPU
# kernel is, nothing reserved) at fp32; memory does not depend on the cluster's speeds.
"$bin" plan --save-cluster "$work/cluster.json" --cluster dgx-h100 > /dev/null
/usr/bin/env python3 - "$work/cluster.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(name="cpu-fp32", kind="cpu", fused_attention=True, reserved_bytes=0, precision="fp32")
json.dump(c, open(sys.argv[1], "w"))
PY
plan() {  # plan NAME MODEL LAYOUT
  "$bin" plan --model "$2" --cluster "$work/cluster.json" --precision fp32 --evaluate --layout "$3" \
    --seq-len 32 --global-batch 8 --loads "$work/single/metrics.jsonl" --json > "$work/plan-$1.json"
}
plan dp2-z test-moe "pp=1,dp=2,ep=1,mb=1,recompute=none,a2a=flat,zero1=1"
plan ep2dp2-z test-moe "pp=1,dp=2,ep=2,mb=1,recompute=none,a2a=flat,zero1=1"
plan pp.pp2dp2-z test-moe4 "pp=2,dp=2,ep=1,mb=4,recompute=none,a2a=flat,zero1=1"
# The command the planner prints is one `moetrain train` accepts, --zero1 included: run it.
cmd=$(/usr/bin/env python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["train_command"])' \
      "$work/plan-dp2-z.json")
read -r -a words <<< "$cmd"
for i in "${!words[@]}"; do [ "${words[$i]}" = moetrain ] && words[$i]="$bin"; done
[ "${words[0]}" = mpirun ] && words=("$MPIRUN" "${MPIRUN_FLAGS[@]}" "${words[@]:1}")
"${words[@]}" --steps 2 --eval-every 0 --eval-batches 1 --quiet --data "$corpus" --out "$work/plan-cmd"
echo "ok   the planner's command ran: $cmd"

/usr/bin/env python3 - "$work" "$(dirname "$0")" <<'PY'
import json, os, sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import checks
check = checks.Checks()
metrics = lambda name: checks.metrics(work, name)
weights = lambda name: checks.weights(work, name)[0]
LOSSES = ("loss", "ce_loss", "aux_loss", "val_loss")
worst_metrics = lambda got, ref, qs=LOSSES + ("grad_norm",): checks.worst_metrics(got, ref, qs)
worst_weights = checks.worst_weights
bits_equal = lambda a, b, qs=LOSSES: checks.bits_equal(a, b, qs)

# 1. Parity with one process, 2. bit for bit against the same layout without --zero1.
for z, plain, ref, expect_bits in [("single-z", "single", "single", True), ("dp2-z", "dp2", "single", True),
                                   ("ep2-z", "ep2", "single", True),
                                   ("ep2dp2-z", "ep2dp2", "single", False),
                                   ("pp.pp2dp2-z", "pp.pp2dp2", "pp.single", True)]:
    wm = worst_metrics(metrics(z), metrics(ref))
    ww = worst_weights(weights(z), weights(ref))
    check(wm <= 1e-5 and ww <= 1e-5, f"{z} vs {ref}: losses {wm:.2e}, final weights {ww:.2e} relative (<= 1e-5)")
    same = bits_equal(metrics(z), metrics(plain))
    wsame = open(os.path.join(work, z, "model.safetensors"), "rb").read() == \
            open(os.path.join(work, plain, "model.safetensors"), "rb").read()
    gn = worst_metrics(metrics(z), metrics(plain), ("grad_norm",))
    print(f"     {z} vs {plain}: losses bit-identical {same}, weights bit-identical {wsame}, grad_norm {gn:.2e}")
    if expect_bits:
        check(same and wsame and gn <= 1e-12, f"{z} bit for bit with {plain} (grad_norm within 1e-12: {gn:.2e})")
    else:  # a 4-rank data group: MPI_Reduce_scatter and MPI_Allreduce add the 4 parts in other orders
        wm = worst_metrics(metrics(z), metrics(plain))
        ww = worst_weights(weights(z), weights(plain))
        check(wm <= 1e-5 and ww <= 1e-5, f"{z} vs {plain}: losses {wm:.2e}, weights {ww:.2e} (not bit for bit, <= 1e-5)")

# 3. Memory: optimizer bytes per rank, the high-water marks, the planner.
def last(name): return metrics(name)[-1]
def coords(rank, pp, dp, ep):  # world rank -> (pp, dp, ep), EP fastest
    return rank // (dp * ep), (rank // ep) % dp, rank % ep
for z, plain, (pp, dp, ep) in [("single-z", "single", (1, 1, 1)), ("dp2-z", "dp2", (1, 2, 1)),
                               ("ep2-z", "ep2", (1, 1, 2)),
                               ("ep2dp2-z", "ep2dp2", (1, 2, 2)), ("pp.pp2dp2-z", "pp.pp2dp2", (2, 2, 1))]:
    oz, op = last(z)["optimizer_bytes"], last(plain)["optimizer_bytes"]
    spans = 2 * json.load(open(os.path.join(work, z, "config.json")))["num_hidden_layers"] + 1  # an upper bound
    if ep > 1:
        # Replicated tensors split over the EP x DP data group, experts over DP: with R replicated
        # and X expert elements per EP rank (from the weights file), a rank holds 8 (R/(EP DP) + X/DP) B.
        w = weights(z)
        nexp = sum(len(v) for k, v in w.items() if ".mlp.experts." in k)
        R, X = sum(len(v) for v in w.values()) - nexp, nexp / ep
        want = 8 * (R / (ep * dp) + X / dp)
        check(all(op[r] == 8 * (R + X) for r in range(len(op))),
              f"{plain}: every rank holds 8 (R + X) = {int(8 * (R + X))} B of AdamW state")
        check(all(abs(oz[r] - want) <= 8 * spans for r in range(len(oz))),
              f"{z}: optimizer bytes {[int(x) for x in oz]} = 8 (R/{ep * dp} + X/{dp}) = {want:.0f} B "
              f"(+- 8 B per span), plain {int(op[0])} B")
        check(sum(oz) == 8 * (R + ep * X), f"{z}: together the ranks hold every logical element once")
    for s in range(pp):
        group = [r for r in range(len(oz)) if coords(r, pp, dp, ep)[0] == s]
        full = op[group[0]]
        if ep == 1:
            check(sum(oz[r] for r in group) == full and all(op[r] == full for r in group),
                  f"{z} stage {s}: optimizer bytes {[int(oz[r]) for r in group]} sum to one plain rank's {int(full)}")
            check(max(oz[r] for r in group) - min(oz[r] for r in group) <= 8 * spans,
                  f"{z} stage {s}: ranks' shares differ by <= 8 bytes per span")
        pz = [st["total_peak_bytes"] for st in last(z)["stages"]]
        pp_ = [st["total_peak_bytes"] for st in last(plain)["stages"]]
        saved = max(op[r] for r in group) - max(oz[r] for r in group)
        check(abs((pp_[s] - pz[s]) - saved) <= 16 * 4,
              f"{z} stage {s}: high-water mark {int(pp_[s])} -> {int(pz[s])} B, down {int(pp_[s] - pz[s])} B, "
              f"optimizer bytes saved {int(saved)} B")
    if z in ("single-z", "ep2-z"): continue
    pred = json.load(open(os.path.join(work, f"plan-{z}.json")))
    meas = max(st["total_peak_bytes"] for st in last(z)["stages"])
    pm = pred["memory"]["peak_bytes"]
    check(abs(pm - meas) <= 0.05 * meas, f"{z}: planner predicts {pm / 1e6:.3f} MB, measured {meas / 1e6:.3f} MB "
          f"({100 * (pm - meas) / meas:+.2f}%, within 5%)")
    check(pred["train_command"].endswith("--zero1"), f"{z}: plan's command carries --zero1: {pred['train_command']}")

# 4. Resume at step 10 from a checkpoint of the other kind: steps 11-20 of the uninterrupted run.
for res, ref, exact in [("res.dp2-z-to-dp2", "dp2", True), ("res.dp2-z-to-single", "single", False),
                        ("res.dp2-to-dp2-z", "dp2-z", True), ("res.ep2dp2-z-to-ep2dp2-z", "ep2dp2-z", True),
                        ("res.ep2dp2-z-to-ep2dp2", "ep2dp2", False)]:
    got, want = metrics(res), metrics(ref)[10:]
    wm, ww = worst_metrics(got, want), worst_weights(weights(res), weights(ref))
    if exact:
        check(bits_equal(got, want) and ww == 0, f"{res}: steps 11-20 and final weights bit for bit with {ref}")
    else:
        check(wm <= 1e-5 and ww <= 1e-5, f"{res}: steps 11-20 vs {ref}: {wm:.2e}, weights {ww:.2e} (<= 1e-5)")
sys.exit(check.finish())
PY
