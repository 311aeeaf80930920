#include "cuda/embed/embed.hpp"
#include "cuda/embed/embed_rows_kernels.cuh"

#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda::embed {

void embed_rows(const void* table, bool f32_table, const int32_t* tokens, int T, int H, float* x, cudaStream_t s) {
  if (T == 0) return;
  embed_kernel<<<T, kEmbedThreads, 0, s>>>(table, f32_table, tokens, H, x);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void gather_rows(const uint16_t* src, int dim, const int32_t* rows, int n, uint16_t* dst, cudaStream_t s) {
  if (n == 0) return;
  gather_kernel<<<n, kGatherThreads, 0, s>>>(src, dim, rows, dst);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::embed
