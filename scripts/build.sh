#!/usr/bin/env bash
# Installs dependencies (scripts/setup.sh) and builds moetrain in build/ (Release).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
mkdir -p "$root/build"
log="$root/build/build.log"
if ! { cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release &&
       cmake --build "$root/build" -j"$(nproc)"; } >"$log" 2>&1; then
  grep -E -A3 "error|Error" "$log" | head -60 >&2
  echo "build failed; full log: $log" >&2
  exit 1
fi
echo "build: ok (build/moetrain)"
