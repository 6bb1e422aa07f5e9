#!/usr/bin/env bash
# Issue 42, classes 7 and 8 through the CLI: what the second pass left, and numbers with absurd
# ranges. Every case must exit non-zero without a signal (exit code < 128) and within its timeout,
# print exactly one line on stderr naming the file, flag or field at fault, and leave what existed
# unchanged (the run folder its --out names, an earlier export, the checkpoint it reads).
#  class 7: a file-size limit (ulimit -f) in train and export (MPI is not initialised for a lone
#     process, so nothing aborts inside MPI_Init; a write fails with EFBIG and names its file); an
#     export that fails halfway over an earlier export leaves that export as it was and no staging
#     folder; metrics.jsonl a link or a FIFO on --resume; stale PATH.tmp.<pid> files of a dead
#     writer swept at the start of train (a planted link of that name left alone);
#  class 8: every numeric train flag given NaN, inf, a negative or an absurdly large value, and a
#     checkpoint whose manifest or router bias holds one, through --resume and export (the ranges
#     are one table: train/value_ranges.cpp).
# Usage: hostile_flags.sh MOETRAIN [--markdown]
#   --markdown: print a "## Class 7" and a "## Class 8" table (| case | command | error printed |).
set -euo pipefail
bin="$1"
markdown=0
[ "${2:-}" = "--markdown" ] && markdown=1
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
export OPENBLAS_NUM_THREADS=1
# A lone process: no launcher's variables (a world of one without MPI is what is tested).
unset OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK PMIX_RANK PMIX_NAMESPACE PMI_RANK PMI_SIZE PMI_FD
py=/usr/bin/python3
pass=0
fail=0
ok() { pass=$((pass + 1)); [ "$markdown" -eq 1 ] || echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1" >&2; }
section() {
  [ "$markdown" -eq 1 ] || return 0
  printf '\n## %s\n\n%s\n\n| case | command | error printed |\n|---|---|---|\n' "$1" "$2"
}

printf 'In the beginning God created the heaven and the earth.\n%.0s' {1..3000} > "$dir/text.txt"
common=(train --preset test-moe-noaux --steps 2 --batch 2 --seq-len 16 --eval-batches 1 --quiet
        --data "$dir/text.txt")
short="train --preset test-moe-noaux --steps 2 --batch 2 --seq-len 16 --eval-batches 1 --quiet --data T/text.txt"

# snap PATH...: one line per file under PATH (name, size, checksum), to compare before and after.
# The lock file is left out: a run takes the lock (and writes its line) before it reads its inputs.
snap() { find "$@" -type f ! -name .moetrain.lock -print0 2>/dev/null | sort -z | xargs -0 -r md5sum; }

# expect NAME PATTERN PROTECT ARGS...: `moetrain ARGS` (under the shell prefix $pre, if set) fails
# with 0 < rc < 128 within 120 s, prints exactly one stderr line holding PATTERN (fixed string),
# and leaves every file under the paths in PROTECT as it was.
pre=""
expect() {
  local name="$1" pattern="$2" protect="$3"
  shift 3
  local err rc=0 lines before
  before="$(snap $protect)"
  err="$(bash -c "$pre"' exec timeout -s KILL 120 "$@"' _ "$bin" "$@" 2>&1 >/dev/null)" || rc=$?
  lines=$(printf '%s\n' "$err" | grep -c . || true)
  if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && [ "$lines" -eq 1 ] && printf '%s' "$err" | grep -qF -- "$pattern" \
     && [ "$(snap $protect)" = "$before" ]; then
    local shown="${err//$dir/T}" cmd="moetrain" a
    ok "$name: $shown"
    if [ "$markdown" -eq 1 ]; then
      for a in "$@"; do cmd+=" ${a//$dir/T}"; done
      cmd="${cmd//$short/train …}"
      [ -n "$pre" ] && cmd="$pre $cmd"
      printf '| %s | `%s` | `%s` |\n' "$name" "${cmd//|/\\|}" "${shown//|/\\|}"
    fi
  else
    bad "$name: rc=$rc lines=$lines changed=$([ "$(snap $protect)" = "$before" ] && echo no || echo yes) stderr: ${err:0:600}"
  fi
}

# A good run (test-moe-noaux: it stores a router bias) and an export of it.
"$bin" "${common[@]}" --out "$dir/run" >/dev/null
good="$dir/run/checkpoints/step-2"
[ -f "$good/manifest.json" ] || { echo "FAIL setup: no checkpoint in $good" >&2; exit 1; }
"$bin" export "$good" "$dir/hf" --shard-mb 0.02 >/dev/null
fresh() { rm -rf "${dir:?}/$1"; cp -r "$good" "$dir/$1"; }
manifest() { "$py" - "$1/manifest.json" "$2" <<'PY'
import json, sys
p = sys.argv[1]; m = json.load(open(p)); exec(sys.argv[2]); open(p, "w").write(json.dumps(m, indent=1))
PY
}

section "Class 7: left from the second pass" \
"A file-size limit, an export that fails halfway, metrics.jsonl that is not a plain file, and the
temp files of a writer that died. A lone \`moetrain\` no launcher started does not initialise MPI
(a world of one needs no PMIx), so \`ulimit -f\` no longer aborts inside \`MPI_Init\`."

pre="ulimit -f 200;"
expect "train under ulimit -f 200 (100 KB): the checkpoint write fails" \
  'failed (File too large)' "$dir/run" "${common[@]}" --out "$dir/small"
[ -z "$(find "$dir/small" -name '*.tmp*')" ] && ok "  and leaves no temp file or step-N.tmp folder" \
  || bad "ulimit train left $(find "$dir/small" -name '*.tmp*')"
pre="ulimit -f 1;"
expect "train under ulimit -f 1 (1 KB): metrics.jsonl fills up" \
  'metrics.jsonl: cannot write the record of step 1 (File too large)' "$dir/run" "${common[@]}" --steps 30 --out "$dir/small1"
pre="ulimit -f 200;"
expect "export under ulimit -f 200 over an earlier export: it stays whole" \
  'failed (File too large)' "$dir/hf $good" export "$good" "$dir/hf"
pre=""
[ -z "$(find "$dir" -maxdepth 1 -name '.hf.*')" ] && ok "  and leaves no staging folder beside it" \
  || bad "export left $(find "$dir" -maxdepth 1 -name '.hf.*')"

# An export that fails halfway: the fifth of twelve shards' names in OUT is a planted link, found
# only when that shard's turn comes (four are written by then, in the staging folder).
"$bin" export "$good" "$dir/hf2" >/dev/null
ln -s "$dir/victim" "$dir/hf2/model-00005-of-00012.safetensors"
echo "secret" > "$dir/victim"
expect "export that fails at its 5th of 12 shards, over an earlier export" \
  'model-00005-of-00012.safetensors: is a symbolic link' "$dir/hf2 $dir/victim $good" export "$good" "$dir/hf2" --shard-mb 0.02
[ "$(ls "$dir/hf2" | tr '\n' ' ')" = "config.json model-00005-of-00012.safetensors model.safetensors " ] \
  && ! ls -a "$dir" | grep -q staging && ok "  the earlier export's files as they were, no staging folder left" \
  || bad "export halfway left: $(ls -a "$dir/hf2" | tr '\n' ' ') / $(ls -a "$dir" | tr '\n' ' ')"

# SIGTERM during an export: a large shard count makes it last; the earlier export stays whole.
before="$(snap "$dir/hf")"
"$bin" export "$good" "$dir/hf" --shard-mb 0.0001 >/dev/null 2>&1 &
pid=$!
sleep 0.05
kill -TERM "$pid" 2>/dev/null || true
rc=0; wait "$pid" || rc=$?
if [ "$rc" -eq 0 ]; then
  # It finished first: the new export is whole (its config.json is last) and nothing is staged.
  [ -f "$dir/hf/config.json" ] && ! ls -a "$dir" | grep -q staging && ok "export finished before SIGTERM: whole" \
    || bad "export (finished) left $(ls -a "$dir")"
  "$bin" export "$good" "$dir/hf" --shard-mb 0.02 >/dev/null
elif [ "$rc" -eq 143 ] && [ "$(snap "$dir/hf")" = "$before" ] && ! ls -a "$dir" | grep -q staging; then
  ok "export stopped by SIGTERM: exit 143, the earlier export unchanged, no staging folder"
else
  bad "export SIGTERM: rc=$rc changed=$([ "$(snap "$dir/hf")" = "$before" ] && echo no || echo yes) $(ls -a "$dir" | tr '\n' ' ')"
fi

cp -r "$dir/run" "$dir/m1"
echo "secret" > "$dir/victim"
rm "$dir/m1/metrics.jsonl"; ln -s "$dir/victim" "$dir/m1/metrics.jsonl"
expect "metrics.jsonl a symlink on --resume" 'metrics.jsonl: is a symbolic link' "$dir/victim $dir/m1/checkpoints" \
  "${common[@]}" --steps 3 --out "$dir/m1" --resume latest
rm "$dir/m1/metrics.jsonl"; mkfifo "$dir/m1/metrics.jsonl"
expect "metrics.jsonl a FIFO on --resume" 'metrics.jsonl: is a FIFO' "$dir/m1/checkpoints" \
  "${common[@]}" --steps 3 --out "$dir/m1" --resume latest
rm "$dir/m1/metrics.jsonl"; mkdir "$dir/m1/metrics.jsonl"
expect "metrics.jsonl a folder on --resume" 'metrics.jsonl: is a directory' "$dir/m1/checkpoints" \
  "${common[@]}" --steps 3 --out "$dir/m1" --resume latest
mkfifo "$dir/fifo"
expect "--data a FIFO: refused at once, not blocked in open" 'must be a regular file, this is a FIFO' "$dir/run" \
  "${common[@]}" --data "$dir/fifo" --out "$dir/run"

# Stale temp files of a writer that died (pid 2^22 + 1 is above pid_max's default: never alive).
cp -r "$dir/run" "$dir/st"
dead=4194305
echo partial > "$dir/st/model.safetensors.tmp.$dead"
echo partial > "$dir/st/checkpoints/shard.safetensors.tmp.$dead"
ln -s "$dir/victim" "$dir/st/config.json.tmp.$dead"
echo mine > "$dir/st/notes.tmp.$$"   # a live pid (this shell): left
err="$("$bin" "${common[@]}" --out "$dir/st" 2>&1 >/dev/null)" && rc=0 || rc=$?
if [ "$rc" -eq 0 ] && [ ! -e "$dir/st/model.safetensors.tmp.$dead" ] && [ ! -e "$dir/st/checkpoints/shard.safetensors.tmp.$dead" ] \
   && [ -L "$dir/st/config.json.tmp.$dead" ] && [ "$(cat "$dir/victim")" = secret ] && [ -f "$dir/st/notes.tmp.$$" ] \
   && [ "$(printf '%s\n' "$err" | grep -c 'removed a stale temp file')" -eq 2 ]; then
  ok "stale PATH.tmp.<pid> files of a dead pid swept at the start of train (2 said), a link and a live pid's left"
  [ "$markdown" -eq 1 ] && printf '| %s | `%s` | exit 0; `%s` |\n' "stale temp files of a dead writer in --out and its checkpoints" \
    "moetrain train … --out T/st" "$(printf '%s' "$err" | grep -m1 removed | sed "s|$dir|T|g")"
else
  bad "stale temp sweep: rc=$rc $err $(ls -a "$dir/st")"
fi

# Class 9 (a thin kill made thick): one bit flipped in a shard's tensor data, not its header, the
# value still finite and the manifest untouched: only the checksum can tell (no table row).
fresh flip
"$py" - "$dir/flip/shard-00000.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; raw = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]; hdr = json.loads(raw[8:8 + n])
name = sorted(k for k in hdr if k != "__metadata__")[0]
at = 8 + n + hdr[name]["data_offsets"][0] + 4 * 3   # the lowest mantissa byte of element 3
raw[at] ^= 1
open(p, "wb").write(raw)
PY
saved_md=$markdown; markdown=0
expect "a bit flipped in a shard's tensor data (--resume)" 'checksum mismatch' "$dir/flip $dir/run" \
  "${common[@]}" --steps 4 --out "$dir/run" --resume "$dir/flip"
expect "a bit flipped in a shard's tensor data (export)" 'checksum mismatch' "$dir/flip $dir/hf" export "$dir/flip" "$dir/hf"
markdown=$saved_md

section "Class 8: numbers with absurd ranges" \
"Every numeric \`train\` flag and every number a checkpoint's manifest stores is checked against
one table of ranges (\`src/train/value_ranges.cpp\`): NaN, inf, a negative or an absurdly large
value is refused by name, on the command line and when read back. The run folder \`--out\` names
(an earlier run) is left as it was."

flag() {  # flag FLAG VALUE PATTERN
  expect "\`$1 $2\`" "$3" "$dir/run" "${common[@]}" "$1" "$2" --out "$dir/run"
}
flag --balance.bias-rate 1e30 '--balance.bias-rate must be at most 1'
flag --balance.bias-rate nan '--balance.bias-rate must be a finite number >= 0, got nan'
flag --balance.bias-rate -1 '--balance.bias-rate must be a finite number >= 0, got -1'
flag --lr 1e30 '--lr must be a number in (0, 1], got 1e+30'
flag --min-lr 5 '--min-lr must be at most 1'
flag --weight-decay 1e30 '--weight-decay must be at most 100'
flag --weight-decay inf '--weight-decay must be at most 100'
flag --grad-clip 1e30 '--grad-clip must be at most 1e+09'
flag --capacity-factor 1e30 '--capacity-factor must be at most 10000'
flag --balance.threshold 1e300 '--balance.threshold must be at most 1e+06'
flag --balance.threshold nan '--balance.threshold must be a max/mean rank load > 1'
flag --comm.timeout 1e300 '--comm.timeout must be at most 1e+09'
flag --comm.timeout inf '--comm.timeout must be at most 1e+09'
flag --peak-gflops 1e30 '--peak-gflops must be a GFLOP/s figure in (0, 1e7]'
flag --steps 2000000000 '--steps must be at most 1e+09'
flag --batch 2000000000 '--batch must be at most 1.67772e+07'
flag --seq-len 2000000000 '--seq-len must be at most 1.67772e+07'
flag --micro-batches 2000000000 '--micro-batches must be at most 1.67772e+07'
flag --warmup 2000000000 '--warmup must be at most 1e+09'
flag --eval-every 2000000000 '--eval-every must be at most 1e+09'
flag --eval-batches 2000000000 '--eval-batches must be at most 1e+06'
flag --checkpoint.every 2000000000 '--checkpoint.every must be at most 1e+09'
flag --checkpoint.keep 2000000000 '--checkpoint.keep must be at most 1e+06'
flag --max-bad-steps 2000000000 '--max-bad-steps must be at most 1e+06'
flag --balance.migrate-every 2000000000 '--balance.migrate-every must be at most 1e+09'
flag --fault.nan-steps 2000000000 '--fault.nan-steps must be at most 1e+09'
flag --vocab-size 2000000000 '--vocab-size must be in [1, 2^24]'
flag --ep 100000 '--ep must be at most 65536'
flag --topo.ranks-per-node 2000000000 '--topo.ranks-per-node must be at most 65536'
flag --pp.layers 2000000000 '--pp.layers must be at most 1.04858e+06'
flag --time-budget 1e30 '--time-budget'

gen() {  # gen FLAG VALUE PATTERN: moetrain generate on the good checkpoint
  expect "\`generate $1 $2\`" "$3" "$good" generate "$good" --prompt "In the" "$1" "$2"
}
gen --temperature 1e30 '--temperature must be at most 1000'
gen --temperature inf '--temperature must be at most 1000'
gen --top-k 2000000000 '--top-k must be at most 1.67772e+07'
gen --tokens 2000000000 '--tokens must be at most 1.67772e+07'

fresh tb
manifest "$dir/tb" 'm["time_budget_steps"] = 2000000000'
expect "manifest: a tampered time budget (time_budget_steps 2e9) on --resume" \
  'field "time_budget_steps" must be at most 1e+08' "$dir/tb $dir/run" "${common[@]}" --steps 4 --out "$dir/run" --resume "$dir/tb"
expect "manifest: a tampered time budget (time_budget_steps 2e9) on export" \
  'field "time_budget_steps" must be at most 1e+08' "$dir/tb $dir/hf" export "$dir/tb" "$dir/hf"
fresh bs
manifest "$dir/bs" 'm["bad_steps"] = 2000000000'
expect "manifest: bad_steps 2e9 on --resume" \
  'field "bad_steps" must be at most 1e+09' "$dir/bs $dir/run" "${common[@]}" --steps 4 --out "$dir/run" --resume "$dir/bs"
fresh rb
manifest "$dir/rb" 'k = next(iter(m["router_bias"])); m["router_bias"][k][0] = 1e30'
expect "manifest: a router bias of 1e30 on --resume" \
  'must be at most 10000' "$dir/rb $dir/run" "${common[@]}" --steps 4 --out "$dir/run" --resume "$dir/rb"
fresh rn
manifest "$dir/rn" 'k = next(iter(m["router_bias"])); m["router_bias"][k][0] = -1e6'
expect "manifest: a router bias of -1e6 on --resume" \
  'must be a finite number >= -10000' "$dir/rn $dir/run" "${common[@]}" --steps 4 --out "$dir/run" --resume "$dir/rn"

echo "$pass passed, $fail failed" >&2
[ "$fail" -eq 0 ]
