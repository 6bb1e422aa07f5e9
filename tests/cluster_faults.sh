#!/usr/bin/env bash
# Network faults on a real cluster of namespaces (issue 39, item 7): EP 4 training (every exchange
# crosses the nodes) on
# 2 nodes x 2 ranks (scripts/cluster.sh), --comm.timeout 5, a checkpoint every 10 steps, against
# the same run left alone (the reference: its final weights).
#   cut    node 1's uplink cut mid-run: every rank ends within --comm.timeout + 10 s; the lines name
#          the stalled operation and the ranks not heard from (2,3 seen from node 0); the link
#          back, --resume latest on a fresh cluster ends with the reference's weights, bit for bit
#   kill   every rank of node 1 killed (kill -9): the job ends, the launcher names them; the
#          checkpoints already written resume to the reference's weights, bit for bit
#   slow   node 1's uplink down to 10 Mbit/s mid-run: the run finishes (exit 0) with the
#          reference's weights (the bits do not depend on the network), and every rank's exchange
#          time (a2a_rank_s, the report's per-rank table) shows the slow link: an all-to-all is
#          paced by its slowest link, so with two nodes every rank waits on it alike
#   flap   node 1's uplink down 2 s then up, within --comm.timeout 10: the run finishes with the
#          reference's weights, and the long wait is logged with its end
# Each case prints its figures. Exits 77 (SKIPPED) where namespaces cannot be made.
# Usage: tests/cluster_faults.sh MOETRAIN [SOURCE_DIR] [CASE...]   (default: all four)
set -euo pipefail
MOETRAIN=$(realpath "${1:?usage: tests/cluster_faults.sh MOETRAIN [SOURCE_DIR] [CASE...]}")
SRC=$(realpath "${2:-$(dirname "$0")/..}")
shift; [ $# -gt 0 ] && shift
cases=("$@"); [ ${#cases[@]} -gt 0 ] || cases=(cut kill slow flap)
CLUSTER="$SRC/scripts/cluster.sh"
if ! why=$("$CLUSTER" can); then echo "SKIPPED: cannot make network namespaces here (${why#no: })"; exit 77; fi
command -v mpirun >/dev/null || { echo "SKIPPED: no mpirun (openmpi-bin)"; exit 77; }

work=$(mktemp -d)
C="f$$"; C=${C:0:8}
trap '"$CLUSTER" down --name "$C" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
STEPS=200
train=(train --preset test-moe --ep 4 --batch 2 --seq-len 32 --eval-every 0 --quiet --lr 3e-3 --warmup 5
       --steps "$STEPS" --checkpoint.every 10)
up() { "$CLUSTER" down --name "$C" >/dev/null 2>&1 || true; "$CLUSTER" up 2 2 --name "$C" "$@" >/dev/null; }
run() { "$CLUSTER" run --name "$C" -- "$MOETRAIN" "${train[@]}" "$@"; }
lines() { local n=0; [ -f "$1" ] && n=$(grep -c '"step_time_s"' "$1" || true); echo "${n:-0}"; }
# World-rank processes of node I (moetrain inside its namespace).
node_ranks() { for p in $(ip netns pids "moetrain-$C-n$1" 2>/dev/null); do
                 [ "$(cat /proc/"$p"/comm 2>/dev/null)" = moetrain ] && echo "$p"; done; true; }
ranks_left() { { node_ranks 0; node_ranks 1; } | wc -l; }
# Waits (bounded) until the run at $1 has logged $2 steps; fails if its mpirun ($3) ended first.
wait_steps() {
  local t=0
  while [ "$(lines "$1/metrics.jsonl")" -lt "$2" ]; do
    kill -0 "$3" 2>/dev/null || fail "the run ended before step $2: $(tail -3 "$1.log")"
    sleep 0.2; t=$((t + 1)); [ "$t" -lt 600 ] || fail "no step $2 within 120 s"
  done
}
same_weights() { cmp -s "$1/model.safetensors" "$work/ref/model.safetensors"; }

up
t0=$SECONDS
run --out "$work/ref" > "$work/ref.log" 2>&1 || { cat "$work/ref.log"; fail "the reference run"; }
echo "reference: $STEPS steps of EP 4 on 2 nodes x 2 ranks in $((SECONDS - t0)) s"

for c in "${cases[@]}"; do
  case "$c" in
    cut|kill)
      up
      run --comm.timeout 5 --out "$work/$c" > "$work/$c.log" 2>&1 &
      mp=$!
      wait_steps "$work/$c" 25 "$mp"
      t0=$(date +%s.%N)
      if [ "$c" = cut ]; then
        "$CLUSTER" link --name "$C" 1 down 2>/dev/null
      else
        victims=$(node_ranks 1); [ -n "$victims" ] || fail "no rank found on node 1"
        kill -9 $victims
      fi
      # Every rank gone (cut: mpirun itself waits on, for the cut-off node's daemon; kill: it ends).
      while [ "$(ranks_left)" -gt 0 ]; do
        sleep 0.1
        [ "$(echo "$(date +%s.%N) - $t0 > 40" | bc)" = 1 ] && fail "$c: ranks still alive after 40 s: $(ranks_left)"
      done
      dt=$(echo "$(date +%s.%N) - $t0" | bc)
      if [ "$c" = kill ]; then
        for _ in $(seq 100); do kill -0 "$mp" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$mp" 2>/dev/null && fail "kill: mpirun still running 10 s after its ranks ended"
        grep -E "exited on signal 9|killed" "$work/$c.log" | head -2
        grep -qE "rank [23] with PID [0-9]+ on node n1 exited on signal 9" "$work/$c.log" ||
          fail "kill: the launcher does not name rank 2 or 3 on n1: $(tail -5 "$work/$c.log")"
      else
        sleep 1  # the lines that crossed before the cut
        grep -m2 "no progress" "$work/$c.log" || true
        grep -qE "no progress for [0-9.]+ s in MPI_[A-Za-z]+.*no heartbeat from world rank\(s\) 2,3 " "$work/$c.log" ||
          fail "cut: no line names the stalled operation and ranks 2,3: $(tail -5 "$work/$c.log")"
        [ "$(echo "$dt <= 15" | bc)" = 1 ] || fail "cut: ranks ended $dt s after the cut (limit: --comm.timeout 5 + 10 s)"
        "$CLUSTER" link --name "$C" 1 up 2>/dev/null
      fi
      last=$(ls "$work/$c/checkpoints" | sort -t- -k2 -n | tail -1)
      [ -n "$last" ] || fail "$c: no checkpoint in $work/$c: $(ls -la "$work/$c" "$work/$c/checkpoints" 2>&1 | tr "\n" " ")"
      echo "$c: every rank ended ${dt:0:5} s after the fault; last checkpoint $last"
      kill "$mp" 2>/dev/null || true
      up  # a fresh cluster (the old mpirun and daemons go with the old one)
      wait "$mp" 2>/dev/null || true
      run --resume latest --out "$work/$c" > "$work/$c.resume.log" 2>&1 ||
        { cat "$work/$c.resume.log"; fail "$c: --resume latest"; }
      same_weights "$work/$c" || fail "$c: resumed from $last, the final weights differ from the reference"
      echo "$c: resumed from $last to step $STEPS: final weights bit-identical to the reference"
      ;;
    slow|flap)
      up
      timeout=5; [ "$c" = flap ] && timeout=10
      t0=$SECONDS
      run --comm.timeout "$timeout" --out "$work/$c" > "$work/$c.log" 2>&1 &
      mp=$!
      wait_steps "$work/$c" 30 "$mp"
      if [ "$c" = slow ]; then
        "$CLUSTER" rate --name "$C" 1 10mbit 2>/dev/null
        at=$(lines "$work/$c/metrics.jsonl")
      else
        "$CLUSTER" link --name "$C" 1 down 2>/dev/null; sleep 2; "$CLUSTER" link --name "$C" 1 up 2>/dev/null
      fi
      wait "$mp" || { cat "$work/$c.log"; fail "$c: the run did not survive"; }
      same_weights "$work/$c" || fail "$c: the final weights differ from the reference"
      if [ "$c" = slow ]; then
        python3 - "$work/$c/metrics.jsonl" "$at" <<'EOF' || fail "slow: the exchange times do not show node 1"
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"step_time_s"' in l]
at = int(sys.argv[2])
before, after = recs[5:at - 1], recs[at + 1:]
def node_means(rs):
    per = [statistics.median(r["a2a_rank_s"][q] for r in rs) for q in range(4)]
    return per, statistics.median(r["step_time_s"] for r in rs)
(pb, sb), (pa, sa) = node_means(before), node_means(after)
print(f"slow: median step {sb * 1e3:.1f} ms before node 1 went to 10 Mbit/s, {sa * 1e3:.1f} ms after; "
      "exchange per rank (ms) before " + " ".join(f"{x * 1e3:.1f}" for x in pb) +
      ", after " + " ".join(f"{x * 1e3:.1f}" for x in pa))
sys.exit(0 if sa > 2 * sb and min(pa) > 2 * max(pb) else 1)
EOF
        echo "slow: finished (exit 0) in $((SECONDS - t0)) s with the reference's weights"
      else
        grep -m1 "warning (rank" "$work/$c.log" || fail "flap: the long wait is not logged"
        grep -m1 "completed after" "$work/$c.log" || fail "flap: the wait's end is not logged"
        echo "flap: link down 2 s, the run finished (exit 0) in $((SECONDS - t0)) s with the reference's weights"
      fi
      ;;
    *) fail "unknown case '$c' (cut, kill, slow, flap)";;
  esac
done
"$CLUSTER" down --name "$C" >/dev/null
"$CLUSTER" check-clean --name "$C" >/dev/null || fail "cluster $C left something"
echo "PASS: cluster_faults (${cases[*]})"
