#!/usr/bin/env bash
# `--comm.backend nccl` on the emulated CUDA device, through the fake libnccl.so.2 of
# tests/fake_nccl (NCCL's API over MPI; a -DMOETRAIN_EMULATE_CUDA=ON build):
#  1. the fake's contract through its C API (fake_nccl_contract: error codes and strings, ids,
#     groups, send/receive order, all-reduce == MPI_Allreduce bit for bit) on 2 and 4 ranks;
#  2. comm::Group's NCCL path (nccl.cpp's grouped alltoallv and all-reduce of device buffers)
#     against its MPI path on host buffers, on 2 and 4 ranks (nccl_group_check);
#  3. training with --device cuda --comm.backend nccl against --comm.backend mpi, EP 2 on 2 ranks
#     and EP 2 x DP 2 on 4 (one emulated GPU per rank): the backend line says NCCL, the fake
#     carried all-reduces, and every logged loss and the final weights are identical bit for bit;
#  4. --comm.backend nccl with two ranks on one GPU fails with one clear line.
# The model is the test-moe preset (8 experts, top-2, 3 layers): the tiny preset of
# emulated_multirank.sh takes 8-15 s a run on the emulated device's kernels
# (EMULATED_NCCL_PRESET=tiny runs it anyway).
# Usage: emulated_nccl.sh MOETRAIN CONTRACT GROUP_CHECK FAKE_NCCL_DIR CORPUS WORKDIR MPIRUN
set -euo pipefail
bin="$1"
contract="$2"
group_check="$3"
fake_dir="$4"
corpus="$5"
work="$6"
MPIRUN="$7"
source "$(dirname "$0")/lib.sh"
scratch "$work"
preset="${EMULATED_NCCL_PRESET:-test-moe}"
common=(train --preset "$preset" --steps 3 --batch 2 --seq-len 16 --eval-every 2 --eval-batches 1
        --data "$corpus" --lr 3e-3 --warmup 1 --peak-gflops 1 --device cuda)
fail=0
check() {  # check NAME CONDITION-COMMAND...
  local name="$1"
  shift
  if "$@"; then echo "PASS $name"; else echo "FAIL $name"; fail=1; fi
}
# mpirun with NP emulated GPUs and the fake NCCL first on the library path; output to LOG.
launch() {  # launch LOG GPUS NP COMMAND...
  local log="$1" gpus="$2" np="$3"
  shift 3
  MOETRAIN_EMULATED_GPUS="$gpus" LD_LIBRARY_PATH="$fake_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    NCCL_DEBUG=INFO FAKE_NCCL_TIMEOUT_S="${FAKE_NCCL_TIMEOUT_S:-60}" \
    timeout 300 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -np "$np" "$@" >"$log" 2>&1
}

# ---- 1, 2: the fake's contract; Group over NCCL == Group over MPI ----
for np in 2 4; do
  if launch "$work/contract.$np.log" "$np" "$np" "$contract"; then
    check "fake NCCL contract, $np ranks" grep -q "^PASS fake NCCL contract on $np ranks" "$work/contract.$np.log"
  else
    echo "FAIL fake NCCL contract, $np ranks: exit $?"; grep -E "FAIL|rror" "$work/contract.$np.log" | head -20; fail=1
  fi
  if launch "$work/group.$np.log" "$np" "$np" "$group_check"; then
    check "Group alltoallv/all-reduce over NCCL == over MPI, $np ranks" \
      grep -q "^PASS Group over NCCL == Group over MPI" "$work/group.$np.log"
  else
    echo "FAIL Group over NCCL, $np ranks: exit $?"; grep -E "FAIL|rror" "$work/group.$np.log" | head -20; fail=1
  fi
done

# ---- 3: training, NCCL against MPI ----
# The loss strings of every step as metrics.jsonl wrote them (no float parsing): loss, ce_loss,
# aux_loss, grad_norm, val_loss.
losses() {
  /usr/bin/python3 - "$1" <<'PY'
import re, sys
for line in open(f"{sys.argv[1]}/metrics.jsonl"):
    m = re.search(r'"step":(\d+)', line)
    if not m or '"loss":' not in line:
        continue
    vals = [f"{k}={v}" for k, v in re.findall(r'"(loss|ce_loss|aux_loss|grad_norm|val_loss)":([^,}]+)', line)]
    print(f"step {m.group(1)} " + " ".join(vals))
PY
}
same_losses() {  # same_losses DIR_A DIR_B
  local a b
  a="$(losses "$1")" && b="$(losses "$2")" || return 1
  echo "$a" | sed "s|^|  $(basename "$1"): |"
  [ -n "$a" ] && [ "$a" = "$b" ] || { echo "  $(basename "$2") differs:"; echo "$b" | sed 's/^/    /'; return 1; }
}
used_nccl() {  # the header line names NCCL, and the fake's communicators carried all-reduces
  grep -q "^moetrain: device buffers between ranks over NCCL" "$1" &&
    grep -Eq "ncclCommDestroy: .* [1-9][0-9]* all-reduces" "$1"
}
pair() {  # pair NAME NP ARGS...
  local name="$1" np="$2" ok=1
  shift 2
  for backend in nccl mpi; do
    launch "$work/$name.$backend.log" "$np" "$np" "$bin" "${common[@]}" "$@" --comm.backend "$backend" \
      --out "$work/$name.$backend" ||
      { echo "FAIL $name --comm.backend $backend: exit $?"; tail -5 "$work/$name.$backend.log"; fail=1; ok=0; }
  done
  [ "$ok" = 1 ] || return 0
  check "$name: --comm.backend nccl ran over the fake NCCL" used_nccl "$work/$name.nccl.log"
  check "$name: --comm.backend mpi staged through the host" \
    grep -q "^moetrain: device buffers between ranks over MPI, staged through the host (requested)" "$work/$name.mpi.log"
  check "$name: nccl == mpi, every logged loss (as written)" same_losses "$work/$name.nccl" "$work/$name.mpi"
  check "$name: nccl == mpi, final weights" cmp -s "$work/$name.nccl/model.safetensors" "$work/$name.mpi/model.safetensors"
}
pair ep2 2 --ep 2
pair ep2dp2 4 --ep 2 --dp 2

# ---- 4: two ranks on one GPU ----
if launch "$work/shared_gpu.log" 1 2 "$bin" "${common[@]}" --ep 2 --comm.backend nccl --quiet --out "$work/shared_gpu"; then
  echo "FAIL shared GPU: --comm.backend nccl with 2 ranks on 1 GPU succeeded"; fail=1
else
  # One message (each rank prints it; the rank tag aside they are the same line).
  errs="$(grep '^moetrain: error' "$work/shared_gpu.log" | sed 's/ (rank [0-9]* of [0-9]*)//' | sort -u)"
  echo "  $errs"
  check "shared GPU: --comm.backend nccl refused with one clear line" \
    test "$(echo "$errs" | wc -l)" = 1 -a -n "$(echo "$errs" | grep -F -- '--comm.backend nccl: ranks 0 and 1 share GPU 0')"
fi
exit "$fail"
