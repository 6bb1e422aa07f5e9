#!/usr/bin/env bash
# Fuzzes the parsers of user files with libFuzzer (clang-14): safetensors, config.json, dataset,
# the planner's Hugging Face configs and cluster profiles, the checkpoint manifest, the indexed
# dataset reader (.idx + .bin) and the tokenizer sidecar.
# Usage: scripts/fuzz.sh [SECONDS]   (per target, default 30)
# Installs clang-14 + libclang-rt-14-dev if missing (and moetrain's dependencies), builds the
# targets of tests/fuzz in build-fuzz/ (-DMOETRAIN_FUZZ=ON), runs each on a fresh copy of its seed
# corpus tests/fuzz/corpus/<target>/ for SECONDS, and fails on any finding (crash, sanitizer
# report, unexpected exception, timeout). A finding's input is kept in build-fuzz/artifacts/;
# replay it with build-fuzz/tests/fuzz/<target> <file>.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-30}"
targets=(fuzz_safetensors fuzz_config fuzz_dataset fuzz_plan fuzz_checkpoint fuzz_indexed_dataset fuzz_tokenizer_sidecar)

"$root/scripts/setup.sh" clang-14 libclang-rt-14-dev

build="$root/build-fuzz"
mkdir -p "$build"
log="$build/build.log"
if ! { cmake -S "$root" -B "$build" -DMOETRAIN_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
         -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 &&
       cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"; } >"$log" 2>&1; then
  grep -E -A3 "error|Error" "$log" | head -60 >&2
  echo "fuzz build failed; full log: $log" >&2
  exit 1
fi

rm -rf "$build/corpus" "$build/artifacts"
mkdir -p "$build/artifacts"
failed=()
for t in "${targets[@]}"; do
  work="$build/corpus/$t"
  mkdir -p "$work"
  cp "$root/tests/fuzz/corpus/$t/"* "$work/"
  out="$build/$t.log"
  # -timeout: an input that runs this long is a finding (a hang); -rss_limit_mb likewise for memory.
  # -max_len: inputs up to 300 KB, so JSON nested 100000 deep (200 KB, the seeds bad_deep*) and
  # huge size fields are generated, not only libFuzzer's default of the largest seed or 4 KB.
  if (cd "$build" && "$build/tests/fuzz/$t" -max_total_time="$seconds" -timeout=25 \
        -max_len=300000 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" \
        "$work") >"$out" 2>&1; then
    runs=$(grep -oE "^stat::number_of_executed_units: *[0-9]+" "$out" | grep -oE "[0-9]+$" || echo "?")
    echo "fuzz: $t ok: $runs inputs in ${seconds}s, corpus $(ls "$work" | wc -l) files"
  else
    echo "fuzz: $t FAILED (log $out):" >&2
    grep -E "ERROR|runtime error|SUMMARY|Test unit written|deadly signal|terminate called|what\(\)" \
      "$out" | head -20 >&2
    failed+=("$t")
  fi
done
[ ${#failed[@]} -eq 0 ] || { echo "fuzz: findings in ${failed[*]}" >&2; exit 1; }
