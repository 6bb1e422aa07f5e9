// Sixteen-float vectors for the CPU kernels' inner loops (GCC/Clang vector extensions), used inside
// CPU-feature clones (kernels/cpu_clones.h): one zmm register per vector where the CPU has
// AVX-512, two ymm with AVX2, four SSE registers on any x86-64, a generic lowering elsewhere.
// Only for .cpp files of src/kernels compiled with -ffp-contract=off (CMakeLists.txt), so a
// product and a sum stay two roundings in every clone and results do not depend on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

// The helpers below take and return F16 by value. They are always inlined into the clones, so no
// call crosses the clones' different vector ABIs, and GCC's note about that ABI (which it also
// gives where the baseline clone inlines them) does not apply to the files that include this one.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace moe::kernels::lanes {

typedef float F16 __attribute__((vector_size(64)));
typedef int32_t I16 __attribute__((vector_size(64)));
constexpr int kLanes = 16;

#define MOE_LANES inline __attribute__((always_inline))

template <class F>
MOE_LANES F splat(float c) {
  return F{} + c;
}

MOE_LANES F16 load16(const float* p) {
  F16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
MOE_LANES void store16(float* p, F16 v) { std::memcpy(p, &v, sizeof v); }

// The first n < 16 floats of p (the rest 0), and their store back.
MOE_LANES F16 load_part(const float* p, int n) {
  F16 v{};
  std::memcpy(&v, p, sizeof(float) * static_cast<size_t>(n));
  return v;
}
MOE_LANES void store_part(float* p, F16 v, int n) {
  std::memcpy(p, &v, sizeof(float) * static_cast<size_t>(n));
}

MOE_LANES F16 max16(F16 a, F16 b) { return a > b ? a : b; }

// Native vectors of W floats (16: one zmm, 8: one ymm, 4: one SSE register), for loops compiled
// once per instruction set (MOE_ISA_CLONES in kernels/cpu_clones.h). A 64-byte F16 in a function
// built for AVX2 has no register of its size and GCC lowers much of its arithmetic lane by lane
// through the stack (SwiGLU's AVX2 clone ran at 10 cycles an element so, 2026-12-05).
typedef float F8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));
typedef float F4 __attribute__((vector_size(16)));
typedef int32_t I4 __attribute__((vector_size(16)));
template <int W>
struct Vec;
template <>
struct Vec<16> {
  using F = F16;
  using I = I16;
};
template <>
struct Vec<8> {
  using F = F8;
  using I = I8;
};
template <>
struct Vec<4> {
  using F = F4;
  using I = I4;
};
template <class F>
MOE_LANES F loadv(const float* p) {
  F v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class F>
MOE_LANES void storev(float* p, F v) {
  std::memcpy(p, &v, sizeof v);
}

// e^x, Cephes' expf: x = n·ln2 + f with n = round(x/ln2) (the 1.5·2^23 rounding trick), a degree-6
// polynomial in f, times 2^n built in the exponent bits. Relative error below 1e-7 on [-87, 88],
// where x is clamped (so e^x stays a normal float; -inf/+inf give e^-87/e^88); NaN stays NaN.
// F is float (I int32_t) or F16 (I I16): the same arithmetic per lane, so a loop's vector body and
// its scalar tail agree bit for bit.
template <class F, class I>
MOE_LANES F exp_lanes(F x) {
  x = x < splat<F>(-87.0f) ? splat<F>(-87.0f) : x;
  x = x > splat<F>(88.0f) ? splat<F>(88.0f) : x;
  const F r = x * 1.44269504088896341f + 12582912.0f;
  const F n = r - 12582912.0f;
  const F two_n = __builtin_bit_cast(F, (__builtin_bit_cast(I, r) - 0x4B400000 + 127) << 23);
  const F f = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  F p = splat<F>(1.9875691500e-4f);
  p = p * f + 1.3981999507e-3f;
  p = p * f + 8.3334519073e-3f;
  p = p * f + 4.1665795894e-2f;
  p = p * f + 1.6666665459e-1f;
  p = p * f + 5.0000001201e-1f;
  return (p * (f * f) + f + 1.0f) * two_n;
}

}  // namespace moe::kernels::lanes
