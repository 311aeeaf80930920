#include "cuda/permute/dense_combine_f32.hpp"
#include "cuda/permute/dense_combine_f32_kernels.cuh"

#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda {

void moe_dense_combine_f32(const float* y, const int32_t* ids, const float* wts, const float* shared, int T, int k,
                           int H, float* out, cudaStream_t s) {
  if (T == 0) return;
  densecombine::combine_kernel<<<T, densecombine::kDenseCombineThreads, 0, s>>>(y, ids, wts, shared, T, k, H, out);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda
