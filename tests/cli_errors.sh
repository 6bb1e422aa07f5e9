#!/usr/bin/env bash
# Bad input through the CLI (one process): each case must exit non-zero with a one-line error
# naming the problem, and leave no weights behind.
# Usage: cli_errors.sh MOETRAIN [--markdown]
#   --markdown: also print one markdown table row per case (case | command | error printed) on
#   stdout, for docs/bad_inputs.md (scripts/bad_inputs_table.sh); failures still fail the run.
set -uo pipefail
bin="$1"
markdown=0
[ "${2:-}" = "--markdown" ] && markdown=1
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
pass=0
fail=0

printf 'In the beginning God created the heaven and the earth.\n%.0s' {1..3000} > "$dir/text.txt"
common=(train --steps 2 --batch 2 --seq-len 16 --eval-batches 1 --quiet --data "$dir/text.txt")

# The command as the table shows it: temporary paths by their base name, the shared flags
# (${common[@]}) as "…", the per-case --out folder left out.
show_command() {
  local -a a=("$@")
  local s="moetrain" i=0
  if [ "${#a[@]}" -ge "${#common[@]}" ] && [ "${a[*]:0:${#common[@]}}" = "${common[*]}" ]; then
    s+=" train …"
    i=${#common[@]}
  fi
  for (( ; i < ${#a[@]}; i++)); do
    if [ "${a[i]}" = "--out" ] && [[ "${a[i + 1]:-}" == "$dir"/o* ]]; then
      i=$((i + 1))
      continue
    fi
    s+=" ${a[i]//$dir\//}"
  done
  printf '%s' "$s"
}

# expect NAME 'WHAT' PATTERN ARGS...: the command fails and prints exactly one line to stderr
# matching PATTERN (fixed string). WHAT is the case as the table names it.
expect() {
  local name="$1" what="$2" pattern="$3"
  shift 3
  local err rc lines
  err="$("$bin" "$@" 2>&1 >/dev/null)"
  rc=$?
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [ "$rc" -ne 0 ] && [ "$lines" -eq 1 ] && printf '%s' "$err" | grep -qF -- "$pattern"; then
    pass=$((pass + 1))
    if [ "$markdown" -eq 1 ]; then
      local cmd shown
      cmd="$(show_command "$@")"
      shown="${err//$dir\//}"
      printf '| %s | `%s` | `%s` |\n' "$what" "${cmd//|/\\|}" "${shown//|/\\|}"
    fi
  else
    echo "FAIL $name: rc=$rc lines=$lines stderr: $err" >&2
    fail=$((fail + 1))
  fi
}

cfg() {  # cfg FILE PYTHON-EDIT: writes a test-moe-like config.json with one edit applied to c
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, sys
c = {"model_type": "deepseek", "vocab_size": 256, "hidden_size": 32, "num_hidden_layers": 2,
     "num_attention_heads": 4, "intermediate_size": 48, "moe_intermediate_size": 16,
     "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
     "first_k_dense_replace": 1, "aux_loss_alpha": 0.01}
exec(sys.argv[2])
open(sys.argv[1], "w").write(json.dumps(c))
PY
}
if [ "$markdown" -eq 1 ]; then
  echo '| case | command | error printed |'
  echo '|---|---|---|'
fi

# --- model config -------------------------------------------------------------------------------
expect unknown-preset 'unknown preset' \
  'unknown model preset "huge"' "${common[@]}" --preset huge --out "$dir/o1"
cfg "$dir/k.json" 'c["num_experts_per_tok"] = 9'
expect k-greater-than-E 'config: top-k > experts (`num_experts_per_tok` 9, E = 8)' \
  'num_experts_per_tok (9) exceeds n_routed_experts (8)' "${common[@]}" --config "$dir/k.json" --out "$dir/o2"
cfg "$dir/div.json" 'c["num_attention_heads"] = 5'
expect heads-not-divisible 'config: hidden 32 not divisible by 5 heads' \
  'not divisible by num_attention_heads (5)' "${common[@]}" --config "$dir/div.json" --out "$dir/o3"
cfg "$dir/miss.json" 'del c["hidden_size"]'
expect missing-field 'config: required field missing (`hidden_size`)' \
  'missing field "hidden_size"' "${common[@]}" --config "$dir/miss.json" --out "$dir/o4"
cfg "$dir/type.json" 'c["n_routed_experts"] = "eight"'
expect wrong-type 'config: field of the wrong type (`"n_routed_experts": "eight"`)' \
  '"n_routed_experts" must be an integer' "${common[@]}" --config "$dir/type.json" --out "$dir/o5"
echo '{"hidden_size": 32,' > "$dir/broken.json"
expect broken-json 'config: truncated JSON' \
  'broken.json: not valid JSON' "${common[@]}" --config "$dir/broken.json" --out "$dir/o6"
expect missing-config 'config: file does not exist' \
  'nope.json: cannot open' "${common[@]}" --config "$dir/nope.json" --out "$dir/o7"
echo '[32, 2, 4]' > "$dir/array.json"
expect config-not-object 'config: JSON but not an object' \
  'a config must be a JSON object' "${common[@]}" --config "$dir/array.json" --out "$dir/o13"
cfg "$dir/neg.json" 'c["hidden_size"] = -32'
expect negative-hidden 'config: negative size (`hidden_size` -32)' \
  '"hidden_size" must be positive, got -32' "${common[@]}" --config "$dir/neg.json" --out "$dir/o14"
cfg "$dir/huge.json" 'c["hidden_size"] = 10**10'
expect int-out-of-range 'config: integer beyond int32 (`hidden_size` 10^10)' \
  'field "hidden_size" = 10000000000 is out of range' "${common[@]}" --config "$dir/huge.json" --out "$dir/o15"
cfg "$dir/theta.json" 'c["rope_theta"] = 1e300'
expect float-out-of-range 'config: number beyond float32 (`rope_theta` 1e300)' \
  'field "rope_theta" = 1e+300 is out of range for a 32-bit float' "${common[@]}" --config "$dir/theta.json" --out "$dir/o38"
cfg "$dir/llama.json" 'c["model_type"] = "llama"'
expect unsupported-model-type 'config: another architecture (`model_type` llama)' \
  'model_type "llama" is not supported' "${common[@]}" --config "$dir/llama.json" --out "$dir/o16"
cfg "$dir/odd.json" 'c["hidden_size"] = 12'
expect odd-head-dim 'config: odd head_dim (12 / 4 heads = 3), no RoPE pairs' \
  'head_dim = hidden_size / num_attention_heads = 3 must be even' "${common[@]}" --config "$dir/odd.json" --out "$dir/o17"
cfg "$dir/gqa.json" 'c["num_key_value_heads"] = 2'
expect gqa 'config: grouped-query attention (`num_key_value_heads` 2 of 4)' \
  'grouped-query attention is not supported' "${common[@]}" --config "$dir/gqa.json" --out "$dir/o18"
# The other families (model/family.h): what the trainer cannot honour names its field.
fam='c = {"model_type": "qwen3_moe", "vocab_size": 256, "hidden_size": 32, "num_hidden_layers": 2,
     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 48,
     "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True}; '
cfg "$dir/q3bias.json" "$fam"'c["attention_bias"] = True'
expect family-attention-bias 'config: attention biases for a family without them (qwen3_moe `attention_bias` true)' \
  'attention_bias = true is not supported (qwen3_moe has no attention biases)' "${common[@]}" --config "$dir/q3bias.json" --out "$dir/o18a"
cfg "$dir/q3kv.json" "$fam"'c["num_key_value_heads"] = 3'
expect family-kv-heads 'config: query heads not in whole groups (`num_key_value_heads` 3 of 4)' \
  'num_attention_heads (4) is not a multiple of num_key_value_heads (3)' "${common[@]}" --config "$dir/q3kv.json" --out "$dir/o18b"
cfg "$dir/mixwin.json" "$fam"'c.update(model_type="mixtral", num_local_experts=8, intermediate_size=16, sliding_window=8)'
expect family-sliding-window 'config: a sliding window shorter than the sequence (mixtral `sliding_window` 8, --seq-len 16)' \
  'sequence length 16 exceeds sliding_window 8 (mixtral)' "${common[@]}" --config "$dir/mixwin.json" --out "$dir/o18c"
cfg "$dir/sigmoid.json" 'c["scoring_func"] = "sigmoid"'
expect sigmoid-router 'config: unsupported router (`scoring_func` sigmoid)' \
  'scoring_func "sigmoid" is not supported' "${common[@]}" --config "$dir/sigmoid.json" --out "$dir/o19"
cfg "$dir/topk.json" 'c["topk_method"] = "sparse_magic"'
expect unknown-topk-method 'config: unknown router selection (`topk_method` sparse_magic)' \
  'topk_method "sparse_magic" is not supported (supported: greedy, group_limited_greedy, noaux_tc)' "${common[@]}" --config "$dir/topk.json" --out "$dir/o19b"
expect bias-rate-without-noaux '`--balance.bias-rate` for a model without aux-loss-free balancing' \
  '--balance.bias-rate 0.001: the model'"'"'s router uses topk_method "greedy"' "${common[@]}" --preset test-moe --balance.bias-rate 1e-3 --out "$dir/o19c"
# Group-limited routing (DeepSeek-V2/V3 n_group, topk_group); v3 = the sigmoid + noaux_tc router.
v3='c.update(scoring_func="sigmoid", topk_method="noaux_tc", norm_topk_prob=True); '
cfg "$dir/g1.json" "$v3"'c.update(n_group=4, topk_group=5)'
expect topk-group-over-n-group 'config: more groups kept than there are (`topk_group` 5, `n_group` 4)' \
  'topk_group (5) exceeds n_group (4)' "${common[@]}" --config "$dir/g1.json" --out "$dir/o19d"
cfg "$dir/g2.json" "$v3"'c.update(n_group=3, topk_group=1)'
expect n-group-not-dividing 'config: `n_group` 3 does not divide the 8 experts' \
  'n_group (3) does not divide n_routed_experts (8)' "${common[@]}" --config "$dir/g2.json" --out "$dir/o19e"
cfg "$dir/g3.json" "$v3"'c.update(n_group=4, topk_group=0)'
expect topk-group-zero 'config: `topk_group` 0' \
  '"topk_group" must be >= 1, got 0' "${common[@]}" --config "$dir/g3.json" --out "$dir/o19f"
cfg "$dir/g4.json" 'c.update(n_group=2, topk_group=1)'
expect groups-with-greedy 'config: `n_group` 2 with `topk_method` greedy (which ignores groups)' \
  'n_group = 2 needs topk_method "group_limited_greedy" (softmax) or "noaux_tc" (sigmoid)' "${common[@]}" --config "$dir/g4.json" --out "$dir/o19g"
cfg "$dir/g5.json" 'c.update(topk_method="group_limited_greedy", n_group=8, topk_group=1)'
expect groups-cannot-hold-k 'config: kept groups hold fewer experts than top-k (1 group of 1, k = 2)' \
  'topk_group (1) * n_routed_experts / n_group (1) = 1 experts cannot hold num_experts_per_tok (2)' "${common[@]}" --config "$dir/g5.json" --out "$dir/o19h"
cfg "$dir/vocab.json" 'c["vocab_size"] = 100'
expect small-vocab 'config: vocabulary smaller than the 256 byte tokens' \
  'byte-level data needs vocab_size >= 256, the config has 100' "${common[@]}" --config "$dir/vocab.json" --out "$dir/o20"
cfg "$dir/k0.json" 'c["num_experts_per_tok"] = 0'
expect zero-topk 'config: MoE layers with top-k 0' \
  '"num_experts_per_tok" must be positive, got 0' "${common[@]}" --config "$dir/k0.json" --out "$dir/o21"

# --- parallel degrees on one process --------------------------------------------------------------
expect ep-one-process '`--ep 2` on one process' \
  'pp(1) * dp(1) * ep(2) * tp(1) = 2 != world size 1' "${common[@]}" --preset test-moe --ep 2 --out "$dir/o22"
expect pp-one-process '`--pp 2` on one process' \
  'pp(2) * dp(1) * ep(1) * tp(1) = 2 != world size 1' "${common[@]}" --preset test-moe --pp 2 --out "$dir/o23"
expect dp-zero '`--dp 0`' \
  'parallel degrees must be >= 1, got pp(1) dp(0) ep(1) tp(1)' "${common[@]}" --preset test-moe --dp 0 --out "$dir/o24"
expect topo-one-process 'emulated nodes that do not tile the world' \
  'world size 1 is not a multiple of ranks per node 2' "${common[@]}" --topo.ranks-per-node 2 --out "$dir/o25"

# --- dataset --------------------------------------------------------------------------------------
expect missing-data 'data: file does not exist' \
  'missing.txt: cannot open' train --steps 2 --quiet --data "$dir/missing.txt" --out "$dir/o8"
: > "$dir/empty.txt"
expect empty-data 'data: empty file' \
  'empty.txt: file is empty' train --steps 2 --quiet --data "$dir/empty.txt" --out "$dir/o9"
printf 'short' > "$dir/short.txt"
expect tiny-data 'data: 5 bytes, no window of seq-len + 1' \
  'short.txt: the val split has no window' train --steps 2 --quiet --data "$dir/short.txt" --out "$dir/o10"
head -c 3000 "$dir/text.txt" > "$dir/3k.txt"
expect data-too-small-for-seq-len 'data: 3 KB file, `--seq-len 200` (held-out blocks too short)' \
  '3k.txt: the val split has no window of seq_len+1 = 201 bytes' "${common[@]}" --preset test-moe --data "$dir/3k.txt" --seq-len 200 --out "$dir/o26"
mkdir -p "$dir/corpus_dir"
expect data-directory 'data: `--data` is a directory' \
  'corpus_dir: is a directory' "${common[@]}" --data "$dir/corpus_dir" --out "$dir/o27"

# --- tokenized datasets (moetrain tokenize; Megatron .bin/.idx) -----------------------------------
# ds: text.txt as bytes, one document per line. Each damaged copy keeps the other file intact.
"$bin" tokenize --input "$dir/text.txt" --tokenizer bytes --docs line --output "$dir/ds" --quiet
damaged_copy() { cp "$dir/ds.idx" "$dir/$1.idx"; cp "$dir/ds.bin" "$dir/$1.bin"; }
damaged_copy trunc && head -c 100 "$dir/ds.idx" > "$dir/trunc.idx"
expect idx-truncated 'tokenized data: `.idx` truncated' \
  'trunc.idx: truncated: the file ends at offset 100 inside the sequence lengths' "${common[@]}" --data "$dir/trunc" --out "$dir/o-tok1"
damaged_copy shortbin && head -c 1000 "$dir/ds.bin" > "$dir/shortbin.bin"
expect bin-short 'tokenized data: `.bin` shorter than the index says' \
  'shortbin.bin: shorter than the index says: sequence 18 (55 tokens at byte offset 990, ' "${common[@]}" --data "$dir/shortbin" --out "$dir/o-tok2"
damaged_copy badmagic && printf 'XMIDIDX' | dd of="$dir/badmagic.idx" conv=notrunc status=none
expect idx-magic 'tokenized data: not an MMIDIDX index' \
  'badmagic.idx: bad magic at offset 0' "${common[@]}" --data "$dir/badmagic.idx" --out "$dir/o-tok3"
damaged_copy noside
expect token-id-vocab 'tokenized data: a token id >= vocab_size' \
  'noside.bin: token id 110 at token 1 (byte offset 1) is >= the model'"'"'s vocab_size 100' "${common[@]}" --data "$dir/noside" --vocab-size 100 --out "$dir/o-tok4"
cp "$dir/ds.tokenizer.json" "$dir/withside.tokenizer.json" && damaged_copy withside
expect tokenizer-vocab 'tokenized data: the tokenizer'"'"'s vocabulary is larger than the model'"'"'s' \
  'withside.tokenizer.json: the tokenizer has vocab_size 256, the model only 100' "${common[@]}" --data "$dir/withside" --vocab-size 100 --out "$dir/o-tok5"
expect tokenize-unknown '`tokenize --tokenizer` unknown' \
  "--tokenizer: expected bytes, bpe:VOCAB or spm:MODEL_PATH, got 'gpt2'" tokenize --input "$dir/text.txt" --tokenizer gpt2 --output "$dir/o-tok6"
expect tokenize-bpe-small '`tokenize --tokenizer bpe:100` (no room for the 256 byte pieces)' \
  '--tokenizer bpe:100: the vocabulary must be in [260, 1000000]' tokenize --input "$dir/text.txt" --tokenizer bpe:100 --output "$dir/o-tok7"
expect tokenize-missing-input '`tokenize --input` missing file' \
  '--input missing.txt: cannot open' tokenize --input missing.txt --output "$dir/o-tok8"

# --- flag values ----------------------------------------------------------------------------------
expect bad-steps '`--steps 0`' \
  '--steps must be positive, got 0' "${common[@]}" --steps 0 --out "$dir/o11"
expect bad-batch '`--batch 0`' \
  '--batch must be positive, got 0' "${common[@]}" --batch 0 --out "$dir/o28"
expect seq-len-one '`--seq-len 1`' \
  '--seq-len must be at least 2, got 1' "${common[@]}" --seq-len 1 --out "$dir/o29"
expect seq-too-long '`--seq-len` beyond max_position_embeddings' \
  "--seq-len 100000 exceeds the model's max_position_embeddings 256" "${common[@]}" --preset test-moe --seq-len 100000 --out "$dir/o12"
expect batch-vs-micro '`--batch` not divisible by `--micro-batches`' \
  '--batch 2 is not divisible by --micro-batches 4' "${common[@]}" --micro-batches 4 --out "$dir/o30"
expect bad-a2a 'unknown `--a2a`' \
  "unknown all-to-all algorithm 'ring'" "${common[@]}" --a2a ring --out "$dir/o31"
expect global-and-batch '`--global-batch` with `--batch`' \
  '--global-batch 8 and --batch 2: give one (--batch is per data rank, --global-batch over all 1)' \
  "${common[@]}" --global-batch 8 --out "$dir/o90"
expect global-batch-zero '`--global-batch 0`' \
  '--global-batch 0 must be a positive multiple of the data ranks (ep 1 x dp 1 = 1)' \
  train --steps 2 --seq-len 16 --eval-batches 1 --quiet --data "$dir/text.txt" --global-batch 0 --out "$dir/o91"
expect micro-batch-not-divisor '`--micro-batch` that does not divide the batch' \
  '--micro-batch 3 must be a positive divisor of the per-data-rank batch 2' \
  "${common[@]}" --micro-batch 3 --out "$dir/o95"
expect micro-batch-and-count '`--micro-batch` with `--micro-batches`' \
  '--micro-batch 1 and --micro-batches 2: give one' \
  "${common[@]}" --micro-batch 1 --micro-batches 2 --out "$dir/o96"
expect a2a-auto-no-cluster '`--a2a auto` without `--cluster`' \
  '--a2a auto needs --cluster PROFILE' "${common[@]}" --a2a auto --out "$dir/o92"
expect cluster-without-auto '`--cluster` without `--a2a auto`' \
  '--cluster frontier is the profile --a2a auto prices the exchanges with; with --a2a flat nothing reads it' \
  "${common[@]}" --cluster frontier --out "$dir/o93"
expect a2a-auto-bad-profile '`--a2a auto --cluster` of a file that is not there' \
  'nope.json' "${common[@]}" --a2a auto --cluster "$dir/nope.json" --out "$dir/o94"
expect bad-recompute 'unknown `--recompute`' \
  'some' "${common[@]}" --recompute some --out "$dir/o32"
expect bad-schedule 'unknown `--pp.schedule`' \
  'zigzag' "${common[@]}" --pp.schedule zigzag --out "$dir/o33"
expect negative-capacity '`--capacity-factor -1`' \
  '--capacity-factor must be >= 0 (0 = dropless), got -1' "${common[@]}" --preset test-moe --capacity-factor -1 --out "$dir/o34"
expect negative-capacity-dense '`--capacity-factor -1` on a dense model' \
  '--capacity-factor must be >= 0 (0 = dropless), got -1' "${common[@]}" --preset test-dense --capacity-factor -1 --out "$dir/o35"
expect bad-threads '`--threads 0`' \
  '--threads must be in [1, 1024], got 0' "${common[@]}" --threads 0 --out "$dir/o36"
expect not-a-number '`--threads` not a number' \
  'abc' "${common[@]}" --threads abc --out "$dir/o37"
expect out-not-writable 'output folder cannot be created (`--out /proc/x`)' \
  '/proc/x: cannot create output folder' "${common[@]}" --out /proc/x
expect out-is-a-file 'output folder is an existing file' \
  'text.txt: cannot create output folder' "${common[@]}" --out "$dir/text.txt"
expect unknown-flag 'unknown flag' 'bogus' train --bogus

# --- every number a flag gives (issue 15, class 5): one line naming the flag and the value --------
expect lr-nan '`--lr nan`' '--lr must be a number in (0, 1], got nan' "${common[@]}" --lr nan --out "$dir/o39"
expect lr-inf '`--lr inf`' '--lr must be a number in (0, 1], got inf' "${common[@]}" --lr inf --out "$dir/o40"
expect lr-negative '`--lr -0.001`' '--lr must be a number in (0, 1], got -0.001' "${common[@]}" --lr -0.001 --out "$dir/o41"
expect lr-absurd '`--lr 5`' '--lr must be a number in (0, 1], got 5' "${common[@]}" --lr 5 --out "$dir/o42"
expect min-lr-above-lr '`--min-lr` above `--lr`' \
  '--min-lr 0.01 is above --lr 0.001' "${common[@]}" --lr 0.001 --min-lr 0.01 --out "$dir/o43"
expect min-lr-nan '`--min-lr nan`' '--min-lr must be a number >= 0, got nan' "${common[@]}" --min-lr nan --out "$dir/o44"
expect warmup-negative '`--warmup -1`' '--warmup must be >= 0, got -1' "${common[@]}" --warmup -1 --out "$dir/o45"
expect grad-clip-negative '`--grad-clip -1`' \
  '--grad-clip must be a number >= 0 (0 = off), got -1' "${common[@]}" --grad-clip -1 --out "$dir/o46"
expect grad-clip-nan '`--grad-clip nan`' \
  '--grad-clip must be a number >= 0 (0 = off), got nan' "${common[@]}" --grad-clip nan --out "$dir/o47"
expect weight-decay-negative '`--weight-decay -0.1`' \
  '--weight-decay must be a number >= 0, got -0.1' "${common[@]}" --weight-decay -0.1 --out "$dir/o48"
expect weight-decay-flips '`--weight-decay 4 --lr 0.5` (lr · wd >= 1)' \
  'lr * weight decay = 2 >= 1 would zero or flip the weights' "${common[@]}" --weight-decay 4 --lr 0.5 --out "$dir/o49"
expect seed-negative '`--seed -1`' '--seed: must be a non-negative integer, got -1' "${common[@]}" --seed -1 --out "$dir/o50"
expect seed-fraction '`--seed 1.5`' '--seed: must be a non-negative integer, got 1.5' "${common[@]}" --seed 1.5 --out "$dir/o51"
expect eval-every-negative '`--eval-every -1`' \
  '--eval-every must be >= 0 (0 = only at the end), got -1' "${common[@]}" --eval-every -1 --out "$dir/o52"
expect eval-batches-zero '`--eval-batches 0`' '--eval-batches must be positive, got 0' "${common[@]}" --eval-batches 0 --out "$dir/o53"
expect steps-negative '`--steps -5`' '--steps must be positive, got -5' "${common[@]}" --steps -5 --out "$dir/o54"
expect batch-overflow '`--batch` beyond int32' '--batch' "${common[@]}" --batch 99999999999 --out "$dir/o55"
expect threads-absurd '`--threads 5000`' '--threads must be in [1, 1024], got 5000' "${common[@]}" --threads 5000 --out "$dir/o56"
expect peak-negative '`--peak-gflops -3`' \
  '--peak-gflops must be a GFLOP/s figure in (0, 1e7] (or 0: measure it), got -3' "${common[@]}" --peak-gflops -3 --out "$dir/op1"
expect peak-nan '`--peak-gflops nan`' \
  '--peak-gflops must be a GFLOP/s figure in (0, 1e7] (or 0: measure it), got nan' "${common[@]}" --peak-gflops nan --out "$dir/op2"
expect budget-zero '`--time-budget 0`' \
  "--time-budget must be more than 0 and at most 1e7 seconds, got '0'" "${common[@]}" --time-budget 0 --out "$dir/ob1"
expect budget-unit '`--time-budget 5x`' \
  "--time-budget must be a duration: seconds, or a number with the unit s, m or h (300, 90s, 5m, 1.5h), got '5x'" \
  "${common[@]}" --time-budget 5x --out "$dir/ob2"
expect budget-negative '`--time-budget -5`' \
  "got '-5'" "${common[@]}" --time-budget=-5 --out "$dir/ob3"
expect budget-warmup '`--time-budget 5m --warmup 2`' \
  '--time-budget chooses the step count from the warm-up steps'"'"' time (their learning rates do not depend on it), so it needs --warmup >= 4, got 2' \
  "${common[@]}" --time-budget 5m --warmup 2 --out "$dir/ob4"
expect capacity-inf '`--capacity-factor inf`' \
  '--capacity-factor must be at most 10000 (buffers of capacity factor x tokens x k rows per expert), got inf' "${common[@]}" --preset test-moe --capacity-factor inf --out "$dir/o57"
expect capacity-nan '`--capacity-factor nan`' \
  '--capacity-factor must be >= 0 (0 = dropless), got nan' "${common[@]}" --preset test-moe --capacity-factor nan --out "$dir/o58"
expect micro-batches-zero '`--micro-batches 0`' '--micro-batches must be >= 1, got 0' "${common[@]}" --micro-batches 0 --out "$dir/o59"
expect checkpoint-every-negative '`--checkpoint.every -1`' \
  '--checkpoint.every must be >= 0, got -1' "${common[@]}" --checkpoint.every -1 --out "$dir/o60"
expect checkpoint-keep-negative '`--checkpoint.keep -1`' \
  '--checkpoint.keep must be >= 0, got -1' "${common[@]}" --checkpoint.keep -1 --out "$dir/o61"
expect max-bad-steps-zero '`--max-bad-steps 0`' '--max-bad-steps must be >= 1, got 0' "${common[@]}" --max-bad-steps 0 --out "$dir/o62"
expect fault-step-zero '`--fault.nan-steps 0`' '--fault.nan-steps must be a step counted from 1, got 0' "${common[@]}" --fault.nan-steps 0 --out "$dir/o63"
expect comm-timeout-negative '`--comm.timeout -1`' \
  '--comm.timeout must be a number of seconds >= 0 (0 = wait forever), got -1' "${common[@]}" --comm.timeout -1 --out "$dir/o64"
expect comm-timeout-nan '`--comm.timeout nan`' \
  '--comm.timeout must be a number of seconds >= 0 (0 = wait forever), got nan' "${common[@]}" --comm.timeout nan --out "$dir/o65"
expect topo-negative '`--topo.ranks-per-node -1`' \
  '--topo.ranks-per-node -1 must be >= 0' "${common[@]}" --topo.ranks-per-node -1 --out "$dir/o66"

# --- resources before the work (class 3): memory, the data file's kind, output folders ----------
expect batch-out-of-memory '`--batch 100000` (hundreds of GB of activations)' \
  'not enough memory on' "${common[@]}" --batch 100000 --seq-len 128 --out "$dir/o67"
cfg "$dir/enormous.json" 'c.update(hidden_size=65536, num_hidden_layers=64, num_attention_heads=64, intermediate_size=200000, moe_intermediate_size=16000, n_routed_experts=256)'
expect config-out-of-memory 'config: 800 TB of weights and optimizer state' \
  "the model's state alone does not fit" "${common[@]}" --config "$dir/enormous.json" --batch 1 --out "$dir/o68"
MOETRAIN_MEMORY_AVAILABLE=1000000 expect memory-limit 'memory below the estimate (test hook: 1 MB available)' \
  '1.0 MB (1000000 bytes) available (MOETRAIN_MEMORY_AVAILABLE)' "${common[@]}" --out "$dir/o69"
mkfifo "$dir/fifo"
expect data-fifo 'data: `--data` is a FIFO (would block in open)' \
  'fifo: --data must be a regular file, this is a FIFO (named pipe)' "${common[@]}" --data "$dir/fifo" --out "$dir/o70"
expect data-char-device 'data: `--data /dev/zero` (never ends)' \
  '/dev/zero: --data must be a regular file, this is a character device' "${common[@]}" --data /dev/zero --out "$dir/o71"
expect checkpoint-dir-unwritable 'checkpoint folder cannot be created (`--checkpoint.dir /proc/x`), before step 1' \
  '/proc/x: cannot create output folder' "${common[@]}" --checkpoint.dir /proc/x --out "$dir/o72"
mkdir -p "$dir/o73/model.safetensors"
expect out-weights-is-a-folder 'output: `model.safetensors` in --out is a folder' \
  'model.safetensors: is a directory; an output must be a new or regular file' "${common[@]}" --out "$dir/o73"
rmdir "$dir/o73/model.safetensors"

# The planner (moetrain plan): models, clusters, layouts.
expect plan-unknown-model '`plan`: unknown model' \
  'unknown model "nosuch"' plan --model nosuch --gpus 8
cfg "$dir/llama.json" 'c["model_type"] = "llama"'
expect plan-unsupported-type '`plan`: unsupported model_type' \
  'llama.json: model_type "llama" is not supported by the planner' plan --model "$dir/llama.json" --gpus 8
cfg "$dir/novocab.json" 'del c["vocab_size"]'
expect plan-missing-field '`plan`: config.json without vocab_size' \
  'novocab.json: missing field "vocab_size"' plan --model "$dir/novocab.json" --gpus 8
expect plan-unknown-cluster '`plan`: unknown cluster' \
  'unknown cluster "nosuch"' plan --cluster nosuch --gpus 8
expect plan-partial-node '`plan`: GPUs not a whole number of nodes' \
  '--gpus 12 is not a whole number of frontier nodes of 8 GPUs' plan --cluster frontier --gpus 12
expect plan-too-many-gpus '`plan`: more GPUs than the cluster has' \
  '--gpus 100000000 does not fit cluster frontier' plan --cluster frontier --gpus 100000000
"$bin" plan --cluster frontier --save-cluster "$dir/frontier.json" >/dev/null
/usr/bin/python3 -c "
import json, sys; p = sys.argv[1]; c = json.load(open(p)); c['nics_per_node'] = 0; json.dump(c, open(p, 'w'))" "$dir/frontier.json"
expect plan-cluster-zero-nics '`plan`: cluster profile with 0 NICs per node' \
  'frontier.json: "nics_per_node" must be positive, got 0' plan --cluster "$dir/frontier.json" --gpus 8
"$bin" plan --cluster dgx-h100 --save-cluster "$dir/dgx.json" >/dev/null
/usr/bin/python3 -c "
import json, sys; p = sys.argv[1]; c = json.load(open(p)); c['hbm_bytes'] = -80e9; json.dump(c, open(p, 'w'))" "$dir/dgx.json"
expect plan-cluster-negative-hbm '`plan`: cluster profile with negative HBM' \
  'dgx.json: "hbm_bytes" must be positive' plan --cluster "$dir/dgx.json" --gpus 8
expect plan-layout-world '`plan --evaluate`: layout ranks differ from `--gpus`' \
  '--gpus 64 != pp(2) * dp(3) * ep(8) * tp(1) = 48 of --layout' \
  plan --model xmoe-small --gpus 64 --evaluate --layout pp=2,dp=3,ep=8,mb=4,recompute=none,a2a=flat
expect plan-batch-indivisible '`plan --evaluate`: global batch the layout cannot divide' \
  'global batch 100 is not divisible by dp(4) * ep(8) * micro-batches(4) = 128' \
  plan --model xmoe-small --global-batch 100 --evaluate --layout pp=2,dp=4,ep=8,mb=4,recompute=none,a2a=flat
expect plan-layout-experts '`plan --evaluate`: EP degree that does not divide the experts' \
  'ep(48)' plan --model xmoe-small --evaluate --layout pp=1,dp=1,ep=48,mb=1,recompute=none,a2a=flat
expect plan-gemm-syntax '`plan --gemm`: malformed shape' \
  "--gemm: 'nt:3x4' is not FORM:MxNxK" plan --gemm nt:3x4
expect plan-layout-syntax '`plan --evaluate`: malformed `--layout`' \
  'pp=two' plan --model xmoe-small --evaluate --layout pp=two
expect plan-imbalance-inf '`plan --imbalance inf`' \
  '--imbalance must be a finite number >= 1 (rows on the busiest rank / the mean), got inf' plan --model tiny --gpus 2 --imbalance inf
expect plan-imbalance-nan '`plan --imbalance nan`' \
  '--imbalance must be a finite number >= 1 (rows on the busiest rank / the mean), got nan' plan --model tiny --gpus 2 --imbalance nan
expect plan-max-micro-batches-zero '`plan --max-micro-batches 0`' \
  '--max-micro-batches must be >= 1, got 0' plan --model tiny --gpus 2 --max-micro-batches 0
expect plan-gpus-negative '`plan --gpus -3`' '--gpus must be >= 1, got -3' plan --model tiny --gpus -3
expect plan-gemm-inf '`plan --gemm` with an infinite size' \
  "--gemm: 'nt:infx3x4' is not FORM:MxNxK" plan --gemm nt:infx3x4

# export's numbers
expect export-shard-nan '`export --shard-mb nan`' \
  '--shard-mb must be a positive number of megabytes (at most 1e9), got nan' export "$dir/nockpt" "$dir/exp" --shard-mb nan
expect export-shard-zero '`export --shard-mb 0`' \
  '--shard-mb must be a positive number of megabytes (at most 1e9), got 0' export "$dir/nockpt" "$dir/exp" --shard-mb 0
expect export-shard-negative '`export --shard-mb -5`' \
  '--shard-mb must be a positive number of megabytes (at most 1e9), got -5' export "$dir/nockpt" "$dir/exp" --shard-mb -5

# bench's numbers
expect bench-capacity-nan '`bench moe-layer --capacity-factor nan`' \
  '--capacity-factor must be a finite number >= 0, got nan' bench moe-layer --capacity-factor nan
expect bench-seed-negative '`bench moe-layer --seed -2`' '--seed: must be a non-negative integer, got -2' bench moe-layer --seed -2
expect bench-a2a-factor-inf '`bench a2a -f inf` (sizes would never grow past the first)' \
  '-f must be a finite number in (1, 1024], got inf' bench a2a -f inf
expect bench-a2a-size-inf '`bench a2a -e inf`' "-e: 'inf' is not a size" bench a2a -e inf
expect bench-a2a-node-limited-no-group '`bench a2a --routing node-limited` without `--topk-group`' \
  '--routing node-limited needs --topk-group in [1, 1 nodes], got 0' bench a2a --routing node-limited
expect bench-a2a-topk-group-uniform '`bench a2a --topk-group 2` with uniform routing' \
  '--topk-group 2 applies to --routing node-limited only (routing is uniform)' bench a2a --topk-group 2
expect bench-pipeline-forward-inf '`bench pipeline --forward-ms inf` (a stage would sleep forever)' \
  '--forward-ms must be a finite number of milliseconds in (0, 60000], got inf' bench pipeline --forward-ms inf
expect bench-pipeline-activation-negative '`bench pipeline --activation-floats -1`' \
  '--activation-floats must be at most 2^30' bench pipeline --activation-floats -1

# generate's flags and lengths (a 2-step tiny model whose config.json then allows 8 positions)
"$bin" "${common[@]}" --out "$dir/genmodel" 2>/dev/null
sed -i 's/"max_position_embeddings": 1024/"max_position_embeddings": 8/' "$dir/genmodel/config.json"
expect generate-prompt-too-long '`generate` with a prompt longer than max_position_embeddings (8)' \
  '--prompt is 16 tokens, longer than max_position_embeddings 8' generate "$dir/genmodel" --prompt "In the beginning"
expect generate-too-many-tokens '`generate` asking for more tokens than the positions left' \
  '--prompt (5 tokens) + --tokens 4 = 9 exceeds max_position_embeddings 8' \
  generate "$dir/genmodel" --prompt "Jesus" --tokens 4
expect generate-top-k-negative '`generate --top-k -1`' '--top-k must be >= 0' generate "$dir/genmodel" --prompt x --top-k -1
expect generate-temperature-negative '`generate --temperature -0.5`' \
  '--temperature must be a finite number >= 0 (0 = greedy), got -0.5' generate "$dir/genmodel" --prompt x --temperature -0.5
expect generate-temperature-nan '`generate --temperature nan`' \
  '--temperature must be a finite number >= 0 (0 = greedy), got nan' generate "$dir/genmodel" --prompt x --temperature nan
expect generate-tokens-negative '`generate --tokens -3`' '--tokens must be >= 0, got -3' generate "$dir/genmodel" --prompt x --tokens -3
expect eval-seq-len-too-long '`eval` with --seq-len beyond max_position_embeddings (8)' \
  '--seq-len 16 exceeds the model'"'"'s max_position_embeddings 8' eval "$dir/genmodel" --seq-len 16
expect eval-no-model '`eval` of a folder that does not exist' \
  'no such folder' eval "$dir/no-such-model"
expect eval-batch-zero '`eval --batch 0`' '--batch must be in [1, 1048576], got 0' eval "$dir/genmodel" --batch 0
expect eval-data-missing '`eval --data` of a file that does not exist' \
  "$dir/no-such.txt" eval "$dir/genmodel" --seq-len 4 --data "$dir/no-such.txt"
expect generate-prompt-empty '`generate --prompt ""`' '--prompt is empty' generate "$dir/genmodel" --prompt ""
expect generate-no-model '`generate` from a folder that does not exist' \
  'nomodel: no such folder' generate "$dir/nomodel" --prompt x
# Expert migration (--balance.*): thresholds at or below perfect balance, a negative period, no EP.
expect migrate-threshold-one '`--balance.threshold 1` (max/mean load can never be below 1)' \
  '--balance.threshold must be a max/mean rank load > 1 (1 is perfect balance), got 1' "${common[@]}" \
  --balance.threshold 1 --out "$dir/om1"
expect migrate-threshold-below-one '`--balance.threshold 0.5`' \
  '--balance.threshold must be a max/mean rank load > 1 (1 is perfect balance), got 0.5' "${common[@]}" \
  --balance.threshold 0.5 --out "$dir/om2"
expect migrate-every-negative '`--balance.migrate-every -1`' \
  '--balance.migrate-every must be >= 0 (0 = never), got -1' "${common[@]}" --balance.migrate-every -1 --out "$dir/om3"
expect migrate-without-ep '`--balance.migrate-every` on one process (no expert parallelism)' \
  '--balance.migrate-every 5 needs expert parallelism (--ep > 1): with --ep 1 every expert is on every rank' \
  "${common[@]}" --balance.migrate-every 5 --out "$dir/om4"
expect migrate-with-zero1 '`--balance.migrate-every` with `--zero1`' \
  '--balance.migrate-every with --zero1: moving experts with a sharded AdamW state is not supported' \
  "${common[@]}" --balance.migrate-every 5 --zero1 --out "$dir/om5"
# train --init-from and upcycle: a dense and an MoE model folder to start from (tests/init_from.sh
# has the bad tensors; tests/upcycle.sh the rule).
"$bin" "${common[@]}" --preset test-dense --steps 1 --out "$dir/dense-run" >/dev/null 2>&1
"$bin" export "$dir/dense-run/checkpoints/step-1" "$dir/dense" >/dev/null
"$bin" "${common[@]}" --preset test-moe --steps 1 --out "$dir/moe-run" >/dev/null 2>&1
"$bin" export "$dir/moe-run/checkpoints/step-1" "$dir/moe" >/dev/null
expect init-from-missing '`--init-from` a folder that does not exist' \
  "--init-from $dir/nofolder: no such folder" "${common[@]}" --init-from "$dir/nofolder" --out "$dir/oi1"
expect init-from-not-a-model '`--init-from` a folder without config.json' \
  "checkpoints/config.json: cannot open config file" "${common[@]}" --init-from "$dir/dense-run/checkpoints" --out "$dir/oi2"
expect init-from-checkpoint '`--init-from` a checkpoint folder' \
  "--init-from $dir/dense-run/checkpoints/step-1: is a checkpoint (manifest.json), not a model folder: export it" \
  "${common[@]}" --init-from "$dir/dense-run/checkpoints/step-1" --out "$dir/oi5"
expect init-from-preset '`--init-from` with a `--preset` of another shape' \
  "--preset test-moe disagrees with --init-from's $dir/dense/config.json: " \
  "${common[@]}" --init-from "$dir/dense" --preset test-moe --out "$dir/oi3"
expect init-from-config '`--init-from` with a `--config` of another model' \
  "--config $dir/moe/config.json disagrees with --init-from's $dir/dense/config.json: " \
  "${common[@]}" --init-from "$dir/dense" --config "$dir/moe/config.json" --out "$dir/oi4"
expect upcycle-missing '`upcycle` a folder that does not exist' \
  "$dir/nofolder: no such folder" upcycle "$dir/nofolder" -o "$dir/ou1" --experts 4 --topk 2
expect upcycle-moe '`upcycle` an MoE model' \
  'upcycle: the input model already has n_routed_experts = 8' upcycle "$dir/moe" -o "$dir/ou2" --experts 4 --topk 2
expect upcycle-topk '`upcycle --topk` above `--experts`' \
  '--topk must be in [1, --experts 4], got 5' upcycle "$dir/dense" -o "$dir/ou3" --experts 4 --topk 5
expect upcycle-experts '`upcycle --experts 0`' \
  '--experts must be in [1, 4096], got 0' upcycle "$dir/dense" -o "$dir/ou4" --experts 0 --topk 1
expect upcycle-split '`upcycle --split` not dividing intermediate_size' \
  "--split 5 does not divide the dense model's intermediate_size 48" upcycle "$dir/dense" -o "$dir/ou5" --experts 4 --topk 2 --split 5
expect upcycle-noise '`upcycle --noise nan`' \
  '--noise must be a finite number in [0, 1]' upcycle "$dir/dense" -o "$dir/ou6" --experts 4 --topk 2 --noise nan
expect upcycle-router '`upcycle --router-init big`' \
  "--router-init: expected zero or a standard deviation in [0, 1] (e.g. 0.02), got 'big'" \
  upcycle "$dir/dense" -o "$dir/ou7" --experts 4 --topk 2 --router-init big
expect upcycle-first-dense '`upcycle --first-dense` past the last layer' \
  '--first-dense 2 leaves no layer to upcycle (the model has 2 layers)' \
  upcycle "$dir/dense" -o "$dir/ou8" --experts 4 --topk 2 --first-dense 2
expect upcycle-over-input '`upcycle -o` its own input' \
  "-o $dir/dense: is the folder it reads" upcycle "$dir/dense" -o "$dir/dense" --experts 4 --topk 2
for o in "$dir"/ou*; do
  [ -e "$o/model.safetensors" ] || [ -e "$o/config.json" ] && { echo "FAIL: $o has an upcycled model after an error" >&2; fail=$((fail + 1)); }
done

# OpenBLAS told to load kernels this CPU cannot run would die of SIGILL at the first GEMM. Only a
# CPU without AVX-512 can show it; on one with AVX-512 the same run must train.
if grep -qw avx512f /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo &&
   grep -qw avx512dq /proc/cpuinfo; then
  OPENBLAS_CORETYPE=SkylakeX "$bin" "${common[@]}" --out "$dir/ob1" >/dev/null 2>&1 ||
    { echo "FAIL blas-core-avx512: OPENBLAS_CORETYPE=SkylakeX failed on a CPU with AVX-512" >&2; fail=$((fail + 1)); }
  rm -rf "$dir/ob1"
else
  OPENBLAS_CORETYPE=SkylakeX expect blas-core-avx512 '`OPENBLAS_CORETYPE=SkylakeX` on a CPU without AVX-512' \
    'OPENBLAS_CORETYPE=SkylakeX: its kernels need AVX-512 (F, BW, VL, DQ), which this CPU lacks' \
    "${common[@]}" --out "$dir/ob1"
fi

for o in "$dir"/o*; do
  [ -e "$o/model.safetensors" ] && { echo "FAIL: $o has weights after an error" >&2; fail=$((fail + 1)); }
done
echo "$pass passed, $fail failed" >&2
[ "$fail" -eq 0 ]
