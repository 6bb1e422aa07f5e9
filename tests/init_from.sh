#!/usr/bin/env bash
# train --init-from FOLDER end to end (seconds, tiny models):
#  1. a short trained run (test-moe) is exported (one file, and sharded with --shard-mb); a run
#     started from the folder evaluates the loaded weights on its held-out windows before step 1
#     (val_loss_start): equal to `moetrain eval` of the folder on the same windows (<= 1e-6
#     relative), and its first step's loss within 1% of it. The corpus is stationary (words drawn
#     from one fixed distribution) so that a training batch and the held-out windows measure the
#     same thing; on the KJV the held-out blocks (never trained on) sit 2-7% above the training
#     batches (docs/upcycle.md).
#  2. the sharded folder gives the one-file folder's losses bit for bit; EP 2, PP 2, TP 2 and
#     DP 2 --zero1 give one process's first 3 losses to <= 1e-6 relative (TP: 1e-5, tests/tp.sh's
#     bound; measured 5e-6: its sequence-sharded MoE block sums in another order).
#  3. bf16 and fp16 copies of the folder load (widened to fp32): the held-out loss moves by the
#     rounding only (<= 1%), and equals `moetrain eval` of that copy.
#  4. a missing, extra, wrongly shaped or wrongly typed tensor, and a --preset / --vocab-size that
#     disagrees with the folder's config, are one error line naming it; nothing is written.
#  5. noaux_tc: the folder's e_score_correction_bias tensors become the run's selection bias
#     (a large bias on expert 0 shows in the first step's loads); a bias of the wrong length is an error.
# Usage: init_from.sh MOETRAIN PYTHON WORK
set -euo pipefail
bin="$1"; py="$2"; work="$3"
here="$(cd "$(dirname "$0")" && pwd)"
rm -rf "$work"; mkdir -p "$work"
edit() { "$py" "$here/hf_folder_edit.py" "$@"; }
fail=0
check() { if [ "$1" = ok ]; then echo "ok: $2"; else echo "FAIL: $2" >&2; fail=1; fi; }

"$py" - "$work/corpus.txt" <<'PY'
import random, sys
r = random.Random(7)
letters = "etaoinshrdlucmfwypvbgkqjxz"
words = ["".join(r.choice(letters[: r.randint(6, 26)]) for _ in range(r.randint(1, 7))) for _ in range(300)]
weights = [1.0 / (i + 1) for i in range(len(words))]
out = []
while sum(map(len, out)) < 600_000:
    out.append(" ".join(r.choices(words, weights, k=r.randint(4, 14))).capitalize() + ".\n")
open(sys.argv[1], "w").write("".join(out))
PY
data=(--data "$work/corpus.txt")
common=(train --seq-len 64 --eval-batches 8 --eval-every 0 --quiet "${data[@]}" --lr 3e-3 --warmup 5)
source "$here/layout_runs.sh"  # run NAME NP ARGS...

run base 1 --preset test-moe --steps 200 --batch 16
"$bin" export "$work/base/checkpoints/step-200" "$work/hf" >/dev/null
"$bin" export "$work/base/checkpoints/step-200" "$work/hf-sharded" --shard-mb 0.05 >/dev/null
test -f "$work/hf-sharded/model.safetensors.index.json"
"$bin" eval "$work/hf" "${data[@]}" --batch 32 --seq-len 64 --eval-batches 8 > "$work/eval.txt"

f=(--init-from "$work/hf" --steps 3)
run single 1 "${f[@]}" --batch 32
run sharded 1 --init-from "$work/hf-sharded" --steps 3 --batch 32
run ep2 2 "${f[@]}" --batch 16 --ep 2
run pp2 2 "${f[@]}" --batch 32 --pp 2
run tp2 2 "${f[@]}" --batch 32 --tp 2
run dp2zero1 2 "${f[@]}" --batch 16 --dp 2 --zero1

for d in BF16 F16; do
  edit "$work/hf" "$work/hf-$d" dtype "$d"
  run "single-$d" 1 --init-from "$work/hf-$d" --steps 1 --batch 32
  "$bin" eval "$work/hf-$d" "${data[@]}" --batch 32 --seq-len 64 --eval-batches 8 > "$work/eval-$d.txt"
done

"$py" - "$work" <<'PY' || fail=1
import json, re, sys
w = sys.argv[1]
def metrics(name): return [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl")]
def held_out(f): return float(re.search(r"held-out loss ([0-9.]+)", open(f"{w}/{f}").read()).group(1))
def rel(a, b): return abs(a - b) / abs(b)
ok = True
def check(cond, what):
    global ok
    print(("ok: " if cond else "FAIL: ") + what)
    ok = ok and cond
ev, base, one = held_out("eval.txt"), metrics("base"), metrics("single")
print(f"export held-out {ev:.6f}; its run's last steps' loss {base[-1]['ce_loss']:.4f}, {base[-2]['ce_loss']:.4f}; "
      f"--init-from: held-out before step 1 {one[0]['val_loss_start']:.6f}, step losses "
      + ", ".join(f"{m['ce_loss']:.4f}" for m in one))
check(rel(one[0]["val_loss_start"], ev) <= 1e-6, f"val_loss_start equals moetrain eval ({rel(one[0]['val_loss_start'], ev):.1e})")
check(rel(one[0]["ce_loss"], ev) <= 0.01, f"first step's loss within 1% of the held-out loss ({rel(one[0]['ce_loss'], ev):.2%})")
check([m["loss"] for m in metrics("sharded")] == [m["loss"] for m in one], "sharded folder: the same losses bit for bit")
for name in ["ep2", "pp2", "tp2", "dp2zero1"]:
    bound = 1e-5 if name == "tp2" else 1e-6  # tests/tp.sh's and tests/parity.sh's bounds
    got = metrics(name)
    worst = max(rel(g[q], r[q]) for g, r in zip(got, one) for q in ("loss", "ce_loss", "grad_norm"))
    worst = max(worst, rel(got[0]["val_loss_start"], one[0]["val_loss_start"]))
    check(len(got) == 3 and worst <= bound,
          f"{name}: first 3 losses, grad norms and val_loss_start as one process (worst {worst:.1e} <= {bound:g})")
for d in ["BF16", "F16"]:
    m, e = metrics(f"single-{d}"), held_out(f"eval-{d}.txt")
    check(rel(m[0]["val_loss_start"], e) <= 1e-6 and rel(e, ev) <= 0.01,
          f"{d} folder: held-out {e:.6f} (fp32 {ev:.6f}, {rel(e, ev):.1e}), the run's val_loss_start the same")
sys.exit(0 if ok else 1)
PY

# Bad folders and flags: one line naming the tensor / field, exit 1, no output written.
bad() {
  local what="$1" pattern="$2"; shift 2
  local out="$work/bad-out" err rc
  rm -rf "$out"
  err="$("$bin" train --steps 1 --batch 2 --seq-len 16 --quiet "${data[@]}" --out "$out" "$@" 2>&1 >/dev/null)" && rc=0 || rc=$?
  if [ "$rc" -ne 0 ] && [ "$(printf '%s\n' "$err" | grep -c .)" -eq 1 ] && printf '%s' "$err" | grep -qF -- "$pattern" &&
     [ ! -e "$out/model.safetensors" ] && [ ! -s "$out/metrics.jsonl" ]; then
    check ok "$what: $err"
  else
    check no "$what: rc=$rc, stderr: $err"
  fi
}
t=model.layers.1.mlp.experts.3.up_proj.weight
edit "$work/hf" "$work/m-missing" drop "$t"
edit "$work/hf" "$work/m-extra" extra model.layers.1.mlp.experts.99.up_proj.weight
edit "$work/hf" "$work/m-shape" shape "$t"
edit "$work/hf" "$work/m-dtype" retype "$t"
bad "missing tensor" "m-missing/model.safetensors: tensor \"$t\" is missing" --init-from "$work/m-missing"
bad "extra tensor" "m-extra/model.safetensors: unexpected tensor \"model.layers.1.mlp.experts.99.up_proj.weight\"" \
  --init-from "$work/m-extra"
bad "wrong shape" "m-shape/model.safetensors: tensor \"$t\" has shape [512], expected [16, 32]" --init-from "$work/m-shape"
bad "wrong dtype" "m-dtype/model.safetensors: tensor \"$t\" has dtype I32, expected F32, BF16 or F16" \
  --init-from "$work/m-dtype"
bad "--preset disagrees" "--preset test-moe4 disagrees with --init-from's $work/hf/config.json: num_hidden_layers = 4 there, 3 in the folder" \
  --init-from "$work/hf" --preset test-moe4
bad "--vocab-size disagrees" "--vocab-size 300 disagrees with --init-from's $work/hf/config.json: vocab_size = 256" \
  --init-from "$work/hf" --vocab-size 300
bad "no such folder" "--init-from $work/nowhere: no such folder" --init-from "$work/nowhere"

# Fine-tuning on the user's own tokenized data (an indexed dataset PREFIX): the byte tokenizer's
# dataset trains from the folder; a BPE dataset (another tokenizer, vocab 512) is refused, naming both.
"$bin" tokenize --input "$work/corpus.txt" --output "$work/tok-bytes" --tokenizer bytes --docs line --quiet
"$bin" tokenize --input "$work/corpus.txt" --output "$work/tok-bpe" --tokenizer bpe:512 --docs line --quiet
run tokenized 1 --init-from "$work/hf" --steps 2 --batch 8 --data "$work/tok-bytes"
"$py" - "$work/tokenized/metrics.jsonl" "$work/eval.txt" <<'PY' || fail=1
import json, re, sys
m = [json.loads(l) for l in open(sys.argv[1])]
ev = float(re.search(r"held-out loss ([0-9.]+)", open(sys.argv[2]).read()).group(1))
good = len(m) == 2 and abs(m[0]["ce_loss"] - ev) / ev < 0.05
print(f"{'ok' if good else 'FAIL'}: fine-tuning on a tokenized dataset (bytes): step 1 ce {m[0]['ce_loss']:.4f} "
      f"(the folder's held-out {ev:.4f} on the text)")
sys.exit(0 if good else 1)
PY
bad "a dataset of another tokenizer" "tok-bpe" --init-from "$work/hf" --data "$work/tok-bpe"

# noaux_tc: the folder's selection bias is the run's. Expert 0 of every MoE layer biased by +10:
# every token picks it at step 1 (its load is the tokens x 1 of each layer), unlike zero bias.
run noaux 1 --preset test-moe-noaux --steps 10 --batch 8
"$bin" export "$work/noaux/checkpoints/step-10" "$work/hf-noaux" >/dev/null
edit "$work/hf-noaux" "$work/hf-noaux-bias" bias 10
edit "$work/hf-noaux" "$work/hf-noaux-badbias" bias 10 7
run noaux-plain 1 --init-from "$work/hf-noaux" --steps 1 --batch 8
run noaux-bias 1 --init-from "$work/hf-noaux-bias" --steps 1 --batch 8
"$py" - "$work" <<'PY' || fail=1
import json, sys
w = sys.argv[1]
def loads(name): return json.loads(open(f"{w}/{name}/metrics.jsonl").readline())["expert_loads"]
plain, biased = loads("noaux-plain"), loads("noaux-bias")
tokens = 8 * 64
ok = all(layer[0] == tokens for layer in biased) and not all(layer[0] == tokens for layer in plain)
print(("ok" if ok else "FAIL") + f": noaux bias loaded: expert 0's loads {[l[0] for l in biased]} of {tokens} tokens "
      f"(zero bias: {[l[0] for l in plain]})")
sys.exit(0 if ok else 1)
PY
bad "noaux bias of the wrong length" \
  "hf-noaux-badbias/model.safetensors: tensor \"model.layers.1.mlp.gate.e_score_correction_bias\" has shape [7], expected [8]" \
  --init-from "$work/hf-noaux-badbias"

[ "$fail" -eq 0 ] && echo "init_from: all passed" || { echo "init_from: FAILED" >&2; exit 1; }
