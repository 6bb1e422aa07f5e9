# Shared by the SMPI tests (smoke.sh, step.sh): sourced after `set -euo pipefail` with $root set.
# smpi_setup NAME BUILD_DIR TARGET: skips the test (exit 77) when SimGrid is not installed,
# configures BUILD_DIR with -DMOETRAIN_SMPI=ON and builds TARGET there (log in
# BUILD_DIR/build-TARGET.log; on failure its tail and exit 1); sets $build to BUILD_DIR, absolute
# (smpirun runs in a scratch dir below it).
smpi_setup() {
  local name="$1" dir="$2" target="$3"
  mkdir -p "$dir"
  build="$(cd "$dir" && pwd)"
  if ! command -v smpicxx >/dev/null || ! command -v smpirun >/dev/null; then
    echo "smpi $name: SimGrid not installed (scripts/setup.sh installs libsimgrid-dev): skipped"
    exit 77
  fi
  local log="$build/build-$target.log"
  if ! { cmake -S "$root" -B "$build" -DMOETRAIN_SMPI=ON &&
         cmake --build "$build" --target "$target" -j"$(nproc)"; } >"$log" 2>&1; then
    tail -30 "$log" >&2
    echo "smpi $name: the SMPI build failed; full log: $log" >&2
    exit 1
  fi
}
