// The kernels behind embed.hpp. Kernels only: embed_rows.cu launches them,
// tests/ops/backend_ops_emu_test runs them through the CUDA emulator.
#pragma once

#include "cuda/common/device_prims.cuh"
#include "cuda/common/row_prims.cuh"

namespace fp4moe::cuda::embed {

inline constexpr int kEmbedThreads = 256;
inline constexpr int kGatherThreads = 256;

namespace {

using rowprims::ld;

__global__ void embed_kernel(const void* table, bool f32, const int32_t* tokens, int H, float* x) {
  const int t = blockIdx.x;
  const int64_t row = int64_t(tokens[t]) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x)
    x[int64_t(t) * H + i] = f32 ? static_cast<const float*>(table)[row + i] : ld(static_cast<const uint16_t*>(table), row + i);
}

__global__ void gather_kernel(const uint16_t* src, int dim, const int32_t* rows, uint16_t* dst) {
  const int64_t s = int64_t(rows[blockIdx.x]) * dim, d = int64_t(blockIdx.x) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[d + i] = src[s + i];
}

}  // namespace
}  // namespace fp4moe::cuda::embed
