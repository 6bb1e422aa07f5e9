#!/usr/bin/env bash
# Runs the PyTorch reference check: the C++ dump tool writes weights, a batch, logits, loss, every
# gradient, 10 training losses and the weights after them into OUTDIR; deepseek_ref.py recomputes
# them in PyTorch and compares (hf_moe_ref.py for the Mixtral and Qwen families). Exit code is non-zero if either step fails.
# PRECISION bf16: the C++ GEMMs take bf16 inputs and so does the reference (its bf16 tolerances);
# exit 77 (ctest: SKIPPED) where bf16 on the CPU is not available.
# SEQ_LEN: the batch's tokens per sequence (16 by default).
# Usage: run_reference.sh DUMP_TOOL PYTHON OUTDIR [PRESET [PRECISION [SEQ_LEN]]]
set -euo pipefail
if [[ $# -lt 3 || $# -gt 6 ]]; then
  echo "usage: $0 DUMP_TOOL PYTHON OUTDIR [PRESET [PRECISION [SEQ_LEN]]]" >&2
  exit 2
fi
dump_tool=$1
python=$2
outdir=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
mkdir -p "$outdir"
# Stale files from an earlier run must not be compared (only the known names are removed).
rm -f "$outdir"/config.json "$outdir"/train.json "$outdir"/model.safetensors \
  "$outdir"/batch.safetensors "$outdir"/expected.safetensors "$outdir"/final.safetensors \
  "$outdir"/bias.safetensors
rc=0
"$dump_tool" "$outdir" ${4:+"$4"} ${5:+"$5"} ${6:+"$6"} || rc=$?
[[ $rc -eq 0 ]] || exit $rc
# Mixtral, Qwen2-MoE and Qwen3-MoE have their own model (hf_moe_ref.py; the rest is deepseek_ref's).
# REF_DTYPE=float64: the torch side in float64, so that only the C++ side's round-off is measured
# (a preset whose float32 reference itself drifts past the final-weight bound).
script=deepseek_ref.py
grep -Eq '"model_type": "(mixtral|qwen2_moe|qwen3_moe)"' "$outdir/config.json" && script=hf_moe_ref.py
"$python" "$here/$script" "$outdir" --dtype "${REF_DTYPE:-float32}"
