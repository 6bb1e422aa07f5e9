# Sourced by the shell tests (the test spine): the environment of multi-rank runs as root with one
# BLAS thread per rank, the scratch folder, and pass/fail counting.
#   scratch DIR          DIR emptied and made (a test's own work folder)
#   mpi NP ARGS...       ARGS under mpirun ($MPIRUN when set) on NP ranks (as root, oversubscribed,
#                        unbound: $MPIRUN_FLAGS; a test that needs mpirun's own pid runs
#                        "$MPIRUN" "${MPIRUN_FLAGS[@]}" -np NP ARGS... &)
#   ok MSG / not_ok MSG  one passed / failed check, printed
#   check STATUS MSG     ok when STATUS is "ok" or 0, else not_ok
#   check_that MSG CMD...  ok when CMD succeeds, else not_ok
#   finish [NAME]        "[NAME: ]P passed, F failed"; returns 1 when any check failed
#   compare KIND ARGS... one comparison of tests/checks.py (losses A B | weights A B | golden FILE
#                        METRICS, with --rtol R: 0, the default, is bit for bit), counted; its
#                        status is the comparison's
#   PY                   the Python the checks run with (/usr/bin/python3: it has torch)
# Python checks import tests/checks.py (Checks: the same counting; the comparisons) through
# $TESTS_DIR on sys.path.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
TESTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export TESTS_DIR
PY="${PY:-/usr/bin/python3}"
MPIRUN="${MPIRUN:-mpirun}"
MPIRUN_FLAGS=(--oversubscribe --bind-to none)
lib_passed=0
lib_failed=0
scratch() { rm -rf "$1"; mkdir -p "$1"; }
mpi() {
  local np="$1"
  shift
  "$MPIRUN" "${MPIRUN_FLAGS[@]}" -np "$np" "$@"
}
ok() { lib_passed=$((lib_passed + 1)); echo "ok: $*"; }
not_ok() { lib_failed=$((lib_failed + 1)); echo "FAIL: $*" >&2; }
check() {
  local status="$1"
  shift
  if [ "$status" = ok ] || [ "$status" = 0 ]; then ok "$@"; else not_ok "$@"; fi
}
check_that() {
  local msg="$1"
  shift
  if "$@"; then ok "$msg"; else not_ok "$msg"; fi
}
compare() {
  if "$PY" "$TESTS_DIR/checks.py" "$@"; then
    lib_passed=$((lib_passed + 1))
  else
    lib_failed=$((lib_failed + 1))
    return 1
  fi
}
finish() {
  echo "${1:+$1: }$lib_passed passed, $lib_failed failed"
  [ "$lib_failed" -eq 0 ]
}
