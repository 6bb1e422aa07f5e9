#!/usr/bin/env bash
# Training speed of the default model (tiny, batch 16x128, AdamW) in moetrain and in eager PyTorch
# (scripts/torch_train_model.py, the tests/reference model), one thread each, in one go. The PyTorch
# peer runs twice a round, fp32 and under bf16 autocast (bf16 GEMM inputs through oneDNN, the peer
# of moetrain --precision bf16), and the faster of the two is the one compared. Both link
# the same OpenBLAS: its kernels are set explicitly for both (PyTorch would otherwise get the
# generic ones on this CPU). Prints the median-step tokens/s of both and the ratio (goal >= 2x).
# This machine's speed drifts by up to 25% over minutes (other tenants share the chip), so
# --rounds R alternates the pair R times: each round's ratio compares two runs a few seconds apart,
# and the summary gives the median of the rounds' ratios and each side's best round.
#   scripts/torch_train_compare.sh [--steps N] [--rounds R] [--build DIR] [-- extra moetrain train args]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
steps=30 rounds=1 build="$root/build" extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "torch_train_compare.sh: unknown argument '$1' (expected --steps, --rounds, --build, --)" >&2; exit 2 ;;
  esac
done
moetrain="$build/moetrain"
# moetrain runs the default job's precision (auto, as scripts/train.sh) unless --precision is given.
precision=(--precision auto)
for a in "${extra[@]}"; do [[ "$a" == --precision || "$a" == --precision=* ]] && precision=(); done
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "torch_train_compare.sh: --steps must be a positive integer, got '$steps'" >&2; exit 2; }
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "torch_train_compare.sh: --rounds must be a positive integer, got '$rounds'" >&2; exit 2; }
[ -x "$moetrain" ] || { echo "torch_train_compare.sh: $moetrain not found (build it first, or pass --build DIR)" >&2; exit 2; }
python=/usr/bin/python3  # PyTorch 1.13 (not the pyenv python3 on PATH)
source "$root/scripts/blas_core.sh"
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-$(blas_core_for_this_cpu)}" OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
# PyTorch's bf16 autocast runs its GEMMs through oneDNN's AVX-512 BF16 kernels; without them it
# emulates bf16 and is ~12x slower than its fp32 (8.7 s a step on an AVX2 Zen), so there the peer
# is PyTorch fp32 alone.
autocast=0
grep -qw avx512_bf16 /proc/cpuinfo && autocast=1
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

for r in $(seq 1 "$rounds"); do
  "$moetrain" train --steps "$steps" --batch 16 --seq-len 128 --threads 1 --eval-every 0 --quiet \
    --out "$out/run$r" "${precision[@]}" "${extra[@]}" >"$out/moetrain.log" 2>&1 ||
    { cat "$out/moetrain.log" >&2; exit 1; }
  "$python" "$root/scripts/torch_train_model.py" "$out/run$r/config.json" --steps "$steps" \
    --batch 16 --seq-len 128 >"$out/torch$r.json"
  if [ "$autocast" = 1 ]; then
    "$python" "$root/scripts/torch_train_model.py" "$out/run$r/config.json" --steps "$steps" \
      --batch 16 --seq-len 128 --autocast-bf16 >"$out/torchbf16_$r.json"
  fi
done

"$python" - "$out" "$rounds" <<'PY'
import json, os, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = []
for r in range(1, rounds + 1):
    recs = [json.loads(l) for l in open(f"{out}/run{r}/metrics.jsonl") if l.strip()]
    steps = [x for x in recs if "step_time_s" in x]
    dts = sorted(x["step_time_s"] for x in steps[1:] or steps)  # the first step warms up
    med = dts[len(dts) // 2]
    m_tps = steps[-1]["tokens"] / med
    # the peer: the faster of PyTorch fp32 and PyTorch under bf16 autocast in this round
    t32 = json.load(open(f"{out}/torch{r}.json"))
    bf16_file = f"{out}/torchbf16_{r}.json"
    t16 = json.load(open(bf16_file)) if os.path.exists(bf16_file) else None
    t = min([x for x in (t32, t16) if x], key=lambda x: x["median_step_s"])
    prec = {x["mfu_peak"]["precision"] for x in recs if "mfu_peak" in x}
    rows.append((med, m_tps, t["median_step_s"], t["tokens_per_s"], len(steps), t32["median_step_s"],
                 t16["median_step_s"] if t16 else None, "/".join(sorted(prec))))
print(f"# tiny, batch 16x128, AdamW, 1 thread, {rows[0][4]} steps each (median step), {rounds} round(s)")
print(f"{'':<30}{'step ms':>9}{'tokens/s':>10}")
for i, (med, m_tps, t_med, t_tps, _, t32, t16, prec) in enumerate(rows, 1):
    tag = f" (round {i})" if rounds > 1 else ""
    print(f"{'moetrain ' + prec + tag:<30}{med * 1e3:>9.1f}{m_tps:>10.0f}")
    print(f"{'PyTorch eager, best' + tag:<30}{t_med * 1e3:>9.1f}{t_tps:>10.0f}"
          f"   (fp32 {t32 * 1e3:.1f} ms, bf16 autocast "
          + (f"{t16 * 1e3:.1f} ms)" if t16 else "not run: this CPU has no AVX-512 BF16)"))
ratios = sorted(r[1] / r[3] for r in rows)
ratio = ratios[(len(ratios) - 1) // 2]  # the lower median: an even count never rounds up
if rounds > 1:
    best_m, best_t = max(x[1] for x in rows), max(x[3] for x in rows)
    print(f"best round: moetrain {best_m:.0f}, PyTorch {best_t:.0f} tokens/s ({best_m / best_t:.2f}x); "
          f"rounds' ratios {', '.join(f'{x:.2f}' for x in ratios)}")
print(f"ratio {ratio:.2f}x{' (median of the rounds)' if rounds > 1 else ''} "
      f"(goal >= 2x: {'met' if ratio >= 2 else 'NOT met'})")
PY
