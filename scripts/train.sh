#!/usr/bin/env bash
# One command for a new user: install, build, and train the default model (tiny) on the built-in
# corpus. Extra arguments go to `moetrain train` (e.g. --steps 100 --out runs/x).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/build.sh"
cd "$root"
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
exec "$root/build/moetrain" train "$@"
