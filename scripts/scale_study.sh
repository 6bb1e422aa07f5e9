#!/usr/bin/env bash
# The SMPI scale study: the real token exchange (flat, rbd, halo) of `bench a2a` simulated with
# SimGrid on a Frontier-like platform (platforms/gen_platform.py), nodes x routing x per-message
# overhead (calibrated | 0, the two bounds) x size; beside each point, the planner's prediction.
#   scripts/scale_study.sh [OUT_DIR]          (default out/scale_study)
# Environment (defaults in brackets):
#   NODES ["2 4 8"]  ROUTINGS ["uniform skewed"]  SIZES ["256K"] (bytes per rank, flat dispatch)
#   OVERHEADS ["cal 0"] (us per message sent and received; cal = platforms/calibration.json)
#   PLATFORM [frontier]  HIDDEN [auto: 256 below 1 MiB per rank, 4096 from 1 MiB]  EXPERTS [256]
#   TOPK [6]
#   ALGOS ["flat rbd halo rbd-halo"] (any exchange moetrain_smpi_a2a --algos takes)
#   PRECISION [auto] (SimGrid surf/precision, seconds; auto: 1e-7 below 128 ranks, 1e-6 from 128:
#     see docs/scale_study.md "Simulation precision")
# EXPERTS is raised to the next multiple of the ranks where it is not one (the bench places
# E / ranks experts on each rank: 512 ranks get E = 512).
#   SMPI_BUILD [build-smpi] (configured and built here when missing)
#   PREDICT [build/moetrain_a2a_predict] (the planner; its columns are empty when it is missing)
# Writes OUT_DIR/points.csv, OUT_DIR/scale_study.svg and one JSON per simulation (raw/).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/out/scale_study}"
NODES="${NODES:-2 4 8}"; ROUTINGS="${ROUTINGS:-uniform skewed}"; SIZES="${SIZES:-256K}"
OVERHEADS="${OVERHEADS:-cal 0}"; PLATFORM="${PLATFORM:-frontier}"
HIDDEN="${HIDDEN:-auto}"; EXPERTS="${EXPERTS:-256}"; TOPK="${TOPK:-6}"
ALGOS="${ALGOS:-flat rbd halo rbd-halo}"; PRECISION="${PRECISION:-auto}"
SMPI_BUILD="${SMPI_BUILD:-$root/build-smpi}"; PREDICT="${PREDICT:-$root/build/moetrain_a2a_predict}"
# the simulations run inside OUT_DIR/raw: a relative build dir is taken from where this was started
case "$SMPI_BUILD" in /*) ;; *) SMPI_BUILD="$PWD/$SMPI_BUILD" ;; esac
case "$PREDICT" in /*) ;; *) PREDICT="$PWD/$PREDICT" ;; esac
mkdir -p "$out/raw"
if [ ! -x "$SMPI_BUILD/moetrain_smpi_a2a" ]; then
  cmake -S "$root" -B "$SMPI_BUILD" -DMOETRAIN_SMPI=ON >/dev/null
  cmake --build "$SMPI_BUILD" --target moetrain_smpi_a2a -j"$(nproc)" >/dev/null
fi
[ -s "$root/platforms/calibration.json" ] || "$root/platforms/calibrate.sh"
cal=$(python3 -c "import json;print(json.load(open('$root/platforms/calibration.json'))['overhead_us'])")
# SMPI settings, each for a reason (NOTES §D4): host code is not timed; no eager copies of small
# messages; bandwidth/latency factors 1 (the platform's figures as they are); LMM precision that
# does not crash at 100 GB/s links; smpi/iprobe 1e-10 s: SMPI's MPI_Probe polls, sleeping a
# growing multiple of this after each miss (default 1e-4 s: 100 us steps, 2.1 ms for the rails'
# metadata at 64 ranks); 1e-10 and 1e-9 give the same plan time within 0.3 us.
cfg=(--cfg=smpi/simulate-computation:no --cfg=smpi/send-is-detached-thresh:0 --cfg=smpi/bw-factor:0:1
     --cfg=smpi/lat-factor:0:1 --cfg=maxmin/precision:1e-4 --cfg=smpi/iprobe:1e-10 --cfg=contexts/stack-size:128)
algos=$(echo $ALGOS | tr ' ' ',')
# surf/precision: flow completions closer than this (s) are handled as one event. smpirun's 1e-9
# re-solves every flow at each of ~P^2 completions (random routing: every pair a different
# size): 80 s at 64 ranks. 1e-7 / 1e-6 coalesce them; the error this costs is measured in the doc.
bytes_of() {  # "256K" -> 262144
  python3 -c "import sys;s=sys.argv[1];m={'K':2**10,'M':2**20,'G':2**30}.get(s[-1],1);print(int(float(s.rstrip('KMG'))*m))" "$1"
}
precision_for() {  # SIZE RANKS
  if [ "$PRECISION" != auto ]; then echo "$PRECISION"; return; fi
  if [ "$2" -lt 128 ]; then echo 1e-7; else echo 1e-6; fi
}
hidden_for() {  # 256K: 168 tokens x k 6 x H 256; 24M: 256 tokens x k 6 x H 4096 (X-MoE-Small's bytes)
  if [ "$HIDDEN" != auto ]; then echo "$HIDDEN"; return; fi
  if [ "$(bytes_of "$1")" -lt 1048576 ]; then echo 256; else echo 4096; fi
}
# Memory: every rank holds its send, receive and staging rows (~3 x size). Above 4 GiB in all,
# buffers of 1 MiB or more are folded onto one shared block (smpi/auto-shared-malloc-thresh): row
# contents are then garbage, so those points check origins and counts only (--no-check-rows).
fold_args() {
  if [ $(( $2 * $(bytes_of "$1") * 3 )) -gt $(( 4 << 30 )) ]; then
    echo "--cfg=smpi/auto-shared-malloc-thresh:1048576"
  fi
}
for n in $NODES; do
  python3 "$root/platforms/gen_platform.py" "$PLATFORM" "$n" "$out/raw/$PLATFORM-$n.xml"
  ranks=$((8 * n)); experts=$EXPERTS
  [ $((experts % ranks)) -eq 0 ] || experts=$(( (experts + ranks - 1) / ranks * ranks ))
  for routing in $ROUTINGS; do
    for ov in $OVERHEADS; do
      o=$ov; [ "$ov" = cal ] && o=$cal
      tag="$PLATFORM-n$n-$routing-o$o"
      [ -s "$out/raw/$tag.json" ] && continue   # resumable
      for s in $SIZES; do
        start=$(date +%s); prec=$(precision_for "$s" "$ranks"); fold=$(fold_args "$s" "$ranks")
        (cd "$out/raw" && smpirun -np "$ranks" -platform "$PLATFORM-$n.xml" -hostfile "$PLATFORM-$n.hosts" \
           "${cfg[@]}" --cfg=surf/precision:"$prec" $fold "$SMPI_BUILD/moetrain_smpi_a2a" \
           --topo.ranks-per-node 8 -b "$s" -e "$s" --hidden "$(hidden_for "$s")" --experts "$experts" \
           --topk "$TOPK" --routing "$routing" --iters 1 --warmup 0 --msg-overhead-us "$o" \
           --algos "$algos" ${fold:+--no-check-rows} --json 2>"$tag-$s.log" |
           sed -n '/^{/,/^}/p' >"$tag-$s.part")
        wall=$(( $(date +%s) - start ))
        python3 - "$out/raw/$tag-$s.part" "$prec" "$wall" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["surf_precision"], j["wall_s"] = float(sys.argv[2]), int(sys.argv[3])
j["rows_checked"] = j["options"]["check_rows"]
json.dump(j, open(sys.argv[1], "w"))
PY
        echo "scale_study: $tag size $s (E $experts, surf/precision $prec${fold:+, rows folded}): $wall s wall"
      done
      python3 - "$out/raw" "$tag" $SIZES <<'PY'
import json, sys
d, tag, sizes = sys.argv[1], sys.argv[2], sys.argv[3:]
rows, head = [], None
for s in sizes:
    j = json.load(open(f"{d}/{tag}-{s}.part"))
    head = head or j
    for r in j["rows"]:
        r["surf_precision"], r["wall_s"] = j["surf_precision"], j["wall_s"]
    rows += j["rows"]
head["rows"] = rows
json.dump(head, open(f"{d}/{tag}.json", "w"), indent=1)
PY
    done
  done
done
python3 "$root/scripts/scale_study_report.py" "$out" "$PREDICT" "$cal" "$TOPK"
