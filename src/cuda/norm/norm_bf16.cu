#include "cuda/norm/norm.hpp"
#include "cuda/norm/norm_bf16_kernels.cuh"

#include <cstdint>

#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda::norm {
namespace {

template <typename In>
void launch_rms_norm(const In* x, int64_t xs, int rows, int dim, const float* w, float eps, uint16_t* y, int64_t ys,
                     cudaStream_t s) {
  if (rows == 0) return;
  const RmsNormLaunch l = rms_norm_launch(x, xs, dim, w, y, ys);
  if (l.threads == 0)
    rms_norm_strided_kernel<In><<<rows, kRmsNormThreads, 0, s>>>(x, xs, dim, w, eps, y, ys);
  else if (l.chunks == kRmsRegTargetChunks)
    rms_norm_reg_kernel<In, kRmsRegTargetChunks><<<rows, l.threads, 0, s>>>(x, xs, dim, w, eps, y, ys, l.x_vec, l.y_vec, l.w_vec);
  else
    rms_norm_reg_kernel<In, kRmsRegMaxChunks><<<rows, l.threads, 0, s>>>(x, xs, dim, w, eps, y, ys, l.x_vec, l.y_vec, l.w_vec);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rms_norm(const float* x, int64_t xs, int rows, int dim, const float* w, float eps, uint16_t* y, int64_t ys,
              cudaStream_t s) {
  launch_rms_norm(x, xs, rows, dim, w, eps, y, ys, s);
}
void rms_norm(const uint16_t* x, int64_t xs, int rows, int dim, const float* w, float eps, uint16_t* y, int64_t ys,
              cudaStream_t s) {
  launch_rms_norm(x, xs, rows, dim, w, eps, y, ys, s);
}
void rms_norm_v0(const float* x, int64_t xs, int rows, int dim, const float* w, float eps, uint16_t* y, int64_t ys,
                 cudaStream_t s) {
  if (rows == 0) return;
  rms_norm_strided_kernel<float><<<rows, kRmsNormThreads, 0, s>>>(x, xs, dim, w, eps, y, ys);
  FP4MOE_CUDA_CHECK_LAUNCH();
}
void rms_norm_v0(const uint16_t* x, int64_t xs, int rows, int dim, const float* w, float eps, uint16_t* y, int64_t ys,
                 cudaStream_t s) {
  if (rows == 0) return;
  rms_norm_strided_kernel<uint16_t><<<rows, kRmsNormThreads, 0, s>>>(x, xs, dim, w, eps, y, ys);
  FP4MOE_CUDA_CHECK_LAUNCH();
}
void layer_norm(const uint16_t* x, int rows, int dim, const float* w, const float* b, float eps, uint16_t* y,
                cudaStream_t s) {
  if (rows == 0) return;
  layer_norm_kernel<<<rows, kLayerNormThreads, 0, s>>>(x, dim, w, b, eps, y);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::norm
