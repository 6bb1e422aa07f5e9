// Deterministic random numbers, identical on every platform and compiler: splitmix64 for seeding,
// splitmix64 as the generator itself, Box-Muller for normals. std::*_distribution is
// avoided on purpose (its output differs between standard libraries).
#pragma once
#include <cmath>
#include <cstdint>

namespace moe {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : state_(seed) {}
  uint64_t next_u64() {  // splitmix64: passes BigCrush, one multiply chain per call
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return (next_u64() >> 11) * (1.0 / 9007199254740992.0); }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next_u64() % n; }
  double normal() {
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  uint64_t state() const { return state_; }
  void set_state(uint64_t s) { state_ = s; }

 private:
  uint64_t state_;
};

// A child stream derived from (seed, stream id), so independent consumers do not share a sequence.
inline Rng derive_rng(uint64_t seed, uint64_t stream) {
  Rng r(seed ^ (0xD1B54A32D192ED03ull * (stream + 1)));
  r.next_u64();
  return r;
}

}  // namespace moe
