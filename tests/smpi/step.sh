#!/usr/bin/env bash
# CI test of the simulated training step (ctest -L smpi): builds moetrain_smpi_step (the SMPI
# build, -DMOETRAIN_SMPI=ON) in BUILD_DIR and simulates one step of X-MoE-Small on 32 ranks
# (4 Frontier-like nodes x 8), 512 tokens per rank, the layout the planner's search picks, and
# checks what must hold whatever the network:
#   - every exchange plan's counts are exact (#wrong = 0), and the number of exchanges is the
#     schedule's: 4 per MoE layer and micro-batch on every EP rank (dispatch and combine, forward
#     and backward), 6 with recomputation;
#   - the injected compute is the planner's (the slowest rank's stage compute, within 1e-6), and
#     the simulated step is no shorter than its compute + optimizer;
#   - the gradient all-reduce part is within 25% of the planner's ring model for that stage
#     (2(g-1)/g of the bytes over the node's NIC share, 2(g-1) latencies; measured -3% to +1%);
#   - a layout that does not fit the world is refused in one line naming it, exit status != 0.
# Exits 77 (ctest: skipped) when SimGrid (smpicxx, smpirun) is not installed.
# Usage: tests/smpi/step.sh BUILD_DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
source "$root/tests/smpi/common.sh"
smpi_setup step "${1:?usage: step.sh BUILD_DIR}" moetrain_smpi_step
run="$build/run-step"
mkdir -p "$run"
python3 "$root/platforms/gen_platform.py" frontier 4 "$run/frontier-4.xml"
overhead=$(python3 -c "import json;print(json.load(open('$root/platforms/calibration.json'))['overhead_us'])")
cfg=(--cfg=smpi/simulate-computation:no --cfg=smpi/send-is-detached-thresh:0 --cfg=smpi/bw-factor:0:1
     --cfg=smpi/lat-factor:0:1 --cfg=maxmin/precision:1e-4 --cfg=smpi/iprobe:1e-10 --cfg=contexts/stack-size:128
     --cfg=surf/precision:1e-6 --cfg=smpi/shared-malloc:local --cfg=smpi/auto-shared-malloc-thresh:65536)
step() {
  (cd "$run" && smpirun -np 32 -platform frontier-4.xml -hostfile frontier-4.hosts "${cfg[@]}" \
     "$build/moetrain_smpi_step" --topo.ranks-per-node 8 --model xmoe-small --tokens-per-rank 512 \
     --seq-len 512 --msg-overhead-us "$overhead" "$@")
}
step --json >"$run/out.txt" 2>"$run/err.txt" || {
  tail -20 "$run/err.txt" >&2
  echo "smpi step: smpirun failed" >&2
  exit 1
}
python3 - "$run/out.txt" <<'PY'
import json, sys
t = open(sys.argv[1]).read()
j = json.loads(t[t.index("{"):t.rindex("}") + 1])
s, p = j["simulated"], j["predicted"]
print(f'smpi step: {j["ranks"]} ranks, layout {j["layout"]} ({j["layout_source"]}): step {s["step_s"]:.4f} s '
      f'simulated (compute {s["compute_s"]:.4f}, a2a {s["a2a_s"]:.4f}, p2p+bubble {s["p2p_wait_s"]:.4f}, '
      f'all-reduce {s["allreduce_s"]:.4f}), planner {p["step_s"]:.4f} s; {j["exchanges"]} exchanges, #wrong {j["wrong"]}')
lay = dict(kv.split("=") for kv in j["layout"].split(","))
pp, ep, mb = int(lay["pp"]), int(lay["ep"]), int(lay["mb"])
per = 6 if lay["recompute"] != "none" else 4
moe_layers = 28  # xmoe-small: every layer is an MoE layer, each on one stage
want = per * moe_layers * mb * (j["ranks"] // pp) if ep > 1 else 0
assert j["layout_source"] == "planner search", j["layout_source"]
assert j["wrong"] == 0, f'{j["wrong"]} exchange counts wrong'
assert j["exchanges"] == want, f'{j["exchanges"]} exchanges, the schedule has {want}'
assert abs(s["compute_s"] / p["compute_stage_s"] - 1) <= 1e-6, (s["compute_s"], p["compute_stage_s"])
assert s["step_s"] >= s["compute_s"] + s["optimizer_s"], s
err = s["allreduce_s"] / p["allreduce_stage_s"] - 1
print(f'smpi step: all-reduce {s["allreduce_s"]:.4f} s simulated vs {p["allreduce_stage_s"]:.4f} s ring model ({100 * err:+.1f}%)')
assert abs(err) <= 0.25, f"all-reduce {100 * err:+.1f}% off the planner's ring model"
PY
if step --layout "pp=1,dp=1,ep=16,mb=1" >"$run/bad.txt" 2>&1; then
  echo "smpi step: a 16-rank layout on 32 ranks was accepted" >&2
  exit 1
fi
grep -q "layout pp=1,dp=1,ep=16.* has 16 ranks, the run 32" "$run/bad.txt" || {
  cat "$run/bad.txt" >&2
  echo "smpi step: the refusal does not name the layout and the world size" >&2
  exit 1
}
echo "smpi step: passed"
