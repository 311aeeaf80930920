#include "cuda/sampling/argmax_f32.hpp"
#include "cuda/sampling/argmax_f32_kernels.cuh"

#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda::sampling {

void argmax_rows_f32(const float* logits, int rows, int vocab, int32_t* out, cudaStream_t s) {
  if (rows == 0) return;
  argmax::argmax_kernel<<<rows, argmax::kArgmaxThreads, 0, s>>>(logits, vocab, out);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::sampling
