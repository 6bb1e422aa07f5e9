#!/usr/bin/env bash
# moetrain export: a checkpoint written by EP 2 x PP 2 becomes a Hugging Face folder (single file
# and sharded with an index) that the independent PyTorch model loads and evaluates to the loss the
# C++ model computes from the checkpoint. Usage: export.sh MOETRAIN TOOL_EVAL_LOSS PYTHON CORPUS WORK
set -euo pipefail
bin="$1"; tool="$2"; py="$3"; corpus="$4"; work="$5"
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
scratch "$work"
mpi 4 "$bin" train --preset test-moe4 --steps 5 --seq-len 32 \
  --batch 4 --ep 2 --pp 2 --micro-batches 2 --quiet --data "$corpus" --out "$work/run"
ckpt="$work/run/checkpoints/step-5"
"$bin" export "$ckpt" "$work/hf"
"$bin" export "$ckpt" "$work/hf-sharded" --shard-mb 0.1
test -f "$work/hf-sharded/model.safetensors.index.json"
"$tool" "$ckpt" "$work/batch.safetensors"
"$py" "$here/reference/eval_hf.py" "$work/hf" "$work/batch.safetensors" && ok "PyTorch: the export's loss" ||
  not_ok "PyTorch: the export's loss"
"$py" "$here/reference/eval_hf.py" "$work/hf-sharded" "$work/batch.safetensors" && ok "PyTorch: the sharded export's loss" ||
  not_ok "PyTorch: the sharded export's loss"
# moetrain eval scores the exported folder on the trainer's own held-out windows (global batch
# 4 x EP 2): its figure is the run's final val_loss, and PyTorch recomputes it from the export.
"$bin" eval "$work/hf" --data "$corpus" --batch 8 --seq-len 32 --dump "$work/val.safetensors" | tee "$work/eval.txt"
rc=0
"$py" - "$work/run/metrics.jsonl" "$work/eval.txt" <<'PY' || rc=$?
import json, re, sys
val = [json.loads(l)["val_loss"] for l in open(sys.argv[1]) if "val_loss" in json.loads(l)][-1]
got = float(re.search(r"held-out loss ([0-9.]+)", open(sys.argv[2]).read()).group(1))
err = abs(got - val) / val
print(f"eval {got:.6f} vs the run's final val_loss {val:.6f}: relative {err:.1e}")
sys.exit(0 if err <= 1e-6 else 1)
PY
check $rc "moetrain eval of the export = the run's final val_loss"
"$py" "$here/reference/eval_hf.py" "$work/hf" "$work/val.safetensors" && ok "PyTorch: the held-out loss" ||
  not_ok "PyTorch: the held-out loss"
finish export
