#!/usr/bin/env bash
# One command for a new user and for CI: install, build, run every test (unit, PyTorch reference).
#   scripts/test.sh [CTEST ARGS...]             Release build in build/
#   scripts/test.sh --sanitize [CTEST ARGS...]  AddressSanitizer + UBSan build in build-asan/
#                                               (-DMOETRAIN_SANITIZE=ON, -O1 -g1): the tests but the
#                                               SMPI and "long" ones (minutes-long training runs of
#                                               code the others drive); any memory error, leak in
#                                               our code or UB fails
#   scripts/test.sh --emulated-cuda [CTEST ARGS...] the GPU path (--device cuda) on an emulated
#                                               device whose memory faults outside device work
#                                               (-DMOETRAIN_EMULATE_CUDA=ON, build-emu/): the .cu
#                                               kernels run through the SIMT shim (three schedule
#                                               seeds, under ASan + UBSan in build-emu-asan/ and
#                                               ThreadSanitizer in build-emu-tsan/),
#                                               the model on them against the CPU, device
#                                               checkpoints, bf16, NCCL through a fake over MPI
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ "${1:-}" = "--sanitize" ]; then
  shift
  "$root/scripts/setup.sh"
  build="$root/build-asan"
  mkdir -p "$build"
  log="$build/build.log"
  # -O1 -g1: ASan's usual optimisation with line tables for its reports; -O2 -g took twice as long
  # to compile (24 min on a 2-core machine) for tests that run as fast.
  if ! { cmake -S "$root" -B "$build" -DMOETRAIN_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
           "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
           "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" &&
         cmake --build "$build" -j"$(nproc)"; } >"$log" 2>&1; then
    grep -E -A3 "error|Error" "$log" | head -60 >&2
    echo "sanitizer build failed; full log: $log" >&2
    exit 1
  fi
  echo "build: ok (build-asan, ASan + UBSan)"
  # The SMPI smoke test simulates the same exchange code in its own (unsanitized) SimGrid build,
  # and the "long" end-to-end runs (parity, checkpoint faults, ZeRO-1, TP, golden files) take
  # 3-5x their Release time under ASan (27 min of the 35 min run in CI): the Release run has them.
  set -- -LE "smpi|long" "$@"
elif [ "${1:-}" = "--emulated-cuda" ]; then
  shift
  "$root/scripts/setup.sh"
  build="$root/build-emu"
  mkdir -p "$build"
  log="$build/build.log"
  if ! { cmake -S "$root" -B "$build" -DMOETRAIN_CUDA=OFF -DMOETRAIN_EMULATE_CUDA=ON \
           -DCMAKE_BUILD_TYPE=Release &&
         cmake --build "$build" -j"$(nproc)" --target moetrain tool_device_parity \
           moetrain_cuda_tests; } >"$log" 2>&1; then
    grep -E -A3 "error|Error" "$log" | head -60 >&2
    echo "emulated-device build failed; full log: $log" >&2
    exit 1
  fi
  echo "build: ok (build-emu, emulated CUDA device)"
  # The CUDA kernels' tests once more under AddressSanitizer + UBSan (build-emu-asan: only the
  # kernels and the SIMT shim are compiled; schedule seed 1).
  asan="$root/build-emu-asan"
  mkdir -p "$asan"
  if ! { cmake -S "$root" -B "$asan" -DMOETRAIN_CUDA=OFF -DMOETRAIN_EMULATE_CUDA=ON \
           -DMOETRAIN_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
           "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
           "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" &&
         cmake --build "$asan" -j"$(nproc)" --target moetrain_cuda_tests; } >"$asan/build.log" 2>&1; then
    grep -E -A3 "error|Error" "$asan/build.log" | head -60 >&2
    echo "ASan build of the CUDA kernel tests failed; full log: $asan/build.log" >&2
    exit 1
  fi
  # (the two expected faults print AddressSanitizer's SEGV report to stderr: kept in the log)
  if ! "$asan/moetrain_cuda_tests" --seed 1 >"$asan/kernels.log" 2>"$asan/kernels.err"; then
    grep -v "PASS" "$asan/kernels.log" >&2
    grep -E -m5 "ERROR: AddressSanitizer|runtime error" "$asan/kernels.err" >&2 || true
    echo "CUDA kernel tests under ASan + UBSan failed; logs: $asan/kernels.log, kernels.err" >&2
    exit 1
  fi
  echo "CUDA kernel tests under ASan + UBSan (SIMT shim, seed 1): $(tail -1 "$asan/kernels.log")"
  # ... and with the .cu sources under ThreadSanitizer (build-emu-tsan): each CUDA thread a TSan
  # fiber, so threads of a block racing without an atomic or a barrier are reported. One BLAS
  # thread: OpenBLAS's own threads synchronise in ways TSan cannot see.
  tsan="$root/build-emu-tsan"
  mkdir -p "$tsan"
  if ! { cmake -S "$root" -B "$tsan" -DMOETRAIN_CUDA=OFF -DMOETRAIN_EMULATE_CUDA=ON \
           -DMOETRAIN_SIMT_TSAN=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
           "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
           "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" &&
         cmake --build "$tsan" -j"$(nproc)" --target moetrain_cuda_tests; } >"$tsan/build.log" 2>&1; then
    grep -E -A3 "error|Error" "$tsan/build.log" | head -60 >&2
    echo "ThreadSanitizer build of the CUDA kernel tests failed; full log: $tsan/build.log" >&2
    exit 1
  fi
  if ! OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 "$tsan/moetrain_cuda_tests" --seed 1 \
       >"$tsan/kernels.log" 2>"$tsan/kernels.err"; then
    grep -v "PASS" "$tsan/kernels.log" >&2
    grep -E -m1 -A8 "WARNING: ThreadSanitizer" "$tsan/kernels.err" >&2 || true
    echo "CUDA kernel tests under ThreadSanitizer failed; logs: $tsan/kernels.log, kernels.err" >&2
    exit 1
  fi
  echo "CUDA kernel tests under ThreadSanitizer (SIMT shim, seed 1): $(tail -1 "$tsan/kernels.log")"
  set -- -L emulated-cuda "$@"
else
  "$root/scripts/build.sh"
  build="$root/build"
fi
cd "$build"
export OPENBLAS_NUM_THREADS=1
ctest --output-on-failure -j"$(nproc)" "$@"
