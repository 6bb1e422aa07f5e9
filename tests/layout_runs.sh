# Sourced by the layout tests (tests/tp.sh, tests/zero1.sh, tests/parity.sh) after they set `bin`,
# `work` and the `common` array of train flags: the environment of multi-rank runs as root with
# one BLAS thread per rank, and
#   run NAME NP ARGS...   `moetrain train` with common + ARGS into $work/NAME: one process when NP
#                         is 1, else NP ranks under mpirun.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
run() {
  local name="$1" np="$2"
  shift 2
  if [ "$np" -eq 1 ]; then
    "$bin" "${common[@]}" "$@" --out "$work/$name"
  else
    mpirun --oversubscribe --bind-to none -np "$np" "$bin" "${common[@]}" "$@" --out "$work/$name"
  fi
}
