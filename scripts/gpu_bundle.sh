#!/usr/bin/env bash
# Prepares what scripts/gpu_check.sh needs on a GPU machine that has no OpenMPI, OpenBLAS or test
# libraries: builds the CUDA backend here (build-gpu/, Release, static CUDA runtime) and packs the
# binaries, every shared library they load that is not glibc or CUDA, OpenMPI's plugins and help
# files, the corpus and the scripts into build-gpu/bundle.tar.xz (well under the 64 MiB a device
# call can carry). libcublas comes from the GPU machine's own PyTorch wheels.
# Usage: scripts/gpu_bundle.sh   then: run scripts/gpu_check.sh with carry ["build-gpu/bundle.tar.xz"]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
build="$root/build-gpu"
mkdir -p "$build"
if ! { cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOETRAIN_CUDA=ON &&
       cmake --build "$build" -j"$(nproc)" --target moetrain moetrain_cuda_tests tool_device_parity; } \
     >"$build/build.log" 2>&1; then
  grep -E -A3 "error|Error" "$build/build.log" | head -40 >&2
  echo "gpu_bundle: build failed; full log: $build/build.log" >&2
  exit 1
fi
stage="$build/stage"
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib" "$stage/data"
bins=(moetrain moetrain_cuda_tests tool_device_parity)
for b in "${bins[@]}"; do cp "$build/$b" "$stage/bin/"; done
# OpenMPI keeps its plugins and help files under its prefix; keep Debian's layout below usr/ so
# OPAL_PREFIX=$stage/usr relocates it.
ompi_lib=/usr/lib/x86_64-linux-gnu/openmpi
mkdir -p "$stage/usr/lib/x86_64-linux-gnu" "$stage/usr/share" "$stage/usr/bin"
cp -a "$ompi_lib" "$stage/usr/lib/x86_64-linux-gnu/"
cp -a /usr/share/openmpi "$stage/usr/share/"
for t in orterun mpirun mpiexec orted; do
  [ -e "/usr/bin/$t" ] && cp -L "/usr/bin/$t" "$stage/usr/bin/$t"
done
[ -d /usr/share/pmix ] && cp -a /usr/share/pmix "$stage/usr/share/"
[ -d /usr/lib/x86_64-linux-gnu/pmix2 ] && cp -a /usr/lib/x86_64-linux-gnu/pmix2 "$stage/usr/lib/x86_64-linux-gnu/"
# Shared libraries of the binaries and plugins, except glibc's own and CUDA's (the driver and
# cuBLAS belong to the GPU machine).
skip='^(libc|libm|libdl|libpthread|librt|ld-linux-x86-64|libcuda|libcublas|libcublasLt|libnvidia)[.-]'
objs=("${bins[@]/#/$build/}" $(find "$ompi_lib" -name '*.so*' -type f) /usr/bin/orterun)
for o in "${objs[@]}"; do
  ldd "$o" 2>/dev/null | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  name="$(basename "$lib")"
  [[ "$name" =~ $skip ]] && continue
  cp -L "$lib" "$stage/lib/$name"
done
cp "$root/data/kjv.txt" "$stage/data/"
tar -C "$stage" -cJf "$build/bundle.tar.xz" .
echo "gpu_bundle: $build/bundle.tar.xz ($(du -h "$build/bundle.tar.xz" | cut -f1))"
