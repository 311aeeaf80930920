// Helpers shared by the GPU MoE tests (routing, permute, layer, GEMMs): typed device arrays,
// random data, relative errors, event timing.
#pragma once

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_buffer.hpp"
#include "gpu_test.hpp"

namespace fp4moe::test {

// Median of `runs` CUDA-event timings (µs) of fn() on the default stream after `warm`
// warm-up calls, the `flush_bytes` at `flush` overwritten before each call (cold L2).
template <typename Fn>
double median_event_us(void* flush, size_t flush_bytes, int warm, int runs, Fn&& fn) {
  cudaEvent_t e0, e1;
  FP4MOE_CUDA_CHECK(cudaEventCreate(&e0));
  FP4MOE_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int it = 0; it < warm + runs; ++it) {
    FP4MOE_CUDA_CHECK(cudaMemsetAsync(flush, it, flush_bytes));
    FP4MOE_CUDA_CHECK(cudaEventRecord(e0));
    fn();
    FP4MOE_CUDA_CHECK(cudaEventRecord(e1));
    FP4MOE_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    FP4MOE_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (it >= warm) ms.push_back(t);
  }
  FP4MOE_CUDA_CHECK(cudaEventDestroy(e0));
  FP4MOE_CUDA_CHECK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]) * 1e3;
}

// A typed device array on cuda::DeviceBuffer, poisoned (0xff bytes: NaN floats, -1 ints)
// when made from a count.
template <typename T>
struct DeviceArray {
  cuda::DeviceBuffer buf;
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceArray(size_t count) : buf(std::max<size_t>(count, 1) * sizeof(T)), ptr(buf.as<T>()), n(count) {
    FP4MOE_CUDA_CHECK(cudaMemset(ptr, 0xff, buf.bytes()));  // poison
  }
  explicit DeviceArray(const std::vector<T>& h) : DeviceArray(h.size()) { upload(h); }
  void upload(const std::vector<T>& h) { buf.upload(h); }
  std::vector<T> download() const {
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    return buf.download<T>(n);
  }
};

inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// ‖a − b‖ / ‖b‖ (NaN anywhere -> +inf).
inline double rel_error(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace fp4moe::test
