#!/usr/bin/env bash
# Tensor parallelism (`train --tp`, model.h: TensorParallel; Megatron TP + sequence parallelism with
# X-MoE's sequence-sharded MoE block) against one process, 20 steps of test-moe / test-moe4 (global
# batch 8, as tests/parity.sh and tests/zero1.sh):
#  1. parity: every logged loss (loss, ce_loss, aux_loss, val_loss) and grad_norm at every step, and
#     every final weight, within 1e-5 relative of the one-process run, for TP2, TP4, TP2xEP2,
#     TP2xPP2 (1F1B, 4 micro-batches), TP2xEP2xDP2 --zero1 (8 ranks), DP2 --zero1, and TP2 of the
#     seq_aux and noaux_tc routers (whose selection bias must end bit for bit), TP2 of test-qwen2moe
#     and TP2xEP2 of test-qwen3moe (the families' GQA, biases, QK-norm). None is bit for
#     bit with one process: the row-parallel o_proj / down_proj outputs are sums of TP partial
#     products (a reduce-scatter), and the replicated tensors' gradients TP all-reduced, in another
#     order than one GEMM's. Bit for bit: TP2xDP2 with and without --zero1 (a 2-rank data group adds
#     its two parts in one order either way; grad_norm to 1e-12), and a TP2 run resumed from its own checkpoint;
#  2. memory (metrics.jsonl, measured per rank): the MoE blocks' token-row bytes
#     ("moe_dispatch_bytes": dispatched rows, expert intermediates and outputs, shared experts) of
#     TP2 and TP4 are exactly 1/2 and 1/4 of one process's on every rank; ZeRO-1's optimizer bytes
#     ("optimizer_bytes") are each rank's share of its data group: DP2 ranks hold half of one
#     process's each (+- 8 B per span), TP2xEP2xDP2 ranks 8 (R/(EP DP) + X/DP) B;
#  3. checkpoints hold logical tensors whatever the TP degree: a TP2 checkpoint resumes on one
#     process and a one-process checkpoint on TP2, giving the uninterrupted runs' steps 11-20;
#  4. the weights file of a TP run is the logical model: its tensors have the one-process shapes.
# Usage: tp.sh MOETRAIN CORPUS WORKDIR
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
run tp2 2 "${m[@]}" --batch 8 --tp 2
run tp4 4 "${m[@]}" --batch 8 --tp 4
run tp2ep2 4 "${m[@]}" --batch 4 --tp 2 --ep 2 --topo.ranks-per-node 4
run tp2dp2 4 "${m[@]}" --batch 4 --tp 2 --dp 2
run tp2dp2-z 4 "${m[@]}" --batch 4 --tp 2 --dp 2 --zero1
run tp2ep2dp2-z 8 "${m[@]}" --batch 2 --tp 2 --ep 2 --dp 2 --zero1 --topo.ranks-per-node 8
run dp2-z 2 "${m[@]}" --batch 4 --dp 2 --zero1
# The router's other branches: per-sequence aux statistics (each TP rank's shard holds whole
# sequences), and DeepSeek-V3's selection bias moved by the global loads (summed over TP too).
run sa.single 1 --preset test-moe-seqaux --batch 8
run sa.tp2 2 --preset test-moe-seqaux --batch 8 --tp 2
run na.single 1 --preset test-moe-noaux --batch 8 --checkpoint.every 20
run na.tp2ep2 4 --preset test-moe-noaux --batch 4 --tp 2 --ep 2 --checkpoint.every 20
# The other families (model/family.h): grouped-query attention split by kv-head groups, Qwen2-MoE's
# q/k/v biases (split with their rows) and gated shared expert, Qwen3-MoE's QK-norm and head_dim.
run q2.single 1 --preset test-qwen2moe --batch 8
run q2.tp2 2 --preset test-qwen2moe --batch 8 --tp 2
run q3.single 1 --preset test-qwen3moe --batch 8
run q3.tp2ep2 4 --preset test-qwen3moe --batch 4 --tp 2 --ep 2 --topo.ranks-per-node 4
p=(--preset test-moe4 --micro-batches 4)
run pp.single 1 "${p[@]}" --batch 8
run pp.tp2pp2 4 "${p[@]}" --batch 8 --tp 2 --pp 2
# Resume at step 10 across TP degrees, and TP2 from its own checkpoint.
run res.tp2-to-single 1 "${m[@]}" --batch 8 --resume "$work/tp2/checkpoints/step-10"
run res.single-to-tp2 2 "${m[@]}" --batch 8 --tp 2 --resume "$work/single/checkpoints/step-10"
run res.tp2-to-tp2 2 "${m[@]}" --batch 8 --tp 2 --resume "$work/tp2/checkpoints/step-10"

/usr/bin/env python3 - "$work" "$(dirname "$0")" <<'PY'
import json, os, sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import checks
check = checks.Checks()
rel, worst_weights = checks.rel, checks.worst_weights
metrics = lambda name: checks.metrics(work, name)
weights = lambda name: checks.weights(work, name)
same_file = lambda a, b: checks.same_weights_file(work, a, b)
QS = ("loss", "ce_loss", "aux_loss", "val_loss", "grad_norm")
worst_metrics = lambda got, ref: checks.worst_metrics(got, ref, QS)
bits_equal = lambda a, b: checks.bits_equal(a, b, QS)

# 1. Parity with one process.
for run, ref in [("tp2", "single"), ("tp4", "single"), ("tp2ep2", "single"), ("tp2dp2", "single"),
                 ("tp2dp2-z", "single"), ("tp2ep2dp2-z", "single"), ("dp2-z", "single"),
                 ("pp.tp2pp2", "pp.single"), ("sa.tp2", "sa.single"), ("na.tp2ep2", "na.single")]:
    wm = worst_metrics(metrics(run), metrics(ref))
    (wr, sr), (wf, sf) = weights(run), weights(ref)
    ww = worst_weights(wr, wf)
    check(wm <= 1e-5 and ww <= 1e-5, f"{run} vs {ref}: losses and grad_norm {wm:.2e}, final weights {ww:.2e} relative (<= 1e-5)")
    # 4. The weights file holds the logical tensors.
    check(sr == sf, f"{run}: model.safetensors has the one-process tensors and shapes")
    print(f"     {run} vs {ref}: losses bit-identical {bits_equal(metrics(run), metrics(ref))}, "
          f"weights bit-identical {same_file(run, ref)}")
# The families: losses to 1e-5 as above; final weights to 2e-4, since the k_proj biases' gradient
# is nearly zero (the bias shifts a query's scores almost uniformly; only RoPE's rotation makes
# it count), so Adam turns its round-off into O(lr) steps: measured 7.3e-5 (q2.tp2, k_proj.bias),
# 1.1e-5 (q3.tp2ep2); every loss within 7e-8.
for run, ref in [("q2.tp2", "q2.single"), ("q3.tp2ep2", "q3.single")]:
    wm = worst_metrics(metrics(run), metrics(ref))
    (wr, sr), (wf, sf) = weights(run), weights(ref)
    ww = worst_weights(wr, wf)
    check(wm <= 1e-5 and ww <= 2e-4 and sr == sf,
          f"{run} vs {ref}: losses and grad_norm {wm:.2e} (<= 1e-5), final weights {ww:.2e} (<= 2e-4), logical tensors")
def router_bias(n):
    with open(os.path.join(work, n, "checkpoints", "step-20", "manifest.json")) as f:
        return json.load(f)["router_bias"]
rb = router_bias("na.single")
check(any(v != 0 for row in rb.values() for v in row) and router_bias("na.tp2ep2") == rb,
      "na.tp2ep2: the selection bias after step 20 is one process's, bit for bit (it moved)")
# The router sees each TP rank's shard only: without its gradient's TP all-reduce (which X-MoE's
# released code lacks) its weights would follow half the tokens.
w1, _ = weights("single")
w2, _ = weights("tp2")
for k in sorted(k for k in w1 if k.endswith("mlp.gate.weight")):
    d = max(abs(x - y) for x, y in zip(w2[k], w1[k])) / max(abs(x) for x in w1[k])
    check(d <= 1e-5, f"tp2: router {k} within {d:.2e} of one process's (<= 1e-5)")
# grad_norm is summed over ZeRO slices instead of whole tensors: compared to 1e-12 instead.
LOSSES = ("loss", "ce_loss", "aux_loss", "val_loss")
gn = max(rel(x["grad_norm"], y["grad_norm"]) for x, y in zip(metrics("tp2dp2-z"), metrics("tp2dp2")))
check(all(x.get(q) == y.get(q) for x, y in zip(metrics("tp2dp2-z"), metrics("tp2dp2")) for q in LOSSES)
      and same_file("tp2dp2-z", "tp2dp2") and gn <= 1e-12,
      f"tp2dp2-z bit for bit with tp2dp2 (losses and final weights; grad_norm {gn:.1e} <= 1e-12)")

# 2. Memory.
def last(name): return metrics(name)[-1]
base = last("single")["moe_dispatch_bytes"][0]
check(base > 0, f"single: MoE token-row bytes {int(base)}")
for run, t in [("tp2", 2), ("tp4", 4)]:
    got = last(run)["moe_dispatch_bytes"]
    check(all(g * t == base for g in got), f"{run}: MoE token-row bytes per rank {[int(g) for g in got]} = "
          f"{int(base)} / {t} exactly")
    ap, a1 = last(run)["activation_peak_bytes"], last("single")["activation_peak_bytes"]
    print(f"     {run}: activation high-water mark {ap / 1e6:.3f} MB (rank 0) vs one process {a1 / 1e6:.3f} MB")
o1 = last("single")["optimizer_bytes"][0]
oz = last("dp2-z")["optimizer_bytes"]
spans = 2 * json.load(open(os.path.join(work, "single", "config.json")))["num_hidden_layers"] + 1  # an upper bound
check(sum(oz) == o1 and max(oz) - min(oz) <= 8 * spans,
      f"dp2-z: optimizer bytes {[int(x) for x in oz]} sum to one process's {int(o1)}, shares within 8 B per span")
# TP2 x EP2 x DP2 with ZeRO-1: against TP2 x EP2 without it (the same slices and experts per rank),
# replicated elements R split over the EP x DP data group, experts X over DP.
plain = last("tp2ep2")["optimizer_bytes"]  # [tp fastest, then ep]: 8 (R + X) per rank
z = last("tp2ep2dp2-z")["optimizer_bytes"]
w, _ = weights("single")
X = sum(len(v) for k, v in w.items() if ".mlp.experts." in k) / 2
for r in range(8):
    tp_r, ep_r = r % 2, (r // 2) % 2
    full = plain[ep_r * 2 + tp_r]
    R = full / 8 - X
    want = 8 * (R / 4 + X / 2)
    check(abs(z[r] - want) <= 8 * spans, f"tp2ep2dp2-z rank {r}: optimizer bytes {int(z[r])} = 8 (R/4 + X/2) = "
          f"{want:.0f} B (+- 8 B per span; without ZeRO {int(full)} B)")

# 3. Resume across TP degrees at step 10.
for res, ref, exact in [("res.tp2-to-single", "single", False), ("res.single-to-tp2", "tp2", False),
                        ("res.tp2-to-tp2", "tp2", True)]:
    got, want = metrics(res), metrics(ref)[10:]
    wm, ww = worst_metrics(got, want), worst_weights(weights(res)[0], weights(ref)[0])
    if exact:
        check(bits_equal(got, want) and same_file(res, ref), f"{res}: steps 11-20 and final weights bit for bit with {ref}")
    else:
        check(wm <= 1e-5 and ww <= 1e-5, f"{res}: steps 11-20 vs {ref}: {wm:.2e}, weights {ww:.2e} (<= 1e-5)")
sys.exit(check.finish())
PY
