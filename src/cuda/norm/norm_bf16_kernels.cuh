// The kernels behind norm.hpp (one CTA per row, FP32 sums). Kernels only: norm_bf16.cu
// launches them, tests/ops/backend_ops_emu_test runs them through the CUDA emulator.
#pragma once

#include "cuda/common/device_prims.cuh"
#include "cuda/common/row_prims.cuh"

namespace fp4moe::cuda::norm {

// CTA sizes of the launches (also the emulator's).
inline constexpr int kRmsNormThreads = 256;
inline constexpr int kLayerNormThreads = 128;

namespace {

using rowprims::block_sum;
using rowprims::ld;
using rowprims::st;

template <typename In>
__global__ void rms_norm_kernel(const In* x, int64_t xs, int dim, const float* w, float eps, uint16_t* y, int64_t ys) {
  const In* xr = x + int64_t(blockIdx.x) * xs;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = ld(xr, i);
    ss += v * v;
  }
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(dim) + eps);
  uint16_t* yr = y + int64_t(blockIdx.x) * ys;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) st(yr, i, w[i] * (ld(xr, i) * inv));
}

__global__ void layer_norm_kernel(const uint16_t* x, int dim, const float* w, const float* b, float eps, uint16_t* y) {
  const uint16_t* xr = x + int64_t(blockIdx.x) * dim;
  float s = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) s += ld(xr, i);
  const float mean = block_sum(s) / float(dim);
  float v = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) v += (ld(xr, i) - mean) * (ld(xr, i) - mean);
  const float inv = 1.0f / sqrtf(block_sum(v) / float(dim) + eps);
  uint16_t* yr = y + int64_t(blockIdx.x) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) st(yr, i, (ld(xr, i) - mean) * inv * w[i] + b[i]);
}

}  // namespace
}  // namespace fp4moe::cuda::norm
