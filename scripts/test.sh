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
  # The CUDA kernels' tests once more under a sanitizer, in a tree of their own where only the
  # kernels and the SIMT shim are compiled (schedule seed 1):
  #   sanitized_kernels NAME DIR CMAKE_OPTION REPORT_PATTERN
  sanitized_kernels() {
    local name="$1" dir="$2" option="$3" pattern="$4"
    mkdir -p "$dir"
    if ! { cmake -S "$root" -B "$dir" -DMOETRAIN_CUDA=OFF -DMOETRAIN_EMULATE_CUDA=ON "$option" \
             -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
             "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" &&
           cmake --build "$dir" -j"$(nproc)" --target moetrain_cuda_tests; } >"$dir/build.log" 2>&1; then
      grep -E -A3 "error|Error" "$dir/build.log" | head -60 >&2
      echo "$name build of the CUDA kernel tests failed; full log: $dir/build.log" >&2
      exit 1
    fi
    # (the refusals' two provoked faults print the sanitizer's SEGV report to stderr: kept in the log)
    if ! "$dir/moetrain_cuda_tests" --seed 1 >"$dir/kernels.log" 2>"$dir/kernels.err"; then
      grep -v "PASS" "$dir/kernels.log" >&2
      grep -E -m1 -A8 "$pattern" "$dir/kernels.err" >&2 || true
      echo "CUDA kernel tests under $name failed; logs: $dir/kernels.log, kernels.err" >&2
      exit 1
    fi
    echo "CUDA kernel tests under $name (SIMT shim, seed 1): $(tail -1 "$dir/kernels.log")"
  }
  sanitized_kernels "ASan + UBSan" "$root/build-emu-asan" -DMOETRAIN_SANITIZE=ON \
    "ERROR: AddressSanitizer|runtime error"
  # ThreadSanitizer over the .cu sources: each CUDA thread a TSan fiber, so threads of a block
  # racing without an atomic or a barrier are reported. One BLAS thread: OpenBLAS's own threads
  # synchronise in ways TSan cannot see.
  OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 sanitized_kernels "ThreadSanitizer" \
    "$root/build-emu-tsan" -DMOETRAIN_SIMT_TSAN=ON "WARNING: ThreadSanitizer"
  set -- -L emulated-cuda "$@"
else
  "$root/scripts/build.sh"
  build="$root/build"
fi
cd "$build"
export OPENBLAS_NUM_THREADS=1
ctest --output-on-failure -j"$(nproc)" "$@"
