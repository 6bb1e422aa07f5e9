#!/usr/bin/env bash
# The C++ sources in the repository's style (.clang-format: Google's, lines broken by hand, no
# include sorting). scripts/format.sh rewrites every tracked C++ file in place;
# scripts/format.sh --check (CI) changes nothing and fails naming the files that differ.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
"$root/scripts/setup.sh" clang-format >/dev/null
mapfile -t files < <(git ls-files -- 'src/*.h' 'src/*.cpp' 'src/*.cu' 'src/*.cuh' 'src/*.inc' \
                                      'tests/*.h' 'tests/*.cpp' 'bench/*.cpp')
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do
    clang-format --style=file "$f" | cmp -s - "$f" || bad+=("$f")
  done
  if [ ${#bad[@]} -gt 0 ]; then
    printf "format: %s differs from clang-format (run scripts/format.sh)\n" "${bad[@]}" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files in style"
else
  clang-format --style=file -i "${files[@]}"
fi
