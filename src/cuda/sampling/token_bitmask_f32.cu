#include "cuda/sampling/token_bitmask_f32.hpp"
#include "cuda/sampling/token_bitmask_f32_kernels.cuh"

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda::sampling {

void apply_token_bitmask_f32(float* logits, int64_t logits_stride, int rows, int vocab, const int32_t* mask_slot,
                             const uint32_t* masks, int64_t mask_words, cudaStream_t s) {
  if (rows == 0) return;
  FP4MOE_CHECK(rows > 0 && rows <= 65535 && vocab >= 1 && logits_stride >= vocab &&
                   mask_words >= token_mask_words(vocab) && logits && mask_slot && masks,
               "apply_token_bitmask_f32: rows {} vocab {} stride {} words {}", rows, vocab, logits_stride, mask_words);
  tokenmask::token_bitmask_kernel<<<dim3(tokenmask::mask_grid_x(vocab), rows), tokenmask::kMaskThreads, 0, s>>>(
      logits, logits_stride, vocab, mask_slot, masks, mask_words);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::sampling
