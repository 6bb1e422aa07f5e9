#!/usr/bin/env bash
# The measured 1F1B bubble of balanced stages lies within 25% of (PP-1)/(M+PP-1), for PP 2 and 4
# and several M (moetrain bench pipeline; fixed-time stages, see its header).
# Usage: bubble.sh MOETRAIN
set -euo pipefail
bin="$1"
source "$(dirname "$0")/lib.sh"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for pp in 2 4; do
  mpi "$pp" "$bin" bench pipeline --forward-ms 20 --iters 3 \
    --activation-floats 4096 --micro-batches 1,2,4,8 --schedule both --json >>"$out"
done
/usr/bin/env python3 - "$out" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
dec, pos, results = json.JSONDecoder(), 0, []
while pos < len(text):
    while pos < len(text) and text[pos].isspace(): pos += 1
    if pos >= len(text): break
    obj, pos = dec.raw_decode(text, pos); results.append(obj)
passed = failed = 0
for r in results:
    for row in r["rows"]:
        ok = row["bubble_theory"] == 0 or 0.75 <= row["ratio"] <= 1.25
        ok = ok and row["wrong"] == 0
        passed += ok; failed += not ok
        print(f'{"ok  " if ok else "FAIL"} {row["schedule"]:5s} PP={row["pp"]} M={row["M"]:2d} bubble {row["bubble"]:.3f} '
              f'theory {row["bubble_theory"]:.3f} ratio {row["ratio"]:.3f}')
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
