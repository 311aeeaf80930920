// Small AVX2/FMA vector helpers over FP32 arrays of any length (scalar tails).
// Internal to src/cpu (compiled with -march=x86-64-v3).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu/avx2_weight_dot.hpp"

namespace fp4moe::cpu {

// Σ a[i]·b[i], FP32, 4 independent accumulators over 8 lanes, then the tail in order.
inline float dot_f32(const float* a, const float* b, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 4; ++j)
      acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * j), _mm256_loadu_ps(b + i + 8 * j), acc[j]);
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc[0]);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y[i] = y[i] * c + a * x[i]
inline void scale_axpy_f32(float* y, float c, float a, const float* x, int64_t n) {
  const __m256 vc = _mm256_set1_ps(c), va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_mul_ps(vc, _mm256_loadu_ps(y + i))));
  for (; i < n; ++i) y[i] = y[i] * c + a * x[i];
}

// y[i] += a * x[i]
inline void axpy_f32(float* y, float a, const float* x, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

}  // namespace fp4moe::cpu
