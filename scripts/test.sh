#!/usr/bin/env bash
# One command for a new user and for CI: install, build, run every test (unit, PyTorch reference).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/build.sh"
cd "$root/build"
export OPENBLAS_NUM_THREADS=1
ctest --output-on-failure -j"$(nproc)" "$@"
