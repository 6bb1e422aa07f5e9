#!/usr/bin/env bash
# Sparse upcycling study (docs/upcycle.md): train a small dense model on the built-in corpus,
# export it, upcycle it (moetrain upcycle), then continue both the dense model and the upcycled
# MoE model for the same added steps on the same data (same seed: the same batches), and print
# their held-out losses. The upcycled model is E=4 copies of each dense MLP split in S=2 (8 experts
# of half the width, top-2): its active FLOPs per token equal the dense model's (plus the router's
# 8 x H per token), so the same added steps are also the same added FLOPs.
# Usage: scripts/upcycle_study.sh [WORKDIR]   (env: DENSE_STEPS, ADDED_STEPS, EVAL_EVERY, MOETRAIN_BIN)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$root/runs/upcycle_study}"
bin="${MOETRAIN_BIN:-$root/build/moetrain}"
corpus="$root/data/kjv.txt"
dense_steps="${DENSE_STEPS:-400}"
added="${ADDED_STEPS:-400}"
every="${EVAL_EVERY:-100}"
export OPENBLAS_NUM_THREADS=1
[ -x "$bin" ] || "$root/scripts/build.sh" >/dev/null
[ -f "$corpus" ] || "$root/scripts/setup.sh" >/dev/null
rm -rf "$work"; mkdir -p "$work"

# The dense model: the tiny preset's shape (H 128, 4 layers, 4 heads) with a dense SwiGLU of 384
# (tiny's intermediate_size) in every layer.
cat > "$work/dense.json" <<'EOF'
{"model_type": "deepseek", "vocab_size": 256, "hidden_size": 128, "num_hidden_layers": 4,
 "num_attention_heads": 4, "intermediate_size": 384, "moe_intermediate_size": 0, "n_routed_experts": 0,
 "num_experts_per_tok": 0, "first_k_dense_replace": 0, "rope_theta": 10000.0, "rms_norm_eps": 1e-06,
 "max_position_embeddings": 1024}
EOF
shape=(--batch 16 --seq-len 128 --eval-batches 8 --data "$corpus" --quiet)
"$bin" train --config "$work/dense.json" --steps "$dense_steps" --eval-every 0 "${shape[@]}" --out "$work/dense-run"
"$bin" export "$work/dense-run/checkpoints/step-$dense_steps" "$work/dense" >/dev/null
"$bin" upcycle "$work/dense" -o "$work/moe" --experts 4 --topk 1 --split 2 --noise 0.01 --router-init zero --seed 1
# The same continuation for both: fresh AdamW, 20 warm-up steps to 1e-3, cosine to 1e-4, seed 7.
cont=(--steps "$added" --eval-every "$every" --lr 1e-3 --min-lr 1e-4 --warmup 20 --seed 7 "${shape[@]}")
start=$(date +%s)
"$bin" train --init-from "$work/dense" "${cont[@]}" --out "$work/dense-cont"
mid=$(date +%s)
"$bin" train --init-from "$work/moe" "${cont[@]}" --out "$work/moe-cont"
end=$(date +%s)

python3 - "$work" "$dense_steps" "$((mid - start))" "$((end - mid))" <<'PY'
import json, sys
w, dense_steps, t_dense, t_moe = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def run(name):
    m = [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl")]
    return [(0, m[0]["val_loss_start"])] + [(r["step"], r["val_loss"]) for r in m if "val_loss" in r]
def cfg(d): return json.load(open(f"{w}/{d}/config.json"))
def active(c):  # parameters a token uses (matrices only), as model::count_params counts them
    H, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    n = 2 * V * H + L * 4 * H * H
    for l in range(L):
        if c["n_routed_experts"] and l >= c["first_k_dense_replace"]:
            n += c["n_routed_experts"] * H + 3 * H * c["moe_intermediate_size"] * (c["num_experts_per_tok"] + c["n_shared_experts"])
        else:
            n += 3 * H * c["intermediate_size"]
    return n
d, m = run("dense-cont"), run("moe-cont")
cd, cm = cfg("dense"), cfg("moe")
print(f"dense: {dense_steps} steps from scratch, then both continue {d[-1][0]} steps (same batches); "
      f"held-out loss (nats/byte, 8 x 16 windows of 128 bytes)")
print(f"dense  : {active(cd) / 1e6:.3f}M active params/token; continuation {t_dense} s")
print(f"upcycled: E={cm['n_routed_experts']} x {cm['moe_intermediate_size']}, k={cm['num_experts_per_tok']}: "
      f"{active(cm) / 1e6:.3f}M active params/token; continuation {t_moe} s")
print()
print("| added steps | dense | upcycled | upcycled - dense |")
print("|---:|---:|---:|---:|")
for (s, a), (_, b) in zip(d, m):
    print(f"| {s} | {a:.4f} | {b:.4f} | {b - a:+.4f} |")
PY
