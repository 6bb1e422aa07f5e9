# Sourced by the layout tests (tests/tp.sh, tests/zero1.sh, tests/parity.sh) after they set `bin`,
# `work` and the `common` array of train flags: tests/lib.sh, and
#   run NAME NP ARGS...   `moetrain train` with common + ARGS into $work/NAME: one process when NP
#                         is 1, else NP ranks under mpirun.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
run() {
  local name="$1" np="$2"
  shift 2
  if [ "$np" -eq 1 ]; then
    "$bin" "${common[@]}" "$@" --out "$work/$name"
  else
    mpi "$np" "$bin" "${common[@]}" "$@" --out "$work/$name"
  fi
}
