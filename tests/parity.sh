#!/usr/bin/env bash
# Parallel parity: the same global batch and seed on one process and on EP / EP×DP layouts (one and
# several emulated nodes) must give the same losses to <= 1e-5 relative; the three token exchanges
# (flat, rbd, halo) must give bit-identical losses and final weights.
# Usage: parity.sh MOETRAIN CORPUS WORKDIR
set -euo pipefail
bin="$1"
corpus="$2"
work="$3"
rm -rf "$work"
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
mpirun_() { mpirun --oversubscribe --bind-to none "$@"; }
GLOBAL_BATCH=8
common=(train --preset test-moe --steps 20 --seq-len 32 --eval-every 0 --eval-batches 1 --quiet
        --data "$corpus" --lr 3e-3 --warmup 5)

run() {  # run NAME RANKS EP DP RPN ALGO
  local name="$1" np="$2" ep="$3" dp="$4" rpn="$5" algo="$6"
  local batch=$((GLOBAL_BATCH / (ep * dp)))
  if [ "$np" -eq 1 ]; then
    "$bin" "${common[@]}" --batch "$batch" --out "$work/$name"
  else
    mpirun_ -np "$np" "$bin" "${common[@]}" --batch "$batch" --ep "$ep" --dp "$dp" \
      --topo.ranks-per-node "$rpn" --a2a "$algo" --out "$work/$name"
  fi
}

run single 1 1 1 1 flat
layouts=("ep2 2 2 1 2" "ep4 4 4 1 4" "ep2dp2 4 2 2 4" "ep4-2nodes 4 4 1 2" "ep8-4nodes 8 8 1 2" "dp2 2 1 2 2")
for l in "${layouts[@]}"; do
  set -- $l
  for algo in flat rbd halo; do
    [ "$3" -eq 1 ] && [ "$algo" != flat ] && continue  # no exchange without EP
    run "$1-$algo" "$2" "$3" "$4" "$5" "$algo"
  done
done

/usr/bin/env python3 - "$work" <<'PY'
import json, os, sys, filecmp
work = sys.argv[1]
def losses(name):
    with open(os.path.join(work, name, "metrics.jsonl")) as f:
        return [json.loads(l)["loss"] for l in f]
ref = losses("single")
passed = failed = 0
def check(ok, msg):
    global passed, failed
    if ok: passed += 1
    else: failed += 1; print("FAIL", msg)
runs = sorted(d for d in os.listdir(work) if d != "single")
for name in runs:
    got = losses(name)
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    check(len(got) == len(ref) and worst <= 1e-5, f"{name}: worst relative loss difference {worst:.3e}")
    print(f"{name:22s} worst relative difference vs one process: {worst:.2e}")
for name in runs:
    if not name.endswith("-flat"): continue
    base = name[:-5]
    for algo in ("rbd", "halo"):
        other = f"{base}-{algo}"
        if other not in runs: continue
        check(losses(other) == losses(name), f"{other}: losses not bit-identical to {name}")
        check(filecmp.cmp(os.path.join(work, other, "model.safetensors"),
                          os.path.join(work, name, "model.safetensors"), shallow=False),
              f"{other}: final weights not bit-identical to {name}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
