#!/usr/bin/env bash
# generate --device cuda equals --device cpu token for token (greedy and sampled), on the emulated
# device of CI (its memory faults when host code touches it outside a kernel or a device copy, so
# this also checks that the decoder keeps every buffer on the device) or on a real GPU.
# Usage: generate_device.sh MOETRAIN CORPUS WORK
set -euo pipefail
bin="$1"; corpus="$2"; work="$3"
rm -rf "$work"; mkdir -p "$work"
export OPENBLAS_NUM_THREADS=1
"$bin" train --preset test-moe --steps 10 --seq-len 64 --batch 4 --quiet --data "$corpus" --out "$work/run"
prompt="And God said, Let there be light"
n=0
for args in "--temperature 0" "--seed 4 --top-k 20" "--seed 9 --temperature 1.3"; do
  # shellcheck disable=SC2086
  "$bin" generate "$work/run" --prompt "$prompt" --tokens 96 $args --ids --device cuda > "$work/cuda.ids"
  # shellcheck disable=SC2086
  "$bin" generate "$work/run" --prompt "$prompt" --tokens 96 $args --ids --device cpu > "$work/cpu.ids"
  cmp "$work/cuda.ids" "$work/cpu.ids" || { echo "FAIL: generate $args differs between cuda and cpu"; exit 1; }
  n=$((n + 1))
done
echo "generate --device cuda == --device cpu: $n runs of 96 tokens"
