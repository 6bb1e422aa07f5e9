#!/usr/bin/env bash
# The SMPI scale study: the real token exchange (flat, rbd, halo) of `bench a2a` simulated with
# SimGrid on a Frontier-like platform (platforms/gen_platform.py), nodes x routing x per-message
# overhead (calibrated | 0, the two bounds) x size; beside each point, the planner's prediction.
#   scripts/scale_study.sh [OUT_DIR]          (default out/scale_study)
# Environment (defaults in brackets):
#   NODES ["2 4 8"]  ROUTINGS ["uniform skewed"]  SIZES ["256K"] (bytes per rank, flat dispatch)
#   OVERHEADS ["cal 0"] (us per message sent and received; cal = platforms/calibration.json)
#   PLATFORM [frontier]  HIDDEN [256]  EXPERTS [256]  TOPK [6]
#   SMPI_BUILD [build-smpi] (configured and built here when missing)
#   PREDICT [build/moetrain_a2a_predict] (the planner; its columns are empty when it is missing)
# Writes OUT_DIR/points.csv, OUT_DIR/scale_study.svg and one JSON per simulation (raw/).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/out/scale_study}"
NODES="${NODES:-2 4 8}"; ROUTINGS="${ROUTINGS:-uniform skewed}"; SIZES="${SIZES:-256K}"
OVERHEADS="${OVERHEADS:-cal 0}"; PLATFORM="${PLATFORM:-frontier}"
HIDDEN="${HIDDEN:-256}"; EXPERTS="${EXPERTS:-256}"; TOPK="${TOPK:-6}"
SMPI_BUILD="${SMPI_BUILD:-$root/build-smpi}"; PREDICT="${PREDICT:-$root/build/moetrain_a2a_predict}"
mkdir -p "$out/raw"
if [ ! -x "$SMPI_BUILD/moetrain_smpi_a2a" ]; then
  cmake -S "$root" -B "$SMPI_BUILD" -DMOETRAIN_SMPI=ON >/dev/null
  cmake --build "$SMPI_BUILD" --target moetrain_smpi_a2a -j"$(nproc)" >/dev/null
fi
[ -s "$root/platforms/calibration.json" ] || "$root/platforms/calibrate.sh"
cal=$(python3 -c "import json;print(json.load(open('$root/platforms/calibration.json'))['overhead_us'])")
# SMPI settings, each for a reason (NOTES §D4): host code is not timed; no eager copies of small
# messages; bandwidth/latency factors 1 (the platform's figures as they are); LMM precision that
# does not crash at 100 GB/s links.
cfg=(--cfg=smpi/simulate-computation:no --cfg=smpi/send-is-detached-thresh:0 --cfg=smpi/bw-factor:0:1
     --cfg=smpi/lat-factor:0:1 --cfg=maxmin/precision:1e-4 --cfg=contexts/stack-size:128)
sizes=$(echo $SIZES | tr ' ' ',')
for n in $NODES; do
  python3 "$root/platforms/gen_platform.py" "$PLATFORM" "$n" "$out/raw/$PLATFORM-$n.xml"
  for routing in $ROUTINGS; do
    for ov in $OVERHEADS; do
      o=$ov; [ "$ov" = cal ] && o=$cal
      tag="$PLATFORM-n$n-$routing-o$o"
      [ -s "$out/raw/$tag.json" ] && continue   # resumable
      for s in $SIZES; do
        start=$(date +%s)
        (cd "$out/raw" && smpirun -np $((8 * n)) -platform "$PLATFORM-$n.xml" -hostfile "$PLATFORM-$n.hosts" \
           "${cfg[@]}" "$SMPI_BUILD/moetrain_smpi_a2a" --topo.ranks-per-node 8 -b "$s" -e "$s" \
           --hidden "$HIDDEN" --experts "$EXPERTS" --topk "$TOPK" --routing "$routing" --iters 1 \
           --warmup 0 --msg-overhead-us "$o" --json 2>"$tag-$s.log" | sed -n '/^{/,/^}/p' >"$tag-$s.part")
        echo "scale_study: $tag size $s: $(( $(date +%s) - start )) s wall"
      done
      python3 - "$out/raw" "$tag" $SIZES <<'PY'
import json, sys
d, tag, sizes = sys.argv[1], sys.argv[2], sys.argv[3:]
rows, head = [], None
for s in sizes:
    j = json.load(open(f"{d}/{tag}-{s}.part"))
    head = head or j
    rows += j["rows"]
head["rows"] = rows
json.dump(head, open(f"{d}/{tag}.json", "w"), indent=1)
PY
    done
  done
done
python3 "$root/scripts/scale_study_report.py" "$out" "$PREDICT" "$cal" "$TOPK"
