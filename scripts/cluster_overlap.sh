#!/usr/bin/env bash
# Shared-expert overlap on a real cluster (issue 39, item 3): EP 4 over 2 nodes x 2 ranks
# (scripts/cluster.sh) at RATE, a model whose shared experts are a real share of the layer (H 256,
# 4 shared experts of F 256, E 8, k 2), trained with and without --comm.overlap in ROUNDS
# interleaved rounds. Per run: the median step time over steps 3.., the exchange's share of the
# step (--profile: all-to-all total and exposed), and the final weights, which must be the same
# bits with and without overlap.
#   scripts/cluster_overlap.sh [OUT]      (default out/cluster_overlap; about 3 minutes)
# Environment: RATE (200mbit), ROUNDS (3), STEPS (12), BATCH (8 per rank), SEQ (64).
set -euo pipefail
source "$(dirname "$0")/cluster_lib.sh" cluster_overlap "${1:-}"  # root, out, bin, cluster
RATE="${RATE:-200mbit}"; ROUNDS="${ROUNDS:-3}"; STEPS="${STEPS:-12}"; BATCH="${BATCH:-8}"; SEQ="${SEQ:-64}"
rm -rf "$out"; mkdir -p "$out"
name="co$$"; name="${name:0:8}"
trap '"$cluster" down --name "$name" >/dev/null 2>&1 || true' EXIT
cat > "$out/config.json" <<'EOF'
{"architectures": ["DeepseekForCausalLM"], "model_type": "deepseek", "hidden_act": "silu",
 "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 256, "n_routed_experts": 8,
 "n_shared_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 3, "first_k_dense_replace": 1,
 "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 256,
 "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "aux_loss_alpha": 0.01, "seq_aux": false,
 "norm_topk_prob": false, "scoring_func": "softmax", "tie_word_embeddings": false, "moe_layer_freq": 1}
EOF
"$cluster" up 2 2 --name "$name" --rate "$RATE" >/dev/null
echo "# $(nproc) cores, load average $(cut -d' ' -f1 /proc/loadavg); 2 nodes x 2 ranks at $RATE, EP 4"
for ((r = 1; r <= ROUNDS; r++)); do
  for mode in off on; do
    flag=(); [ "$mode" = on ] && flag=(--comm.overlap)
    "$cluster" run --name "$name" -- "$bin" train --config "$out/config.json" --steps "$STEPS" --batch "$BATCH" \
      --seq-len "$SEQ" --eval-every 0 --eval-batches 1 --ep 4 --profile "${flag[@]}" --out "$out/r$r-$mode" \
      > "$out/r$r-$mode.log" 2>&1
    echo "# round $r, overlap $mode: done"
  done
done
python3 - "$out" "$ROUNDS" <<'PY'
import filecmp, json, re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def run(r, mode):
    recs = [json.loads(l) for l in open(f"{out}/r{r}-{mode}/metrics.jsonl") if '"step_time_s"' in l]
    log = open(f"{out}/r{r}-{mode}.log").read()
    prof = {k: float(v) for k, v in re.findall(r"^\s+(all-to-all(?: exposed)?|shared beside a2a)\s+([0-9.]+) s", log, re.M)}
    total = float(re.search(r"profile \(rank 0, all steps\): ([0-9.]+) s", log)[1])
    return statistics.median(r["step_time_s"] for r in recs[2:]), prof, total
rows, bits = [], True
for r in range(1, rounds + 1):
    off, on = run(r, "off"), run(r, "on")
    bits &= filecmp.cmp(f"{out}/r{r}-off/model.safetensors", f"{out}/r{r}-on/model.safetensors", shallow=False)
    rows.append((r, off, on))
print("| round | step, no overlap | step, overlap | saved | a2a share (no overlap) | a2a exposed (overlap) | shared work hidden |")
print("|---|---|---|---|---|---|---|")
for r, off, on in rows:
    print(f"| {r} | {off[0] * 1e3:.0f} ms | {on[0] * 1e3:.0f} ms | {100 * (1 - on[0] / off[0]):.1f}% | "
          f"{100 * off[1]['all-to-all'] / off[2]:.0f}% | {100 * on[1]['all-to-all exposed'] / on[2]:.0f}% | "
          f"{on[1]['shared beside a2a']:.2f} s |")
m_off = statistics.median(x[1][0] for x in rows); m_on = statistics.median(x[2][0] for x in rows)
print(f"\nmedian of the rounds: {m_off * 1e3:.0f} ms without, {m_on * 1e3:.0f} ms with --comm.overlap "
      f"({100 * (1 - m_on / m_off):.1f}% less); final weights {'bit-identical' if bits else 'DIFFER'} in every round")
sys.exit(0 if bits else 1)
PY
