#!/usr/bin/env bash
# Checkpoints and faults, end to end through the CLI:
#  1. stop + resume gives the losses of an uninterrupted run bit for bit (1 and 4 ranks);
#  2. kill -9 at random moments (one rank, or the whole job; checkpoints every step so some kills
#     land mid-write), resume until done: final losses equal the uninterrupted run's, bit for bit,
#     and every checkpoint the resume accepted verified its checksums;
#  3. resharding: a checkpoint of PP2 x EP2 x DP2 continues on 1 rank, EP 2 and PP 4 (<= 1e-5);
#  4. SIGTERM finishes the step, checkpoints and exits 0;
#  5. non-finite steps are skipped and counted; too many in a row stop the run with an error and
#     leave the last good checkpoint valid;
#  6. a write that fails (file-size limit = disk full) is a clean error, the previous checkpoint
#     stays valid; an unwritable checkpoint folder is refused.
# Usage: checkpoint.sh MOETRAIN CORPUS WORKDIR
set -uo pipefail
bin="$1"
corpus="$2"
work="$3"
source "$(dirname "$0")/lib.sh"
scratch "$work"
STEPS=12
common=(train --preset test-moe4 --steps $STEPS --seq-len 32 --eval-every 0 --eval-batches 1 --quiet
        --data "$corpus" --micro-batches 2)

# 1. Uninterrupted references, then stop at step 5 and resume.
"$bin" "${common[@]}" --batch 8 --out "$work/ref1"
mpi 4 "$bin" "${common[@]}" --batch 4 --ep 2 --pp 2 --out "$work/ref4"
"$bin" "${common[@]}" --batch 8 --checkpoint.every 5 --out "$work/res1"
rm -rf "$work/res1/checkpoints/step-10" "$work/res1/checkpoints/step-12"
/usr/bin/env python3 -c "
import sys; p='$work/res1/metrics.jsonl'; l=open(p).readlines()[:5]; open(p,'w').writelines(l)"
"$bin" "${common[@]}" --batch 8 --out "$work/res1" --resume latest
compare losses "$work/res1" "$work/ref1" --keys loss --name "resume at step 5, 1 rank"
compare weights "$work/res1" "$work/ref1" --name "resume at step 5, 1 rank: final weights"

# 2. kill -9 at random moments, resume until done.
latest_step() {  # the newest complete checkpoint's step, 0 if none
  # (bash alone, no pipeline: the kill loop polls it while a run does a step every ~20 ms)
  local d best=0 n
  for d in "$1"/checkpoints/step-*; do
    n=${d##*/step-}
    [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -gt "$best" ] && best=$n
  done
  echo "$best"
}
kill_loop() {  # kill_loop NAME NP WHO ARGS...   WHO: all | rank
  local name="$1" np="$2" who="$3"
  shift 3
  local out="$work/$name" tries=0 mid_write=0
  RANDOM=7
  while :; do
    local resume=()
    [ -d "$out/checkpoints" ] && [ -n "$(ls "$out/checkpoints" | grep -v tmp)" ] && resume=(--resume latest)
    if [ "$np" -eq 1 ]; then
      "$bin" "${common[@]}" "$@" --checkpoint.every 1 --checkpoint.keep 2 --out "$out" "${resume[@]}" >"$out.log" 2>&1 &
    else
      "$MPIRUN" "${MPIRUN_FLAGS[@]}" -np "$np" "$bin" "${common[@]}" "$@" --checkpoint.every 1 \
        --checkpoint.keep 2 --out "$out" "${resume[@]}" >"$out.log" 2>&1 &
    fi
    local pid=$!
    tries=$((tries + 1))
    if [ "$tries" -le 4 ]; then
      # a random moment, chosen by progress rather than by wall time so that it lands on fast and
      # slow machines alike: wait until the newest checkpoint is a few steps past the resume point,
      # then a random fraction of a step more.
      local target=$(( $(latest_step "$out") + 2 + RANDOM % 5 ))
      local waited=0
      while kill -0 "$pid" 2>/dev/null && [ "$(latest_step "$out")" -lt "$target" ] && [ "$waited" -lt 6000 ]; do
        sleep 0.01; waited=$((waited + 1))
      done
      if [ $((tries % 2)) -eq 0 ]; then
        # every second kill aims at a checkpoint being written: as soon as a step-N.tmp folder
        # exists (busy polling; the write takes milliseconds). On a loaded machine the poll can
        # miss every write: three steps on, the kill lands anyway (so the run never ends first).
        local t_poll=$SECONDS polls=0
        while kill -0 "$pid" 2>/dev/null && ! compgen -G "$out/checkpoints/*.tmp" >/dev/null &&
              [ $((SECONDS - t_poll)) -lt 60 ]; do
          polls=$((polls + 1))
          if [ $((polls % 500)) -eq 0 ] && [ "$(latest_step "$out")" -ge $((target + 3)) ]; then break; fi
        done
      else
        sleep "0.0$((RANDOM % 10))"
      fi
      if [ "$who" = all ]; then
        pkill -9 -P "$pid" 2>/dev/null; kill -9 "$pid" 2>/dev/null
      else
        local victim
        victim=$(pgrep -P "$pid" | sed -n "$((RANDOM % np + 1))p")
        [ -n "$victim" ] && kill -9 "$victim" 2>/dev/null
      fi
    fi
    local t0=$SECONDS
    wait "$pid" 2>/dev/null
    local rc=$?
    # a kill that left a step-N.tmp folder behind landed while a checkpoint was being written
    [ "$rc" -ne 0 ] && compgen -G "$out/checkpoints/*.tmp" >/dev/null && mid_write=$((mid_write + 1))
    [ $((SECONDS - t0)) -le 30 ] || { not_ok "$name: the job took $((SECONDS - t0)) s to end after a kill"; }
    if [ "$rc" -eq 0 ] && [ -f "$out/model.safetensors" ]; then break; fi
    grep -q "checksum mismatch\|truncated\|malformed" "$out.log" && { not_ok "$name: resume met a corrupt checkpoint"; cat "$out.log"; break; }
    [ "$tries" -gt 12 ] && { not_ok "$name: did not finish"; cat "$out.log"; break; }
  done
  [ "$tries" -gt 2 ] || not_ok "$name: finished before two kills landed"
  echo "     $name: finished after $tries launches ($((tries - 1)) killed, $mid_write of them while a checkpoint was being written)"
  mid_write_total=$((mid_write_total + mid_write))
}
# (longer runs, so that four kills land before the end)
mid_write_total=0
common=("${common[@]}" --steps 80)
"$bin" "${common[@]}" --batch 8 --out "$work/ref1"
mpi 4 "$bin" "${common[@]}" --batch 4 --ep 2 --pp 2 --out "$work/ref4"
kill_loop kill-1rank 1 all --batch 8
compare losses "$work/kill-1rank" "$work/ref1" --keys loss --name "kill -9 (single process) at random moments + resume"
kill_loop kill-one-of-4 4 rank --batch 4 --ep 2 --pp 2
compare losses "$work/kill-one-of-4" "$work/ref4" --keys loss --name "kill -9 of one rank of 4 + resume"
kill_loop kill-all-4 4 all --batch 4 --ep 2 --pp 2
compare losses "$work/kill-all-4" "$work/ref4" --keys loss --name "kill -9 of the whole 4-rank job + resume"
[ "$mid_write_total" -ge 1 ] && ok "$mid_write_total kill(s) landed while a checkpoint was being written; every resume found a valid one" \
  || not_ok "no kill landed while a checkpoint was being written"
common=("${common[@]}" --steps $STEPS)

# 3. Resharding a PP2 x EP2 x DP2 checkpoint (global batch 16).
mpi 8 "$bin" "${common[@]}" --batch 4 --ep 2 --pp 2 --dp 2 --checkpoint.every 6 --checkpoint.keep 0 --out "$work/grid"
for layout in "1|1|--batch 16" "ep2|2|--batch 8 --ep 2" "pp4|4|--batch 16 --pp 4" "ep4dp2|8|--batch 2 --ep 4 --dp 2"; do
  IFS='|' read -r tag np args <<<"$layout"
  out="$work/reshard-$tag"
  mkdir -p "$out"
  head -6 "$work/grid/metrics.jsonl" >"$out/metrics.jsonl"
  # shellcheck disable=SC2086
  mpi "$np" "$bin" "${common[@]}" $args --out "$out" --resume "$work/grid/checkpoints/step-6" >/dev/null 2>&1
  compare losses "$out" "$work/grid" --keys loss --rtol 1e-5 --name "reshard PP2xEP2xDP2 -> $tag"
done

# 4. SIGTERM: finish the step, checkpoint, exit 0; the resumed run continues exactly.
"$bin" "${common[@]}" --batch 8 --steps 400 --out "$work/term" >/dev/null 2>&1 &
pid=$!
sleep 1.5
kill -TERM "$pid"
wait "$pid"
rc=$?
last=$(ls "$work/term/checkpoints" 2>/dev/null | grep -v tmp | sort -t- -k2 -n | tail -1)
[ "$rc" -eq 0 ] && [ -n "$last" ] && ok "SIGTERM: exit 0 with checkpoint $last" || not_ok "SIGTERM: rc=$rc checkpoint '$last'"

# 5. Non-finite steps.
"$bin" "${common[@]}" --batch 8 --fault.nan-steps 3 --out "$work/nan1" 2>"$work/nan1.log"
[ $? -eq 0 ] && grep -q "step 3: non-finite gradient, update skipped" "$work/nan1.log" && ok "one non-finite step skipped and counted" || not_ok "one non-finite step"
"$bin" "${common[@]}" --batch 8 --checkpoint.every 2 --fault.nan-steps 5,6,7 --max-bad-steps 3 --out "$work/nan3" 2>"$work/nan3.log"
rc=$?
[ "$rc" -ne 0 ] && grep -q "3 non-finite steps in a row (--max-bad-steps 3): stopping; the last good checkpoint is .*step-4" "$work/nan3.log" \
  && "$bin" "${common[@]}" --batch 8 --out "$work/nan3" --resume latest --steps $STEPS >/dev/null 2>&1 \
  && ok "too many non-finite steps: error, last good checkpoint resumes" || { not_ok "too many non-finite steps (rc=$rc)"; cat "$work/nan3.log"; }

# 6. A failing write (a full disk: a small tmpfs that holds one checkpoint, not two) is a clean
#    error and leaves the previous checkpoint valid.
"$bin" "${common[@]}" --batch 8 --steps 1 --out "$work/size" >/dev/null 2>&1
kb=$(du -sk "$work/size/checkpoints/step-1" | cut -f1)
mkdir -p "$work/smallfs"
if mount -t tmpfs -o size=$((kb * 3 / 2))k tmpfs "$work/smallfs" 2>/dev/null; then
  err=$("$bin" "${common[@]}" --batch 8 --checkpoint.every 4 --checkpoint.keep 2 \
        --checkpoint.dir "$work/smallfs" --out "$work/full" 2>&1 >/dev/null)
  rc=$?
  [ "$rc" -ne 0 ] && echo "$err" | grep -q "No space left on device" && [ ! -e "$work/smallfs/step-8.tmp" ] \
    && [ -f "$work/smallfs/step-4/manifest.json" ] \
    && "$bin" "${common[@]}" --batch 8 --checkpoint.dir "$work/full-ck" \
         --out "$work/full" --resume "$work/smallfs/step-4" >/dev/null 2>&1 \
    && ok "disk full: clean error ($(echo "$err" | tail -1 | cut -c1-100)...), previous checkpoint resumes" \
    || not_ok "disk full: rc=$rc err=$err"
  umount "$work/smallfs"
else
  echo "SKIP disk full: cannot mount a tmpfs here (not root?)"
fi
err=$("$bin" "${common[@]}" --batch 8 --checkpoint.dir /proc/nope --out "$work/unwritable" 2>&1 >/dev/null)
[ $? -ne 0 ] && echo "$err" | grep -q "/proc/nope" && ok "unwritable checkpoint folder: $err" || not_ok "unwritable: $err"

# 7. Damaged checkpoints are refused with an error naming the folder and what is wrong.
"$bin" "${common[@]}" --batch 8 --steps 2 --out "$work/good" >/dev/null 2>&1
ck="$work/good/checkpoints/step-2"
damaged() {  # damaged NAME PATTERN EDIT-COMMAND...
  local name="$1" pattern="$2"
  shift 2
  rm -rf "$work/dmg"; cp -r "$ck" "$work/dmg"
  "$@"
  local err
  err=$("$bin" "${common[@]}" --batch 8 --steps 4 --out "$work/dmg-out" --resume "$work/dmg" 2>&1 >/dev/null)
  if [ $? -ne 0 ] && echo "$err" | grep -q -- "$pattern" && [ "$(echo "$err" | wc -l)" -eq 1 ]; then
    ok "damaged checkpoint ($name): $err"
  else
    not_ok "damaged checkpoint ($name): $err"
  fi
}
flip() { printf '\x55' | dd of="$1" bs=1 seek="$2" conv=notrunc status=none; }
damaged "flipped byte" "shard shard-00000.safetensors checksum mismatch" flip "$work/dmg/shard-00000.safetensors" 5000
damaged "truncated shard" "truncated" truncate -s 1000 "$work/dmg/shard-00000.safetensors"
damaged "missing shard" "shard shard-00000.safetensors is missing" rm "$work/dmg/shard-00000.safetensors"
damaged "no manifest" "no manifest" rm "$work/dmg/manifest.json"
damaged "manifest not JSON" "manifest.json: not valid JSON" sh -c "echo '{broken' > '$work/dmg/manifest.json'"
damaged "other format" 'format "x"' sed -i 's/"format": "moetrain-checkpoint-1"/"format": "x"/' "$work/dmg/manifest.json"
err=$("$bin" "${common[@]}" --preset test-moe --batch 8 --steps 4 --out "$work/dmg-out" --resume "$ck" 2>&1 >/dev/null)
[ $? -ne 0 ] && echo "$err" | grep -q "checkpoint was written for a different model (num_hidden_layers = 4, this run: 3)" \
  && ok "checkpoint of another model: $err" || not_ok "checkpoint of another model: $err"
err=$("$bin" "${common[@]}" --batch 8 --out "$work/none" --resume latest 2>&1 >/dev/null)
[ $? -ne 0 ] && echo "$err" | grep -q "found no complete checkpoint" && ok "resume latest with none: $err" || not_ok "resume latest with none: $err"

finish checkpoint
