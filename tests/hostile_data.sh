#!/usr/bin/env bash
# Datasets as one unit, tokenizers with one identity, files that change under a run, and a bounded
# setup (issue 42, classes 3-6), through the CLI. Every case ends in one line naming the thing, a
# non-zero exit, no signal (exit < 128; the SIGTERM cases: 143 with a clear line, or 1 with one),
# no hang (each command under `timeout`), and leaves every file that existed before as it was
# (sha1 of each protected file compared).
#  class 3: a second tokenize onto a prefix while one runs (refused naming the first one's pid),
#     and a reader (eval) of that prefix meanwhile;
#     a tokenize that fails after training its BPE (invalid UTF-8), or with an unusable model,
#     leaves the dataset and its SentencePiece model untouched; SIGTERM/SIGINT during tokenize
#     removes every temporary file; a lock file that is one of the inputs is refused;
#  class 4: eval, generate and train --resume with another tokenizer's dataset or model (same
#     vocabulary) are refused naming both fingerprints; a sidecar whose bytes were multiplied by
#     1000, a model file swapped beside the dataset, a fingerprint of another kind are refused;
#  class 5: a .bin truncated under a running train (a clear error, a checkpoint, exit 1; not
#     SIGBUS; resumed from that checkpoint the run equals an uninterrupted one bit for bit), a .bin
#     or .idx replaced by a file of the same size, found at --resume;
#  class 6: a 1.2 MB .idx whose 100,000 sequences all point at the same 1 MB (refused at once),
#     sequences out of order, and SIGTERM during the token check of a 3 GB dataset (ends in < 1 s).
# Usage: hostile_data.sh MOETRAIN [KJV_TEXT] [--markdown]
#   --markdown: per class "## Class N: title" and a table | case | command | error printed |.
set -euo pipefail
bin="$1"
shift
root="$(cd "$(dirname "$0")/.." && pwd)"
kjv="$root/data/kjv.txt"
markdown=0
for a in "$@"; do
  if [ "$a" = "--markdown" ]; then markdown=1; else kjv="$a"; fi
done
[ -f "$kjv" ] || { echo "hostile_data: $kjv is missing (scripts/setup.sh extracts it)" >&2; exit 1; }
dir="$(mktemp -d)"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
export OPENBLAS_NUM_THREADS=1
py=/usr/bin/python3
pass=0
fail=0
ok() { pass=$((pass + 1)); [ "$markdown" -eq 1 ] || echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1" >&2; }

section() {
  [ "$markdown" -eq 1 ] || return 0
  printf '\n## %s\n\n%s\n\n| case | command | error printed |\n|---|---|---|\n' "$1" "$2"
}
# row NAME ERROR ARGS...: a table row (the temporary folder shown as T).
row() {
  local name="$1" err="$2" cmd="moetrain" a
  shift 2
  [ "$markdown" -eq 1 ] || return 0
  for a in "$@"; do cmd+=" ${a//$dir/T}"; done
  err="${err//$dir/T}"
  err="$(printf '%s' "$err" | sed -E 's/pid [0-9]+ on [^ ]+ since [0-9-]+ [0-9:]+/pid P on HOST since TIME/')"
  printf '| %s | `%s` | `%s` |\n' "$name" "${cmd//|/\\|}" "${err//|/\\|}"
}
# snap FILE...: each file's kind and sha1, to compare after a case.
snap() {
  local f
  for f in "$@"; do
    if [ -L "$f" ]; then echo "link $(readlink "$f")"; elif [ -f "$f" ]; then echo "file $(sha1sum < "$f")";
    elif [ -e "$f" ]; then echo other; else echo none; fi
  done
}
no_temps() { [ -z "$(find "$dir" -name '*.tmp.[0-9]*' -print -quit)" ]; }

# expect NAME PATTERN "PROTECTED FILES" ARGS...: moetrain ARGS (under timeout 300) fails with
# 1 <= rc < 128, prints exactly one stderr line containing PATTERN, changes none of the files.
expect() {
  local name="$1" pattern="${2//T\//$dir/}" keep="$3" before err rc=0 lines
  shift 3
  # shellcheck disable=SC2086
  before="$(snap $keep)"
  err="$(timeout 300 "$bin" "$@" 2>&1 >/dev/null)" || rc=$?
  lines=$(printf '%s\n' "$err" | grep -c . || true)
  if [ "$rc" -ne 0 ] && [ "$rc" -lt 124 ] && [ "$lines" -eq 1 ] && printf '%s' "$err" | grep -qF -- "$pattern"; then
    # shellcheck disable=SC2086
    if [ "$(snap $keep)" != "$before" ]; then
      bad "$name: a protected file changed ($keep)"
    elif ! no_temps; then
      bad "$name: a temporary file was left: $(find "$dir" -name '*.tmp.[0-9]*')"
    else
      ok "$name: ${err//$dir/T}"
      row "$name" "$err" "$@"
    fi
  else
    bad "$name: rc=$rc lines=$lines stderr: ${err:0:600}"
  fi
}

ds_files() { echo "$1.bin $1.idx $1.tokenizer.json $1.model"; }
train_common=(train --preset test-dense --batch 2 --seq-len 32 --eval-batches 1 --eval-every 0 --quiet)

# The data: the first 400 KB of the KJV (a BPE of vocabulary 400 on it, dataset A) and the next
# 400 KB (another BPE of the same vocabulary, dataset B).
head -c 400000 "$kjv" > "$dir/a.txt"
head -c 800000 "$kjv" | tail -c 400000 > "$dir/b.txt"
"$bin" tokenize --input "$dir/a.txt" --output "$dir/A" --tokenizer bpe:400 --quiet
"$bin" tokenize --input "$dir/b.txt" --output "$dir/B" --tokenizer bpe:400 --quiet
"$bin" "${train_common[@]}" --data "$dir/A" --vocab-size 400 --steps 3 --out "$dir/runA"

# --- class 3 ------------------------------------------------------------------------------------
section "Class 3: A dataset is one unit" \
  "\`tokenize\` writes .bin, .idx, the tokenizer model and its sidecar under temporary names and \
publishes them together after success; a second writer is refused naming the first; a signal removes \
the temporary files. Each case checks the existing dataset C (a BPE: .bin, .idx, .model, sidecar) byte \
for byte."

# C: a copy of dataset A. A slow tokenize (a BPE of 4000 pieces on the whole KJV, seconds) onto
# C's prefix; while it runs, a second one onto the same prefix is refused naming its pid; then
# SIGTERM stops it.
for f in bin idx model tokenizer.json; do cp "$dir/A.$f" "$dir/C.$f"; done
sed -i 's/A\.model/C.model/' "$dir/C.tokenizer.json"
A_files="$(ds_files "$dir/C")"
# shellcheck disable=SC2086
A_before="$(snap $A_files)"
"$bin" tokenize --input "$kjv" --output "$dir/C" --tokenizer bpe:4000 --quiet 2> "$dir/slow.err" &
slow=$!
pids+=("$slow")
for _ in $(seq 100); do
  grep -q "pid $slow " "$dir/C.lock" 2>/dev/null && break
  sleep 0.05
done
expect "second tokenize onto a prefix being written" "--output is in use by another moetrain run (pid $slow " \
  "$A_files" tokenize --input "$dir/b.txt" --output "$dir/C" --tokenizer bytes --quiet
expect "eval on a dataset while tokenize writes it" "T/C: the dataset is being written (pid $slow " "$A_files" \
  eval "$dir/runA" --data "$dir/C" --seq-len 32 --batch 2 --eval-batches 1
kill -TERM "$slow"
rc=0
wait "$slow" || rc=$?
err="$(cat "$dir/slow.err")"
# shellcheck disable=SC2086
if [ "$rc" -eq 143 ] && [ "$(printf '%s\n' "$err" | grep -c .)" -eq 1 ] && no_temps &&
   [ "$(snap $A_files)" = "$A_before" ]; then
  ok "SIGTERM during tokenize: rc 143, $err"
  row "SIGTERM during tokenize (exit 143)" "$err" tokenize --input kjv.txt --output "$dir/C" --tokenizer bpe:4000
else
  bad "SIGTERM during tokenize: rc=$rc stderr=$err temps=$(find "$dir" -name '*.tmp.[0-9]*')"
fi

# SIGINT while the .bin is being written (a bytes tokenize of 40 MB of text).
for _ in $(seq 10); do cat "$kjv"; done > "$dir/big.txt"
"$bin" tokenize --input "$dir/big.txt" --output "$dir/C" --tokenizer bytes --docs line --quiet 2> "$dir/int.err" &
slow=$!
pids+=("$slow")
for _ in $(seq 200); do
  [ -n "$(find "$dir" -name 'C.bin.tmp.*' -print -quit)" ] && break
  sleep 0.02
done
kill -INT "$slow"
rc=0
wait "$slow" || rc=$?
err="$(cat "$dir/int.err")"
# shellcheck disable=SC2086
if [ "$rc" -eq 130 ] && no_temps && [ "$(snap $A_files)" = "$A_before" ]; then
  ok "SIGINT while the .bin is written: rc 130, $err"
  row "SIGINT while PREFIX.bin.tmp is written (exit 130)" "$err" tokenize --input big.txt --output "$dir/C" --tokenizer bytes
else
  bad "SIGINT during tokenize: rc=$rc stderr=$err temps=$(find "$dir" -name '*.tmp.[0-9]*')"
fi

# A tokenize that fails after training its model (a document of invalid UTF-8 does not decode back).
{ head -c 200000 "$dir/b.txt"; printf 'caf\xc3 broken\n\n'; tail -c 200000 "$dir/b.txt"; } > "$dir/bad_utf8.txt"
expect "a failed tokenize (invalid UTF-8) onto an existing dataset" "does not decode back to its text" "$A_files" \
  tokenize --input "$dir/bad_utf8.txt" --output "$dir/C" --tokenizer bpe:420 --quiet
printf 'not a model' > "$dir/junk.model"
expect "a failed tokenize (unusable spm model) onto an existing dataset" "not a SentencePiece model" "$A_files" \
  tokenize --input "$dir/b.txt" --output "$dir/C" --tokenizer "spm:$dir/junk.model" --quiet
cp "$dir/a.txt" "$dir/L.lock"
expect "tokenize whose lock file PREFIX.lock is one of its inputs" "--output T/L.lock: is the input T/L.lock" \
  "$dir/L.lock" tokenize --input "$dir/L.lock" --output "$dir/L" --quiet

# --- class 4 ------------------------------------------------------------------------------------
section "Class 4: One identity for a tokenizer" \
  "The tokenizer's fingerprint (its kind, vocabulary and model file bytes) is in the dataset sidecar, \
in checkpoints and in exports; eval, generate and train --resume refuse another one, naming both. Model \
runA was trained on dataset A (a BPE of 400 pieces); B is another BPE of 400 pieces."
fpA="$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['fingerprint'])" "$dir/A.tokenizer.json")"
fpB="$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['fingerprint'])" "$dir/B.tokenizer.json")"
run_files="$dir/runA/model.safetensors $dir/runA/config.json $dir/runA/checkpoints/step-3/manifest.json"
expect "eval on another tokenizer's dataset" "tokenizer fingerprint $fpB, but the model (T/runA/config.json) was trained on tokenizer $fpA" \
  "$run_files $(ds_files "$dir/B")" eval "$dir/runA" --data "$dir/B" --seq-len 32 --batch 2 --eval-batches 1
expect "generate with another tokenizer's model" "--tokenizer spm:T/B.model: tokenizer fingerprint $fpB" \
  "$run_files" generate "$dir/runA" --prompt "In the" --tokens 4 --tokenizer "spm:$dir/B.model"
"$bin" export "$dir/runA/checkpoints/step-3" "$dir/exportA" > /dev/null
expect "generate from an export with another tokenizer's model" "was trained on tokenizer $fpA" \
  "$dir/exportA/config.json" generate "$dir/exportA" --prompt "In the" --tokens 4 --tokenizer "spm:$dir/B.model"
expect "train --resume on another tokenizer's dataset" "(T/runA/checkpoints/step-3/manifest.json) was trained on tokenizer $fpA" \
  "$run_files" "${train_common[@]}" --data "$dir/B" --vocab-size 400 --steps 6 --out "$dir/runA" --resume latest
for f in bin idx model tokenizer.json; do cp "$dir/A.$f" "$dir/T4.$f"; done
"$py" - "$dir/T4.tokenizer.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); s["val"]["bytes"] *= 1000; json.dump(s, open(sys.argv[1], "w"))
PY
expect "a sidecar whose val bytes were multiplied by 1000" "T/T4.tokenizer.json: records" "$(ds_files "$dir/T4")" \
  "${train_common[@]}" --data "$dir/T4" --vocab-size 400 --steps 1 --out "$dir/run_t4"
for f in bin idx model tokenizer.json; do cp "$dir/A.$f" "$dir/T5.$f"; done
sed -i 's/A\.model/T5.model/' "$dir/T5.tokenizer.json"
cp "$dir/B.model" "$dir/T5.model"
expect "another BPE's model file put beside the dataset" "T/T5.model: tokenizer fingerprint $fpB, but T/T5.tokenizer.json records $fpA" \
  "$(ds_files "$dir/T5")" eval "$dir/runA" --data "$dir/T5" --seq-len 32 --batch 2 --eval-batches 1
for f in bin idx model; do cp "$dir/A.$f" "$dir/T6.$f"; done
sed -e 's/A\.model/T6.model/' -e "s/$fpA/bytes-400-${fpA##*-}/" "$dir/A.tokenizer.json" > "$dir/T6.tokenizer.json"
expect "a sidecar fingerprint of another kind" "is not of this tokenizer (kind spm, vocab_size 400)" "$(ds_files "$dir/T6")" \
  eval "$dir/runA" --data "$dir/T6" --seq-len 32 --batch 2 --eval-batches 1
"$py" - "$dir/runA/config.json" "$dir/cfg_bad.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["moetrain_tokenizer_fingerprint"] = "spm-400-../../etc/passwd"
json.dump(c, open(sys.argv[2], "w"))
PY
mkdir -p "$dir/export_bad"
cp "$dir/exportA/model.safetensors" "$dir/export_bad/" && cp "$dir/cfg_bad.json" "$dir/export_bad/config.json"
expect "an export whose config carries a malformed fingerprint" "field \"moetrain_tokenizer_fingerprint\" must be a tokenizer fingerprint" \
  "$dir/export_bad/config.json" eval "$dir/export_bad" --data "$dir/A" --seq-len 32 --batch 2 --eval-batches 1

# --- class 5 ------------------------------------------------------------------------------------
section "Class 5: Files that change under a run" \
  "The .bin is read with pread per window: one truncated under a running train is a clear error at \
the next batch, then a checkpoint and exit 1 (it was SIGBUS, rc 135, and no checkpoint). A checkpoint \
records the data's size, sampled checksum and mtime; --resume refuses data replaced under the same name."
"$bin" tokenize --input "$kjv" --output "$dir/K" --tokenizer bytes --quiet
cp "$dir/K.bin" "$dir/K.bin.orig"
# A flat learning rate (--min-lr = --lr, no warm-up): the schedule does not depend on --steps, so a
# resumed run can be compared with an uninterrupted one of another length.
flat=(--lr 0.003 --min-lr 0.003 --warmup 0)
"$bin" "${train_common[@]}" "${flat[@]}" --data "$dir/K" --steps 100000 --checkpoint.every 100000 --out "$dir/runK" 2> "$dir/runK.err" &
trainer=$!
pids+=("$trainer")
for _ in $(seq 600); do
  [ "$(cat "$dir/runK/metrics.jsonl" 2>/dev/null | wc -l)" -ge 20 ] && break
  sleep 0.05
done
truncate -s 100000 "$dir/K.bin"
rc=0
timeout 60 tail --pid="$trainer" -f /dev/null || true
wait "$trainer" || rc=$?
err="$(cat "$dir/runK.err")"
ck="$(ls "$dir/runK/checkpoints" 2>/dev/null | head -1)"
if [ "$rc" -eq 1 ] && [ "$(printf '%s\n' "$err" | grep -c .)" -eq 1 ] &&
   printf '%s' "$err" | grep -qF "K.bin: changed under the run" && [ -f "$dir/runK/checkpoints/$ck/manifest.json" ] &&
   printf '%s' "$err" | grep -qF "checkpoint $dir/runK/checkpoints/$ck"; then
  ok "a .bin truncated under a running train: rc 1, $ck written: ${err//$dir/T}"
  row "a .bin truncated under a running train (checkpoint written, exit 1)" "$err" \
    "${train_common[@]}" "${flat[@]}" --data "$dir/K" --steps 100000 --out "$dir/runK" "&& truncate -s 100000 T/K.bin"
else
  bad "a .bin truncated under a running train: rc=$rc checkpoint=$ck stderr=${err:0:600}"
fi
# The checkpoint written at the error is exact: resumed on the restored .bin (a copy of runK), the
# run reaches the same loss bit for bit as one that was never interrupted.
cp "$dir/K.bin.orig" "$dir/K.bin"
n=$(( ${ck#step-} + 5 ))
cp -r "$dir/runK" "$dir/runK2"
"$bin" "${train_common[@]}" "${flat[@]}" --data "$dir/K" --steps "$n" --out "$dir/runK2" --resume latest 2> /dev/null
"$bin" "${train_common[@]}" "${flat[@]}" --data "$dir/K" --steps "$n" --out "$dir/runK_straight"
last_loss() { tail -1 "$1/metrics.jsonl" | "$py" -c "import json,sys; print(json.loads(sys.stdin.read())['loss'])"; }
if [ "$(last_loss "$dir/runK2")" = "$(last_loss "$dir/runK_straight")" ]; then
  ok "resumed from the truncation's checkpoint: step $n's loss equals an uninterrupted run's"
else
  bad "resumed from the truncation's checkpoint: loss $(last_loss "$dir/runK2") at step $n, uninterrupted $(last_loss "$dir/runK_straight")"
fi
# Resuming on a .bin of the same size with other bytes (the text reversed), then on an .idx of
# the same size with two documents' lengths swapped.
"$py" -c "import sys; b=open(sys.argv[1],'rb').read(); open(sys.argv[2],'wb').write(b[::-1])" "$dir/K.bin.orig" "$dir/K.bin"
expect "--resume on a .bin replaced by another of the same size" "T/K.bin: not the data this run trained on" \
  "$(ds_files "$dir/K") $dir/runK/checkpoints/$ck/manifest.json" \
  "${train_common[@]}" --data "$dir/K" --steps 100000 --out "$dir/runK" --resume latest
cp "$dir/K.bin.orig" "$dir/K.bin"
cp "$dir/K.idx" "$dir/K.idx.orig"
"$py" - "$dir/K.idx" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
l0, l1 = struct.unpack_from("<ii", b, 34)
struct.pack_into("<ii", b, 34, l1, l0)             # lengths of sequences 0 and 1 swapped
struct.pack_into("<q", b, 34 + 4 * struct.unpack_from("<Q", b, 18)[0] + 8, l1)  # pointer of 1 follows
open(sys.argv[1], "wb").write(b)
PY
expect "--resume on an .idx replaced by another of the same size" "T/K.bin: not the data this run trained on" \
  "$(ds_files "$dir/K") $dir/runK/checkpoints/$ck/manifest.json" \
  "${train_common[@]}" --data "$dir/K" --steps 100000 --out "$dir/runK" --resume latest
cp "$dir/K.idx.orig" "$dir/K.idx"

# --- class 6 ------------------------------------------------------------------------------------
section "Class 6: Setup is bounded and stops on SIGTERM" \
  "Sequence pointers must increase without overlap, so each token of the .bin is checked once; the \
loops of setup poll the stop flag."
# The issue's .idx: 100,000 sequences of 1 MB each, every one at byte 0 of a 1 MB .bin (10^11
# token checks before).
"$py" - "$dir/same" <<'PY'
import struct, sys
S, L = 100000, 1 << 20
idx = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 1, S, S + 1)
idx += struct.pack("<i", L) * S + struct.pack("<q", 0) * S + b"".join(struct.pack("<q", j) for j in range(S + 1))
open(sys.argv[1] + ".idx", "wb").write(idx)
open(sys.argv[1] + ".bin", "wb").write(bytes(range(256)) * (L // 256))
PY
t0=$(date +%s%N)
expect "100,000 sequences over the same 1 MB (a 1.2 MB .idx)" "T/same.idx: sequence 1 pointer 0 at offset 400042 overlaps or precedes sequence 0" \
  "$dir/same.idx $dir/same.bin" "${train_common[@]}" --data "$dir/same" --steps 1 --out "$dir/run_same"
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
[ "$ms" -lt 20000 ] || bad "the overlapping .idx took $ms ms to refuse"
"$py" - "$dir/order" <<'PY'
import struct, sys
idx = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 1, 3, 4)
idx += struct.pack("<3i", 100, 100, 100) + struct.pack("<3q", 200, 0, 100) + struct.pack("<4q", 0, 1, 2, 3)
open(sys.argv[1] + ".idx", "wb").write(idx)
open(sys.argv[1] + ".bin", "wb").write(b"a" * 300)
PY
expect "sequence pointers out of order" "T/order.idx: sequence 1 pointer 0 at offset 54 overlaps or precedes sequence 0, which ends at byte 300" \
  "$dir/order.idx $dir/order.bin" eval "$dir/runA" --data "$dir/order" --seq-len 32 --batch 2 --eval-batches 1
# A valid 3 GB dataset (a sparse .bin: ids 0) whose token check takes seconds: SIGTERM one second
# into it ends the run within another second, with one line.
"$py" - "$dir/huge" <<'PY'
import struct, sys
S, L = 3000, 1 << 20
idx = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 1, S, S + 1)
idx += struct.pack("<i", L) * S + b"".join(struct.pack("<q", i * L) for i in range(S))
idx += b"".join(struct.pack("<q", j) for j in range(S + 1))
open(sys.argv[1] + ".idx", "wb").write(idx)
with open(sys.argv[1] + ".bin", "wb") as f:
    f.truncate(S * L)
PY
start=$(date +%s%N)
"$bin" "${train_common[@]}" --data "$dir/huge" --steps 1 --out "$dir/run_huge" 2> "$dir/huge.err" &
trainer=$!
pids+=("$trainer")
sleep 1.5
sent=$(date +%s%N)
kill -TERM "$trainer" 2>/dev/null || true
rc=0
wait "$trainer" || rc=$?
end=$(date +%s%N)
err="$(cat "$dir/huge.err")"
ms=$(( (end - sent) / 1000000 ))
if { [ "$rc" -eq 143 ] || { [ "$rc" -eq 1 ] && [ "$(printf '%s\n' "$err" | grep -c .)" -eq 1 ] &&
       printf '%s' "$err" | grep -qF "stopped by a signal (SIGTERM/SIGINT) during setup"; }; } && [ "$ms" -lt 1000 ]; then
  ok "SIGTERM during the token check of a 3 GB dataset: rc $rc after $ms ms: ${err//$dir/T}"
  row "SIGTERM 1.5 s into the token check of a 3 GB dataset (ends within 1 s)" "$err" \
    "${train_common[@]}" --data "$dir/huge" --steps 1 --out "$dir/run_huge"
else
  bad "SIGTERM during setup: rc=$rc after $ms ms (total $(( (end - start) / 1000000 )) ms) stderr=${err:0:400}"
fi

echo "$pass passed, $fail failed" >&2
[ "$fail" -eq 0 ]
