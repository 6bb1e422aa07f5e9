#!/usr/bin/env bash
# Builds moetrain (scripts/build.sh; its target onednn_probe, bench/probe/onednn_probe.cpp, is built
# where oneDNN is found) and runs build/onednn_probe with one thread and OpenBLAS's core chosen as
# the comparison scripts choose it (scripts/blas_core.sh). Arguments go to the probe:
#   scripts/onednn_probe.sh bw
#   scripts/onednn_probe.sh bf16-experts 64 384 1408 1024
#   scripts/onednn_probe.sh fp32 128 256 256 1024 0 1 0
#   scripts/onednn_probe.sh gate-up 128 256 1024 256
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/build.sh" >/dev/null
probe="$root/build/onednn_probe"
[ -x "$probe" ] || { echo "onednn_probe.sh: $probe was not built (oneDNN not found?)" >&2; exit 1; }
. "$root/scripts/blas_core.sh"
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE="$(blas_core_for_this_cpu)" exec "$probe" "$@"
