#!/usr/bin/env bash
# The batch words of `moetrain train`, the accepted cases (the refused ones are in cli_errors.sh):
# --global-batch G (sequences per step over all data ranks) and --micro-batch B (sequences per
# micro-batch) say what --batch G / (ep x dp) and --micro-batches (G / (ep x dp)) / B say, so
#   1. one process: --global-batch 8 is --batch 8, and --global-batch 8 --micro-batch 2 is
#      --batch 8 --micro-batches 4, loss for loss and weight for weight, bit for bit;
#   2. 2 ranks: --dp 2 --global-batch 8 is --dp 2 --batch 4 (and with --micro-batch 2, --dp 2
#      --batch 4 --micro-batches 2), bit for bit, and matches one process with the same number of
#      micro-batches within tests/parity.sh's bound (1e-6 relative; summing the data ranks'
#      gradients rounds differently): --global-batch 8, and for --micro-batch 2 (2 micro-batches
#      on each rank) --global-batch 8 --micro-batch 4. Not one process's --micro-batch 2 (4
#      micro-batches): the aux loss balances the loads of a micro-batch over all data ranks, so
#      its value depends on the micro-batch count (2.3e-3 relative at step 1 here);
#   3. the run header states the global batch (8x32 on every layout) and each step's "tokens" in
#      metrics.jsonl is 8 x 32.
# test-moe, 3 steps of 8 sequences of 32 tokens: about 15 s in all on the 2-core machine.
# Usage: batch_words.sh MOETRAIN CORPUS WORK
set -euo pipefail
bin="$1"
corpus="$2"
work="$3"
common=(train --preset test-moe --steps 3 --seq-len 32 --eval-every 0 --eval-batches 1 --data "$corpus")
source "$(dirname "$0")/layout_runs.sh"  # run NAME NP ARGS...: one process when NP is 1, else mpirun
scratch "$work"  # tests/lib.sh: the work folder, emptied
# run_logged NAME NP ARGS...: run, with the header (stderr) in NAME.log; a failed run stops the test.
run_logged() {
  local name="$1"
  run "$@" 2>"$work/$name.log" >/dev/null || { cat "$work/$name.log" >&2; exit 1; }
}

run_logged batch 1 --batch 8
run_logged global 1 --global-batch 8
run_logged batch_mbs 1 --batch 8 --micro-batches 4
run_logged global_mb 1 --global-batch 8 --micro-batch 2
run_logged global_mb4 1 --global-batch 8 --micro-batch 4
run_logged dp2_batch 2 --dp 2 --batch 4
run_logged dp2_global 2 --dp 2 --global-batch 8
run_logged dp2_batch_mbs 2 --dp 2 --batch 4 --micro-batches 2
run_logged dp2_global_mb 2 --dp 2 --global-batch 8 --micro-batch 2

# 1. and 2.: the new words against the old, bit for bit; across layouts within parity's bound.
for pair in global:batch global_mb:batch_mbs dp2_global:dp2_batch dp2_global_mb:dp2_batch_mbs; do
  a="${pair%%:*}" b="${pair#*:}"
  compare losses "$work/$a" "$work/$b" --name "$a = $b" || true
  compare weights "$work/$a" "$work/$b" --name "$a = $b" || true
done
compare losses "$work/dp2_global" "$work/global" --rtol 1e-6 --name "dp2_global ~ global" || true
compare losses "$work/dp2_global_mb" "$work/global_mb4" --rtol 1e-6 --name "dp2_global_mb ~ global_mb4" || true

# 3. The header: "global batch 8x32 in M micro-batch(es)" (M per data rank), once per run.
header() {  # header NAME M: NAME's log states global batch 8x32 in M micro-batches, once
  local n
  n=$(grep -c "^moetrain: .*, global batch 8x32 in $2 micro-batch(es), " "$work/$1.log" || true)
  check_that "$1: the header states global batch 8x32 in $2 micro-batch(es)" [ "$n" = 1 ]
}
header global 1
header global_mb 4
header global_mb4 2
header dp2_global 1
header dp2_global_mb 2
for name in global global_mb global_mb4 dp2_global dp2_global_mb; do
  check_that "$name: every step's tokens is 8 x 32" "$PY" -c '
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if "\"step_time_s\"" in l]
sys.exit(0 if len(steps) == 3 and all(r["tokens"] == 8 * 32 for r in steps) else 1)' \
    "$work/$name/metrics.jsonl"
done
finish batch_words
