#include "cuda/elementwise/elementwise.hpp"
#include "cuda/elementwise/elementwise_bf16_f32_kernels.cuh"

#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda::elementwise {

void silu_mul(const uint16_t* g, int64_t gs, const uint16_t* u, int64_t us, uint16_t* h, int rows, int n,
              cudaStream_t s) {
  if (rows == 0) return;
  silu_mul_kernel<<<dim3(silu_mul_grid_x(n), rows), kThreads, 0, s>>>(g, gs, u, us, h, n);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void add_into(float* x, const uint16_t* o, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  add_kernel<uint16_t><<<grid_1d(n), kThreads, 0, s>>>(x, o, n);
  FP4MOE_CUDA_CHECK_LAUNCH();
}
void add_into(float* x, const float* o, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  add_kernel<float><<<grid_1d(n), kThreads, 0, s>>>(x, o, n);
  FP4MOE_CUDA_CHECK_LAUNCH();
}
void bf16_to_f32_scaled(const uint16_t* x, float* y, int64_t n, float scale, cudaStream_t s) {
  if (n == 0) return;
  to_f32_kernel<<<grid_1d(n), kThreads, 0, s>>>(x, y, n, scale);
  FP4MOE_CUDA_CHECK_LAUNCH();
}
void f32_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  to_bf16_kernel<<<grid_1d(n), kThreads, 0, s>>>(x, y, n);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::elementwise
