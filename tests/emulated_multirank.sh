#!/usr/bin/env bash
# Ranks on GPUs, on the emulated CUDA device (a -DMOETRAIN_EMULATE_CUDA=ON build: device memory
# faults if host code touches it outside a kernel or a device copy). Every rank's model lives on
# its device; the token exchange, the gradient sync, the pipeline's activations and the
# validation p2p move device buffers, staged through the host by comm/ (MPI here is not
# CUDA-aware). The emulated device runs the real .cu kernels (SIMT shim), so each layout with
# --device cuda must agree with the same layout with --device cpu within the bounds of their
# reduction orders (tests/checks.py, 1e-4 relative;
# the weights 1e-3 of their tensor's largest): every logged quantity and the final weights, with
# tensor parallelism and expert migration too. Then a multi-rank device checkpoint resumes
# exactly (bit for bit).
# Usage: emulated_multirank.sh MOETRAIN CORPUS WORKDIR MPIRUN
set -euo pipefail
bin="$1"
corpus="$2"
work="$3"
MPIRUN="$4"
source "$(dirname "$0")/lib.sh"
scratch "$work"
common=(train --steps 4 --batch 4 --seq-len 32 --eval-every 2 --eval-batches 1 --quiet
        --data "$corpus" --lr 3e-3 --warmup 2)
run() {  # run NAME NP ARGS...
  local name="$1" np="$2"
  shift 2
  mpi "$np" "$bin" "${common[@]}" "$@" --out "$work/$name" >"$work/$name.log" 2>&1 ||
    { not_ok "$name: exit $?"; tail -5 "$work/$name.log"; }
}
pair() {  # pair NAME NP ARGS...: the layout on the device against the same layout on the CPU
  local name="$1" np="$2"
  shift 2
  run "$name.cpu" "$np" "$@" --device cpu
  run "$name.cuda" "$np" "$@" --device cuda
  compare losses "$work/$name.cuda" "$work/$name.cpu" --rtol 1e-4 --name "$name: cuda ~ cpu" || true
  compare weights "$work/$name.cuda" "$work/$name.cpu" --rtol 1e-3 --name "$name: cuda ~ cpu" || true
}

pair ep2 2 --ep 2
pair dp2 2 --dp 2
pair pp2ep2 4 --pp 2 --ep 2 --micro-batches 2
pair ep4.halo 4 --ep 4 --a2a halo --topo.ranks-per-node 2
pair ep4.rbd 4 --ep 4 --a2a rbd --topo.ranks-per-node 2
# Tensor parallelism: the TP all-gathers / reduce-scatters and the TP gradient sum move device
# buffers; a TP checkpoint gathers the slices from the devices.
pair tp2ep2 4 --tp 2 --ep 2 --checkpoint.every 2
pair tp2dp2.zero1 4 --tp 2 --dp 2 --zero1
# Expert migration after every step: weights and AdamW moments moved between the ranks' devices.
pair ep4.migrate 4 --ep 4 --balance.migrate-every 1 --balance.threshold 1.01
check_that "ep4.migrate: experts moved on the devices" grep -q '"migration"' "$work/ep4.migrate.cuda/metrics.jsonl"

# A device checkpoint of PP2 x EP2 at step 2, resumed on the devices to step 4.
run ckpt 4 --pp 2 --ep 2 --micro-batches 2 --device cuda --checkpoint.every 2
mkdir -p "$work/resumed"
cp -r "$work/ckpt/checkpoints" "$work/resumed/checkpoints"
rm -rf "$work/resumed/checkpoints/step-4"
run resumed 4 --pp 2 --ep 2 --micro-batches 2 --device cuda --resume latest
compare weights "$work/resumed" "$work/ckpt" --name "pp2ep2 device checkpoint resumed on the devices" || true
finish emulated_multirank
