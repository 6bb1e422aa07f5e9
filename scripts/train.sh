#!/usr/bin/env bash
# One command for a new user: install, build, and train the default model (tiny) on the built-in
# corpus. Extra arguments go to `moetrain train` (e.g. --steps 100 --out runs/x, or --time-budget 2m).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/build.sh"
cd "$root"
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
# The default job's precision is auto (bf16 GEMM inputs where this CPU's bf16 peak is >= 1.3x its
# fp32 peak, else fp32); an explicit --precision wins.
# It trains for 5 minutes of training steps (--time-budget 5m: the step count and its cosine
# schedule are chosen from the warm-up steps' time, so a faster machine trains longer and reaches a
# lower loss); an explicit --steps or --time-budget wins.
precision=(--precision auto)
budget=(--time-budget 5m)
for a in "$@"; do
  [[ "$a" == --precision || "$a" == --precision=* ]] && precision=()
  [[ "$a" == --steps || "$a" == --steps=* || "$a" == --time-budget || "$a" == --time-budget=* ]] && budget=()
done
exec "$root/build/moetrain" train "${precision[@]}" "${budget[@]}" "$@"
