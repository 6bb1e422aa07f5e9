#!/usr/bin/env bash
# moetrain train --time-budget: the step count is chosen once, after the warm-up, from the median
# warm-up step (the choice is in the metrics line of that step, and the count follows from its
# figures); the run then has exactly that many steps, and its learning rates are the cosine
# schedule of that count. `--steps N` with the chosen N repeats the run loss for loss. A resume
# from a checkpoint written after the choice keeps the count whatever budget it is given (and
# repeats the losses); one from a fixed-step run's checkpoint past the warm-up is refused.
# Usage: time_budget.sh MOETRAIN CORPUS WORK
set -euo pipefail
bin="$1"; corpus="$2"; work="$3"
rm -rf "$work"; mkdir -p "$work"
source "$(dirname "$0")/lib.sh"
common=(train --preset test-moe --seq-len 32 --batch 4 --eval-every 0 --warmup 6 --data "$corpus")
run() {  # run NAME ARGS...: a training run that must succeed, its stderr in NAME.log
  local name="$1"; shift
  "$bin" "${common[@]}" --out "$work/$name" "$@" 2>"$work/$name.log" || { cat "$work/$name.log" >&2; exit 1; }
}
# At most 400 steps, so a fast machine runs no longer than it must.
run budget --time-budget 0.3 --steps 400
n=$(/usr/bin/python3 -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "time_budget" in r: print(r["time_budget"]["steps"])' "$work/budget/metrics.jsonl")
grep -q "steps to fill a 0.3s time budget (at most 400)" "$work/budget.log" ||
  { cat "$work/budget.log"; echo "the first line does not state the budget"; exit 1; }
grep -q -- "--time-budget 0.3s: $n steps (median step" "$work/budget.log" ||
  { cat "$work/budget.log"; echo "no line states the choice"; exit 1; }
grep -q "^done: $n steps in .* (training steps .* of the 0.3s budget)" "$work/budget.log" ||
  { cat "$work/budget.log"; echo "the last line does not state the budget"; exit 1; }
run fixed --steps "$n"
# `moetrain report` states the choice in its summary; a malformed choice is refused by name.
"$bin" report "$work/budget" -o "$work/budget.html" >/dev/null
grep -q "time budget</td><td>300.0 ms: $n steps, chosen after step 7 from a median warm-up step of" "$work/budget.html" ||
  { echo "the report does not state the time budget"; exit 1; }
mkdir -p "$work/badreport"
sed 's/"time_budget":{[^}]*}/"time_budget":"soon"/' "$work/budget/metrics.jsonl" > "$work/badreport/metrics.jsonl"
if "$bin" report "$work/badreport" -o "$work/bad.html" 2>"$work/badreport.log"; then
  echo "report accepted a malformed time_budget"; exit 1
fi
grep -q '"time_budget" must be an object' "$work/badreport.log" || { cat "$work/badreport.log"; exit 1; }
/usr/bin/python3 - "$work" "$n" <<'PY'
import json, math, sys
work, n = sys.argv[1], int(sys.argv[2])
def recs(name):
    return [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl") if '"step_time_s"' in l]
a, b = recs("budget"), recs("fixed")
chosen = [r for r in a if "time_budget" in r]
assert len(chosen) == 1 and chosen[0]["step"] == 7, [r["step"] for r in chosen]  # after warm-up step 6 (0-based)
tb = chosen[0]["time_budget"]
assert tb["budget_s"] == 0.3 and tb["timed_steps"] == 5, tb  # steps 3..7 of this process
# The figure is the median of those five steps' own logged times (not the largest, not the mean).
timed = sorted(r["step_time_s"] for r in a[2:7])
assert tb["step_time_s"] == timed[2], (tb["step_time_s"], timed)
assert tb["steps"] == min(400, 7 + math.floor(max(0.0, 0.3 - tb["spent_s"]) / tb["step_time_s"])), tb
assert abs(tb["spent_s"] - sum(r["step_time_s"] for r in a[:7])) <= 1e-6, tb  # one rank: its own clock
assert len(a) == n == tb["steps"], (len(a), n)
lr, min_lr, warm = 3e-3, 3e-4, 6
for s, r in enumerate(a):
    p = min(1.0, max(0.0, (s - warm) / max(1, n - warm)))
    want = lr * (s + 1) / warm if s < warm else min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * p))
    assert abs(r["lr"] - want) <= 1e-9 + 1e-6 * want, (s, r["lr"], want)
assert [r["loss"] for r in a] == [r["loss"] for r in b], "--steps N does not repeat the budgeted run"
assert all("time_budget" not in r for r in b)
print(f"chose {n} steps: median {tb['step_time_s']:.4f} s, spent {tb['spent_s']:.3f} s")
PY
# Resumed after the choice with another budget: the count stays, the losses repeat. The run that
# writes the checkpoint has a budget far above its --steps 20, so on any machine it chooses 20 and
# writes step-10 after the choice (step 7).
run capped --time-budget 60 --steps 20 --checkpoint.every 10 --checkpoint.keep 0
grep -q -- "--time-budget 1m00s: 20 steps (median step" "$work/capped.log" ||
  { cat "$work/capped.log"; echo "--steps 20 did not cap the choice"; exit 1; }
run resumed --time-budget 100 --resume "$work/capped/checkpoints/step-10"
grep -q "keeping the 20 steps the checkpoint's run chose" "$work/resumed.log" ||
  { cat "$work/resumed.log"; echo "the resume does not keep the count"; exit 1; }
/usr/bin/python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def recs(name):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{work}/{name}/metrics.jsonl")) if "step_time_s" in r}
a, c = recs("capped"), recs("resumed")
assert sorted(c) == [s for s in sorted(a) if s > 10], sorted(c)[:3]
assert all(c[s] == a[s] for s in c), "the resumed run's losses differ"
PY
# Two ranks (EP 2) choose one count together (the slowest rank's median): a disagreement would
# leave one rank waiting in a collective, which --comm.timeout ends.
mpi 2 "$bin" "${common[@]}" --ep 2 --time-budget 0.3 --steps 400 \
  --comm.timeout 60 --out "$work/ep2" 2>"$work/ep2.log" || { cat "$work/ep2.log" >&2; exit 1; }
/usr/bin/python3 - "$work" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(f"{sys.argv[1]}/ep2/metrics.jsonl") if '"step_time_s"' in l]
chosen = [r["time_budget"]["steps"] for r in recs if "time_budget" in r]
assert len(chosen) == 1 and len(recs) == chosen[0], (chosen, len(recs))
print(f"EP 2: chose {chosen[0]} steps")
PY
# A fixed-step run's checkpoint past the warm-up: nothing chose a count to keep.
if "$bin" "${common[@]}" --out "$work/refused" --time-budget 10 --resume "$work/fixed/checkpoints/step-$n" \
     2>"$work/refused.log"; then
  echo "resuming a fixed-step checkpoint with --time-budget was accepted"; exit 1
fi
grep -q "past the 6 warm-up steps whose time chooses the step count, and its run did not use --time-budget: resume it with --steps" \
  "$work/refused.log" || { cat "$work/refused.log"; exit 1; }
[ ! -e "$work/refused/model.safetensors" ] || { echo "the refused run wrote weights"; exit 1; }
echo "1 passed, 0 failed"
