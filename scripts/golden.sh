#!/usr/bin/env bash
# Golden loss curves: fixed short runs whose per-step losses are kept in tests/golden/, so a
# change that moves the numbers (a kernel, the data order, the optimizer, a parallel layout) is
# seen at once. Two cases:
#   tiny-50      the default job (`moetrain train`: tiny preset, batch 16 x 128, seed 0) for 50 steps
#   pp2-ep2-30   4 ranks under mpirun: test-moe4, PP 2 x EP 2, 2 micro-batches, 30 steps
# Usage:
#   scripts/golden.sh [--bin build/moetrain] [--work DIR] [CASE...]           compare (the test)
#   scripts/golden.sh --update [--bin build/moetrain] [CASE...]               rewrite the files
# Comparison (tests/checks.py golden: the test spine's one definition of the same losses): bit for
# bit by default (every step's loss, as the double metrics.jsonl holds). The
# runs pin OpenBLAS to its generic x86-64 kernels (OPENBLAS_CORETYPE=Prescott, which every x86-64
# CPU runs; OpenBLAS otherwise picks kernels by CPU at run time, and other kernels round
# differently), one BLAS thread, so the same build gives the same bits on any x86-64 machine.
# A different build (another compiler, optimisation level or BLAS) is compared with a relative
# tolerance, MOETRAIN_GOLDEN_RTOL=1e-3: 10x the drift measured between two BLAS kernel sets
# (MOETRAIN_GOLDEN_CORETYPE=Haswell or SkylakeX against the Prescott golden files: 8.6e-5 on
# tiny-50, 6.4e-9 on pp2-ep2-30, largest relative difference of any step).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
source "$root/tests/lib.sh"  # mpi, compare
bin="$root/build/moetrain"
work=""
update=0
cases=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --update) update=1; shift ;;
    --bin) bin="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    -h|--help) sed -n 2,18p "$0"; exit 0 ;;
    -*) echo "golden.sh: unknown flag $1" >&2; exit 2 ;;
    *) cases+=("$1"); shift ;;
  esac
done
[[ ${#cases[@]} -gt 0 ]] || cases=(tiny-50 pp2-ep2-30)
[[ -x "$bin" ]] || { echo "golden.sh: $bin is not an executable (build it, or pass --bin)" >&2; exit 2; }
[[ -n "$work" ]] || work="$(mktemp -d /tmp/moetrain_golden.XXXXXX)"
mkdir -p "$work"
rtol="${MOETRAIN_GOLDEN_RTOL:-0}"
data="$root/data/kjv.txt"
# MOETRAIN_GOLDEN_CORETYPE: other OpenBLAS kernels, to measure the drift a different build shows.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_CORETYPE="${MOETRAIN_GOLDEN_CORETYPE:-Prescott}"

# The command of each case (also written into its golden file).
case_command() {
  case "$1" in
    tiny-50) echo "moetrain train --steps 50" ;;
    pp2-ep2-30) echo "mpirun -np 4 moetrain train --preset test-moe4 --pp 2 --ep 2 --micro-batches 2 --batch 4 --seq-len 64 --steps 30" ;;
    *) echo "golden.sh: unknown case '$1' (tiny-50, pp2-ep2-30)" >&2; return 2 ;;
  esac
}

run_case() {  # run_case CASE OUTDIR: trains, leaves OUTDIR/metrics.jsonl
  local c="$1" out="$2"
  rm -rf "$out"
  case "$c" in
    tiny-50) "$bin" train --steps 50 --data "$data" --out "$out" --quiet ;;
    pp2-ep2-30)
      mpi 4 "$bin" train --preset test-moe4 --pp 2 --ep 2 \
        --micro-batches 2 --batch 4 --seq-len 64 --steps 30 --data "$data" --out "$out" --quiet ;;
  esac
}

# "step loss" per line from metrics.jsonl, the loss exactly as written (a shortest round-trip
# decimal of the double).
losses_of() {
  grep -o '"loss":[^,}]*' "$1" | cut -d: -f2 | awk '{ print NR, $1 }'
}

fails=0
for c in "${cases[@]}"; do
  cmd="$(case_command "$c")"
  golden="$root/tests/golden/$c.txt"
  t0=$(date +%s.%N)
  run_case "$c" "$work/$c"
  t1=$(date +%s.%N)
  losses_of "$work/$c/metrics.jsonl" > "$work/$c.txt"
  steps=$(wc -l < "$work/$c.txt")
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  if [[ $update -eq 1 ]]; then
    mkdir -p "$root/tests/golden"
    {
      echo "# $cmd"
      echo "# per-step loss (total = ce + aux), exact decimal of the double in metrics.jsonl"
      echo "# written by: scripts/golden.sh --update $c   ($(date -u +%Y-%m-%d), OPENBLAS_CORETYPE=Prescott, 1 thread)"
      echo "# step loss"
      cat "$work/$c.txt"
    } > "$golden.tmp"
    mv "$golden.tmp" "$golden"
    echo "golden $c: wrote $golden ($steps steps, ${secs} s)"
    continue
  fi
  [[ -f "$golden" ]] || { echo "golden $c: FAIL, $golden is missing (scripts/golden.sh --update $c)"; fails=$((fails + 1)); continue; }
  # Every step present, each loss equal (rtol 0) or within rtol; the report names the first
  # differing step and the largest relative difference.
  if ! compare golden "$golden" "$work/$c/metrics.jsonl" --rtol "$rtol" --name "golden $c (${secs} s)"; then
    fails=$((fails + 1))
  fi
done
[[ $update -eq 1 || $fails -eq 0 ]] || { echo "golden: $fails case(s) failed; runs kept in $work"; exit 1; }
