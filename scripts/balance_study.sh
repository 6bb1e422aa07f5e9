#!/usr/bin/env bash
# Aux-loss-free balancing (DeepSeek-V3: sigmoid + e_score_correction_bias, `--preset tiny-noaux`)
# against the default job's softmax + aux loss (`--preset tiny`): the default job's steps, batch
# and seed for each, on the built-in corpus, one BLAS thread, niced, one run after the other; the
# bias runs at each rate of BALANCE_RATES (default "1e-3 1e-2 0": the config's gamma, a larger
# one, and the bias frozen at 0 as the control). Then scripts/balance_summary.py prints per 100 steps the load CV and max/mean of every run,
# with the held-out loss, as a markdown table, and plots CV against step (docs/balance_cv.svg).
# A run whose metrics.jsonl already reaches the last step is kept (rerun the summary for free;
# delete WORKDIR/NAME to train it again).
#
# Usage: scripts/balance_study.sh [MOETRAIN] [WORKDIR]    (defaults build/moetrain, runs/balance)
#        ~7 min per run alone on a free core, 8-20 min on a shared 2-core machine; four runs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/build/moetrain}"
work="${2:-$root/runs/balance}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"  # absolute: the runs are trained from $root
steps="${BALANCE_STEPS:-600}"
rates="${BALANCE_RATES:-1e-3 1e-2 0}"
svg="${BALANCE_SVG:-$root/docs/balance_cv.svg}"
py=/usr/bin/python3  # the system python: the summary needs the standard library only
[ -x "$bin" ] || { echo "balance_study: $bin is not an executable (build it: cmake --build build --target moetrain)" >&2; exit 1; }
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"  # absolute, like $work
"$root/scripts/setup.sh"  # the built-in corpus
cd "$root"  # the trainer finds data/kjv.txt here

done_steps() {  # the last step recorded in $1/metrics.jsonl (0 when none)
  [ -s "$1/metrics.jsonl" ] || { echo 0; return; }
  "$py" -c 'import json,sys; print(max(json.loads(l)["step"] for l in open(sys.argv[1]) if l.strip()))' \
    "$1/metrics.jsonl"
}

train() {  # train NAME FLAGS...
  local name="$1"; shift
  local out="$work/$name"
  if [ "$(done_steps "$out")" -ge "$steps" ]; then
    echo "balance_study: $name: $out has $steps steps, kept"
    return
  fi
  rm -rf "$out"
  echo "balance_study: $name: moetrain train $* --steps $steps --out $out"
  local t0=$SECONDS
  OPENBLAS_NUM_THREADS=1 nice -n 10 "$bin" train "$@" --steps "$steps" --threads 1 --quiet \
    --out "$out" > "$work/$name.log" 2>&1 || { tail -5 "$work/$name.log" >&2; exit 1; }
  echo "balance_study: $name: $((SECONDS - t0)) s"
}

runs=("aux=$work/aux")
train aux --preset tiny
for g in $rates; do
  train "bias-$g" --preset tiny-noaux --balance.bias-rate "$g"
  runs+=("bias-$g=$work/bias-$g")
done
"$py" "$root/scripts/balance_summary.py" --window 100 --svg "$svg" "${runs[@]}"
