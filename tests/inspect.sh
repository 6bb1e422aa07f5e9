#!/usr/bin/env bash
# moetrain inspect on every kind of path it recognises: a checkpoint (single rank and EP 2), a
# folder of checkpoints, a run's output folder, a sharded export, one .safetensors file, a
# config.json, a byte corpus and a Megatron indexed dataset. Parameter and token counts are
# checked against numbers computed here independently (the safetensors headers and the dataset
# read by Python, the corpus split by its rule). Bad paths: one line each.
# Usage: inspect.sh MOETRAIN CORPUS WORK [MPIRUN]
set -euo pipefail
bin="$1"; corpus="$2"; work="$3"; mpirun="${4:-}"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
rm -rf "$work"; mkdir -p "$work"
source "$(dirname "$0")/lib.sh"
[ -n "$mpirun" ] && MPIRUN="$mpirun"
pass=0
ok() { pass=$((pass + 1)); echo "ok: $*"; }
die() { echo "FAIL: $*"; exit 1; }
has() {  # has FILE TEXT...: every TEXT is a substring of FILE
  local f="$1"; shift
  for s in "$@"; do grep -qF -- "$s" "$f" || { cat "$f"; die "$f lacks '$s'"; }; done
}
# Elements of the tensors in safetensors files (optionally only names not starting with PREFIX).
numel() {
  "$py" - "$@" <<'EOF'
import json, struct, sys
skip = ("adam_m.", "adam_v.")
total = 0
for p in sys.argv[1:]:
    with open(p, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
    for k, v in h.items():
        if k == "__metadata__" or k.startswith(skip):
            continue
        c = 1
        for d in v["shape"]:
            c *= d
        total += c
print(f"{total:,}")
EOF
}

"$bin" train --preset test-moe --data "$corpus" --steps 4 --batch 4 --seq-len 32 --checkpoint.every 2 \
  --quiet --out "$work/run"
ck="$work/run/checkpoints/step-4"
"$bin" inspect "$ck" > "$work/ck.txt"
n="$(numel "$ck"/shard-*.safetensors)"
has "$work/ck.txt" "checkpoint        $ck (moetrain-checkpoint-1)" "step              4 (0 non-finite" \
  "layout            pp 1 x dp 1 x ep 1 x tp 1" "parameters        $n total" \
  "$n parameters (equal to the config's count)" "AdamW adam_m and adam_v of every weight, same shapes" \
  "model.layers.1.mlp.experts.*.up_proj.weight" "x8 (experts 0..7)" "3 layers (1 dense first, 2 MoE)"
ok "checkpoint: $n parameters, as its shard's header says"

"$bin" inspect "$work/run/checkpoints" > "$work/cks.txt"
has "$work/cks.txt" "2 checkpoint folder(s)" "step-2" "step-4" "complete (manifest.json)"
ok "checkpoint folder lists step-2 and step-4"

"$bin" inspect "$work/run" > "$work/run.txt"
n1="$(numel "$work/run/model.safetensors")"
[ "$n1" = "$n" ] || die "the run's model.safetensors holds $n1 parameters, the checkpoint $n"
has "$work/run.txt" "model folder" "1 safetensors file(s)" "$n parameters (equal to the config's count)"
ok "run output folder"

"$bin" export "$ck" "$work/hf" --shard-mb 0.05 >/dev/null
"$bin" inspect "$work/hf" > "$work/hf.txt"
files=$(ls "$work/hf"/model-*.safetensors | wc -l)
[ "$files" -gt 1 ] || die "export --shard-mb 0.05 wrote $files file(s)"
has "$work/hf.txt" "config.json + $files safetensors file(s)" "$(numel "$work/hf"/model-*.safetensors) parameters"
ok "sharded export: $files files"

"$bin" inspect "$work/run/model.safetensors" > "$work/st.txt"
has "$work/st.txt" "tensors           " "$n elements (F32 $n)" "metadata          format = pt"
ok "one safetensors file"

"$bin" inspect "$work/run/config.json" > "$work/cfg.txt"
has "$work/cfg.txt" "parameters        $n total" "8 routed of width"
ok "config.json"

if [ -n "$mpirun" ]; then
  mpi 2 \
    "$bin" train --preset test-moe --data "$corpus" --steps 2 --batch 4 --seq-len 32 --ep 2 --quiet --out "$work/ep"
  "$bin" inspect "$work/ep/checkpoints/step-2" > "$work/ep.txt"
  has "$work/ep.txt" "pp 1 x dp 1 x ep 2 x tp 1" "layer 1 [[0,1,2,3],[4,5,6,7]]" "contiguous)" "$n parameters (equal to the config's count)" \
    "equal to the config's count"
  ok "EP 2 checkpoint: expert placement and the same parameter count"
fi

# A byte corpus of 40,000 bytes: blocks of 40000/40 = 1000 bytes, blocks 19 and 39 held out.
head -c 40000 "$corpus" > "$work/small.txt"
"$bin" inspect "$work/small.txt" > "$work/corpus.txt"
has "$work/corpus.txt" "byte corpus" "tokens            40,000 (training 38,000, validation 2,000)" \
  "blocks of 1,000 bytes" "2 training and 2 validation segment(s)"
ok "byte corpus split"

# A Megatron indexed dataset written here (MMIDIDX v1, uint16 ids): 3 documents of 5, 7 and 2 tokens.
"$py" - "$work/ds" <<'EOF'
import struct, sys
docs = [[1, 2, 3, 4, 5], [300, 301, 302, 303, 304, 305, 306], [9, 10]]
p = sys.argv[1]
with open(p + ".bin", "wb") as b:
    for d in docs:
        b.write(struct.pack(f"<{len(d)}H", *d))
ptr, ptrs = 0, []
for d in docs:
    ptrs.append(ptr)
    ptr += 2 * len(d)
with open(p + ".idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8))
    f.write(struct.pack("<QQ", len(docs), len(docs) + 1))
    f.write(struct.pack(f"<{len(docs)}i", *[len(d) for d in docs]))
    f.write(struct.pack(f"<{len(docs)}q", *ptrs))
    f.write(struct.pack(f"<{len(docs) + 1}q", *range(len(docs) + 1)))
EOF
rc=0
"$bin" inspect "$work/ds" > "$work/ds.txt" 2>&1 || rc=$?
if grep -q "not supported by this build" "$work/ds.txt"; then
  echo "note: this build has no indexed dataset reader (io/indexed_dataset.h): case not run"
else
  [ "$rc" -eq 0 ] || { cat "$work/ds.txt"; die "inspect of an indexed dataset failed"; }
  has "$work/ds.txt" "indexed dataset" "uint16" "documents         3" "tokens            14" "2 to 7 tokens"
  "$bin" inspect "$work/ds.idx" | grep -qF "documents         3" || die "inspect PREFIX.idx"
  ok "indexed dataset: 3 documents, 14 tokens"
fi

expect_error() {  # expect_error "WHAT" "MESSAGE PART" PATH
  local rc=0
  "$bin" inspect "$3" >"$work/out.txt" 2>"$work/err.txt" || rc=$?
  [ "$rc" -ne 0 ] || die "$1: exit 0"
  [ "$(wc -l <"$work/err.txt")" -eq 1 ] || { cat "$work/err.txt"; die "$1: not one line"; }
  grep -qF -- "$2" "$work/err.txt" || { cat "$work/err.txt"; die "$1: message lacks '$2'"; }
  [ ! -s "$work/out.txt" ] || die "$1: printed something on stdout"
  ok "$1: $(cat "$work/err.txt")"
}
expect_error "no such path" "$work/nope: no such file or folder" "$work/nope"
mkdir -p "$work/other"; echo hi > "$work/other/notes.txt"
expect_error "an unrecognised folder" "$work/other: not a recognised folder" "$work/other"
head -c 100 "$work/run/model.safetensors" > "$work/cut.safetensors"
expect_error "a truncated safetensors file" "$work/cut.safetensors" "$work/cut.safetensors"
cp -r "$ck" "$work/ck-broken"; rm "$work/ck-broken"/shard-*.safetensors
expect_error "a checkpoint without its shard" "shard-00000.safetensors" "$work/ck-broken"
echo '{"hidden_size": 64}' > "$work/bad-config.json"
expect_error "a config.json without its fields" "$work/bad-config.json" "$work/bad-config.json"
: > "$work/empty.txt"
expect_error "an empty corpus" "$work/empty.txt" "$work/empty.txt"

echo "$pass passed, 0 failed"
