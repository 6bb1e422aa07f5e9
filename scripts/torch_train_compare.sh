#!/usr/bin/env bash
# Training speed of the default model (tiny, batch 16x128, AdamW) in moetrain and in eager PyTorch
# (scripts/torch_train_model.py, the tests/reference model), one thread each, in one go. Both link
# the same OpenBLAS: its kernels are set explicitly for both (PyTorch would otherwise get the
# generic ones on this CPU). Prints the median-step tokens/s of both and the ratio (goal >= 2x).
#   scripts/torch_train_compare.sh [--steps N] [--build DIR] [-- extra moetrain train args]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
steps=30 build="$root/build" extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "torch_train_compare.sh: unknown argument '$1' (expected --steps, --build, --)" >&2; exit 2 ;;
  esac
done
moetrain="$build/moetrain"
[ -x "$moetrain" ] || { echo "torch_train_compare.sh: $moetrain not found (build it first, or pass --build DIR)" >&2; exit 2; }
python=/usr/bin/python3  # PyTorch 1.13 (not the pyenv python3 on PATH)
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-SkylakeX}" OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

"$moetrain" train --steps "$steps" --batch 16 --seq-len 128 --threads 1 --eval-every 0 --quiet \
  --out "$out/run" "${extra[@]}" >"$out/moetrain.log" 2>&1 ||
  { cat "$out/moetrain.log" >&2; exit 1; }
"$python" "$root/scripts/torch_train_model.py" "$out/run/config.json" --steps "$steps" \
  --batch 16 --seq-len 128 >"$out/torch.json"

"$python" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
recs = [json.loads(l) for l in open(f"{out}/run/metrics.jsonl") if l.strip()]
steps = [r for r in recs if "step_time_s" in r]
dts = sorted(r["step_time_s"] for r in steps[1:] or steps)  # the first step warms up
med = dts[len(dts) // 2]
tokens = steps[-1]["tokens"]
m_tps = tokens / med
t = json.load(open(f"{out}/torch.json"))
print(f"# tiny, batch 16x128, AdamW, 1 thread, {len(steps)} steps each (median step)")
print(f"{'':<22}{'step ms':>9}{'tokens/s':>10}")
print(f"{'moetrain':<22}{med * 1e3:>9.1f}{m_tps:>10.0f}")
print(f"{'PyTorch eager':<22}{t['median_step_s'] * 1e3:>9.1f}{t['tokens_per_s']:>10.0f}")
ratio = m_tps / t["tokens_per_s"]
print(f"ratio {ratio:.2f}x (goal >= 2x: {'met' if ratio >= 2 else 'NOT met'})")
PY
