// Random FP4 expert stacks for tests (host data only; CPU and GPU tests share it).
#pragma once

#include <cstdint>
#include <random>

#include "format/moe_layer.hpp"

namespace fp4moe::test {

// Random FP4 expert stack: uniform codes, E4M3 scales mostly in [2^-4, 2^3] with some
// subnormal and zero scales; MXFP4 scales in [2^-12, 2^2].
inline ExpertStack random_stack(WeightFormat f, int64_t E, int64_t N, int64_t K, uint64_t seed) {
  std::mt19937_64 rng(seed);
  ExpertStack s;
  s.format = f;
  s.num_experts = E;
  s.n = N;
  s.k = K;
  s.packed.resize(size_t(E * N * K / 2));
  for (auto& b : s.packed) b = uint8_t(rng());
  s.scales.resize(size_t(E * N * (K / s.block())));
  for (auto& b : s.scales) {
    const uint32_t r = uint32_t(rng() % 1000);
    if (f == WeightFormat::MXFP4) b = uint8_t(127 - 12 + int(rng() % 15));
    else if (r == 0) b = 0x00;                    // zero scale
    else if (r < 8) b = uint8_t(1 + rng() % 7);   // subnormal E4M3
    else b = uint8_t(0x18 + rng() % 0x38);        // 2^-4 .. ~2^3
  }
  s.global_scale.resize(size_t(E));
  for (auto& g : s.global_scale) g = f == WeightFormat::MXFP4 ? 1.0f : float(0.002 + 0.01 * double(rng() % 100) / 100);
  return s;
}

}  // namespace fp4moe::test
