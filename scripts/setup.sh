#!/usr/bin/env bash
# Installs every Debian package moetrain needs (plus any given as arguments, e.g. the fuzzers'
# compiler) and extracts the built-in corpus. Idempotent: quiet and fast when everything is there.
# Usage: scripts/setup.sh [EXTRA_PACKAGE...]
set -euo pipefail

PKGS=(build-essential cmake pkg-config
      libopenblas-dev libopenblas0 openmpi-bin libopenmpi-dev
      nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev
      libsentencepiece-dev python3-torch python3-numpy bible-kjv iproute2 "$@")
# The SMPI scale study and its CI smoke test (tests/smpi/): SimGrid's smpicxx and smpirun.
PKGS+=(libsimgrid-dev)
# --precision bf16 on the CPU: oneDNN's bf16 matmul (src/kernels/gemm_bf16_cpu.*). Debian's
# dnnl-config.cmake requires OpenCL (its GPU runtime): ocl-icd-opencl-dev is only a Recommends of
# libdnnl-dev, so without it a fresh machine fails to configure.
PKGS+=(libdnnl-dev ocl-icd-opencl-dev)
# tests/report.sh renders moetrain report's pages in headless Chromium (skipped without it).
PKGS+=(chromium)
# Every build compiles through ccache (CMakeLists.txt): a second build folder or clone reuses objects.
PKGS+=(ccache)
# scripts/format.sh (the CI format check): clang-format 14, Debian 12's.
PKGS+=(clang-format)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Built-in corpus: the King James Bible from Debian's bible-kjv package, as plain text.
root="$(cd "$(dirname "$0")/.." && pwd)"
corpus="$root/data/kjv.txt"
if [ ! -s "$corpus" ]; then
  mkdir -p "$root/data"
  # `bible` prints chapter headings and verses wrapped at 80 columns; rejoin each verse on one line.
  bible "Gen1:1-Rev22:21" | awk '
    /^ +[0-9]+ / { if (v != "") print v; sub(/^ +/, ""); v = $0; next }
    /^$/ { next }
    /^[1-3]? ?[A-Z][A-Za-z ]* [0-9]+$/ { if (v != "") print v; v = ""; if (seen) print ""; seen = 1; print; next }
    { v = v " " $0 }
    END { if (v != "") print v }' > "$corpus.tmp"
  mv "$corpus.tmp" "$corpus"
  echo "setup: wrote $corpus ($(wc -c <"$corpus") bytes)"
fi
