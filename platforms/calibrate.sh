#!/usr/bin/env bash
# Measures the real MPI's small-message latency and message rate on this machine (2 ranks,
# shared memory) and writes them as JSON (default platforms/calibration.json):
#   latency_us   half round trip of an 8-byte ping-pong
#   overhead_us  1 / message rate: the CPU time one message costs at the busier end; the SMPI
#                study charges it per message sent and received (--msg-overhead-us)
# Usage: platforms/calibrate.sh [OUT.json]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/calibration.json}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mpicc -O2 -o "$tmp/calibrate_mpi" "$here/calibrate_mpi.c"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun --oversubscribe --bind-to none -np 2 "$tmp/calibrate_mpi" > "$tmp/out.json"
cp "$tmp/out.json" "$out"
echo "calibrate: $(cat "$out") -> $out"
