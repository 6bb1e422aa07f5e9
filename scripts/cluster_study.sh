#!/usr/bin/env bash
# The exchange study on a real cluster of network namespaces (issue 39, item 2): flat, rbd, halo and
# rbd-halo through `moetrain bench a2a` on scripts/cluster.sh clusters of NODES x 2 ranks, at each
# link rate, ROUNDS interleaved rounds (each round visits every point once, so a busy moment of the
# machine lands on one round of every point, not on every round of one); then SimGrid's prediction
# of the same points (moetrain_smpi_a2a on platforms/gen_platform.py's netns platform: the same
# nodes, ranks, rate and routing); then scripts/cluster_study_report.py: medians and spread, a CSV,
# an SVG and the table of docs/cluster.md.
#   scripts/cluster_study.sh [OUT]        (default out/cluster_study; raw JSON in OUT/raw)
# Environment: ROUNDS (3), NODES ("2 4"), RATES ("100mbit 200mbit 1gbit unlimited"), SIZES as
# bench's -b/-e/-f ("256K 16M 4"), ITERS (5; the median of the slowest rank), SMPI_BUILD
# (build-smpi; built if missing), NO_SIMGRID=1 to skip the model.
# Needs root and network namespaces (scripts/cluster.sh can); builds build/moetrain if missing.
set -euo pipefail
source "$(dirname "$0")/cluster_lib.sh" cluster_study "${1:-}"  # root, out, bin, cluster
ROUNDS="${ROUNDS:-3}"; NODES="${NODES:-2 4}"; RATES="${RATES:-100mbit 200mbit 1gbit unlimited}"
read -r BMIN BMAX BFAC <<< "${SIZES:-256K 16M 4}"
ITERS="${ITERS:-5}"; RPN=2
SMPI_BUILD="${SMPI_BUILD:-$root/build-smpi}"
mkdir -p "$out/raw"
live=""
trap 'for c in $live; do "$cluster" down --name "$c" >/dev/null 2>&1 || true; done' EXIT

bench=(bench a2a -b "$BMIN" -e "$BMAX" -f "$BFAC" --iters "$ITERS" --warmup 2 --json)
for ((r = 1; r <= ROUNDS; r++)); do
  for n in $NODES; do
    for rate in $RATES; do
      f="$out/raw/r$r-n$n-$rate.json"
      [ -s "$f" ] && continue   # resumable
      name="cs$$"; name="${name:0:8}"
      rate_args=(); [ "$rate" = unlimited ] || rate_args=(--rate "$rate")
      "$cluster" up "$n" "$RPN" --name "$name" "${rate_args[@]}" >/dev/null
      live="$name"
      t0=$SECONDS
      "$cluster" run --name "$name" -- "$bin" "${bench[@]}" > "$f.part" 2> "$out/raw/r$r-n$n-$rate.log"
      mv "$f.part" "$f"
      "$cluster" down --name "$name" >/dev/null
      live=""
      echo "cluster_study: round $r, $n nodes x $RPN, $rate: $((SECONDS - t0)) s"
    done
  done
done

if [ "${NO_SIMGRID:-0}" != 1 ]; then
  if [ ! -x "$SMPI_BUILD/moetrain_smpi_a2a" ]; then
    cmake -S "$root" -B "$SMPI_BUILD" -DMOETRAIN_SMPI=ON >/dev/null
    cmake --build "$SMPI_BUILD" --target moetrain_smpi_a2a -j"$(nproc)" >/dev/null
  fi
  cfg=(--cfg=smpi/simulate-computation:no --cfg=smpi/send-is-detached-thresh:0 --cfg=smpi/bw-factor:0:1
       --cfg=smpi/lat-factor:0:1 --cfg=maxmin/precision:1e-4 --cfg=contexts/stack-size:128)
  for n in $NODES; do
    for rate in $RATES; do
      [ "$rate" = unlimited ] && continue   # no link to model: the CPUs set that time
      f="$out/raw/simgrid-n$n-$rate.json"
      [ -s "$f" ] && continue
      bps=$(python3 -c "import re,sys;m=re.fullmatch(r'(\d+)(bit|kbit|mbit|gbit)',sys.argv[1]);print(int(m[1])*{'bit':1,'kbit':1e3,'mbit':1e6,'gbit':1e9}[m[2]])" "$rate")
      python3 "$root/platforms/gen_platform.py" netns "$n" "$out/raw/netns-n$n-$rate.xml" "$bps" "$RPN"
      (cd "$out/raw" && smpirun -np $((n * RPN)) -platform "netns-n$n-$rate.xml" -hostfile "netns-n$n-$rate.hosts" \
         "${cfg[@]}" "$SMPI_BUILD/moetrain_smpi_a2a" --topo.ranks-per-node "$RPN" -b "$BMIN" -e "$BMAX" \
         -f "$BFAC" --iters 1 --warmup 0 --json 2> "simgrid-n$n-$rate.log" | sed -n '/^{/,/^}/p' > "$f.part")
      mv "$f.part" "$f"
      echo "cluster_study: SimGrid $n nodes, $rate"
    done
  done
fi
python3 "$root/scripts/cluster_study_report.py" "$out"
