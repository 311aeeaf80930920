// The kernel behind argmax_f32.hpp. Kernels only: argmax_f32.cu launches it,
// tests/ops/backend_ops_emu_test runs it through the CUDA emulator.
#pragma once

#include "cuda/common/device_prims.cuh"

namespace fp4moe::cuda::sampling::argmax {

inline constexpr int kArgmaxThreads = 1024;

namespace {

__global__ void argmax_kernel(const float* logits, int V, int32_t* out) {
  const float* row = logits + int64_t(blockIdx.x) * V;
  float best = -INFINITY;
  int bi = -1;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    const float x = row[v];
    if (!isnan(x) && (bi < 0 || x > best)) best = x, bi = v;  // v increases: ties keep the lower id
  }
  __shared__ float sb[1024];
  __shared__ int si[1024];
  sb[threadIdx.x] = best;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float ob = sb[threadIdx.x + s];
      const int oi = si[threadIdx.x + s];
      const int mi = si[threadIdx.x];
      if (oi >= 0 && (mi < 0 || ob > sb[threadIdx.x] || (ob == sb[threadIdx.x] && oi < mi))) {
        sb[threadIdx.x] = ob;
        si[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = si[0] < 0 ? 0 : si[0];
}

}  // namespace
}  // namespace fp4moe::cuda::sampling::argmax
