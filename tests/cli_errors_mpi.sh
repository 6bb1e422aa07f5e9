#!/usr/bin/env bash
# Bad parallel input under mpirun: the job ends (no hang), exits non-zero, and moetrain's error
# line names the problem exactly once (one rank reports). Usage: cli_errors_mpi.sh MOETRAIN CORPUS
set -uo pipefail
bin="$1"
corpus="$2"
source "$(dirname "$0")/lib.sh"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
pass=0
fail=0
expect() {  # expect NAME NP PATTERN ARGS...
  local name="$1" np="$2" pattern="$3"
  shift 3
  local out rc n
  out="$(timeout 60 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -np "$np" "$bin" train --steps 2 --quiet \
         --preset test-moe --seq-len 16 --batch 2 --data "$corpus" --out "$dir/$name" "$@" 2>&1)"
  rc=$?
  n=$(printf '%s\n' "$out" | grep -c "^moetrain: error")
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$n" -eq 1 ] && grep -q -- "$pattern" <<<"$out" \
     && [ ! -e "$dir/$name/model.safetensors" ]; then
    pass=$((pass + 1))
  else
    echo "FAIL $name: rc=$rc error lines=$n output: $out"
    fail=$((fail + 1))
  fi
}
expect world-mismatch 3 'pp(1) \* dp(1) \* ep(4) \* tp(1) = 4 != world size 3' --ep 4
expect ep-not-dividing-E 3 'ep(3) does not divide n_routed_experts (8)' --ep 3
expect bad-topology 4 'world size 4 is not a multiple of ranks per node 3' --ep 4 --topo.ranks-per-node 3
expect bad-a2a 2 "unknown all-to-all algorithm 'foo'" --ep 2 --a2a foo
expect pp-over-layers 4 "pp(4) exceeds the model's 3 layers" --pp 4
expect empty-stage 2 '--pp.layers: stage 1 has 0 layers' --pp 2 --pp.layers 3,0
expect layers-sum 2 '--pp.layers adds up to 2 layers but the model has 3' --pp 2 --pp.layers 1,1
expect zero-micro-batches 2 '--micro-batches must be >= 1, got 0' --pp 2 --micro-batches 0
expect batch-vs-micro 2 '--batch 2 is not divisible by --micro-batches 4' --pp 2 --micro-batches 4
expect bad-schedule 2 "pp2" --pp 2 --pp.schedule pp2
expect missing-data 2 'nope.txt' --ep 2 --data "$dir/nope.txt"
# Issue 15: flag values, resources and non-finite runs, on more than one rank.
expect lr-nan 2 '--lr must be a number in (0, 1\], got nan' --ep 2 --lr nan
expect min-lr-above-lr 4 '--min-lr 0.5 is above --lr 0.1' --ep 2 --pp 2 --lr 0.1 --min-lr 0.5
expect comm-timeout-negative 2 '--comm.timeout must be a number of seconds >= 0' --pp 2 --comm.timeout -3
# Tensor parallelism: the heads, the dense FFN width, the sequence and (seq_aux) the batch must split.
expect tp-heads 3 'tp(3) does not divide num_attention_heads (4)' --tp 3
expect tp-seq-len 2 '--tp 2 does not divide --seq-len 15' --tp 2 --seq-len 15
expect tp-seq-aux-batch 2 '--tp 2 with seq_aux: the micro-batch of 1 sequences per rank must split' --tp 2 --batch 1 \
  --preset test-moe-seqaux
expect tp-migrate 4 'expert migration under tensor parallelism is not supported yet' --tp 2 --ep 2 \
  --balance.migrate-every 5
/usr/bin/python3 - "$dir/ffn50.json" <<'PY'
import json, sys
json.dump({"architectures": ["DeepseekForCausalLM"], "model_type": "deepseek", "hidden_size": 32,
           "intermediate_size": 50, "moe_intermediate_size": 16, "num_hidden_layers": 3,
           "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_routed_experts": 8, "num_experts_per_tok": 2,
           "n_shared_experts": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
           "max_position_embeddings": 256, "vocab_size": 256}, open(sys.argv[1], "w"))
PY
expect tp-ffn 4 'tp(4) does not divide intermediate_size (50) of the dense layers' --tp 4 --config "$dir/ffn50.json"
# Grouped-query attention (model/family.h): each TP rank keeps whole groups of query heads.
/usr/bin/python3 - "$dir/qwen3.json" <<'PY'
import json, sys
json.dump({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 32,
           "head_dim": 16, "intermediate_size": 48, "moe_intermediate_size": 16, "num_hidden_layers": 2,
           "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True, "num_attention_heads": 4,
           "num_key_value_heads": 2, "max_position_embeddings": 256, "vocab_size": 256}, open(sys.argv[1], "w"))
PY
expect tp-kv-heads 4 'tp(4) does not divide num_key_value_heads (2)' --tp 4 --config "$dir/qwen3.json"
mkfifo "$dir/fifo"
expect data-fifo 2 'fifo: --data must be a regular file, this is a FIFO' --ep 2 --data "$dir/fifo"
expect out-of-memory 4 'not enough memory on .* for 4 ranks' --ep 2 --pp 2 --batch 20000 --seq-len 128
# Two ranks on one host need twice one rank's memory: 1.5 times one rank's estimate fits one only.
one=$(MOETRAIN_MEMORY_AVAILABLE=1 "$bin" train --steps 2 --quiet --preset test-moe --seq-len 16 --batch 2 \
      --data "$corpus" --out "$dir/probe" 2>&1 | sed -n 's/.*needs [^(]*(\([0-9]*\) bytes.*/\1/p')
[ -n "$one" ] || { echo "FAIL memory-probe: no byte count in the one-rank estimate"; fail=$((fail + 1)); one=0; }
MOETRAIN_MEMORY_AVAILABLE=$((one * 3 / 2)) expect memory-adds-up-per-host 2 'for 2 ranks' --dp 2
expect all-steps-skipped 2 'every step of this run was skipped (2 non-finite' --ep 2 --fault.nan-steps 1,2
expect bad-steps-in-a-row 4 '2 non-finite steps in a row (--max-bad-steps 2)' --ep 2 --pp 2 --steps 4 \
  --fault.nan-steps 2,3 --max-bad-steps 2
expect final-weights-not-finite 2 'the final weights are not finite' --pp 2 --fault.inf-weight-steps 1
# A checkpoint whose expert placement is damaged (expert 0 twice, expert 1 nowhere): the resume on the
# EP size that wrote it refuses it in setup, naming the field, the layer and the expert.
timeout 60 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -np 2 "$bin" train --steps 2 --quiet --preset test-moe \
  --seq-len 16 --batch 2 --data "$corpus" --ep 2 --out "$dir/ep2run" >/dev/null 2>&1
/usr/bin/python3 - "$dir/ep2run/checkpoints/step-2/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["expert_placement"]["1"][0][1] = 0
open(sys.argv[1], "w").write(json.dumps(m))
PY
expect bad-expert-placement 2 'manifest.json: field "expert_placement", layer 1: expert 0 is placed twice' \
  --ep 2 --steps 4 --resume "$dir/ep2run/checkpoints/step-2"
# export is one process: under mpirun it refuses (once), instead of every rank writing one folder.
out="$(timeout 60 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -np 2 "$bin" export "$dir/nockpt" "$dir/exp" 2>&1)"
rc=$?
n=$(printf '%s\n' "$out" | grep -c "^moetrain: error")
if [ "$rc" -ne 0 ] && [ "$n" -eq 1 ] && grep -q "export writes one folder from one process, but this is one of 2 ranks" <<<"$out"; then
  pass=$((pass + 1))
else
  echo "FAIL export-under-mpirun: rc=$rc error lines=$n output: $out"
  fail=$((fail + 1))
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
