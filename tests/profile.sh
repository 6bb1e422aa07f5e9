#!/usr/bin/env bash
# moetrain train --profile: every step's metrics carry the MoE layers' step times (time_s.moe),
# which are parts of the step's compute time, the expert GEMMs part of the experts' steps, and the
# run ends with the summary; without --profile the metrics have no time_s.moe.
# Usage: profile.sh MOETRAIN CORPUS WORK
set -euo pipefail
bin="$1"; corpus="$2"; work="$3"
rm -rf "$work"; mkdir -p "$work"
export OPENBLAS_NUM_THREADS=1
"$bin" train --preset test-moe --steps 3 --seq-len 32 --batch 4 --eval-every 0 --data "$corpus" \
  --profile --out "$work/on" 2>"$work/on.log" || { cat "$work/on.log" >&2; exit 1; }
grep -q "^profile (rank 0, all steps)" "$work/on.log" || { cat "$work/on.log"; echo "no profile summary"; exit 1; }
grep -q "expert GEMMs" "$work/on.log"
# --peak-gflops: MFU counts against the given figure (a calibrated profile's), not a measurement.
"$bin" train --preset test-moe --steps 1 --seq-len 32 --batch 4 --eval-every 0 --data "$corpus" \
  --peak-gflops 1234.5 --out "$work/off" 2>"$work/off.log"
grep -q "peak 1234.5 GFLOP/s per rank (fp32 GEMM, given by --peak-gflops)" "$work/off.log" ||
  { cat "$work/off.log"; echo "the first line does not name the given peak"; exit 1; }
/usr/bin/python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
recs = [json.loads(l) for l in open(f"{work}/on/metrics.jsonl") if '"step_time_s"' in l]
assert len(recs) == 3, len(recs)
for r in recs:
    t, m = r["time_s"], r["time_s"]["moe"]
    fwd = ["route", "layout", "buffers", "dispatch", "experts", "combine", "shared"]
    bwd = ["buffers'", "shared'", "combine'", "experts'", "dispatch'", "route'"]
    moe = sum(m[k] for k in fwd + bwd)
    assert 0 < moe <= t["compute"] + 1e-6, (moe, t["compute"])
    assert m["gate+up gemm"] + m["swiglu"] + m["down gemm"] <= m["experts"] + 1e-9, m
    assert m["down' gemms"] + m["swiglu'"] + m["gate+up' gemms"] <= m["experts'"] + 1e-9, m
    assert r["mfu_peak"]["precision"] == "fp32" and r["mfu_peak"]["gflops"] > 0, r["mfu_peak"]
    assert r["mfu_peak"]["source"] == "measured", r["mfu_peak"]
off = [json.loads(l) for l in open(f"{work}/off/metrics.jsonl") if '"step_time_s"' in l]
assert off and "moe" not in off[0]["time_s"], off[0]["time_s"]
assert off[0]["mfu_peak"] == {"gflops": 1234.5, "precision": "fp32", "source": "--peak-gflops"}, off[0]
# Same model and batch, so the same flops a step: mfu x peak x step time agrees between the runs.
flops = [r["mfu"] * r["mfu_peak"]["gflops"] * r["step_time_s"] for r in (recs[0], off[0])]
assert abs(flops[0] - flops[1]) <= 1e-6 * flops[0], flops
print("1 passed, 0 failed")
PY
