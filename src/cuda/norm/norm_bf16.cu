#include "cuda/norm/norm.hpp"
#include "cuda/norm/norm_bf16_kernels.cuh"

#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda::norm {

void rms_norm(const float* x, int64_t xs, int rows, int dim, const float* w, float eps, uint16_t* y, int64_t ys,
              cudaStream_t s) {
  if (rows == 0) return;
  rms_norm_kernel<float><<<rows, kRmsNormThreads, 0, s>>>(x, xs, dim, w, eps, y, ys);
  FP4MOE_CUDA_CHECK_LAUNCH();
}
void rms_norm(const uint16_t* x, int64_t xs, int rows, int dim, const float* w, float eps, uint16_t* y, int64_t ys,
              cudaStream_t s) {
  if (rows == 0) return;
  rms_norm_kernel<uint16_t><<<rows, kRmsNormThreads, 0, s>>>(x, xs, dim, w, eps, y, ys);
  FP4MOE_CUDA_CHECK_LAUNCH();
}
void layer_norm(const uint16_t* x, int rows, int dim, const float* w, const float* b, float eps, uint16_t* y,
                cudaStream_t s) {
  if (rows == 0) return;
  layer_norm_kernel<<<rows, kLayerNormThreads, 0, s>>>(x, dim, w, b, eps, y);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::norm
