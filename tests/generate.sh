#!/usr/bin/env bash
# moetrain generate end to end: a test-moe model trained briefly (30 steps), checkpointed and
# exported; greedy decoding (KV cache) must equal the PyTorch reference's greedy decoding of the
# exported folder token for token (tests/reference/greedy_hf.py, no cache: the whole sequence is
# recomputed each step); the checkpoint and the export generate the same text; a sampled run is
# reproducible by seed; bad input is one error line.
# Usage: generate.sh MOETRAIN PYTHON CORPUS WORK
set -euo pipefail
bin="$1"; py="$2"; corpus="$3"; work="$4"
here="$(cd "$(dirname "$0")" && pwd)"
rm -rf "$work"; mkdir -p "$work"
export OPENBLAS_NUM_THREADS=1
"$bin" train --preset test-moe --steps 30 --seq-len 64 --batch 8 --lr 3e-3 --quiet --data "$corpus" \
  --out "$work/run" --checkpoint.every 30
ckpt="$work/run/checkpoints/step-30"
"$bin" export "$ckpt" "$work/hf" > /dev/null
prompt="And God said, Let there be light"
plen=${#prompt}
# 1. Greedy equals the PyTorch reference on the exported model (positions up to 96 of 256).
"$bin" generate "$work/hf" --prompt "$prompt" --tokens 64 --temperature 0 --ids > "$work/greedy.ids"
"$py" "$here/reference/greedy_hf.py" "$work/hf" "$work/greedy.ids" --prompt-len "$plen"
# The same on weights at their (large) initial scale: 30 steps teach little beyond the last
# byte, so a position error in the cache (RoPE at p - 1, a stale row) can leave the trained
# model's greedy text unchanged; these weights' choices depend on every position.
"$py" -c 'import json, sys; c = json.load(open(sys.argv[1])); c["initializer_range"] = 0.5
json.dump(c, open(sys.argv[2], "w"))' "$work/hf/config.json" "$work/sharp.json"
"$bin" train --config "$work/sharp.json" --steps 1 --lr 1e-9 --min-lr 0 --warmup 1 --seq-len 64 \
  --batch 2 --quiet --data "$corpus" --out "$work/sharp-run"
"$bin" generate "$work/sharp-run" --prompt "$prompt" --tokens 64 --temperature 0 --ids > "$work/sharp.ids"
"$py" "$here/reference/greedy_hf.py" "$work/sharp-run" "$work/sharp.ids" --prompt-len "$plen"
# 2. The checkpoint and its export are the same model: the same text, greedy and sampled.
"$bin" generate "$ckpt" --prompt "$prompt" --tokens 64 --temperature 0 --ids > "$work/greedy_ckpt.ids"
cmp "$work/greedy.ids" "$work/greedy_ckpt.ids"
"$bin" generate "$ckpt" --prompt "$prompt" --tokens 64 --seed 5 --top-k 20 > "$work/s1.txt"
"$bin" generate "$work/hf" --prompt "$prompt" --tokens 64 --seed 5 --top-k 20 > "$work/s2.txt"
cmp "$work/s1.txt" "$work/s2.txt"
test "$(head -c "$plen" "$work/s1.txt")" = "$prompt"
test "$(wc -c < "$work/s1.txt")" -eq $((plen + 64 + 1))  # prompt + 64 bytes + newline
"$bin" generate "$ckpt" --prompt "$prompt" --tokens 64 --seed 6 --top-k 20 > "$work/s3.txt"
if cmp -s "$work/s1.txt" "$work/s3.txt"; then echo "FAIL: seeds 5 and 6 gave the same text"; exit 1; fi
# 3. Bad input: one line naming the problem, exit 1, nothing on stdout (a model larger than the
#    memory available: the run guards' test hook).
fails=0
expect_error() {  # expect_error "MESSAGE PART" ARGS...
  local want="$1"; shift
  local out err rc=0
  out=$("$bin" generate "$@" 2> "$work/err.txt") || rc=$?
  err=$(cat "$work/err.txt")
  if [[ $rc -eq 0 || $(wc -l < "$work/err.txt") -ne 1 || "$err" != *"$want"* || -n "$out" ]]; then
    echo "FAIL: generate $* -> rc $rc, stdout '${out:0:80}', stderr '$err' (wanted '$want')"
    fails=$((fails + 1))
  fi
}
long=$(head -c 300 /dev/zero | tr '\0' 'a')
expect_error "--prompt is 300 tokens, longer than max_position_embeddings 256" "$ckpt" --prompt "$long" --tokens 1
expect_error "--prompt ($plen tokens) + --tokens 250 = $((plen + 250)) exceeds max_position_embeddings 256" \
  "$ckpt" --prompt "$prompt" --tokens 250
expect_error "--top-k must be >= 0" "$ckpt" --prompt "$prompt" --top-k -1
expect_error "--temperature must be a finite number >= 0" "$ckpt" --prompt "$prompt" --temperature -0.5
expect_error "--temperature must be a finite number >= 0" "$ckpt" --prompt "$prompt" --temperature nan
expect_error "--tokens must be >= 0" "$ckpt" --prompt "$prompt" --tokens -3
expect_error "--prompt is empty" "$ckpt" --prompt ""
expect_error "--device: " "$ckpt" --prompt "$prompt" --device tpu
expect_error "$work/nope: no such folder" "$work/nope" --prompt "$prompt"
mkdir -p "$work/empty"
expect_error "neither a checkpoint" "$work/empty" --prompt "$prompt"
mkdir -p "$work/bad"; cp -r "$ckpt" "$work/bad/step-30"
printf 'garbage' > "$work/bad/step-30/shard-00000.safetensors"
expect_error "shard-00000.safetensors" "$work/bad/step-30" --prompt "$prompt"
cp -r "$work/hf" "$work/hf-bad"; truncate -s 1000 "$work/hf-bad/model.safetensors"
expect_error "model.safetensors" "$work/hf-bad" --prompt "$prompt"
# A model whose vocabulary is not the bytes' (a tokenized dataset's): refused, not printed as bytes.
sed 's/"vocab_size": 256/"vocab_size": 300/' "$work/hf/config.json" > "$work/v300.json"
"$bin" train --config "$work/v300.json" --steps 1 --seq-len 16 --batch 2 --quiet --data "$corpus" --out "$work/v300"
expect_error "vocab_size 300 is not the byte-level vocabulary (256)" "$work/v300" --prompt "$prompt"
MOETRAIN_MEMORY_AVAILABLE=100000 expect_error "of host memory to generate" "$ckpt" --prompt "$prompt"
if [[ $fails -ne 0 ]]; then echo "$fails bad-input case(s) failed"; exit 1; fi
echo "generate: greedy == PyTorch (2 models), checkpoint == export, seeds reproducible, 14 bad inputs refused"
