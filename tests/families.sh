#!/usr/bin/env bash
# The other families (model/family.h) through the CLI, each of test-mixtral, test-qwen2moe and
# test-qwen3moe: train 4 steps with a checkpoint, export it, and
#  1. the export's config.json carries the family's Hugging Face field names (not DeepSeek's) and
#     its model.safetensors exactly the family's tensor names (the independent PyTorch model's,
#     tests/reference/hf_moe_ref.py, both ways);
#  2. `moetrain eval` of the export scores the held-out windows to the loss the independent model
#     computes from the exported files (eval_hf.py, relative 1e-5): the names went out and back;
#  3. `moetrain generate` decodes from the export and from the checkpoint with the same greedy ids.
# Usage: families.sh MOETRAIN PYTHON CORPUS WORK
set -euo pipefail
bin="$1"; py="$2"; corpus="$3"; work="$4"
here="$(cd "$(dirname "$0")" && pwd)"
export OPENBLAS_NUM_THREADS=1
rm -rf "$work"; mkdir -p "$work"
for preset in test-mixtral test-qwen2moe test-qwen3moe; do
  w="$work/$preset"
  "$bin" train --preset "$preset" --steps 4 --seq-len 32 --batch 4 --checkpoint.every 4 --quiet \
    --data "$corpus" --out "$w/run"
  "$bin" export "$w/run/checkpoints/step-4" "$w/hf"
  "$py" - "$w/hf" "$here/reference" <<'PY'
import json, os, sys
sys.path.insert(0, sys.argv[2])
import hf_moe_ref
from deepseek_ref import load_safetensors
d = sys.argv[1]
raw = json.load(open(os.path.join(d, "config.json")))
family = {"mixtral": ["num_local_experts", "router_aux_loss_coef", "output_router_logits"],
          "qwen2_moe": ["num_experts", "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers"],
          "qwen3_moe": ["num_experts", "head_dim", "decoder_sparse_step", "mlp_only_layers"]}[raw["model_type"]]
missing = [f for f in family + ["num_key_value_heads"] if f not in raw]
deepseek = [f for f in ("n_routed_experts", "n_shared_experts", "aux_loss_alpha", "first_k_dense_replace") if f in raw]
names = set(load_safetensors(os.path.join(d, "model.safetensors"))[0])
want = set(hf_moe_ref.Config(raw).param_shapes())
ok = not missing and not deepseek and names == want
print(f"{d}: {raw['model_type']} fields {'ok' if not missing and not deepseek else f'missing {missing}, DeepSeek fields {deepseek}'}; "
      f"{len(names)} tensors, names {'as HF' if names == want else f'differ: {sorted(names ^ want)[:4]}'}")
sys.exit(0 if ok else 1)
PY
  "$bin" eval "$w/hf" --data "$corpus" --batch 4 --seq-len 32 --eval-batches 2 --dump "$w/val.safetensors" >"$w/eval.txt"
  "$py" "$here/reference/eval_hf.py" "$w/hf" "$w/val.safetensors"
  "$bin" generate "$w/hf" --prompt "In the beginning" --tokens 12 --temperature 0 --ids >"$w/gen_hf.txt"
  "$bin" generate "$w/run/checkpoints/step-4" --prompt "In the beginning" --tokens 12 --temperature 0 --ids >"$w/gen_ckpt.txt"
  cmp -s "$w/gen_hf.txt" "$w/gen_ckpt.txt" || { echo "$preset: generate differs between export and checkpoint"; exit 1; }
done
echo "families: 3 presets passed"
