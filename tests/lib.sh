# Sourced by the shell tests (the test spine): the environment of multi-rank runs as root with one
# BLAS thread per rank, the scratch folder, and pass/fail counting.
#   scratch DIR          DIR emptied and made (a test's own work folder)
#   mpi NP ARGS...       ARGS under mpirun on NP ranks (as root, oversubscribed, unbound)
#   ok MSG / not_ok MSG  one passed / failed check, printed
#   check STATUS MSG     ok when STATUS is "ok" or 0, else not_ok
#   finish [NAME]        "[NAME: ]P passed, F failed"; returns 1 when any check failed
# Python checks run from heredocs import tests/checks.py (Checks: the same counting) through
# $TESTS_DIR on sys.path.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
TESTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export TESTS_DIR
lib_passed=0
lib_failed=0
scratch() { rm -rf "$1"; mkdir -p "$1"; }
mpi() {
  local np="$1"
  shift
  mpirun --oversubscribe --bind-to none -np "$np" "$@"
}
ok() { lib_passed=$((lib_passed + 1)); echo "ok: $*"; }
not_ok() { lib_failed=$((lib_failed + 1)); echo "FAIL: $*" >&2; }
check() {
  local status="$1"
  shift
  if [ "$status" = ok ] || [ "$status" = 0 ]; then ok "$@"; else not_ok "$@"; fi
}
finish() {
  echo "${1:+$1: }$lib_passed passed, $lib_failed failed"
  [ "$lib_failed" -eq 0 ]
}
