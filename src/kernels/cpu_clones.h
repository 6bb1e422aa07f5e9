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
