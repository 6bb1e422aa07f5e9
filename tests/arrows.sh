#!/usr/bin/env bash
# The build enforces the module arrows (DESIGN.md): each module target exposes only its own
# headers and its dependencies'. Compiles tests/arrows/*.cpp, each against one module target
# (CMake object targets arrows_<file>, not built by default):
#   plan_includes_model_config: allowed, must compile (the control);
#   plan_includes_comm, kernels_includes_comm, model_includes_train: forbidden, each must fail
#   with the compiler saying it cannot find the forbidden header.
# Usage: tests/arrows.sh BUILD_DIR
set -uo pipefail
build="$1"
fail=0
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
if cmake --build "$build" --target arrows_plan_includes_model_config >"$out" 2>&1; then
  echo "ok: plan -> model_config, moe_layout, parallel_schedule compiles"
else
  cat "$out" >&2
  echo "FAIL: the allowed include did not compile" >&2
  fail=1
fi
for case in plan_includes_comm:comm/group.h kernels_includes_comm:comm/exchange.h \
            model_includes_train:train/trainer.h; do
  target="arrows_${case%%:*}" header="${case#*:}"
  if cmake --build "$build" --target "$target" >"$out" 2>&1; then
    echo "FAIL: $target compiled: $header is visible where the arrows forbid it" >&2
    fail=1
  elif grep -q "$header: No such file or directory" "$out"; then
    echo "ok: $target fails to compile: $(grep -m1 -o "[^ ]*$header: No such file or directory" "$out")"
  else
    tail -20 "$out" >&2
    echo "FAIL: $target failed, but not on the missing header $header" >&2
    fail=1
  fi
done
exit $fail
