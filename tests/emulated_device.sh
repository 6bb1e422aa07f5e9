#!/usr/bin/env bash
# The GPU path of the trainer on the emulated CUDA device (a -DMOETRAIN_EMULATE_CUDA=ON build:
# device memory faults if host code touches it outside a kernel or a device copy). The emulated
# device runs the real .cu kernels through the SIMT shim, so --device cuda must agree with
# --device cpu within the bounds of their different reduction orders (tests/device_close.py):
# every logged quantity (loss, CE, aux, gradient norm, validation loss) and the written weights;
# a checkpoint written from the device and resumed there continues exactly (bit for bit), and on
# the CPU within the same bounds; bf16 trains within a few percent of fp32; the Qwen families
# (model/family.h) agree with the CPU as the default model does.
# Usage: emulated_device.sh MOETRAIN CORPUS WORKDIR
set -euo pipefail
bin="$1"
corpus="$2"
work="$3"
rm -rf "$work"
mkdir -p "$work"
export OPENBLAS_NUM_THREADS=1
common=(train --steps 8 --batch 4 --seq-len 32 --eval-every 4 --eval-batches 1 --quiet
        --data "$corpus" --lr 3e-3 --warmup 2)
fail=0
check() {  # check NAME CONDITION-COMMAND...
  local name="$1"
  shift
  if "$@"; then echo "PASS $name"; else echo "FAIL $name"; fail=1; fi
}
same_metrics() {  # same_metrics DIR_A DIR_B [REL_TOL [KEYS]]
  /usr/bin/python3 - "$1" "$2" "${3:-0}" "${4:-loss,ce_loss,aux_loss,grad_norm,val_loss}" <<'PY'
import json, sys
a, b, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
keys = tuple(sys.argv[4].split(","))
def rows(d):
    out = {}
    for line in open(f"{d}/metrics.jsonl"):
        r = json.loads(line)
        out[r["step"]] = {k: r[k] for k in keys if k in r}
    return out
ra, rb = rows(a), rows(b)
ok = ra.keys() == rb.keys() and len(ra) > 0
worst = 0.0
for s in ra:
    for k, v in ra[s].items():
        w = rb[s].get(k)
        if w is None:
            ok = False
            continue
        d = abs(v - w) / max(abs(v), 1e-30)
        worst = max(worst, d)
print(f"  {a} vs {b}: {len(ra)} steps, worst relative difference {worst:.3e} (bound {tol:g})")
sys.exit(0 if ok and worst <= tol else 1)
PY
}

"$bin" "${common[@]}" --device cpu --out "$work/cpu"
"$bin" "${common[@]}" --device cuda --out "$work/cuda"
close() {  # close A B: the device run against the CPU run (metrics 1e-4 relative, weights 1e-3 of
  # their tensor's largest: AdamW's first steps turn round-off in near-zero gradients into lr-sized moves)
  /usr/bin/python3 "$(dirname "$0")/device_close.py" "$work" "$1" "$2" 1e-4 1e-3
}
check "cuda ~ cpu: every logged quantity and the final weights within bounds" close cuda cpu
# The other families (model/family.h) on the device: GQA, q/k/v biases and the gated shared
# expert (test-qwen2moe), QK-norm and an explicit head_dim (test-qwen3moe).
for p in test-qwen2moe test-qwen3moe; do
  "$bin" "${common[@]}" --preset "$p" --device cpu --out "$work/$p.cpu"
  "$bin" "${common[@]}" --preset "$p" --device cuda --out "$work/$p.cuda"
  check "$p: cuda ~ cpu within the same bounds" close "$p.cuda" "$p.cpu"
done

# Checkpoint from the device at step 4, resume on the device to step 8.
"$bin" "${common[@]}" --device cuda --steps 8 --checkpoint.every 4 --out "$work/ckpt" >/dev/null
rm -rf "$work/ckpt_resumed"
mkdir -p "$work/ckpt_resumed"
cp -r "$work/ckpt/checkpoints" "$work/ckpt_resumed/checkpoints"
rm -rf "$work/ckpt_resumed/checkpoints/step-8"
"$bin" "${common[@]}" --device cuda --resume latest --out "$work/ckpt_resumed"
check "device checkpoint resumed on the device: final weights bit for bit" \
  cmp -s "$work/ckpt/model.safetensors" "$work/ckpt_resumed/model.safetensors"
# ... and on the CPU (a checkpoint does not know the device it came from).
rm -rf "$work/ckpt_cpu"
mkdir -p "$work/ckpt_cpu"
cp -r "$work/ckpt_resumed/checkpoints" "$work/ckpt_cpu/checkpoints"
rm -rf "$work/ckpt_cpu/checkpoints/step-8"
"$bin" "${common[@]}" --device cpu --resume latest --out "$work/ckpt_cpu"
check "device checkpoint resumed on the CPU: within the device-vs-CPU bounds" close ckpt_cpu ckpt

# bf16 GEMM inputs (emulated rounding): the losses within 1% of fp32 (the gradient norm is not
# compared: a token whose top-k flips under bf16 rounding moves it by up to ~20% in one step).
"$bin" "${common[@]}" --device cuda --precision bf16 --out "$work/bf16"
check "bf16 losses within 1% of fp32" same_metrics "$work/cpu" "$work/bf16" 0.01 loss,ce_loss,val_loss

# The fault hooks write device memory through device copies: a poisoned step is skipped.
"$bin" "${common[@]}" --device cuda --fault.nan-steps 3 --out "$work/nan" >/dev/null 2>&1
check "a NaN gradient on the device is skipped and the run still finishes" test -s "$work/nan/model.safetensors"
# A run that does not fit in the GPU's free memory: one line naming the bytes, nothing written.
set +e
msg=$(MOETRAIN_EMULATED_GPU_BYTES=1000000 "$bin" "${common[@]}" --device cuda --out "$work/small" 2>&1)
rc=$?
set -e
echo "  $msg"
check "a run larger than the GPU is refused naming the bytes" \
  test "$rc" -ne 0 -a "$rc" -lt 128 -a "$(echo "$msg" | wc -l)" -eq 1 -a ! -e "$work/small/model.safetensors"
check "  ... the message names GPU memory" grep -q "not enough GPU memory: this run needs .* bytes" <<<"$msg"
exit $fail
