#!/usr/bin/env bash
# moetrain upcycle end to end (seconds): a short trained dense model (test-dense) is exported and
# upcycled (train/upcycle.h has the rule).
#  1. Exact: identical experts, renormalised softmax top-k, no noise, no shared experts => the MoE
#     model computes the dense model. Its held-out loss (`moetrain eval`) and its first training
#     step's cross-entropy (train --init-from, same seed, so the same batch) equal the dense
#     model's to <= 1e-6 relative (measured: 0 to ~1e-7, the order of the expert sums), for
#     E4 K2 (zero router, and a random router N(0, 0.5)), E4 K1 split 2 and E2 K2 split 2 (zero router).
#  2. Not exact, by design: --noise 0.01 and --shared 1 move the loss (and split 2 with a random
#     router mixes slices of different copies); the noisy model still trains from there (EP 2).
#  3. The output is published whole: an earlier folder at -o is replaced, -o never its input.
# Usage: upcycle.sh MOETRAIN PYTHON CORPUS WORK
set -euo pipefail
bin="$1"; py="$2"; corpus="$3"; work="$4"
source "$(dirname "$0")/lib.sh"
scratch "$work"
fail=0
data=(--data "$corpus" --seq-len 64)
"$bin" train --preset test-dense --steps 100 --batch 16 --lr 3e-3 --eval-every 0 --quiet "${data[@]}" --out "$work/dense-run"
"$bin" export "$work/dense-run/checkpoints/step-100" "$work/dense" >/dev/null

# held-out loss (eval --dump's ce, fp32) and step 1's ce_loss of a folder
score() {
  local name="$1" dir="$2"
  "$bin" eval "$dir" "${data[@]}" --batch 16 --eval-batches 4 --dump "$work/$name.eval.safetensors" >/dev/null
  "$bin" train --init-from "$dir" --steps 1 --batch 16 --eval-batches 1 --quiet "${data[@]}" --out "$work/$name.run"
}
score dense "$work/dense"
up() {  # up NAME ARGS...: upcycle the dense folder into $work/NAME and score it
  local name="$1"; shift
  "$bin" upcycle "$work/dense" -o "$work/$name" "$@" >/dev/null
  score "$name" "$work/$name"
}
up e4k2 --experts 4 --topk 2
up e4k2-random --experts 4 --topk 2 --router-init 0.5 --seed 3
up e4k1s2 --experts 4 --topk 1 --split 2
up e2k2s2 --experts 2 --topk 2 --split 2
up e4k2-noise --experts 4 --topk 2 --noise 0.01 --router-init 0.02
up e4k2-shared --experts 4 --topk 2 --shared 1

"$py" - "$work" <<'PY' || fail=1
import json, struct, sys
w = sys.argv[1]
def ce(name):
    raw = open(f"{w}/{name}.eval.safetensors", "rb").read()
    (n,) = struct.unpack("<Q", raw[:8]); h = json.loads(raw[8:8 + n]); b, _ = h["ce"]["data_offsets"]
    return struct.unpack("<f", raw[8 + n + b:8 + n + b + 4])[0]
def step1(name): return json.loads(open(f"{w}/{name}.run/metrics.jsonl").readline())["ce_loss"]
def rel(a, b): return abs(a - b) / abs(b)
ok = True
d_eval, d_step = ce("dense"), step1("dense")
print(f"dense: held-out {d_eval:.7f}, step 1 ce {d_step:.7f}")
for name in ["e4k2", "e4k2-random", "e4k1s2", "e2k2s2"]:
    e, s = rel(ce(name), d_eval), rel(step1(name), d_step)
    good = e <= 1e-6 and s <= 1e-6
    ok &= good
    print(f"{'ok' if good else 'FAIL'}: {name}: held-out {ce(name):.7f} ({e:.1e}), step 1 ce {step1(name):.7f} ({s:.1e}) <= 1e-6")
for name in ["e4k2-noise", "e4k2-shared"]:
    e = rel(ce(name), d_eval)
    good = e > 1e-6
    ok &= good
    print(f"{'ok' if good else 'FAIL'}: {name}: held-out {ce(name):.7f} moves ({e:.1e}), as it should")
sys.exit(0 if ok else 1)
PY

# The noisy model trains from there on 2 EP ranks (the folder's experts split by the layout).
mpi 2 "$bin" train --init-from "$work/e4k2-noise" --steps 20 --batch 8 --ep 2 \
  --lr 3e-3 --warmup 2 --eval-every 0 --eval-batches 1 --quiet "${data[@]}" --out "$work/e4k2-noise.ep2"
"$py" - "$work/e4k2-noise.ep2/metrics.jsonl" <<'PY' || fail=1
import json, sys
m = [json.loads(l)["ce_loss"] for l in open(sys.argv[1])]
good = len(m) == 20 and sum(m[-5:]) / 5 < sum(m[:5]) / 5
print(f"{'ok' if good else 'FAIL'}: upcycled model trains on EP 2: ce {sum(m[:5]) / 5:.4f} (steps 1-5) -> {sum(m[-5:]) / 5:.4f} (16-20)")
sys.exit(0 if good else 1)
PY

# Published whole: a second upcycle into the same folder replaces it (other files stay); the
# input folder is never the output.
touch "$work/e4k2/notes.txt"
"$bin" upcycle "$work/dense" -o "$work/e4k2" --experts 2 --topk 2 >/dev/null
if grep -q '"n_routed_experts": 2' "$work/e4k2/config.json" && [ -f "$work/e4k2/notes.txt" ] &&
   [ -z "$(ls -A "$work" | grep staging || true)" ]; then echo "ok: a second upcycle replaces the folder whole"
else echo "FAIL: second upcycle into the same folder" >&2; fail=1; fi
if err="$("$bin" upcycle "$work/dense" -o "$work/dense" --experts 2 --topk 2 2>&1)"; then fail=1; echo "FAIL: -o = input accepted" >&2
elif printf '%s' "$err" | grep -q "is the folder it reads"; then echo "ok: -o = input refused: $err"
else fail=1; echo "FAIL: -o = input: $err" >&2; fi

[ "$fail" -eq 0 ] && echo "upcycle: all passed" || { echo "upcycle: FAILED" >&2; exit 1; }
