#!/usr/bin/env bash
# Runs that meet each other or a stalled machine (issue 15, classes 3, 4, 6, 7), end to end:
#  1. two concurrent runs on one folder: the second is refused naming the first (pid), the first
#     finishes with all its results; the same through --checkpoint.dir; a kill -9'd holder leaves
#     no stale lock;
#  2. a refused run leaves an earlier run's metrics.jsonl byte for byte; a fresh run keeps it as
#     metrics.jsonl.prev;
#  3. a FIFO as --data is refused at once (it would block in open);
#  4. a run whose every step is skipped exits non-zero; an Inf weight is never checkpointed;
#  5. export into a folder of an earlier export (other shard count) leaves no stale weight files;
#  6. kill -STOP on one of 4 ranks with --comm.timeout 10: the job ends within the timeout, naming
#     a waiting rank, the operation and its group;
#  7. SIGTERM on one rank of 4: every rank stops after the step, checkpoints, exit 0.
# Usage: run_guards.sh MOETRAIN CORPUS [MPIRUN]
set -uo pipefail
bin="$1"
corpus="$2"
MPIRUN="${3:-mpirun}"
source "$(dirname "$0")/lib.sh"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
mpi=("$MPIRUN" "${MPIRUN_FLAGS[@]}")  # an array, not lib.sh's function: $! is mpirun itself
common=(train --preset test-moe4 --seq-len 32 --batch 4 --eval-every 0 --eval-batches 1 --quiet --data "$corpus")
lines() { [ -f "$1" ] && wc -l <"$1" || echo 0; }
# rank_pid MPIRUN_PID RANK: the pid of that rank (a child of mpirun, by its OMPI_COMM_WORLD_RANK).
rank_pid() {
  local p
  for p in $(pgrep -P "$1"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then echo "$p"; return; fi
  done
}
wait_lines() {  # wait_lines FILE N PID: until FILE has N lines or PID ends (60 s at most)
  local t=0
  while [ "$(lines "$1")" -lt "$2" ] && kill -0 "$3" 2>/dev/null && [ "$t" -lt 600 ]; do sleep 0.1; t=$((t + 1)); done
}

# 1. Two runs on one folder (the first runs until SIGTERM: it must still be running for the test).
a="$work/a"
"$bin" "${common[@]}" --steps 100000 --checkpoint.every 20 --out "$a" 2>"$work/a.log" &
pid_a=$!
wait_lines "$a/metrics.jsonl" 1 "$pid_a"
err="$("$bin" "${common[@]}" --steps 2 --out "$a" 2>&1 >/dev/null)"
rc=$?
[ "$rc" -ne 0 ] && echo "$err" | grep -q "a: --out is in use by another moetrain run (pid $pid_a on " \
  && ok "second run on the same --out refused naming the holder" || bad "second run on --out: rc=$rc $err"
err="$("$bin" "${common[@]}" --steps 2 --out "$work/b" --checkpoint.dir "$a/checkpoints" 2>&1 >/dev/null)"
rc=$?
[ "$rc" -ne 0 ] && echo "$err" | grep -q "checkpoints: --checkpoint.dir is in use by another moetrain run (pid $pid_a " \
  && ok "second run on the same --checkpoint.dir refused" || bad "second run on --checkpoint.dir: rc=$rc $err"
kill -TERM "$pid_a"
wait "$pid_a"
rc=$?
n_a=$(lines "$a/metrics.jsonl")
[ "$rc" -eq 0 ] && [ "$n_a" -gt 0 ] && [ -f "$a/checkpoints/step-$n_a/manifest.json" ] \
  && [ "$(sed -n "${n_a}p" "$a/metrics.jsonl" | grep -c "\"step\":$n_a,")" -eq 1 ] \
  && ok "the first run kept all its $n_a metrics lines (steps 1..$n_a) and its checkpoint step-$n_a" \
  || bad "first run: rc=$rc, $n_a metrics lines; $(cat "$work/a.log")"
# A holder killed with -9 leaves its lock file but no lock.
"$bin" "${common[@]}" --steps 400 --out "$work/k" 2>/dev/null &
pid_k=$!
wait_lines "$work/k/metrics.jsonl" 1 "$pid_k"
kill -9 "$pid_k"
wait "$pid_k" 2>/dev/null
"$bin" "${common[@]}" --steps 2 --out "$work/k" 2>"$work/k.log" && [ -f "$work/k/.moetrain.lock" ] \
  && ok "after kill -9 of the holder, the next run takes the folder (no stale lock)" || bad "stale lock: $(cat "$work/k.log")"

# 2. Refused runs do not touch an earlier run's metrics; a fresh run keeps them as .prev.
sum=$(md5sum <"$a/metrics.jsonl")
"$bin" "${common[@]}" --steps 2 --lr nan --out "$a" 2>/dev/null
"$bin" "${common[@]}" --steps 2 --batch 100000 --seq-len 128 --out "$a" 2>/dev/null
"$bin" "${common[@]}" --steps 2 --data "$work/missing.txt" --out "$a" 2>/dev/null
[ "$(md5sum <"$a/metrics.jsonl")" = "$sum" ] && ok "three refused runs left the earlier metrics.jsonl byte for byte" \
  || bad "a refused run changed metrics.jsonl"
"$bin" "${common[@]}" --steps 3 --out "$a" 2>/dev/null
[ "$(md5sum <"$a/metrics.jsonl.prev")" = "$sum" ] && [ "$(lines "$a/metrics.jsonl")" -eq 3 ] \
  && ok "a fresh run in the folder kept the earlier metrics as metrics.jsonl.prev" || bad "metrics rotation"

# 3. A FIFO as --data: refused at once, not blocked in open().
# "At once" is against the same binary's ordinary refusal (a missing --data file) timed just
# before: the start-up cost (MPI, ASan) is not the FIFO's, and varies with the machine's load.
t0=$(date +%s%N)
timeout 20 "$bin" "${common[@]}" --steps 2 --data "$work/no-such-file" --out "$work/f0" >/dev/null 2>&1
base_ms=$((($(date +%s%N) - t0) / 1000000))
mkfifo "$work/fifo"
t0=$(date +%s%N)
err="$(timeout 20 "$bin" "${common[@]}" --steps 2 --data "$work/fifo" --out "$work/f" 2>&1 >/dev/null)"
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$ms" -lt $((base_ms + 5000)) ] && echo "$err" | grep -q "fifo: --data must be a regular file, this is a FIFO" \
  && ok "FIFO as --data refused in $ms ms (a missing file: $base_ms ms)" || bad "FIFO as --data: rc=$rc after $ms ms (a missing file: $base_ms ms): $err"

# 4. Non-finite runs never end in success.
err="$("$bin" "${common[@]}" --steps 3 --fault.nan-steps 1,2,3 --out "$work/n1" 2>&1 >/dev/null)"
rc=$?
[ "$rc" -ne 0 ] && echo "$err" | grep -q "every step of this run was skipped (3 non-finite" && [ ! -e "$work/n1/model.safetensors" ] \
  && ok "a run whose every step was skipped exits $rc, no weights" || bad "all steps skipped: rc=$rc $err"
err="$("$bin" "${common[@]}" --steps 6 --checkpoint.every 2 --fault.inf-weight-steps 4 --out "$work/n2" 2>&1 >/dev/null)"
rc=$?
[ "$rc" -ne 0 ] && echo "$err" | grep -q "step 4: weights or AdamW state not finite after the update: no checkpoint written; the last good one is .*step-2" \
  && echo "$err" | grep -q "the final weights are not finite" && [ ! -e "$work/n2/checkpoints/step-4" ] \
  && [ ! -e "$work/n2/checkpoints/step-6" ] && [ ! -e "$work/n2/model.safetensors" ] \
  && ok "an Inf weight is never checkpointed nor exported as final weights" || bad "Inf weight: rc=$rc $err"

# 5. Export into the folder of an earlier export with another shard count: no stale files.
ck="$a/checkpoints/step-$n_a"
"$bin" export "$ck" "$work/hf" --shard-mb 0.05 >/dev/null && n_sharded=$(ls "$work/hf" | grep -c '^model-.*\.safetensors$')
"$bin" export "$ck" "$work/hf" >/dev/null
left="$(ls "$work/hf" | grep -v '^\.moetrain\.lock$' | tr '\n' ' ')"
[ "${n_sharded:-0}" -gt 1 ] && [ "$left" = "config.json model.safetensors " ] \
  && ok "export over a $n_sharded-shard export leaves only config.json model.safetensors" || bad "export stale files: $left"
"$bin" export "$ck" "$work/hf" --shard-mb 0.05 >/dev/null
[ ! -e "$work/hf/model.safetensors" ] && [ -f "$work/hf/model.safetensors.index.json" ] \
  && ok "and the sharded export over a single-file one removes model.safetensors" || bad "export stale single file"

# 6. A stopped rank ends the job within --comm.timeout, naming a waiting rank, the op and the group
# (a collective names the group's world ranks, a receive its peer, a wait-all its peers), and the
# stopped rank itself: the only one whose heartbeat stopped.
"${mpi[@]}" -np 4 "$bin" "${common[@]}" --steps 100000 --ep 2 --pp 2 --micro-batches 2 --comm.timeout 10 --out "$work/stall" \
  >"$work/stall.log" 2>&1 &
mp=$!
wait_lines "$work/stall/metrics.jsonl" 2 "$mp"
victim="$(rank_pid "$mp" 2)"
if [ -z "$victim" ]; then
  bad "stopped rank: no rank 2 found under mpirun $mp (the job ended first?): $(tail -3 "$work/stall.log")"
  kill "$mp" 2>/dev/null
else
  kill -STOP "$victim"
  t0=$SECONDS
  wait "$mp"
  rc=$?
  dt=$((SECONDS - t0))
  kill -CONT "$victim" 2>/dev/null
  [ "$rc" -ne 0 ] && [ "$dt" -le 30 ] && grep -q "moetrain: error (rank [0-9] of 4, pid [0-9]* on .*): no progress for 1[0-9].[0-9] s in MPI_.* on group rank [0-9] of [0-9].* (--comm.timeout 10): a peer is stalled or has died; no heartbeat from world rank(s) 2 for [0-9.]* s (cut off, stopped or dead); ending the job" "$work/stall.log" \
    && ! grep -q "(rank 2 of 4" "$work/stall.log" \
    && ok "kill -STOP on rank 2 of 4: job ended $dt s later (--comm.timeout 10), rc=$rc: $(grep -m1 'no progress' "$work/stall.log" | cut -c1-150)" \
    || bad "stopped rank: rc=$rc after $dt s; $(cat "$work/stall.log")"
fi

# 7. SIGTERM on one rank of 4: all stop after the step, checkpoint, exit 0.
"${mpi[@]}" -np 4 "$bin" "${common[@]}" --steps 100000 --ep 2 --pp 2 --micro-batches 2 --out "$work/term" >"$work/term.log" 2>&1 &
mp=$!
wait_lines "$work/term/metrics.jsonl" 2 "$mp"
victim="$(rank_pid "$mp" 3)"
[ -n "$victim" ] && kill -TERM "$victim" || { bad "SIGTERM: no rank 3 found under mpirun $mp"; kill "$mp"; }
t0=$SECONDS
wait "$mp"
rc=$?
dt=$((SECONDS - t0))
last=$(ls "$work/term/checkpoints" 2>/dev/null | grep '^step-[0-9]*$' | sort -t- -k2 -n | tail -1)
[ "$rc" -eq 0 ] && [ "$dt" -le 15 ] && [ -n "$last" ] && grep -q "stopping on request after step" "$work/term.log" \
  && ok "SIGTERM on rank 3 of 4: every rank stopped in $dt s with checkpoint $last, exit 0" \
  || bad "SIGTERM on one rank: rc=$rc after $dt s, checkpoint '$last'; $(cat "$work/term.log")"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
