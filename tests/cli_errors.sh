#!/usr/bin/env bash
# Bad input through the CLI: each case must exit non-zero with a one-line error naming the problem,
# and leave no output files behind. Usage: cli_errors.sh MOETRAIN
set -uo pipefail
bin="$1"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
pass=0
fail=0

# expect NAME PATTERN ARGS...: the command fails, prints exactly one line to stderr matching PATTERN.
expect() {
  local name="$1" pattern="$2"
  shift 2
  local err rc
  err="$("$bin" "$@" 2>&1 >/dev/null)"
  rc=$?
  local lines
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [ "$rc" -ne 0 ] && [ "$lines" -eq 1 ] && printf '%s' "$err" | grep -q -- "$pattern"; then
    pass=$((pass + 1))
  else
    echo "FAIL $name: rc=$rc lines=$lines stderr: $err"
    fail=$((fail + 1))
  fi
}

printf 'In the beginning God created the heaven and the earth.\n%.0s' {1..3000} > "$dir/text.txt"
cfg() {  # cfg FILE JQ-LIKE-PYTHON-EDIT: writes the test-moe config with one edit
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
common=(train --steps 2 --batch 2 --seq-len 16 --eval-batches 1 --quiet --data "$dir/text.txt")

expect unknown-preset 'unknown model preset "huge"' "${common[@]}" --preset huge --out "$dir/o1"
cfg "$dir/k.json" 'c["num_experts_per_tok"] = 9'
expect k-greater-than-E 'num_experts_per_tok (9) exceeds n_routed_experts (8)' "${common[@]}" --config "$dir/k.json" --out "$dir/o2"
cfg "$dir/div.json" 'c["num_attention_heads"] = 5'
expect heads-not-divisible 'not divisible by num_attention_heads (5)' "${common[@]}" --config "$dir/div.json" --out "$dir/o3"
cfg "$dir/miss.json" 'del c["hidden_size"]'
expect missing-field 'missing field "hidden_size"' "${common[@]}" --config "$dir/miss.json" --out "$dir/o4"
cfg "$dir/type.json" 'c["n_routed_experts"] = "eight"'
expect wrong-type '"n_routed_experts" must be an integer' "${common[@]}" --config "$dir/type.json" --out "$dir/o5"
echo '{"hidden_size": 32,' > "$dir/broken.json"
expect broken-json 'broken.json: not valid JSON' "${common[@]}" --config "$dir/broken.json" --out "$dir/o6"
expect missing-config 'nope.json: cannot open' "${common[@]}" --config "$dir/nope.json" --out "$dir/o7"
expect missing-data 'missing.txt' train --steps 2 --quiet --data "$dir/missing.txt" --out "$dir/o8"
: > "$dir/empty.txt"
expect empty-data 'empty.txt' train --steps 2 --quiet --data "$dir/empty.txt" --out "$dir/o9"
printf 'short' > "$dir/short.txt"
expect tiny-data 'short.txt' train --steps 2 --quiet --data "$dir/short.txt" --out "$dir/o10"
expect bad-steps '--steps must be positive' "${common[@]}" --steps 0 --out "$dir/o11"
expect seq-too-long 'exceeds the model' "${common[@]}" --preset test-moe --seq-len 100000 --out "$dir/o12"
expect unknown-flag 'bogus' train --bogus

for o in "$dir"/o*; do
  [ -e "$o/model.safetensors" ] && { echo "FAIL: $o has weights after an error"; fail=$((fail + 1)); }
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
