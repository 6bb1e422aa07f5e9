#!/usr/bin/env bash
# Hostile files through the CLI (issue 15): a checkpoint, config, header or profile may come from
# someone else. Every case must exit non-zero without a crash (exit code < 128), print exactly one
# line on stderr naming the file / field / tensor at fault, and read nothing outside its folder.
#  1. checkpoints that reach outside their folder (../, absolute, symlinked shard or manifest),
#     an empty "shards" map, size fields of 2^64-1, malformed numbers (both --resume and export);
#  2. JSON nested 100000 levels deep at every entry point (train --config, plan --model,
#     plan --cluster, plan --loads, a manifest, a safetensors header), configs whose sizes
#     overflow 64 bits, numbers beyond their type;
#  4. NaN / Inf weights, a NaN AdamW moment, a negative second moment, an Inf in an embedding row
#     the data never reads: refused on load, naming the tensor;
#  and stray checkpoints/step-99999999999, step-abc, step-007 or a symlinked step-N break neither
#  saving nor --resume latest.
# Issue 42 (third pass), two more tables:
#  class 1: export folders and datasets are untrusted input like checkpoints: a symlinked
#     model.safetensors, config.json, index shard or dataset file pointing outside its folder is
#     refused by generate, eval, inspect and train; an error never quotes a file's bytes; a
#     40,000-character tensor name is refused by inspect, --resume and export;
#  class 2: outputs never clobber what they must not: eval --dump, plan --save-cluster, report,
#     tokenize, export and train refuse an output that is a symlink, a FIFO or one of the run's
#     inputs, and a symlink planted at tokenize's or report's old temporary name is not written
#     through. Each case checks that the protected file is unchanged.
# Usage: hostile_files.sh MOETRAIN [--markdown]
#   --markdown: print one table row per failing-input case for docs/bad_inputs.md.
set -euo pipefail
bin="$1"
markdown=0
[ "${2:-}" = "--markdown" ] && markdown=1
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
source "$(dirname "$0")/lib.sh"  # the mpirun preamble, one BLAS thread
py=/usr/bin/python3
pass=0
fail=0
ok() { pass=$((pass + 1)); [ "$markdown" -eq 1 ] || echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1" >&2; }

printf 'In the beginning God created the heaven and the earth.\n%.0s' {1..3000} > "$dir/text.txt"
common=(train --preset test-dense --steps 2 --batch 2 --seq-len 16 --eval-batches 1 --quiet
        --data "$dir/text.txt")

# expect NAME PATTERN ARGS...: moetrain ARGS fails (rc 1..127), prints exactly one stderr line
# containing PATTERN (fixed string).
expect() {
  local name="$1" pattern="$2"
  shift 2
  local err rc=0 lines
  err="$("$bin" "$@" 2>&1 >/dev/null)" || rc=$?
  last_err="$err"
  lines=$(printf '%s\n' "$err" | grep -c . || true)
  if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && [ "$lines" -eq 1 ] && printf '%s' "$err" | grep -qF -- "$pattern"; then
    # As shown: the temporary folder as T, the shared flags as "…".
    local shown="${err//$dir/T}" cmd="moetrain"
    ok "$name: $shown"
    if [ "$markdown" -eq 1 ]; then
      for a in "$@"; do cmd+=" ${a//$dir/T}"; done
      cmd="${cmd//train --preset test-dense --steps 2 --batch 2 --seq-len 16 --eval-batches 1 --quiet --data T\/text.txt/train …}"
      printf '| %s | `%s` | `%s` |\n' "$name" "${cmd//|/\\|}" "${shown//|/\\|}"
    fi
  else
    bad "$name: rc=$rc lines=$lines stderr: ${err:0:600}"
  fi
}

# ck.py: edits a checkpoint folder the way an attacker would, keeping it otherwise consistent
# (after editing a shard, its size and checksum in the manifest are recomputed).
cat > "$dir/ck.py" <<'PY'
import json, os, struct, sys
def fnv(path):
    h = 1469598103934665603
    for b in open(path, "rb").read():
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h
def load(d): return json.load(open(os.path.join(d, "manifest.json")))
def save(d, m): open(os.path.join(d, "manifest.json"), "w").write(json.dumps(m, indent=1))
def rehash(d, m):
    for name, info in m["shards"].items():
        p = os.path.join(d, name)
        if os.path.isfile(p) and not os.path.islink(p):
            info["bytes"], info["fnv1a64"] = os.path.getsize(p), fnv(p)
cmd, d = sys.argv[1], sys.argv[2]
if cmd == "manifest":        # ck.py manifest DIR PYTHON: edit the manifest dict m
    m = load(d); exec(sys.argv[3]); save(d, m)
elif cmd == "poke":          # ck.py poke DIR TENSOR ELEMENT VALUE: set one float32, rehash
    m = load(d); shard = os.path.join(d, m["shards"] and next(iter(m["shards"])))
    raw = bytearray(open(shard, "rb").read())
    n = struct.unpack("<Q", raw[:8])[0]; hdr = json.loads(raw[8:8 + n])
    b = 8 + n + hdr[sys.argv[3]]["data_offsets"][0] + 4 * int(sys.argv[4])
    raw[b:b + 4] = struct.pack("<f", float(sys.argv[5]))
    open(shard, "wb").write(raw); rehash(d, m); save(d, m)
elif cmd == "deep_header":   # ck.py deep_header DIR: the shard's header nested 100000 deep
    m = load(d); shard = os.path.join(d, next(iter(m["shards"])))
    h = b"[" * 100000 + b"]" * 100000
    open(shard, "wb").write(struct.pack("<Q", len(h)) + h); rehash(d, m); save(d, m)
elif cmd == "rehash":
    m = load(d); rehash(d, m); save(d, m)
PY
ck() { "$py" "$dir/ck.py" "$@"; }
deep() { "$py" -c "import sys; sys.stdout.write('$1' + '[' * 100000 + ']' * 100000 + '$2')"; }

# A good checkpoint to damage: test-dense, 2 steps (under a second).
"$bin" "${common[@]}" --out "$dir/run" >/dev/null
good="$dir/run/checkpoints/step-2"
[ -f "$good/manifest.json" ] || { echo "FAIL setup: no checkpoint in $good" >&2; exit 1; }
# fresh NAME: a copy of the good checkpoint at $dir/NAME.
fresh() { rm -rf "${dir:?}/$1"; cp -r "$good" "$dir/$1"; }
# both NAME PATTERN CKPT: --resume CKPT and export CKPT both refuse it.
n_out=0
both() {
  n_out=$((n_out + 1))
  expect "$1 (--resume)" "$2" "${common[@]}" --steps 4 --out "$dir/o$n_out" --resume "$3"
  expect "$1 (export)" "$2" export "$3" "$dir/x$n_out"
  [ ! -e "$dir/x$n_out/model.safetensors" ] || bad "$1: export wrote weights"
}

# --- 1. nothing outside the folder, nothing unchecked ---------------------------------------------
cp "$good/shard-00000.safetensors" "$dir/outside.safetensors"
fresh dotdot
mv "$dir/dotdot/shard-00000.safetensors" "$dir/dotdot-moved"
ck manifest "$dir/dotdot" '
s = m["shards"].pop("shard-00000.safetensors"); m["shards"]["../outside.safetensors"] = s
m["tensors"] = {k: "../outside.safetensors" for k in m["tensors"]}'
both "manifest: shard ../outside.safetensors" 'shard name "../outside.safetensors" is not a plain file name inside the checkpoint folder' "$dir/dotdot"
fresh absolute
ck manifest "$dir/absolute" "
s = m['shards'].pop('shard-00000.safetensors'); m['shards']['$dir/outside.safetensors'] = s
m['tensors'] = {k: '$dir/outside.safetensors' for k in m['tensors']}"
both "manifest: absolute shard path" "outside.safetensors\" is not a plain file name inside the checkpoint folder" "$dir/absolute"
fresh tensor-dotdot
ck manifest "$dir/tensor-dotdot" 'm["tensors"]["../../etc/passwd"] = "shard-00000.safetensors"'
both "manifest: tensor name ../../etc/passwd" 'tensor name "../../etc/passwd" is not a plain tensor name' "$dir/tensor-dotdot"
fresh symlink
rm "$dir/symlink/shard-00000.safetensors"
ln -s "$dir/outside.safetensors" "$dir/symlink/shard-00000.safetensors"  # same bytes: checksum matches
both "shard is a symlink out of the folder" 'shard shard-00000.safetensors is a symbolic link (refused' "$dir/symlink"
# A manifest whose step disagrees with its folder name (step-2's files under step-3).
mkdir -p "$dir/moved"
rm -rf "$dir/moved/step-3"
cp -r "$good" "$dir/moved/step-3"
both "manifest: step 2 in a folder named step-3" 'field "step" 2 disagrees with its folder name step-3' "$dir/moved/step-3"

fresh manifest-link
mv "$dir/manifest-link/manifest.json" "$dir/outside-manifest.json"
ln -s "$dir/outside-manifest.json" "$dir/manifest-link/manifest.json"
both "manifest.json is a symlink" 'manifest.json: is a symbolic link (refused' "$dir/manifest-link"
fresh empty-shards
ck poke "$dir/empty-shards" model.layers.0.self_attn.q_proj.weight 0 1000  # tampered weights...
ck manifest "$dir/empty-shards" 'm["shards"] = {}'                          # ...and no checksum
both 'manifest: empty "shards" map' 'is in shard shard-00000.safetensors, which "shards" does not list' "$dir/empty-shards"
fresh huge-size
ck manifest "$dir/huge-size" 'm["shards"]["shard-00000.safetensors"]["bytes"] = 2**64 - 1'
both "manifest: shard size 2^64-1" 'the manifest says 18446744073709551615 (truncated?)' "$dir/huge-size"
fresh negative-size
ck manifest "$dir/negative-size" 'm["shards"]["shard-00000.safetensors"]["bytes"] = -1'
both "manifest: shard size -1" '"bytes" must be a non-negative integer' "$dir/negative-size"
fresh seed-overflow
ck manifest "$dir/seed-overflow" 'm["seed"] = "99999999999999999999999"'
both "manifest: seed beyond 2^64" 'field "seed": "99999999999999999999999" is not an integer in [0, 18446744073709551615]' "$dir/seed-overflow"
fresh step-huge
ck manifest "$dir/step-huge" 'm["step"] = 1e300'
both "manifest: step 1e300" 'field "step" must be an integer in [0, 2147483647], got 1e+300' "$dir/step-huge"
fresh budget-below
ck manifest "$dir/budget-below" 'm["time_budget_steps"] = 1'
both "manifest: time_budget_steps below step" 'field "time_budget_steps" 1 is below field "step" 2' "$dir/budget-below"
fresh budget-text
ck manifest "$dir/budget-text" 'm["time_budget_steps"] = "many"'
both "manifest: time_budget_steps a string" 'field "time_budget_steps" must be an integer in [0, 2147483647]' "$dir/budget-text"
fresh fifo-shard
rm "$dir/fifo-shard/shard-00000.safetensors"
mkfifo "$dir/fifo-shard/shard-00000.safetensors"
both "shard is a FIFO" 'shard shard-00000.safetensors is not a regular file' "$dir/fifo-shard"
fresh dir-shard
rm "$dir/dir-shard/shard-00000.safetensors"
mkdir "$dir/dir-shard/shard-00000.safetensors"
both "shard is a folder" 'shard shard-00000.safetensors is not a regular file' "$dir/dir-shard"
fresh dup
ck manifest "$dir/dup" 'm["tensors"]["model.embed_tokens.weight"] = "shard-00001.safetensors"'
both "manifest: tensor in an unlisted shard" 'tensor model.embed_tokens.weight is in shard shard-00001.safetensors, which "shards" does not list' "$dir/dup"

# --- 2. nothing the program reads can crash it ------------------------------------------------------
deep '' '' > "$dir/deep.json"
expect "deep JSON: train --config" 'deep.json: JSON nested deeper than 256 levels (at byte 256)' \
  "${common[@]}" --config "$dir/deep.json" --out "$dir/o-deep"
expect "deep JSON: plan --model" 'deep.json: JSON nested deeper than 256 levels' plan --model "$dir/deep.json" --gpus 8
expect "deep JSON: plan --cluster" 'deep.json: JSON nested deeper than 256 levels' plan --cluster "$dir/deep.json" --gpus 8
deep '{"expert_loads": ' '}' > "$dir/deep.jsonl"
expect "deep JSON: plan --loads" 'deep.jsonl: line 1: JSON nested deeper than 256 levels' \
  plan --model tiny --gpus 2 --loads "$dir/deep.jsonl"
fresh deep-manifest
deep '{"format": "moetrain-checkpoint-1", "x": ' '}' > "$dir/deep-manifest/manifest.json"
both "deep JSON: manifest" 'manifest.json: JSON nested deeper than 256 levels' "$dir/deep-manifest"
fresh deep-header
ck deep_header "$dir/deep-header"  # checksum and size updated: the header itself must be refused
both "deep JSON: safetensors header" 'shard-00000.safetensors: header: JSON nested deeper than 256 levels' "$dir/deep-header"
echo '{"expert_loads": [[1e999, 2]]}' > "$dir/inf.jsonl"
expect "plan --loads: a load of 1e999 (beyond double)" "inf.jsonl: line 1: not valid JSON ([json.exception.out_of_range.406] number overflow (beyond a 64-bit double))" plan --model tiny --gpus 2 --loads "$dir/inf.jsonl"
echo '{"expert_loads": [[1e308, 1e308]]}' > "$dir/huge-loads.jsonl"
expect "plan --loads: loads of 1e308 (their sum overflows)" "huge-loads.jsonl: line 1: expert load 1e+308 is not a count (0 to 2^53)" plan --model tiny --gpus 2 --loads "$dir/huge-loads.jsonl"
head -c 100000000 /dev/zero > "$dir/zeros.json" 2>/dev/null || true
expect "config of 100 MB" 'zeros.json: config file is 100000000 bytes, more than the limit of 67108864' \
  "${common[@]}" --config "$dir/zeros.json" --out "$dir/o-zeros"
rm -f "$dir/zeros.json"
expect "config is /dev/zero" '/dev/zero: config file is more than the limit of 67108864 bytes' \
  "${common[@]}" --config /dev/zero --out "$dir/o-devzero"
expect "config is a folder" 'is a folder, not a config file' "${common[@]}" --config "$dir" --out "$dir/o-folder"
expect "--loads is /dev/zero" '/dev/zero: line 1 is longer than 67108864 bytes' plan --model tiny --gpus 2 --loads /dev/zero
echo '{"step": 1, "expert_loads": [[5, 3, 2, 1]]}' > "$dir/e4.jsonl"
expect "plan --loads of a model with 4 experts for tiny (8)" \
  'e4.jsonl: the expert loads have 4 experts per MoE layer, model tiny has 8 (loads of another model?)' \
  plan --model tiny --gpus 2 --loads "$dir/e4.jsonl"

cfg() {  # cfg FILE PYTHON-EDIT: a test-dense-like config.json with one edit applied to c
  "$py" - "$1" "$2" <<'PY'
import json, sys
c = {"model_type": "deepseek", "vocab_size": 256, "hidden_size": 32, "num_hidden_layers": 2,
     "num_attention_heads": 2, "intermediate_size": 48}
exec(sys.argv[2])
open(sys.argv[1], "w").write(json.dumps(c))
PY
}
# vocab * hidden = 2^61: 16 bytes a parameter would wrap to 2^65.
cfg "$dir/overflow.json" 'c.update(vocab_size=2**31 - 1, hidden_size=2**30)'
expect "config: vocab_size * hidden_size overflows" \
  'overflow.json: vocab_size * hidden_size = 2147483647 * 1073741824 exceeds 288230376151711744 parameters' \
  "${common[@]}" --config "$dir/overflow.json" --out "$dir/o-ovf"
expect "plan: vocab_size * hidden_size overflows" 'overflow.json: vocab_size * hidden_size = 2147483647 * 1073741824 exceeds' \
  plan --model "$dir/overflow.json" --gpus 8
# 4 layers * 4 * H^2 with H = 2^30 is exactly 2^64: wrapped, the layer count gave 0 bytes.
cfg "$dir/wrap0.json" 'c.update(hidden_size=2**30, num_hidden_layers=4, num_attention_heads=2**20)'
expect "config: 4 * hidden_size^2 per layer (sums to 2^64)" \
  'wrap0.json: 4 * hidden_size * hidden_size = 4294967296 * 1073741824 exceeds' \
  "${common[@]}" --config "$dir/wrap0.json" --out "$dir/o-wrap0"
cfg "$dir/experts.json" 'c.update(n_routed_experts=2**31 - 1, num_experts_per_tok=1, moe_intermediate_size=1, hidden_size=2, num_attention_heads=1)'
expect "config: 2^31 experts (tensor count)" 'experts.json: n_routed_experts = 2147483647 over 2 MoE layers gives more than 1048576 named tensors' \
  "${common[@]}" --config "$dir/experts.json" --out "$dir/o-experts"
cfg "$dir/layers.json" 'c.update(num_hidden_layers=2**31 - 1)'
expect "config: 2^31 layers" 'layers.json: "num_hidden_layers" = 2147483647 gives more than 1048576 named tensors' \
  "${common[@]}" --config "$dir/layers.json" --out "$dir/o-layers"
cfg "$dir/mixtral.json" 'c.update(model_type="mixtral", num_hidden_layers=2**40, num_local_experts=8, num_experts_per_tok=2)'
expect "plan: num_hidden_layers 2^40 (mixtral)" 'mixtral.json: field "num_hidden_layers" = 1099511627776 is out of range [-2147483648, 2147483647]' \
  plan --model "$dir/mixtral.json" --gpus 8
"$bin" plan --cluster dgx-h100 --save-cluster "$dir/dgx.json" >/dev/null
"$py" -c "
import json; p = json.load(open('$dir/dgx.json')); p['nodes'] = 2**32 + 1
json.dump(p, open('$dir/dgx-wrap.json', 'w'))"
expect "profile: nodes 2^32+1 (wrapped to 1 before)" 'dgx-wrap.json: field "nodes" = 4294967297 is out of range' \
  plan --cluster "$dir/dgx-wrap.json" --gpus 8
fresh config-overflow
ck manifest "$dir/config-overflow" 'm["config"].update(vocab_size=2**31 - 1, hidden_size=2**30)'
expect "manifest: config whose sizes overflow (export)" \
  'config-overflow/manifest.json: vocab_size * hidden_size = 2147483647 * 1073741824 exceeds' export "$dir/config-overflow" "$dir/x-config-overflow"
fresh offsets
"$py" - "$dir/offsets/shard-00000.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n]); h["lm_head.weight"]["data_offsets"] = [0, 2**64 - 1]
t = json.dumps(h).encode(); t += b" " * ((8 - len(t) % 8) % 8)
open(p, "wb").write(struct.pack("<Q", len(t)) + t + raw[8 + n:])
PY
ck rehash "$dir/offsets"
both "safetensors header: data_offsets [0, 2^64-1]" 'tensor "lm_head.weight": data_offsets [0, 18446744073709551615] out of bounds' "$dir/offsets"
fresh seed-text
ck manifest "$dir/seed-text" 'm["data_rng_state"] = "12abc"'
both "manifest: data_rng_state \"12abc\" (was a bare stoull)" 'field "data_rng_state": "12abc" is not an integer' "$dir/seed-text"

# --- 4. non-finite state is refused on load ---------------------------------------------------------
fresh nan
ck poke "$dir/nan" model.layers.1.mlp.down_proj.weight 7 nan
both "NaN weight" 'shard-00000.safetensors: tensor "model.layers.1.mlp.down_proj.weight" holds NaN at [0, 7]' "$dir/nan"
fresh inf-row
# Row 255 of the embedding: text.txt is ASCII, the data never reads that row.
ck poke "$dir/inf-row" model.embed_tokens.weight $((255 * 32 + 3)) inf
both "Inf in an embedding row the data never reads" 'tensor "model.embed_tokens.weight" holds +Inf at [255, 3]' "$dir/inf-row"
fresh nan-m
ck poke "$dir/nan-m" adam_m.model.norm.weight 0 nan
expect "NaN AdamW moment m (--resume)" 'tensor "adam_m.model.norm.weight" holds NaN at [0]' \
  "${common[@]}" --steps 4 --out "$dir/o-nan-m" --resume "$dir/nan-m"
fresh neg-v
ck poke "$dir/neg-v" adam_v.lm_head.weight 5 -1
expect "negative AdamW second moment (--resume)" 'tensor "adam_v.lm_head.weight" holds a negative second moment -1 at element 5' \
  "${common[@]}" --steps 4 --out "$dir/o-neg-v" --resume "$dir/neg-v"

# --- the same on 2 ranks: refused in setup, reported once, no rank left waiting ---------------------
if command -v mpirun >/dev/null; then
  moe=(train --preset test-moe --steps 2 --batch 2 --seq-len 16 --eval-batches 1 --quiet --data "$dir/text.txt")
  "$bin" "${moe[@]}" --steps 1 --out "$dir/moe" >/dev/null
  expect_mpi() {  # expect_mpi NAME PATTERN CKPT: resume CKPT on 2 ranks (EP 2)
    local out rc=0 n
    out="$(timeout 120 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -np 2 "$bin" "${moe[@]}" --ep 2 \
           --out "$dir/o-mpi-$n_out" --resume "$3" 2>&1)" || rc=$?
    n_out=$((n_out + 1))
    n=$(printf '%s\n' "$out" | grep -c "^moetrain: error" || true)
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -lt 128 ] && [ "$n" -eq 1 ] && grep -qF -- "$2" <<<"$out"; then
      ok "$1: $(printf '%s\n' "$out" | grep "^moetrain: error" | sed "s|$dir|T|g")"
    else
      bad "$1: rc=$rc error lines=$n output: ${out:0:600}"
    fi
  }
  rm -rf "$dir/moe-nan"; cp -r "$dir/moe/checkpoints/step-1" "$dir/moe-nan"
  # Expert 7 lives on EP rank 1 only: rank 0 never loads it, yet the whole job refuses once.
  ck poke "$dir/moe-nan" model.layers.2.mlp.experts.7.up_proj.weight 3 nan
  expect_mpi "2 ranks: NaN in an expert only rank 1 holds" 'tensor "model.layers.2.mlp.experts.7.up_proj.weight" holds NaN at [0, 3]' "$dir/moe-nan"
  rm -rf "$dir/moe-link"; cp -r "$dir/moe/checkpoints/step-1" "$dir/moe-link"
  mv "$dir/moe-link/shard-00000.safetensors" "$dir/moe-outside.safetensors"
  ln -s "$dir/moe-outside.safetensors" "$dir/moe-link/shard-00000.safetensors"
  expect_mpi "2 ranks: shard is a symlink out of the folder" 'shard shard-00000.safetensors is a symbolic link' "$dir/moe-link"
fi

# --- stray checkpoint folders break neither saving nor --resume latest -------------------------------
run="$dir/stray"
"$bin" "${common[@]}" --out "$run" --checkpoint.every 1 >/dev/null
mkdir -p "$run/checkpoints/step-99999999999" "$run/checkpoints/step-abc" "$run/checkpoints/step-007" \
         "$run/checkpoints/step--3"
cp "$good/manifest.json" "$run/checkpoints/step-99999999999/"
cp "$good/manifest.json" "$run/checkpoints/step-007/"
mkdir -p "$dir/elsewhere"; cp -r "$dir/nan" "$dir/elsewhere/step-50"
ln -s "$dir/elsewhere/step-50" "$run/checkpoints/step-50"  # a symlink out: not a checkpoint
err=""; rc=0
err="$("$bin" "${common[@]}" --steps 4 --out "$run" --resume latest --checkpoint.every 1 --checkpoint.keep 2 2>&1 >/dev/null)" || rc=$?
if [ "$rc" -eq 0 ] && [ -f "$run/checkpoints/step-4/manifest.json" ] && [ -d "$run/checkpoints/step-99999999999" ] \
   && [ ! -e "$run/checkpoints/step-1" ] && [ -L "$run/checkpoints/step-50" ] && [ -f "$dir/elsewhere/step-50/manifest.json" ]; then
  ok "stray step-99999999999, step-abc, step-007, step--3, symlinked step-50: resume latest from step-2, save and prune work"
else
  bad "stray checkpoint folders: rc=$rc $(ls "$run/checkpoints" | tr '\n' ' ') stderr: ${err:0:400}"
fi

# --- issue 42, class 1: export folders and datasets are untrusted input, like checkpoints -----------
# section TITLE TEXT: in --markdown, a new table for the rows that follow.
section() {
  [ "$markdown" -eq 1 ] || return 0
  printf '\n## %s\n\n%s\n\n| case | command | error printed |\n|---|---|---|\n' "$1" "$2"
}
# A file standing in for /etc/passwd: its text and its first 8 bytes read as a little-endian
# number (what a safetensors reader takes for the header length) must appear in no error.
printf 'root:x:0:0:root:/root:/bin/bash\nSECRET-LINE-2\n' > "$dir/secret"
secret_num="$("$py" -c "import struct,sys; print(struct.unpack('<Q', open(sys.argv[1],'rb').read(8))[0])" "$dir/secret")"
# snap FILE...: kind, size and bytes of each FILE (a symlink by its target path), to compare later.
snap() {
  local f
  for f in "$@"; do
    if [ -L "$f" ]; then echo "link $(readlink "$f")"; elif [ -p "$f" ]; then echo fifo; elif [ -f "$f" ]; then
      echo "file $(sha1sum < "$f")"; elif [ -e "$f" ]; then echo other; else echo none; fi
  done
}
# expect_safe NAME PATTERN "PROTECTED FILES" ARGS...: as expect; also no bytes of the secret in the
# error, and every protected file exactly as it was.
expect_safe() {
  local name="$1" pattern="${2//T\//$dir/}" keep="$3" before
  shift 3
  # shellcheck disable=SC2086
  before="$(snap $keep)"
  expect "$name" "$pattern" "$@"
  if printf '%s' "$last_err" | grep -qE "root:x|SECRET|$secret_num"; then
    bad "$name: the error quotes a file's bytes: $last_err"
  fi
  # shellcheck disable=SC2086
  [ "$(snap $keep)" = "$before" ] || bad "$name: a protected file changed ($keep)"
}
section "Export folders and datasets: untrusted input, like checkpoints" \
"Every row is a real run of \`tests/hostile_files.sh\` (issue 42, class 1). Every file moetrain reads as
data is opened as a checkpoint's shards are: a regular file (by \`fstat\` on the descriptor, opened
without blocking), sized on that descriptor, and, for a file found inside a folder or beside a
dataset prefix, with \`O_NOFOLLOW\`: a symbolic link there is refused, never followed out of the
folder. \`T/secret\` stands in for \`/etc/passwd\`: no error quotes its bytes (neither its text nor its
first 8 bytes read as the safetensors header length). Tensor names are at most 1024 bytes."
"$bin" export "$good" "$dir/exp" >/dev/null
"$bin" export "$good" "$dir/exp-sharded" --shard-mb 0.02 >/dev/null
[ -f "$dir/exp-sharded/model.safetensors.index.json" ] || bad "setup: the sharded export has no index"
model_copy() { rm -rf "${dir:?}/$2"; cp -r "$dir/$1" "$dir/$2"; rm -f "$dir/$2/.moetrain.lock"; }
model_copy exp m-link
ln -sf "$dir/secret" "$dir/m-link/model.safetensors"
for c in generate eval inspect; do
  case $c in
    generate) args=(generate "$dir/m-link" --prompt In --tokens 2) ;;
    eval) args=(eval "$dir/m-link" --seq-len 8 --data "$dir/text.txt") ;;
    inspect) args=(inspect "$dir/m-link") ;;
  esac
  expect_safe "$c: model.safetensors is a symlink out of the folder" \
    'm-link: weight file model.safetensors is a symbolic link (refused: a model folder reads only plain files inside its folder)' \
    "$dir/secret" "${args[@]}"
done
model_copy exp m-cfg-link
ln -sf "$dir/secret" "$dir/m-cfg-link/config.json"
for c in generate eval inspect; do
  case $c in
    generate) args=(generate "$dir/m-cfg-link" --prompt In --tokens 2) ;;
    eval) args=(eval "$dir/m-cfg-link" --seq-len 8 --data "$dir/text.txt") ;;
    inspect) args=(inspect "$dir/m-cfg-link") ;;
  esac
  expect_safe "$c: config.json is a symlink out of the folder" \
    'm-cfg-link/config.json: is a symbolic link (refused: a config file is read only as a plain file inside its folder' \
    "$dir/secret" "${args[@]}"
done
model_copy exp-sharded m-shard-link
shard1="$(ls "$dir/m-shard-link" | grep -m1 '^model-00001-of-')"
cp "$dir/m-shard-link/$shard1" "$dir/outside-shard.safetensors"
ln -sf "$dir/outside-shard.safetensors" "$dir/m-shard-link/$shard1"  # same bytes: only the link is wrong
expect_safe "generate: an index shard is a symlink out of the folder" \
  "m-shard-link: weight file $shard1 is a symbolic link (refused: a model folder reads only plain files" \
  "$dir/outside-shard.safetensors" generate "$dir/m-shard-link" --prompt In --tokens 2
expect_safe "inspect: an index shard is a symlink out of the folder" \
  "m-shard-link: weight file $shard1 is a symbolic link (refused" "$dir/outside-shard.safetensors" inspect "$dir/m-shard-link"
model_copy exp-sharded m-index-dotdot
"$py" - "$dir/m-index-dotdot/model.safetensors.index.json" <<'PY'
import json, sys
p = sys.argv[1]; j = json.load(open(p)); k = next(iter(j["weight_map"]))
j["weight_map"][k] = "../outside-shard.safetensors"; json.dump(j, open(p, "w"))
PY
expect_safe "eval: index names ../outside-shard.safetensors" \
  '"../outside-shard.safetensors" is not a plain file name inside the folder' "$dir/outside-shard.safetensors" \
  eval "$dir/m-index-dotdot" --seq-len 8 --data "$dir/text.txt"
model_copy exp-sharded m-index-link
mv "$dir/m-index-link/model.safetensors.index.json" "$dir/outside-index.json"
ln -s "$dir/outside-index.json" "$dir/m-index-link/model.safetensors.index.json"
expect_safe "generate: model.safetensors.index.json is a symlink" \
  'model.safetensors.index.json: is a symbolic link (refused: a safetensors index is read only as a plain file inside its folder' \
  "$dir/outside-index.json" generate "$dir/m-index-link" --prompt In --tokens 2
# The secret copied in (a regular file, not a link): the error still quotes none of its bytes.
model_copy exp m-passwd
cp "$dir/secret" "$dir/m-passwd/model.safetensors"
expect_safe "generate: model.safetensors holding /etc/passwd's text (its bytes not quoted)" \
  'model.safetensors: the header length field (the first 8 bytes) exceeds the limit of 104857600 bytes: not a safetensors file?' \
  "$dir/secret" generate "$dir/m-passwd" --prompt In --tokens 2
model_copy exp m-passwd-cfg
cp "$dir/secret" "$dir/m-passwd-cfg/config.json"
expect_safe "eval: config.json holding /etc/passwd's text (its bytes not quoted)" \
  'm-passwd-cfg/config.json: not valid JSON ([json.exception.parse_error.101] parse error at line 1, column 1: syntax error while parsing value - invalid literal)' \
  "$dir/secret" eval "$dir/m-passwd-cfg" --seq-len 8 --data "$dir/text.txt"
expect_safe "train --config holding /etc/passwd's text (its bytes not quoted)" \
  'secret: not valid JSON ([json.exception.parse_error.101] parse error at line 1, column 1: syntax error while parsing value - invalid literal)' \
  "$dir/secret" "${common[@]}" --config "$dir/secret" --out "$dir/o-passwd"
# One tensor name of 40,000 characters: inspect used to overflow its stack in a recursive
# std::regex; --resume and export accepted the checkpoint. Names are bounded on read.
"$py" - "$dir/longname.safetensors" <<'PY'
import json, struct, sys
h = json.dumps({"model.layers.0.mlp.experts." + "7" * 40000 + ".w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<f", 1.0))
PY
expect_safe "inspect: one tensor name of 40,000 characters (was a segfault)" \
  'longname.safetensors: a tensor name of 40029 bytes in the header is longer than the limit of 1024' \
  "$dir/longname.safetensors" inspect "$dir/longname.safetensors"
# At the limit the name is listed, its expert index folded by a linear scan (no regex).
"$py" - "$dir/name1000.safetensors" <<'PY'
import json, struct, sys
name = "a" * (1024 - len(".experts.7.up_proj.weight")) + ".experts.7.up_proj.weight"
h = json.dumps({name: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<f", 1.0))
PY
if out="$("$bin" inspect "$dir/name1000.safetensors" 2>&1)" && grep -qF 'x1 (experts 7..7)' <<<"$out"; then
  ok "inspect: a 1024-byte expert tensor name is listed and folded"
else
  bad "inspect: a 1024-byte tensor name: ${out:0:300}"
fi
fresh longname
"$py" - "$dir/longname/shard-00000.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n]); data = raw[8 + n:]
h["x" * 40000] = {"dtype": "F32", "shape": [1], "data_offsets": [len(data), len(data) + 4]}
t = json.dumps(h).encode(); t += b" " * ((8 - len(t) % 8) % 8)
open(p, "wb").write(struct.pack("<Q", len(t)) + t + data + struct.pack("<f", 1.0))
PY
ck rehash "$dir/longname"  # size and checksum consistent: the name itself must be refused
both "checkpoint shard with a 40,000-character tensor name" 'a tensor name of 40000 bytes in the header is longer than the limit of 1024' "$dir/longname"
# Datasets: PREFIX.bin, PREFIX.idx and the sidecar sit beside the prefix; a link there is refused.
"$bin" tokenize --input "$dir/text.txt" --tokenizer bytes --docs line --output "$dir/ds" --quiet
ds_copy() { rm -f "$dir/$1".*; for e in bin idx tokenizer.json; do cp "$dir/ds.$e" "$dir/$1.$e"; done; }
ds_copy ds-bin-link
mv "$dir/ds-bin-link.bin" "$dir/outside.bin"
ln -s "$dir/outside.bin" "$dir/ds-bin-link.bin"
expect_safe "train --data: PREFIX.bin is a symlink" \
  'ds-bin-link.bin: is a symbolic link (refused: a dataset token file is read only as a plain file inside its folder' \
  "$dir/outside.bin" "${common[@]}" --data "$dir/ds-bin-link" --out "$dir/o-ds-link"
expect_safe "eval --data: PREFIX.bin is a symlink" \
  'ds-bin-link.bin: is a symbolic link (refused' "$dir/outside.bin" eval "$dir/exp" --seq-len 8 --data "$dir/ds-bin-link"
expect_safe "inspect: PREFIX.bin is a symlink" \
  'ds-bin-link.bin: is a symbolic link (refused' "$dir/outside.bin" inspect "$dir/ds-bin-link"
ds_copy ds-side-link
mv "$dir/ds-side-link.tokenizer.json" "$dir/outside.tokenizer.json"
ln -s "$dir/outside.tokenizer.json" "$dir/ds-side-link.tokenizer.json"
expect_safe "train --data: the tokenizer sidecar is a symlink" \
  'ds-side-link.tokenizer.json: is a symbolic link (refused: a tokenizer sidecar is read only as a plain file inside its folder' \
  "$dir/outside.tokenizer.json" "${common[@]}" --data "$dir/ds-side-link" --out "$dir/o-side-link"
ds_copy ds-idx-fifo
rm "$dir/ds-idx-fifo.idx"; mkfifo "$dir/ds-idx-fifo.idx"
expect_safe "inspect: PREFIX.idx is a FIFO (refused, not waited on)" \
  'ds-idx-fifo.idx: dataset index is not a regular file (it is a FIFO (named pipe))' "" \
  inspect "$dir/ds-idx-fifo"

# --- issue 42, class 2: outputs never clobber what they must not ---------------------------------------
section "Outputs that never clobber" \
"Every row is a real run of \`tests/hostile_files.sh\` (issue 42, class 2). An output is a new or
regular file, never a symbolic link, device, FIFO or folder; it is never one of the run's inputs
(same device and inode; a folder read as a whole stands for every file in it); it is written beside
its place under a temporary name created with \`O_CREAT | O_EXCL | O_NOFOLLOW\` and renamed. Each
refusal leaves the protected file as it was (checked). No test writes to a real device: a FIFO and a
symlink inside the test's folder stand in for \`/dev/full\`."
echo "victim: must stay as it is" > "$dir/victim"
mkfifo "$dir/out-fifo"
ln -s "$dir/victim" "$dir/out-link"
expect_safe "eval --dump onto a FIFO (stands in for a device)" \
  'out-fifo: is a FIFO (named pipe); an output must be a new or regular file' "$dir/out-fifo" \
  eval "$dir/exp" --seq-len 8 --data "$dir/text.txt" --dump "$dir/out-fifo"
expect_safe "eval --dump onto a symlink" \
  '--dump T/out-link: is a symbolic link; an output is written only as a new or regular file, never through a link' \
  "$dir/out-link $dir/victim" eval "$dir/exp" --seq-len 8 --data "$dir/text.txt" --dump "$dir/out-link"
expect_safe "eval --dump onto its own --data (was exit 0, data destroyed)" \
  "--dump T/text.txt: is the input T/text.txt; an output never overwrites one of the run's inputs" \
  "$dir/text.txt" eval "$dir/exp" --seq-len 8 --data "$dir/text.txt" --dump "$dir/text.txt"
expect_safe "eval --dump onto the model's own weights" \
  "--dump T/exp/model.safetensors: is the input T/exp/model.safetensors" \
  "$dir/exp/model.safetensors" eval "$dir/exp" --seq-len 8 --data "$dir/text.txt" --dump "$dir/exp/model.safetensors"
expect_safe "eval --dump onto its dataset's .bin" \
  "--dump T/ds.bin: is the input T/ds.bin" "$dir/ds.bin" eval "$dir/exp" --seq-len 8 --data "$dir/ds" --dump "$dir/ds.bin"
expect_safe "plan --save-cluster onto a symlink" \
  '--save-cluster T/out-link: is a symbolic link' "$dir/out-link $dir/victim" \
  plan --cluster dgx-h100 --save-cluster "$dir/out-link"
expect_safe "plan --save-cluster onto a FIFO (stands in for /dev/full)" \
  '--save-cluster T/out-fifo: is a FIFO (named pipe)' "$dir/out-fifo" plan --cluster dgx-h100 --save-cluster "$dir/out-fifo"
expect_safe "plan --save-cluster onto its own --cluster profile" \
  '--save-cluster T/dgx.json: is the input T/dgx.json' "$dir/dgx.json" \
  plan --cluster "$dir/dgx.json" --save-cluster "$dir/dgx.json"
expect_safe "report -o onto the run's metrics.jsonl" \
  "-o T/run/metrics.jsonl: is the input T/run/metrics.jsonl" "$dir/run/metrics.jsonl" \
  report "$dir/run" -o "$dir/run/metrics.jsonl"
expect_safe "report -o onto a FIFO" '-o T/out-fifo: is a FIFO' "$dir/out-fifo" report "$dir/run" -o "$dir/out-fifo"
cp "$dir/text.txt" "$dir/in.bin"
expect_safe "tokenize --output whose PREFIX.bin is its --input" \
  '--output T/in.bin: is the input T/in.bin' "$dir/in.bin" tokenize --input "$dir/in.bin" --tokenizer bytes --output "$dir/in"
ln -sf "$dir/victim" "$dir/tok-link.idx"
expect_safe "tokenize --output whose PREFIX.idx is a symlink" \
  '--output T/tok-link.idx: is a symbolic link' "$dir/tok-link.idx $dir/victim" \
  tokenize --input "$dir/text.txt" --tokenizer bytes --output "$dir/tok-link"
mkdir -p "$dir/x-cfg-link"; ln -sf "$dir/victim" "$dir/x-cfg-link/config.json"
expect_safe "export OUT whose config.json is a symlink" \
  'export OUT T/x-cfg-link/config.json: is a symbolic link' "$dir/x-cfg-link/config.json $dir/victim" export "$good" "$dir/x-cfg-link"
expect_safe "export into the checkpoint it reads" \
  "export OUT T/run/checkpoints/step-2: is the checkpoint folder it reads" "$good/manifest.json $good/shard-00000.safetensors" \
  export "$good" "$good"
mkdir -p "$dir/o-metrics-link"; ln -sf "$dir/victim" "$dir/o-metrics-link/metrics.jsonl"
expect_safe "train --out whose metrics.jsonl is a symlink" \
  '--out T/o-metrics-link/metrics.jsonl: is a symbolic link' "$dir/o-metrics-link/metrics.jsonl $dir/victim" \
  "${common[@]}" --out "$dir/o-metrics-link"
mkdir -p "$dir/o-lock-link"; ln -sf "$dir/victim" "$dir/o-lock-link/.moetrain.lock"
expect_safe "train --out with a symlink planted at .moetrain.lock (was truncated through)" \
  '--out T/o-lock-link/.moetrain.lock: is a symbolic link; the lock file is written only as a new or regular file' \
  "$dir/o-lock-link/.moetrain.lock $dir/victim" "${common[@]}" --out "$dir/o-lock-link"
mkdir -p "$dir/o-cfg"; cp "$dir/run/config.json" "$dir/o-cfg/config.json"
expect_safe "train --config onto the config.json its --out would rewrite" \
  '--out T/o-cfg/config.json: is the input T/o-cfg/config.json' "$dir/o-cfg/config.json" \
  "${common[@]}" --config "$dir/o-cfg/config.json" --out "$dir/o-cfg"
# A symlink planted at the temporary names tokenize (PREFIX.bin.tmp, PREFIX.idx.tmp) and report
# (report.html.tmp) used: the target stays as it was, the output is complete and correct.
planted() {  # planted NAME "PLANTED LINKS" CHECK-COMMAND ARGS...: exit 0, victim unchanged, CHECK passes
  local name="$1" links="$2" check="$3" before rc=0 err
  shift 3
  before="$(snap "$dir/victim")"
  err="$("$bin" "$@" 2>&1 >/dev/null)" || rc=$?
  if [ "$rc" -eq 0 ] && [ "$(snap "$dir/victim")" = "$before" ] && eval "$check"; then
    local l ok_links=1
    for l in $links; do [ -L "$l" ] || ok_links=0; done
    if [ "$ok_links" -eq 1 ]; then
      ok "$name: exit 0, the link's target untouched, the output correct"
      if [ "$markdown" -eq 1 ]; then
        local cmd="moetrain" a
        for a in "$@"; do cmd+=" ${a//$dir/T}"; done
        printf '| %s | `%s` | exit 0; the planted link and its target untouched, the output correct |\n' "$name" "$cmd"
      fi
      return
    fi
  fi
  bad "$name: rc=$rc stderr: ${err:0:400}"
}
rm -f "$dir/tok.bin.tmp" "$dir/tok.idx.tmp"
ln -s "$dir/victim" "$dir/tok.bin.tmp"
ln -s "$dir/victim" "$dir/tok.idx.tmp"
planted "tokenize with symlinks planted at PREFIX.bin.tmp and PREFIX.idx.tmp" "$dir/tok.bin.tmp $dir/tok.idx.tmp" \
  'cmp -s "$dir/tok.bin" "$dir/ds.bin" && cmp -s "$dir/tok.idx" "$dir/ds.idx"' \
  tokenize --input "$dir/text.txt" --tokenizer bytes --docs line --output "$dir/tok" --quiet
rm -f "$dir/run/report.html" "$dir/run/report.html.tmp"
ln -s "$dir/victim" "$dir/run/report.html.tmp"
planted "report with a symlink planted at report.html.tmp" "$dir/run/report.html.tmp" \
  'grep -q "</html>" "$dir/run/report.html" && [ ! -L "$dir/run/report.html" ]' report "$dir/run"
[ -z "$(find "$dir" -name '*.tmp.[0-9]*')" ] || bad "a temporary file was left behind: $(find "$dir" -name '*.tmp.[0-9]*')"
echo "$pass passed, $fail failed" >&2
[ "$fail" -eq 0 ]
