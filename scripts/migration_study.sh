#!/usr/bin/env bash
# Expert migration in a real run (issue 11): a fine-grained MoE (E = 32, k = 4, no aux loss, so the
# router drifts into skew) trained on EP8 twice, same seed: without migration, and migrating every
# --every steps where a layer's max/mean EP-rank load exceeds 1.1. Prints, from metrics.jsonl, the
# rank imbalance of both runs (mean over steps after the first migration point), the migrations,
# the bytes they moved, and their measured seconds as a share of the run's step time.
#   scripts/migration_study.sh [--steps N] [--every N] [--out DIR]
# Needs a built build/moetrain (scripts/build.sh). 8 ranks, one BLAS thread each; on a 2-core
# machine they share the cores, so step times are long and the migration share is a lower bound
# of what a busy network would show (its bytes are exact).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
steps=120
every=10
out=/tmp/moetrain-migration-study
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --every) every="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "usage: $0 [--steps N] [--every N] [--out DIR]" >&2; exit 2 ;;
  esac
done
bin="$root/build/moetrain"
[ -x "$bin" ] || { echo "$bin not built: run scripts/build.sh first" >&2; exit 1; }
mkdir -p "$out"
cat > "$out/config.json" <<'JSON'
{"architectures": ["DeepseekForCausalLM"], "model_type": "deepseek", "hidden_size": 128,
 "intermediate_size": 384, "moe_intermediate_size": 48, "num_hidden_layers": 4, "first_k_dense_replace": 1,
 "moe_layer_freq": 1, "n_routed_experts": 32, "num_experts_per_tok": 4, "n_shared_experts": 1,
 "norm_topk_prob": false, "aux_loss_alpha": 0.0, "seq_aux": false, "scoring_func": "softmax",
 "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 1024, "vocab_size": 256,
 "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "initializer_range": 0.02, "hidden_act": "silu",
 "attention_bias": false, "tie_word_embeddings": false, "torch_dtype": "float32"}
JSON
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
common=(train --config "$out/config.json" --ep 8 --batch 2 --seq-len 128 --steps "$steps" --eval-every 0
        --checkpoint.dir "$out/ckpt-unused" --quiet)
for variant in static migrate; do
  extra=()
  [ "$variant" = migrate ] && extra=(--balance.migrate-every "$every" --balance.threshold 1.1)
  rm -rf "$out/$variant" "$out/ckpt-unused"
  echo "== $variant: mpirun -np 8 moetrain ${common[*]} ${extra[*]}" >&2
  mpirun --oversubscribe --bind-to none -np 8 "$bin" "${common[@]}" "${extra[@]}" --out "$out/$variant"
done
/usr/bin/env python3 - "$out" "$every" <<'PY'
import json, sys
out, every = sys.argv[1], int(sys.argv[2])
def rows(v):
    return [json.loads(l) for l in open(f"{out}/{v}/metrics.jsonl")]
static, mig = rows("static"), rows("migrate")
def mean_imb(rs):  # mean over steps and MoE layers of max/mean EP-rank load
    v = [x for r in rs for x in r["load_imbalance"]]
    return sum(v) / len(v)
after = lambda rs: [r for r in rs if r["step"] > every]
moves = [r["migration"] for r in mig if "migration" in r]
step_s = sum(r["step_time_s"] for r in mig)
mig_s = sum(m["seconds"] for m in moves)
def mean_floor(rs):  # no placement beats the hottest expert alone: max_e load / mean rank load
    v = []
    for r in rs:
        for layer, ranks in zip(r["expert_loads"], r["rank_loads"]):
            v.append(max(1.0, max(layer) / (sum(ranks) / len(ranks))))
    return sum(v) / len(v)
print(f"| run | mean max/mean EP-rank load, steps {every + 1}-{len(mig)} | floor (hottest expert alone) | held-out loss |")
print("|---|---|---|---|")
for name, rs in (("no migration", static), (f"migration every {every} steps", mig)):
    print(f"| {name} | {mean_imb(after(rs)):.3f} | {mean_floor(after(rs)):.3f} | {rs[-1].get('val_loss', float('nan')):.4f} |")
print()
print(f"migrations: {len(moves)} in {len(mig)} steps, {sum(len(m['layers']) for m in moves)} layer moves, "
      f"{sum(l['swaps'] for m in moves for l in m['layers'])} swaps, "
      f"{sum(m['bytes_moved'] for m in moves) / 1e6:.2f} MB moved")
print("imbalance at the migration steps (the step's loads, before -> after): " +
      ", ".join(f"{l['imbalance_before']:.2f}->{l['imbalance_after']:.2f}" for m in moves for l in m["layers"][:1]))
print(f"migration time: {mig_s:.4f} s of {step_s:.1f} s of steps = {100 * mig_s / step_s:.3f}% "
      f"(amortised over the run; the slowest rank's wall time of each move)")
PY
