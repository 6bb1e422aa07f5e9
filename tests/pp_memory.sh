#!/usr/bin/env bash
# Pipeline memory follows the schedule, from the measured activation high-water marks
# (metrics.jsonl "stages"): under 1F1B stage i holds min(PP - i, M) micro-batches of activations,
# under GPipe all M; --recompute moe/full cut a stage's high-water mark by the factor the layer
# sizes predict (the prediction is computed below from the config, buffer by buffer).
# Usage: pp_memory.sh MOETRAIN CORPUS WORKDIR
set -euo pipefail
bin="$1"
corpus="$2"
work="$3"
source "$(dirname "$0")/lib.sh"
scratch "$work"
common=(train --preset test-moe4 --steps 2 --seq-len 32 --eval-every 0 --eval-batches 1 --quiet
        --data "$corpus")
run() {  # run NAME NP ARGS...
  local name="$1" np="$2"
  shift 2
  mpi "$np" "$bin" "${common[@]}" "$@" --out "$work/$name"
}
# Micro-batches of 2 sequences everywhere.
run pp2-m1 2 --pp 2 --batch 2 --micro-batches 1
run pp2-m4 2 --pp 2 --batch 8 --micro-batches 4
run pp2-m4-gpipe 2 --pp 2 --batch 8 --micro-batches 4 --pp.schedule gpipe
run pp2-m2 2 --pp 2 --batch 4 --micro-batches 2
run pp4-m1 4 --pp 4 --batch 2 --micro-batches 1
run pp4-m8 4 --pp 4 --batch 16 --micro-batches 8
run pp2-m4-moe 2 --pp 2 --batch 8 --micro-batches 4 --recompute moe
run pp2-m4-full 2 --pp 2 --batch 8 --micro-batches 4 --recompute full

/usr/bin/env python3 - "$work" <<'PY'
import json, os, sys
work = sys.argv[1]
def stages(name):
    with open(os.path.join(work, name, "metrics.jsonl")) as f:
        return json.loads(f.readlines()[-1])["stages"]
sys.path.insert(0, os.environ["TESTS_DIR"])
from checks import Checks
check = Checks()

# 1. In-flight micro-batches from the high-water marks: peak(M) = min(PP - i, M) x peak(M = 1).
for pp, ms, sched, name in [(2, 4, "1f1b", "pp2-m4"), (2, 2, "1f1b", "pp2-m2"),
                            (2, 4, "gpipe", "pp2-m4-gpipe"), (4, 8, "1f1b", "pp4-m8")]:
    one = stages(f"pp{pp}-m1")
    for i, st in enumerate(stages(name)):
        held = min(pp - i, ms) if sched == "1f1b" else ms
        a, a1 = st["activation_peak_bytes"], one[i]["activation_peak_bytes"]
        check(a == held * a1 and st["max_in_flight"] == held,
              f"{name} stage {i}: activation peak {a:.0f} B = {a / a1:.3f} micro-batches "
              f"(expected {held}), max in flight {st['max_in_flight']}")

# 2. Recomputation: the prediction from the layer sizes (test-moe4, micro-batch Bm=2, T=32).
c = json.load(open(os.path.join(work, "pp2-m4", "config.json")))
H, nh, I, F = c["hidden_size"], c["num_attention_heads"], c["intermediate_size"], c["moe_intermediate_size"]
E, k, Fs, V = c["n_routed_experts"], c["num_experts_per_tok"], F * c["n_shared_experts"], c["vocab_size"]
Bm, T = 2, 32
N, R = Bm * T, Bm * T * k
attn = 8 * N * H + 2 * N + Bm * nh * T + N * H             # x ln1 q k v attn_out h ln2, 2 rstd, lse + out
dense_ffn = 3 * N * I                                       # g u h
moe_ffn = (N * E + 2 * N * k + E                            # scores, top-k ids and weights, aux coef
           + E + (E + 1) + R + N * k                        # layout: counts, offsets, row maps
           + 2 * R * H + 3 * R * F + 3 * N * Fs)            # rows in/out, expert g u h, shared g u h
head = 2 * N * H + 2 * N + 2 * N * V                        # final in/norm, rstd, losses, logits, probs
def stage_floats(layers, has_head, mode):
    total = head if has_head else 0
    for l in layers:
        moe = l >= c["first_k_dense_replace"]
        if mode == "full": total += N * H
        elif mode == "moe" and moe: total += attn
        else: total += attn + (moe_ffn if moe else dense_ffn)
    return 4 * total
split = [[0, 1], [2, 3]]
for i, layers in enumerate(split):
    for mode, name in [("none", "pp2-m4"), ("moe", "pp2-m4-moe"), ("full", "pp2-m4-full")]:
        held = min(2 - i, 4)
        pred = held * stage_floats(layers, i == 1, mode)
        got = stages(name)[i]["activation_peak_bytes"]
        check(got == pred, f"{name} stage {i}: activation peak {got:.0f} B, predicted {pred} B")
    for mode in ("moe", "full"):
        pred = stage_floats(layers, i == 1, "none") / stage_floats(layers, i == 1, mode)
        got = stages("pp2-m4")[i]["activation_peak_bytes"] / stages(f"pp2-m4-{mode}")[i]["activation_peak_bytes"]
        check(got >= pred * (1 - 1e-9),
              f"stage {i}: --recompute {mode} cuts the activation peak {got:.2f}x (predicted {pred:.2f}x)")
sys.exit(check.finish())
PY
