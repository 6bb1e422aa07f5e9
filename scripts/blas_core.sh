# Sourced by the comparison scripts: the OpenBLAS core that both sides of a comparison load.
# Both link the same OpenBLAS, and on a CPU whose model it does not know it picks its generic
# kernels, so the core is set explicitly, by the CPU's features: SkylakeX where AVX-512 (F, BW,
# VL, DQ) is there, Haswell where AVX2 and FMA are, else the generic Prescott. An OPENBLAS_CORETYPE
# already in the environment is kept (moetrain refuses one this CPU cannot run).
blas_core_for_this_cpu() {
  local flags
  flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  has() { [[ "$flags" == *" $1 "* ]]; }
  if has avx512f && has avx512bw && has avx512vl && has avx512dq; then
    echo SkylakeX
  elif has avx2 && has fma; then
    echo Haswell
  else
    echo Prescott
  fi
}
