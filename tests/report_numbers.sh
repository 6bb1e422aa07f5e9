#!/usr/bin/env bash
# The numbers `moetrain report` computes, against values worked out by hand, and its migration rows
# from a real run (issue 42, class 9). No browser needed.
#  1. Step-time percentiles (nearest rank) and outliers: 20 records whose step times are 1..19 s
#     and one 100 s step, shuffled: p50 is the 10th smallest (10 s), p95 the 19th (19 s, not the
#     max), Q1 5 s and Q3 15 s give the far-out fence 15 + 3 * 10 = 45 s, so only the 100 s step is
#     an outlier; the median MFU of 1..20 % (shuffled) is the 10th smallest, 10.0 %.
#  2. Expert migrations of a real EP 2 run (--balance.migrate-every 2): the page's rows are the
#     metrics' migration records, one per layer that moved, in step order then layer order, with
#     the swaps and the imbalance before -> after the trainer logged.
# Usage: report_numbers.sh MOETRAIN CORPUS WORK [MPIRUN]
set -euo pipefail
bin="$1"; corpus="$2"; work="$3"; mpirun="${4:-}"
py=/usr/bin/python3
rm -rf "$work"; mkdir -p "$work/pct"
source "$(dirname "$0")/lib.sh"
[ -n "$mpirun" ] && MPIRUN="$mpirun"
pass=0
ok() { pass=$((pass + 1)); echo "ok: $*"; }
die() { echo "FAIL: $*"; exit 1; }

"$py" - "$work/pct/metrics.jsonl" <<'PY'
import json, random, sys
rng = random.Random(42)
times = list(range(1, 20)) + [100]
mfu = list(range(1, 21))
rng.shuffle(times); rng.shuffle(mfu)
with open(sys.argv[1], "w") as f:
    for i in range(20):
        f.write(json.dumps({"step": i + 1, "loss": 5.0 - 0.1 * i, "lr": 1e-3, "tokens": 512,
                            "tokens_per_s": 512 / times[i], "mfu": mfu[i] / 100, "step_time_s": times[i]}) + "\n")
PY
"$bin" report "$work/pct" -o "$work/pct.html" >/dev/null
for want in "p50 10.00 s, p95 19.00 s, max 100.00 s" \
            "Outliers (slower than Q3 + 3 IQR = 45.00 s): 1 step(s): step " \
            "MFU (median step)</td><td>10.0%"; do
  grep -qF -- "$want" "$work/pct.html" || die "percentiles: the page lacks '$want'"
done
ok "step-time p50, p95, max, the Q3 + 3 IQR fence and the median MFU match the hand-computed values"

if [ -n "$mpirun" ]; then
  mpi 2 \
    "$bin" train --preset test-moe --data "$corpus" --steps 12 --seq-len 32 --batch 4 --ep 2 --eval-every 0 \
    --balance.migrate-every 2 --balance.threshold 1.0001 --quiet --out "$work/mig" >/dev/null
  "$bin" report "$work/mig" -o "$work/mig.html" >/dev/null
  "$py" - "$work/mig/metrics.jsonl" "$work/mig.html" <<'PY' || die "migration rows"
import html, json, re, sys
want = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    m = r.get("migration")
    if m:
        for l in m["layers"]:
            want.append([str(r["step"] + 1), str(l["layer"]), f'{l["swaps"]} swap(s)',
                         f'{l["imbalance_before"]:.3f} -> {l["imbalance_after"]:.3f}'])
page = open(sys.argv[2]).read()
sec = page.split('id="migrations"', 1)
assert len(sec) == 2, "no migrations section"
table = sec[1].split("<table>", 1)[1].split("</table>", 1)[0]
rows = [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", tr)] for tr in re.findall(r"<tr>(.*?)</tr>", table)]
rows = [r for r in rows if r]
got = [r[:4] for r in rows]
steps = {w[0] for w in want}
assert len(want) >= 2 and len(steps) >= 2, f"the run migrated too little to check an order: {want}"
assert got == want, f"rows {got} != metrics {want}"
print(f"{len(want)} migration rows over {len(steps)} steps, in order")
PY
  ok "the migration rows of a real EP 2 run are the metrics' records, in step then layer order"
fi
echo "$pass passed, 0 failed"
