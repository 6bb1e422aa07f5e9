#!/usr/bin/env bash
# Parallel parity: the same global batch, micro-batch count and seed on one process and on
# parallel layouts (EP, DP, PP, emulated nodes) must give the same losses to <= 1e-5 relative.
# Runs named BASE@VARIANT must be bit-identical (losses and final weights) to every other variant
# of the same BASE: the three token exchanges (flat/rbd/halo), the two pipeline schedules
# (1f1b/gpipe), the three recompute modes (none/moe/full). A run named X.NAME is compared with the
# one-process run single.X (another global batch); others with single.
# Usage: parity.sh SUITE MOETRAIN CORPUS WORKDIR      SUITE: ep | pp
set -euo pipefail
suite="$1"
bin="$2"
corpus="$3"
work="$4"
rm -rf "$work"
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
common=(train --steps 20 --seq-len 32 --eval-every 0 --eval-batches 1 --quiet --data "$corpus"
        --lr 3e-3 --warmup 5)

# run NAME NP ARGS...: one process when NP is 1, else mpirun.
run() {
  local name="$1" np="$2"
  shift 2
  if [ "$np" -eq 1 ]; then
    "$bin" "${common[@]}" "$@" --out "$work/$name"
  else
    mpirun --oversubscribe --bind-to none -np "$np" "$bin" "${common[@]}" "$@" --out "$work/$name"
  fi
}

case "$suite" in
  ep)  # global batch 8, one micro-batch
    m=(--preset test-moe)
    run single 1 "${m[@]}" --batch 8
    for algo in flat rbd halo; do
      run "ep2@$algo" 2 "${m[@]}" --batch 4 --ep 2 --topo.ranks-per-node 2 --a2a "$algo"
      run "ep4@$algo" 4 "${m[@]}" --batch 2 --ep 4 --topo.ranks-per-node 4 --a2a "$algo"
      run "ep2dp2@$algo" 4 "${m[@]}" --batch 2 --ep 2 --dp 2 --topo.ranks-per-node 4 --a2a "$algo"
      run "ep4-2nodes@$algo" 4 "${m[@]}" --batch 2 --ep 4 --topo.ranks-per-node 2 --a2a "$algo"
      run "ep8-4nodes@$algo" 8 "${m[@]}" --batch 1 --ep 8 --topo.ranks-per-node 2 --a2a "$algo"
    done
    run "dp2@flat" 2 "${m[@]}" --batch 4 --dp 2
    ;;
  pp)  # global batch 8 in 4 micro-batches; a 4-layer model so that PP=4 has a layer per stage
    m=(--preset test-moe4 --micro-batches 4)
    run single 1 "${m[@]}" --batch 8
    for sched in 1f1b gpipe; do
      run "pp2@$sched" 2 "${m[@]}" --batch 8 --pp 2 --pp.schedule "$sched"
      run "pp4@$sched" 4 "${m[@]}" --batch 8 --pp 4 --pp.schedule "$sched"
    done
    for rc in none moe full; do
      run "pp2ep2@$rc" 4 "${m[@]}" --batch 4 --pp 2 --ep 2 --recompute "$rc"
    done
    # 8 ranks: global batch 16 (4 data ranks x 4), compared with its own one-process reference.
    run single.b16 1 "${m[@]}" --batch 16
    run "b16.pp2ep2dp2@flat" 8 "${m[@]}" --batch 4 --pp 2 --ep 2 --dp 2 --topo.ranks-per-node 4
    run "b16.pp2ep2dp2@rbd" 8 "${m[@]}" --batch 4 --pp 2 --ep 2 --dp 2 --topo.ranks-per-node 4 --a2a rbd
    run "pp2-uneven@1f1b" 2 "${m[@]}" --batch 8 --pp 2 --pp.layers 1,3
    ;;
  *) echo "unknown suite $suite" >&2; exit 2 ;;
esac

/usr/bin/env python3 - "$work" <<'PY'
import json, os, sys, filecmp
work = sys.argv[1]
def losses(name):
    with open(os.path.join(work, name, "metrics.jsonl")) as f:
        return [json.loads(l)["loss"] for l in f]
passed = failed = 0
def check(ok, msg):
    global passed, failed
    if ok: passed += 1
    else: failed += 1; print("FAIL", msg)
runs = sorted(d for d in os.listdir(work) if not d.startswith("single"))
for name in runs:
    got = losses(name)
    ref = losses("single." + name.split(".")[0] if "." in name else "single")
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    check(len(got) == len(ref) and worst <= 1e-5, f"{name}: worst relative loss difference {worst:.3e}")
    print(f"{name:22s} worst relative difference vs one process: {worst:.2e}")
groups = {}
for name in runs:
    groups.setdefault(name.split("@")[0], []).append(name)
for base, names in sorted(groups.items()):
    first = names[0]
    for other in names[1:]:
        same = losses(other) == losses(first) and filecmp.cmp(
            os.path.join(work, other, "model.safetensors"),
            os.path.join(work, first, "model.safetensors"), shallow=False)
        check(same, f"{other}: losses/weights not bit-identical to {first}")
        print(f"{other:22s} bit-identical to {first}: {same}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
