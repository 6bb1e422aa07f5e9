#!/usr/bin/env bash
# DeepSeek-V3's architecture through the files (issue 40): test-v3 (multi-head latent attention,
# sigmoid routing with the selection bias, a multi-token-prediction module) trained on EP 2, then
#  1. export keeps the MTP module (DeepSeek-V3's layer L names) or drops it (--mtp drop, config
#     num_nextn_predict_layers 0), and writes every MoE layer's e_score_correction_bias;
#  2. moetrain eval of both exports gives the run's own held-out loss, and the independent PyTorch
#     model recomputes it from the export (MLA, the biases: tests/reference/eval_hf.py);
#  3. generate runs on the checkpoint and on the export with the same greedy text; an export whose
#     bias tensor was removed is refused, naming the tensor;
#  4. a folder with DeepSeek-V3's copies of the embedding and head in its MTP layer loads.
# Usage: deepseek_v3.sh MOETRAIN PYTHON CORPUS WORK        (about 20 s)
set -euo pipefail
bin="$1"; py="$2"; corpus="$3"; work="$4"
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
scratch "$work"
mpi 2 "$bin" train --preset test-v3 --steps 6 --seq-len 32 \
  --batch 4 --ep 2 --eval-every 6 --eval-batches 2 --quiet --data "$corpus" --out "$work/run"
ckpt="$work/run/checkpoints/step-6"
"$bin" export "$ckpt" "$work/keep" >/dev/null
"$bin" export "$ckpt" "$work/drop" --mtp drop >/dev/null
"$py" - "$work" <<'PY'
import json, struct, sys
w = sys.argv[1]
def names(d):
    f = open(f"{w}/{d}/model.safetensors", "rb"); n = struct.unpack("<Q", f.read(8))[0]
    return set(json.loads(f.read(n))) - {"__metadata__"}
cfg = json.load(open(f"{w}/keep/config.json"))
L = cfg["num_hidden_layers"]
assert cfg["model_type"] == "deepseek_v3" and cfg["architectures"] == ["DeepseekV3ForCausalLM"], cfg
for f in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
          "num_nextn_predict_layers", "n_group", "topk_group", "topk_method", "scoring_func"):
    assert f in cfg, f"config.json lacks {f}"
keep, drop = names("keep"), names("drop")
mtp = {n for n in keep if n.startswith(f"model.layers.{L}.")}
assert {f"model.layers.{L}.{t}.weight" for t in ("enorm", "hnorm", "eh_proj", "shared_head.norm")} <= mtp, sorted(mtp)[:5]
assert keep - drop == mtp and not drop - keep, "drop removes exactly the MTP module"
assert json.load(open(f"{w}/drop/config.json"))["num_nextn_predict_layers"] == 0
bias = {n for n in keep if n.endswith("e_score_correction_bias")}
moe = [i for i in range(L) if i >= cfg["first_k_dense_replace"]]
assert bias == {f"model.layers.{i}.mlp.gate.e_score_correction_bias" for i in moe}, sorted(bias)
print(f"export: {len(keep)} tensors kept, {len(mtp)} of the MTP module dropped by --mtp drop, {len(bias)} biases")
PY
ok "export keeps / drops the MTP module and writes the selection biases"
for d in keep drop; do
  "$bin" eval "$work/$d" --data "$corpus" --batch 8 --seq-len 32 --eval-batches 2 --dump "$work/val-$d.safetensors" \
    | tee "$work/eval-$d.txt"
done
"$py" - "$work" <<'PY'
import json, re, sys
w = sys.argv[1]
val = [json.loads(l)["val_loss"] for l in open(f"{w}/run/metrics.jsonl") if "val_loss" in json.loads(l)][-1]
got = {d: float(re.search(r"held-out loss ([0-9.]+)", open(f"{w}/eval-{d}.txt").read()).group(1)) for d in ("keep", "drop")}
err = max(abs(g - val) / val for g in got.values())
print(f"eval keep {got['keep']:.6f} drop {got['drop']:.6f} vs the run's final val_loss {val:.6f}: relative {err:.1e}")
sys.exit(0 if err <= 1e-6 else 1)
PY
ok "eval of both exports = the run's held-out loss"
"$py" "$here/reference/eval_hf.py" "$work/keep" "$work/val-keep.safetensors"
ok "PyTorch recomputes the held-out loss from the export (MLA, selection biases)"
a=$("$bin" generate "$ckpt" --prompt "In the beginning" --tokens 24 --temperature 0 2>/dev/null)
b=$("$bin" generate "$work/keep" --prompt "In the beginning" --tokens 24 --temperature 0 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "FAIL: generate differs: '$a' vs '$b'"; exit 1; }
ok "generate: the checkpoint and the export give the same greedy text"
mkdir -p "$work/nobias"
cp "$work/keep/config.json" "$work/nobias/"
"$py" - "$work/keep/model.safetensors" "$work/nobias/model.safetensors" <<'PY'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
f = open(src, "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n)); data = f.read()
gone = sorted(k for k in h if k.endswith("e_score_correction_bias"))[0]
del h[gone]
out, pos = {}, 0
parts = []
for k, v in h.items():
    if k == "__metadata__": out[k] = v; continue
    b, e = v["data_offsets"]; parts.append(data[b:e]); out[k] = dict(v, data_offsets=[pos, pos + e - b]); pos += e - b
hb = json.dumps(out).encode(); hb += b" " * (-len(hb) % 8)
open(dst, "wb").write(struct.pack("<Q", len(hb)) + hb + b"".join(parts))
print(gone)
PY
if "$bin" generate "$work/nobias" --prompt "In" --tokens 4 >"$work/nobias.out" 2>&1; then
  not_ok "an export without its selection bias was accepted"
elif grep -q 'e_score_correction_bias" is missing' "$work/nobias.out"; then
  ok "an export without a selection bias is refused: $(tail -1 "$work/nobias.out")"
else
  not_ok "an export without a selection bias: $(tail -1 "$work/nobias.out")"
fi
# DeepSeek-V3's own checkpoints repeat the embedding and the head in the MTP layer: a folder with
# those copies loads (they are the main model's here) and evaluates to the same loss.
mkdir -p "$work/v3copies"
cp "$work/keep/config.json" "$work/v3copies/"
"$py" - "$work/keep/model.safetensors" "$work/v3copies/model.safetensors" <<'PY'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
f = open(src, "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n)); data = f.read()
L = max(int(k.split(".")[2]) for k in h if k.startswith("model.layers."))
parts, out, pos = [], {}, 0
def put(name, blob, shape):
    global pos
    out[name] = {"dtype": "F32", "shape": shape, "data_offsets": [pos, pos + len(blob)]}; parts.append(blob); pos += len(blob)
for k, v in h.items():
    if k == "__metadata__": out[k] = v; continue
    b, e = v["data_offsets"]; put(k, data[b:e], v["shape"])
for copy, of in (("embed_tokens.weight", "model.embed_tokens.weight"), ("shared_head.head.weight", "lm_head.weight")):
    b, e = h[of]["data_offsets"]; put(f"model.layers.{L}.{copy}", data[b:e], h[of]["shape"])
hb = json.dumps(out).encode(); hb += b" " * (-len(hb) % 8)
open(dst, "wb").write(struct.pack("<Q", len(hb)) + hb + b"".join(parts))
PY
"$bin" eval "$work/v3copies" --data "$corpus" --batch 8 --seq-len 32 --eval-batches 2 >"$work/eval-copies.txt"
if [ "$(grep -o 'held-out loss [0-9.]*' "$work/eval-copies.txt")" = "$(grep -o 'held-out loss [0-9.]*' "$work/eval-keep.txt")" ]; then
  ok "V3's MTP copies of the embedding and head are accepted: $(grep -o 'held-out loss [0-9.]*' "$work/eval-copies.txt")"
else
  not_ok "a folder with V3's MTP copies: $(cat "$work/eval-copies.txt")"
fi
finish deepseek_v3
