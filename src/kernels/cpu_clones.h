// MOE_CPU_CLONES: a CPU loop compiled as AVX-512 / AVX2 / baseline clones, chosen at load time by
// CPU feature (not by CPU model: "arch=" clones check the model, which a virtual machine may not
// report). Binaries stay portable, and the widest clone runs 16 floats per instruction where the
// CPU has AVX-512. Files that use it are compiled with -ffp-contract=off (CMakeLists.txt), so
// every clone rounds alike and results (golden files) do not depend on the CPU.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MOE_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MOE_CPU_CLONES
#endif

// MOE_ISA_CLONES(name, body, (params), (args)): `void name(params)` calls body<W>(args) built for
// AVX-512 (W = 16 floats a vector), AVX2 (8) or the x86-64 baseline (4), chosen once by CPU
// feature. For loops on explicit vectors (kernels/lanes.h Vec<W>), whose width must follow the
// instruction set; body must be always-inline (MOE_LANES) so that it is compiled for each set.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MOE_ISA_CLONES(name, body, params, args)                               \
  __attribute__((target("avx512f"))) void name##_w16 params { body<16> args; } \
  __attribute__((target("avx2"))) void name##_w8 params { body<8> args; }      \
  void name##_w4 params { body<4> args; }                                      \
  void name params {                                                           \
    static const auto fn = __builtin_cpu_supports("avx512f") ? &name##_w16     \
                           : __builtin_cpu_supports("avx2")  ? &name##_w8      \
                                                             : &name##_w4;      \
    fn args;                                                                   \
  }
#else
#define MOE_ISA_CLONES(name, body, params, args) \
  void name params { body<4> args; }
#endif
