#include "cuda/rope/rope.hpp"
#include "cuda/rope/rope_bf16_kernels.cuh"

#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda::rope {

void rope(uint16_t* x, int T, int heads, int64_t ts, int64_t hs, int offset, int rope_dim, const int32_t* positions,
          const float* inv_freq, float af, bool interleaved, cudaStream_t s) {
  if (T == 0 || rope_dim == 0) return;
  rope_kernel<<<T, kRopeThreads, 0, s>>>(x, heads, ts, hs, offset, rope_dim / 2, positions, inv_freq, af, interleaved);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::rope
