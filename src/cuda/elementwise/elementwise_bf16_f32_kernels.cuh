// The kernels behind elementwise.hpp. Kernels only: elementwise_bf16_f32.cu launches them,
// tests/ops/backend_ops_emu_test runs them through the CUDA emulator.
#pragma once

#include <algorithm>

#include "cuda/common/device_prims.cuh"
#include "cuda/common/row_prims.cuh"

namespace fp4moe::cuda::elementwise {

inline constexpr int kThreads = 256;
// Launch grids (the emulator rows of tests/ops use the same).
inline int silu_mul_grid_x(int n) { return std::min((n + kThreads - 1) / kThreads, 64); }  // grid (x, rows)
inline int grid_1d(int64_t n) { return int(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096)); }

namespace {

using rowprims::ld;
using rowprims::st;

__global__ void silu_mul_kernel(const uint16_t* g, int64_t gs, const uint16_t* u, int64_t us, uint16_t* h, int n) {
  const int r = blockIdx.y;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float a = ld(g, r * gs + i);
    st(h, int64_t(r) * n + i, a / (1.0f + __expf(-a)) * ld(u, r * us + i));
  }
}

template <typename T>
__global__ void add_kernel(float* x, const T* o, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += ld(o, i);
}

__global__ void to_f32_kernel(const uint16_t* x, float* y, int64_t n, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = ld(x, i) * scale;
}

__global__ void to_bf16_kernel(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    st(y, i, x[i]);
}

}  // namespace
}  // namespace fp4moe::cuda::elementwise
