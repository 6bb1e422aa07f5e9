#!/usr/bin/env bash
# Bad parallel input under mpirun: the job ends (no hang), exits non-zero, and moetrain's error
# line names the problem exactly once (one rank reports). Usage: cli_errors_mpi.sh MOETRAIN CORPUS
set -uo pipefail
bin="$1"
corpus="$2"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
pass=0
fail=0
expect() {  # expect NAME NP PATTERN ARGS...
  local name="$1" np="$2" pattern="$3"
  shift 3
  local out rc n
  out="$(timeout 60 mpirun --oversubscribe --bind-to none -np "$np" "$bin" train --steps 2 --quiet \
         --preset test-moe --seq-len 16 --batch 2 --data "$corpus" --out "$dir/$name" "$@" 2>&1)"
  rc=$?
  n=$(printf '%s\n' "$out" | grep -c "^moetrain: error")
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$n" -eq 1 ] && printf '%s' "$out" | grep -q -- "$pattern" \
     && [ ! -e "$dir/$name/model.safetensors" ]; then
    pass=$((pass + 1))
  else
    echo "FAIL $name: rc=$rc error lines=$n output: $out"
    fail=$((fail + 1))
  fi
}
expect world-mismatch 3 'pp(1) \* dp(1) \* ep(4) \* tp(1) = 4 != world size 3' --ep 4
expect ep-not-dividing-E 3 'ep(3) does not divide n_routed_experts (8)' --ep 3
expect bad-topology 4 'world size 4 is not a multiple of ranks per node 3' --ep 4 --topo.ranks-per-node 3
expect bad-a2a 2 "unknown all-to-all algorithm 'foo'" --ep 2 --a2a foo
expect pp-over-layers 4 "pp(4) exceeds the model's 3 layers" --pp 4
expect empty-stage 2 '--pp.layers: stage 1 has 0 layers' --pp 2 --pp.layers 3,0
expect layers-sum 2 '--pp.layers adds up to 2 layers but the model has 3' --pp 2 --pp.layers 1,1
expect zero-micro-batches 2 '--micro-batches must be >= 1, got 0' --pp 2 --micro-batches 0
expect batch-vs-micro 2 '--batch 2 is not divisible by --micro-batches 4' --pp 2 --micro-batches 4
expect bad-schedule 2 "pp2" --pp 2 --pp.schedule pp2
expect missing-data 2 'nope.txt' --ep 2 --data "$dir/nope.txt"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
