// The kernel behind dense_combine_f32.hpp. Kernels only: dense_combine_f32.cu launches it,
// tests/ops/backend_ops_emu_test runs it through the CUDA emulator.
#pragma once

#include "cuda/common/device_prims.cuh"

namespace fp4moe::cuda::densecombine {

inline constexpr int kDenseCombineThreads = 256;

namespace {

__global__ void combine_kernel(const float* y, const int32_t* ids, const float* wts, const float* shared, int T, int k,
                               int H, float* out) {
  const int t = blockIdx.x;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    float a = 0.0f;
    for (int j = 0; j < k; ++j) a += wts[t * k + j] * y[(int64_t(ids[t * k + j]) * T + t) * H + i];
    if (shared) a += shared[int64_t(t) * H + i];
    out[int64_t(t) * H + i] = a;
  }
}

}  // namespace
}  // namespace fp4moe::cuda::densecombine
