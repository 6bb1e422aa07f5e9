#!/usr/bin/env bash
# moetrain report: the pages of a short single-rank run, a 4-rank EP 2 x PP 2 run and a 4-rank EP 4
# run with expert migration, rendered in headless Chromium: a screenshot that is not blank, no
# JavaScript error in the browser's log, the browser's DOM holding every plot, every plot drawing
# data, the page self-contained; the sections a run lacks say so in a line. Expert loads of the
# PP 2 run cover both stages' layers (equal to one process's at step 1). The EP 4 run's balance and
# migration sections hold the numbers of its metrics.jsonl. Bad inputs: one line each, no page written.
# Usage: report.sh MOETRAIN CORPUS WORK [MPIRUN]. Exits 77 (ctest: SKIPPED) without chromium.
set -euo pipefail
bin="$1"; corpus="$2"; work="$3"; mpirun="${4:-}"
here="$(cd "$(dirname "$0")" && pwd)"
py=/usr/bin/python3
chromium="$(command -v chromium || true)"
if [ -z "$chromium" ] || [ ! -x "$py" ]; then
  echo "report: SKIPPED (needs Debian's chromium and /usr/bin/python3; scripts/setup.sh installs them)"
  exit 77
fi
rm -rf "$work"; mkdir -p "$work"
source "$(dirname "$0")/lib.sh"
[ -n "$mpirun" ] && MPIRUN="$mpirun"
pass=0
ok() { pass=$((pass + 1)); echo "ok: $*"; }
die() { echo "FAIL: $*"; exit 1; }

# Renders PAGE: screenshot + DOM + the browser's log; fails on a JavaScript error or a blank shot.
render() {
  local page="$1" name="$2"
  "$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars --force-device-scale-factor=0.5 \
    --window-size=1000,2600 --enable-logging=stderr --v=0 --screenshot="$work/$name.png" \
    "file://$page" >"$work/$name.shot.log" 2>&1 || die "chromium screenshot of $page failed"
  "$chromium" --headless --no-sandbox --disable-gpu --enable-logging=stderr --v=0 --dump-dom "file://$page" \
    >"$work/$name.dom.html" 2>"$work/$name.dom.log" || die "chromium --dump-dom of $page failed"
  if grep -E -h "Uncaught|SyntaxError|ReferenceError|TypeError|CONSOLE" "$work/$name.shot.log" "$work/$name.dom.log"; then
    die "$page: JavaScript error or console output in the browser"
  fi
  "$py" "$here/report_check.py" png "$work/$name.png" || die "$name: screenshot"
  "$py" "$here/report_check.py" dom "$page" "$work/$name.dom.html" || die "$name: DOM"
}

common=(--preset test-moe --data "$corpus" --steps 24 --eval-every 8 --seq-len 64 --micro-batches 2 --quiet)
"$bin" train "${common[@]}" --batch 8 --out "$work/one"
"$bin" report "$work/one" >/dev/null
"$py" "$here/report_check.py" html "$work/one/report.html" 8 loss throughput step-time all-to-all expert-load pipeline
grep -q 'No all-to-all in this run' "$work/one/report.html" || die "single rank: no line saying there is no all-to-all"
grep -q 'One pipeline stage' "$work/one/report.html" || die "single rank: no line saying there is no pipeline"
render "$work/one/report.html" one
ok "single-rank report renders"

# A blank page must fail the screenshot check (the check can fail).
echo '<!DOCTYPE html><html><body></body></html>' > "$work/blank.html"
"$chromium" --headless --no-sandbox --disable-gpu --force-device-scale-factor=0.5 --window-size=1000,800 \
  --screenshot="$work/blank.png" "file://$work/blank.html" >/dev/null 2>&1
if "$py" "$here/report_check.py" png "$work/blank.png" >/dev/null; then die "a blank screenshot passed the check"; fi
ok "a blank screenshot fails the check"

if [ -n "$mpirun" ]; then
  mpi 4 \
    "$bin" train "${common[@]}" --batch 4 --ep 2 --pp 2 --topo.ranks-per-node 1 --out "$work/grid"
  "$bin" report "$work/grid" -o "$work/grid.html" >/dev/null
  "$py" "$here/report_check.py" html "$work/grid.html" 12 loss throughput step-time all-to-all expert-load pipeline
  grep -q 'inter_node' "$work/grid.html" || die "EP 2 over 2 nodes: no inter-node bytes in the page"
  grep -q 'Bubble per stage' "$work/grid.html" || die "PP 2: no bubble plot"
  render "$work/grid.html" grid
  # Both stages' MoE layers (1 on stage 0, 2 on stage 1) are in the record, equal to one process's.
  compare losses "$work/grid" "$work/one" --keys expert_loads_layers,expert_loads --steps 1-1 \
    --name "EP 2 x PP 2: step 1's expert loads" || die "PP 2 expert loads"
  ok "EP 2 x PP 2 report renders; expert loads of both stages equal one process's"

  # A real EP 4 run whose experts migrate (every 2 steps, any imbalance above 1.0001): the balance
  # and migration sections render, and their numbers are the metrics file's.
  mpi 4 \
    "$bin" train --preset test-moe --data "$corpus" --steps 12 --eval-every 6 --seq-len 32 --batch 2 --ep 4 \
    --topo.ranks-per-node 2 --balance.migrate-every 2 --balance.threshold 1.0001 --quiet --out "$work/mig"
  "$bin" report "$work/mig" -o "$work/mig.html" >/dev/null
  "$py" "$here/report_check.py" html "$work/mig.html" 9 loss all-to-all expert-load balance migrations
  render "$work/mig.html" mig
  "$py" - "$work/mig/metrics.jsonl" "$work/mig.html" <<'EOF' || die "EP 4: balance and migration numbers"
import html, json, re, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
page = open(sys.argv[2]).read()
def table(section):
    body = page.split(f'<h2 id="{section}">', 1)[1].split("<h2", 1)[0]
    t = body.split("<table>", 1)[1].split("</table>", 1)[0]
    rows = [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", tr)] for tr in re.findall(r"<tr>(.*?)</tr>", t)]
    return body, [r for r in rows if r]
def fmt_bytes(b):
    u, i = ["B", "KiB", "MiB", "GiB", "TiB"], 0
    while b >= 1024 and i < 4: b /= 1024; i += 1
    return (f"{b:.0f}" if i == 0 else f"{b:.2f}") + " " + u[i]
# Balance: per MoE layer, its load_imbalance first, last, mean, max; mean tokens per EP rank; migrations.
ids = recs[0]["expert_loads_layers"]
assert all(len(r["rank_loads"][0]) == 4 for r in recs), "rank_loads is not per EP rank"
want = []
for i, layer in enumerate(ids):
    v = [r["load_imbalance"][i] for r in recs]
    ranks = [sum(r["rank_loads"][i][q] for r in recs) / len(recs) for q in range(4)]
    moves = [l for r in recs if "migration" in r for l in r["migration"]["layers"] if l["layer"] == layer]
    want.append([f"layer {layer}", f"{v[0]:.3f}", f"{v[-1]:.3f}", f"{sum(v) / len(v):.3f}", f"{max(v):.3f}",
                 " / ".join(f"{x:.0f}" for x in ranks), f"{len(moves)} ({sum(l['swaps'] for l in moves)} swap(s))"])
_, got = table("balance")
assert got == want, f"balance rows {got} != metrics {want}"
# Migrations: one row per layer that moved, before the next step, the move's bytes on its first row.
want, total = [], 0
for r in recs:
    m = r.get("migration")
    if not m: continue
    total += m["bytes_moved"]
    for k, l in enumerate(m["layers"]):
        want.append([str(r["step"] + 1), str(l["layer"]), f'{l["swaps"]} swap(s)',
                     f'{l["imbalance_before"]:.3f} -> {l["imbalance_after"]:.3f}',
                     fmt_bytes(m["bytes_moved"]) if k == 0 else ""])
body, got = table("migrations")
assert len(want) >= 2, f"the run migrated too little to check: {want}"
assert [g[:5] for g in got] == want, f"migration rows {got} != metrics {want}"
assert f"{len(want)} migration(s), {fmt_bytes(total)} moved." in body, "migration summary line"
print(f"balance: {len(ids)} layers; migrations: {len(want)} rows, {fmt_bytes(total)}")
EOF
  ok "EP 4 run with migration: balance and migration sections render, their numbers are the metrics'"
fi


# Bad inputs: one line naming the thing, non-zero exit, no page.
expect_error() {  # expect_error "WHAT" "MESSAGE PART" ARGS...
  local what="$1" msg="$2"; shift 2
  local rc=0
  "$bin" "$@" >"$work/out.txt" 2>"$work/err.txt" || rc=$?
  [ "$rc" -ne 0 ] || die "$what: exit 0"
  [ "$(wc -l <"$work/err.txt")" -eq 1 ] || { cat "$work/err.txt"; die "$what: not one line"; }
  grep -qF -- "$msg" "$work/err.txt" || { cat "$work/err.txt"; die "$what: message lacks '$msg'"; }
  ok "$what: $(cat "$work/err.txt")"
}
mkdir -p "$work/empty"
expect_error "folder without metrics" "$work/empty: no metrics.jsonl" report "$work/empty"
[ ! -e "$work/empty/report.html" ] || die "a page was written for a folder without metrics"
expect_error "no such folder" "$work/nope: no such folder" report "$work/nope"
mkdir -p "$work/bad"
{ head -n 2 "$work/one/metrics.jsonl"; echo '{"step": 3, "loss": "high"}'; } > "$work/bad/metrics.jsonl"
expect_error "a field of the wrong type" 'line 3: "loss" must be a number' report "$work/bad"
{ head -n 2 "$work/one/metrics.jsonl"; echo '{"step": 3, "loss": 1.0'; tail -n 1 "$work/one/metrics.jsonl"; } > "$work/bad/metrics.jsonl"
expect_error "a broken line in the middle" "metrics.jsonl: line 3: not valid JSON" report "$work/bad"
: > "$work/bad/metrics.jsonl"
expect_error "an empty metrics file" "no step records" report "$work/bad"
expect_error "an output folder that does not exist" "$work/no/dir/r.html: cannot write" \
  report "$work/one" -o "$work/no/dir/r.html"
[ ! -e "$work/no" ] || die "the report created a folder"
[ -z "$(find "$work" -name '*.tmp' -o -name '*.tmp.[0-9]*')" ] || die "a temporary file was left behind"

# A run killed mid-line, then resumed (steps logged twice), with a line of a kind moetrain does not
# write (an "event"): the torn line is left out, later records win, the event is counted.
mkdir -p "$work/resumed"
{ head -n 12 "$work/one/metrics.jsonl"; sed -n 9,24p "$work/one/metrics.jsonl"
  echo '{"event":"rebalance-plan","step":20}'
  head -c 100 "$work/one/metrics.jsonl"; } > "$work/resumed/metrics.jsonl"
"$bin" report "$work/resumed" >/dev/null
"$py" "$here/report_check.py" html "$work/resumed/report.html" 8 loss
for s in "4 step(s) were logged twice" "last line of the file is incomplete" \
         "1 event record(s) of unknown kind" "steps</td><td>1 .. 24 (24 records)"; do
  grep -qF "$s" "$work/resumed/report.html" || die "resumed run: the page lacks '$s'"
done
for id in migrations balance; do
  grep -q "id=\"$id\"" "$work/one/report.html" && die "a $id section in a single-rank run"
done
ok "resumed run with a torn line and an unknown event"

echo "$pass passed, 0 failed"
