#!/usr/bin/env bash
# The C++ sources in the repository's style (.clang-format, clang-format 14: Google's, lines broken
# by hand, includes in the order written). Files: src/**/*.{h,cpp,cu,cuh,inc}, tests/**/*.{h,cpp},
# bench/*.cpp, as tracked by git.
#   scripts/format.sh            rewrites the files that differ, in place
#   scripts/format.sh --check    changes nothing; lists the files that differ and exits 1 (CI)
# Running it twice changes nothing the second time.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

check=0
case "${1:-}" in
  --check) check=1 ;;
  "") ;;
  *) echo "usage: scripts/format.sh [--check]" >&2; exit 2 ;;
esac

# Another major version lays some constructs out differently, so the check pins 14.
find_clang_format() {
  local c
  for c in clang-format-14 clang-format; do
    if command -v "$c" >/dev/null && "$c" --version | grep -q 'version 14\.'; then
      echo "$c"
      return 0
    fi
  done
  return 1
}
cf="$(find_clang_format)" || { "$root/scripts/setup.sh" >/dev/null; cf="$(find_clang_format)"; } || {
  echo "format: clang-format 14 not found (scripts/setup.sh installs Debian 12's clang-format; have: $(clang-format --version 2>/dev/null || echo none))" >&2
  exit 1
}

mapfile -t files < <(git ls-files -- 'src/*.h' 'src/*.cpp' 'src/*.cu' 'src/*.cuh' 'src/*.inc' \
                                      'tests/*.h' 'tests/*.cpp' 'bench/*.cpp')
# The files whose formatted text differs from what is on disk (one clang-format per file, in parallel).
mapfile -t bad < <(printf "%s\0" "${files[@]}" |
  xargs -0 -n 1 -P "$(nproc)" sh -c '"$0" --style=file "$1" | cmp -s - "$1" || echo "$1"' "$cf" | sort)
if [ ${#bad[@]} -eq 0 ]; then
  echo "format: ${#files[@]} files in style"
  exit 0
fi
if [ "$check" -eq 1 ]; then
  printf "format: %s differs from .clang-format\n" "${bad[@]}" >&2
  echo "format: ${#bad[@]} of ${#files[@]} files differ; fix with scripts/format.sh (see the change with git diff)" >&2
  exit 1
fi
"$cf" --style=file -i "${bad[@]}"
echo "format: rewrote ${#bad[@]} of ${#files[@]} files"
