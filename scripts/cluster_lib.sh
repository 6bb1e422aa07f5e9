# Sourced by scripts/cluster_{study,overlap,plan}.sh with the script's name and its default output
# folder under out/: sets root, out (the first argument of the script, or out/NAME, absolute), bin
# (build/moetrain, built if missing) and cluster (scripts/cluster.sh); exits 77 where network
# namespaces cannot be made.
#   source "$(dirname "$0")/cluster_lib.sh" NAME "${1:-}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(realpath -m "${2:-$root/out/$1}")"
bin="$root/build/moetrain"
[ -x "$bin" ] || "$root/scripts/build.sh" >/dev/null
cluster="$root/scripts/cluster.sh"
why=$("$cluster" can) || { echo "$1: cannot make network namespaces here (${why#no: })" >&2; exit 77; }
