#!/usr/bin/env bash
# moetrain export: a checkpoint written by EP 2 x PP 2 becomes a Hugging Face folder (single file
# and sharded with an index) that the independent PyTorch model loads and evaluates to the loss the
# C++ model computes from the checkpoint. Usage: export.sh MOETRAIN TOOL_EVAL_LOSS PYTHON CORPUS WORK
set -euo pipefail
bin="$1"; tool="$2"; py="$3"; corpus="$4"; work="$5"
here="$(cd "$(dirname "$0")" && pwd)"
rm -rf "$work"; mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
mpirun --oversubscribe --bind-to none -np 4 "$bin" train --preset test-moe4 --steps 5 --seq-len 32 \
  --batch 4 --ep 2 --pp 2 --micro-batches 2 --quiet --data "$corpus" --out "$work/run"
ckpt="$work/run/checkpoints/step-5"
"$bin" export "$ckpt" "$work/hf"
"$bin" export "$ckpt" "$work/hf-sharded" --shard-mb 0.1
test -f "$work/hf-sharded/model.safetensors.index.json"
"$tool" "$ckpt" "$work/batch.safetensors"
"$py" "$here/reference/eval_hf.py" "$work/hf" "$work/batch.safetensors"
"$py" "$here/reference/eval_hf.py" "$work/hf-sharded" "$work/batch.safetensors"
echo "2 passed, 0 failed"
