#!/usr/bin/env bash
# The GPU path of the trainer on the emulated CUDA device (a -DMOETRAIN_EMULATE_CUDA=ON build:
# device memory faults if host code touches it outside a kernel or a device copy). The emulated
# device runs the real .cu kernels through the SIMT shim, so --device cuda must agree with
# --device cpu within the bounds of their different reduction orders (tests/checks.py):
# every logged quantity (loss, CE, aux, gradient norm, validation loss) and the written weights;
# a checkpoint written from the device and resumed there continues exactly (bit for bit), and on
# the CPU within the same bounds; bf16 trains within a few percent of fp32; the Qwen families
# (model/family.h) agree with the CPU as the default model does.
# Usage: emulated_device.sh MOETRAIN CORPUS WORKDIR
set -euo pipefail
bin="$1"
corpus="$2"
work="$3"
source "$(dirname "$0")/lib.sh"
scratch "$work"
common=(train --steps 8 --batch 4 --seq-len 32 --eval-every 4 --eval-batches 1 --quiet
        --data "$corpus" --lr 3e-3 --warmup 2)

"$bin" "${common[@]}" --device cpu --out "$work/cpu"
"$bin" "${common[@]}" --device cuda --out "$work/cuda"
close() {  # close A B WHAT: the device run against the CPU run (metrics 1e-4 relative, on the steps
  # both logged: a resumed run logs only those after its checkpoint; weights 1e-3 of their tensor's
  # largest: AdamW's first steps turn round-off in near-zero gradients into lr-sized moves)
  compare losses "$work/$1" "$work/$2" --common-steps --rtol 1e-4 --name "$3" || true
  compare weights "$work/$1" "$work/$2" --rtol 1e-3 --name "$3" || true
}
close cuda cpu "cuda ~ cpu: every logged quantity and the final weights within bounds"
# The other families (model/family.h) on the device: GQA, q/k/v biases and the gated shared
# expert (test-qwen2moe), QK-norm and an explicit head_dim (test-qwen3moe).
for p in test-qwen2moe test-qwen3moe; do
  "$bin" "${common[@]}" --preset "$p" --device cpu --out "$work/$p.cpu"
  "$bin" "${common[@]}" --preset "$p" --device cuda --out "$work/$p.cuda"
  close "$p.cuda" "$p.cpu" "$p: cuda ~ cpu within the same bounds"
done

# Checkpoint from the device at step 4, resume on the device to step 8.
"$bin" "${common[@]}" --device cuda --steps 8 --checkpoint.every 4 --out "$work/ckpt" >/dev/null
rm -rf "$work/ckpt_resumed"
mkdir -p "$work/ckpt_resumed"
cp -r "$work/ckpt/checkpoints" "$work/ckpt_resumed/checkpoints"
rm -rf "$work/ckpt_resumed/checkpoints/step-8"
"$bin" "${common[@]}" --device cuda --resume latest --out "$work/ckpt_resumed"
compare weights "$work/ckpt_resumed" "$work/ckpt" --name "device checkpoint resumed on the device" || true
# ... and on the CPU (a checkpoint does not know the device it came from).
rm -rf "$work/ckpt_cpu"
mkdir -p "$work/ckpt_cpu"
cp -r "$work/ckpt_resumed/checkpoints" "$work/ckpt_cpu/checkpoints"
rm -rf "$work/ckpt_cpu/checkpoints/step-8"
"$bin" "${common[@]}" --device cpu --resume latest --out "$work/ckpt_cpu"
close ckpt_cpu ckpt "device checkpoint resumed on the CPU: within the device-vs-CPU bounds"

# bf16 GEMM inputs (emulated rounding): the losses within 1% of fp32 (the gradient norm is not
# compared: a token whose top-k flips under bf16 rounding moves it by up to ~20% in one step).
"$bin" "${common[@]}" --device cuda --precision bf16 --out "$work/bf16"
compare losses "$work/bf16" "$work/cpu" --rtol 0.01 --keys loss,ce_loss,val_loss --name "bf16 losses within 1% of fp32" || true

# The fault hooks write device memory through device copies: a poisoned step is skipped.
"$bin" "${common[@]}" --device cuda --fault.nan-steps 3 --out "$work/nan" >/dev/null 2>&1
check_that "a NaN gradient on the device is skipped and the run still finishes" test -s "$work/nan/model.safetensors"
# A run that does not fit in the GPU's free memory: one line naming the bytes, nothing written.
set +e
msg=$(MOETRAIN_EMULATED_GPU_BYTES=1000000 "$bin" "${common[@]}" --device cuda --out "$work/small" 2>&1)
rc=$?
set -e
echo "  $msg"
check_that "a run larger than the GPU is refused naming the bytes" \
  test "$rc" -ne 0 -a "$rc" -lt 128 -a "$(echo "$msg" | wc -l)" -eq 1 -a ! -e "$work/small/model.safetensors"
check_that "  ... the message names GPU memory" grep -q "not enough GPU memory: this run needs .* bytes" <<<"$msg"
finish emulated_device
