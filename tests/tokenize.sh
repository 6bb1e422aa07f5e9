#!/usr/bin/env bash
# moetrain tokenize end to end (ctest tokenize_cli, ~20 s): a KJV excerpt tokenized as bytes (the
# .bin/.idx read back by an independent numpy reader in Megatron's layout: the tokens are the
# text's bytes), as a SentencePiece BPE (trained, then reused with spm:PATH: the same tokens), and
# a dataset from the independent Python writer (no sidecar); each trains 3 steps, and the BPE run
# logs its held-out loss in nats per byte = nats per token * val tokens / val bytes.
# Usage: tokenize.sh MOETRAIN KJV_TXT
set -euo pipefail
bin="$1"
kjv="$2"
here="$(cd "$(dirname "$0")" && pwd)"
py=/usr/bin/python3
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
export OPENBLAS_NUM_THREADS=1
fail() { echo "FAIL: $*" >&2; exit 1; }

head -c 400000 "$kjv" > "$dir/text.txt"  # about 100 chapters = documents, 5 of them held out
train=(train --steps 3 --batch 2 --seq-len 32 --eval-batches 2 --eval-every 0 --quiet)

# 1. bytes: Megatron's layout, the text's bytes in order; trains without --vocab-size.
"$bin" tokenize --input "$dir/text.txt" --tokenizer bytes --output "$dir/bytes" --quiet
"$py" "$here/fixtures/read_mmidx.py" "$dir/bytes" "$dir/text.txt" >/dev/null || fail "bytes dataset unreadable by numpy"
"$bin" "${train[@]}" --data "$dir/bytes" --out "$dir/o-bytes"
[ -s "$dir/o-bytes/model.safetensors" ] || fail "no weights after training on the bytes dataset"

# 2. BPE: trained on the training documents, 3 steps with --vocab-size; nats per byte logged.
"$bin" tokenize --input "$dir/text.txt" --tokenizer bpe:400 --output "$dir/bpe" --quiet
[ -s "$dir/bpe.model" ] || fail "no SentencePiece model beside the dataset"
"$py" "$here/fixtures/read_mmidx.py" "$dir/bpe" >/dev/null || fail "bpe dataset unreadable by numpy"
"$bin" "${train[@]}" --data "$dir/bpe.idx" --vocab-size 400 --out "$dir/o-bpe"
"$py" - "$dir/o-bpe/metrics.jsonl" "$dir/bpe.tokenizer.json" <<'PY' || fail "nats per byte"
import json, sys
last = [json.loads(l) for l in open(sys.argv[1])][-1]
side = json.load(open(sys.argv[2]))
want = last["val_loss"] * side["val"]["tokens"] / side["val"]["bytes"]
assert side["vocab_size"] == 400 and side["val"]["tokens"] < side["val"]["bytes"], side
assert abs(last["val_loss_nats_per_byte"] - want) <= 1e-12 * want, (last, want)
PY

# 2b. generate from the BPE model with its tokenizer: the prompt round-trips through the pieces
# and the text continues; the byte tokenizer is refused for it, naming the flag to use.
out="$("$bin" generate "$dir/o-bpe" --tokenizer "spm:$dir/bpe.model" --prompt "In the beginning God" \
        --tokens 12 --temperature 0)" || fail "generate with --tokenizer spm:PATH"
case "$out" in "In the beginning God"?*) ;; *) fail "generate (spm) did not continue the prompt: $out" ;; esac
ids="$("$bin" generate "$dir/o-bpe" --tokenizer "spm:$dir/bpe.model" --prompt "In the beginning God" \
        --tokens 12 --temperature 0 --ids)" || fail "generate --ids with spm"
n=$(echo "$ids" | wc -w)
[ "$n" -gt 12 ] && [ "$n" -lt $((12 + 20)) ] || fail "spm prompt not encoded as BPE pieces ($n ids)"
err="$("$bin" generate "$dir/o-bpe" --prompt x --tokens 2 2>&1)" && fail "byte tokenizer accepted for a BPE model"
echo "$err" | grep -q "spm:PATH" || fail "unhelpful error for the byte tokenizer on a BPE model: $err"

# 3. spm:PATH reuses that model: the same tokens, the model copied beside the new dataset.
"$bin" tokenize --input "$dir/text.txt" --tokenizer "spm:$dir/bpe.model" --output "$dir/again" --quiet
cmp -s "$dir/bpe.bin" "$dir/again.bin" || fail "spm:PATH gave other tokens than the model's own run"
cmp -s "$dir/bpe.model" "$dir/again.model" || fail "spm:PATH did not copy the model"

# 4. A dataset made by another tool (the independent Python writer, Megatron's layout, documents
# of 2 sequences with gaps between them, no sidecar) trains too; the done line says bytes are unknown.
"$py" "$here/fixtures/write_mmidx.py" "$dir/meg" --dtype int32 --docs 60 --seqs-per-doc 2 --max-len 80 --gap 1 --max-id 512
err="$("$bin" train --steps 3 --batch 2 --seq-len 32 --eval-batches 1 --data "$dir/meg" --vocab-size 512 --out "$dir/o-meg" 2>&1)" ||
  fail "training on the Python-written dataset: $err"
printf '%s\n' "$err" | grep -q "nats/token (bytes per token unknown: no sidecar" || fail "done line: $err"

# 5. Byte-level text still trains, its val_loss already in nats per byte (no second figure).
"$bin" "${train[@]}" --data "$dir/text.txt" --out "$dir/o-text"
grep -q '"val_loss"' "$dir/o-text/metrics.jsonl" || fail "text run without val_loss"
! grep -q 'nats_per_byte' "$dir/o-text/metrics.jsonl" || fail "text run logs a separate nats-per-byte figure"
echo "tokenize: all checks passed" >&2
