#!/usr/bin/env bash
# Weak scaling of a simulated training step (moetrain_smpi_step, SimGrid SMPI): the planner's
# chosen layout for each world size, communication run for real on a Frontier-like platform
# (platforms/gen_platform.py, 8 ranks per node), compute injected from the planner's time model,
# tokens per rank fixed. Beside each point, the planner's predicted step.
#   scripts/step_study.sh [OUT_DIR]          (default out/step_study)
# Environment (defaults in brackets):
#   RANKS ["64 128 256 512 1024"]  MODEL [xmoe-small]  TOKENS [2048] (per rank)  SEQ [512]
#   OVERHEAD [cal] (us per message; cal = platforms/calibration.json)  PLATFORM [frontier]
#   LAYOUT [] (one layout for every size; empty: the planner's search at each size)
#   SMPI_BUILD [build-smpi] (configured and built here when missing)
# Writes OUT_DIR/points.csv, OUT_DIR/step_study.svg, one JSON per simulation (raw/) and prints
# the markdown table (docs/step_study.md).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/out/step_study}"
RANKS="${RANKS:-64 128 256 512 1024}"; MODEL="${MODEL:-xmoe-small}"; TOKENS="${TOKENS:-2048}"
SEQ="${SEQ:-512}"; OVERHEAD="${OVERHEAD:-cal}"; PLATFORM="${PLATFORM:-frontier}"; LAYOUT="${LAYOUT:-}"
SMPI_BUILD="${SMPI_BUILD:-$root/build-smpi}"
# the simulations run inside OUT_DIR/raw: a relative build dir is taken from where this was started
case "$SMPI_BUILD" in /*) ;; *) SMPI_BUILD="$PWD/$SMPI_BUILD" ;; esac
mkdir -p "$out/raw"
if [ ! -x "$SMPI_BUILD/moetrain_smpi_step" ]; then
  cmake -S "$root" -B "$SMPI_BUILD" -DMOETRAIN_SMPI=ON >/dev/null
  cmake --build "$SMPI_BUILD" --target moetrain_smpi_step -j"$(nproc)" >/dev/null
fi
o="$OVERHEAD"
[ "$o" = cal ] && o=$(python3 -c "import json;print(json.load(open('$root/platforms/calibration.json'))['overhead_us'])")
# scale_study.sh's SMPI settings (NOTES §D4), plus: surf/precision 1e-6 (the lead measured the
# 64-rank exchange 50x cheaper to simulate and within 1.6% of the default); shared malloc, local
# (one block per call site), for this program's buffers and the exchange's (above 64 KiB).
cfg=(--cfg=smpi/simulate-computation:no --cfg=smpi/send-is-detached-thresh:0 --cfg=smpi/bw-factor:0:1
     --cfg=smpi/lat-factor:0:1 --cfg=maxmin/precision:1e-4 --cfg=smpi/iprobe:1e-10 --cfg=contexts/stack-size:128
     --cfg=surf/precision:1e-6 --cfg=smpi/shared-malloc:local --cfg=smpi/auto-shared-malloc-thresh:65536)
layout=(); [ -n "$LAYOUT" ] && layout=(--layout "$LAYOUT")
for p in $RANKS; do
  n=$((p / 8))
  tag="$PLATFORM-p$p-$MODEL-t$TOKENS-o$o"
  [ -s "$out/raw/$tag.json" ] && continue   # resumable
  python3 "$root/platforms/gen_platform.py" "$PLATFORM" "$n" "$out/raw/$PLATFORM-$n.xml"
  start=$(date +%s)
  (cd "$out/raw" && smpirun -np "$p" -platform "$PLATFORM-$n.xml" -hostfile "$PLATFORM-$n.hosts" "${cfg[@]}" \
     "$SMPI_BUILD/moetrain_smpi_step" --topo.ranks-per-node 8 --model "$MODEL" --cluster "$PLATFORM" \
     --tokens-per-rank "$TOKENS" --seq-len "$SEQ" --msg-overhead-us "$o" "${layout[@]}" --json \
     2>"$tag.log" | sed -n '/^{/,/^}/p' >"$tag.part")
  wall=$(( $(date +%s) - start ))
  python3 -c "import json,sys;j=json.load(open(sys.argv[1]));j['wall_s']=int(sys.argv[2]);json.dump(j,open(sys.argv[3],'w'),indent=1)" \
    "$out/raw/$tag.part" "$wall" "$out/raw/$tag.json"
  echo "step_study: $p ranks: $wall s wall"
done
python3 "$root/scripts/step_study_report.py" "$out"
