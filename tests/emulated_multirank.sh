#!/usr/bin/env bash
# Ranks on GPUs, on the emulated CUDA device (a -DMOETRAIN_EMULATE_CUDA=ON build: device memory
# faults if host code touches it outside a kernel or a device copy). Every rank's model lives on
# its device; the token exchange, the gradient sync, the pipeline's activations and the
# validation p2p move device buffers, staged through the host by comm/ (MPI here is not
# CUDA-aware). The emulated device runs the real .cu kernels (SIMT shim), so each layout with
# --device cuda must agree with the same layout with --device cpu within the bounds of their
# reduction orders (tests/device_close.py): every logged quantity and the final weights, with
# tensor parallelism and expert migration too. Then a multi-rank device checkpoint resumes
# exactly (bit for bit).
# Usage: emulated_multirank.sh MOETRAIN CORPUS WORKDIR MPIRUN
set -euo pipefail
bin="$1"
corpus="$2"
work="$3"
mpirun="$4"
rm -rf "$work"
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
common=(train --steps 4 --batch 4 --seq-len 32 --eval-every 2 --eval-batches 1 --quiet
        --data "$corpus" --lr 3e-3 --warmup 2)
fail=0
check() {  # check NAME CONDITION-COMMAND...
  local name="$1"
  shift
  if "$@"; then echo "PASS $name"; else echo "FAIL $name"; fail=1; fi
}
run() {  # run NAME NP ARGS...
  local name="$1" np="$2"
  shift 2
  "$mpirun" --oversubscribe -np "$np" "$bin" "${common[@]}" "$@" --out "$work/$name" >"$work/$name.log" 2>&1 ||
    { echo "FAIL $name: exit $?"; tail -5 "$work/$name.log"; fail=1; }
}
pair() {  # pair NAME NP ARGS...: the layout on the device against the same layout on the CPU
  local name="$1" np="$2"
  shift 2
  run "$name.cpu" "$np" "$@" --device cpu
  run "$name.cuda" "$np" "$@" --device cuda
  check "$name: cuda ~ cpu, logged quantities and final weights" \
    /usr/bin/python3 "$(dirname "$0")/device_close.py" "$work" "$name.cuda" "$name.cpu" 1e-4 1e-3
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
check "ep4.migrate: experts moved on the devices" grep -q '"migration"' "$work/ep4.migrate.cuda/metrics.jsonl"

# A device checkpoint of PP2 x EP2 at step 2, resumed on the devices to step 4.
run ckpt 4 --pp 2 --ep 2 --micro-batches 2 --device cuda --checkpoint.every 2
mkdir -p "$work/resumed"
cp -r "$work/ckpt/checkpoints" "$work/resumed/checkpoints"
rm -rf "$work/resumed/checkpoints/step-4"
run resumed 4 --pp 2 --ep 2 --micro-batches 2 --device cuda --resume latest
check "pp2ep2 device checkpoint resumed on the devices: final weights bit for bit" \
  cmp -s "$work/ckpt/model.safetensors" "$work/resumed/model.safetensors"
exit "$fail"
