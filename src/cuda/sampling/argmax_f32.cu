#include "cuda/sampling/argmax_f32.hpp"
#include "cuda/sampling/argmax_f32_kernels.cuh"

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda::sampling {

size_t argmax_rows_f32_workspace_bytes() { return argmax::argmax_workspace_bytes_max(); }

void argmax_rows_f32(const float* logits, int rows, int vocab, int32_t* out, void* ws, size_t ws_bytes, cudaStream_t s) {
  FP4MOE_CHECK(rows >= 0 && vocab >= 1, "argmax_rows_f32: rows {} and vocab {} (rows >= 0, vocab >= 1)", rows, vocab);
  if (rows == 0) return;
  int slices = 1;
  if (ws != nullptr) {
    FP4MOE_CHECK(ws_bytes >= argmax::argmax_workspace_bytes_max(), "argmax_rows_f32: workspace of {} bytes, needs {}",
                 ws_bytes, argmax::argmax_workspace_bytes_max());
    slices = argmax::argmax_slices(rows, vocab);
    FP4MOE_CHECK(slices == 1 || int64_t(rows) * slices < argmax::kArgmaxTargetCtas + argmax::kArgmaxSplitRowsMax,
                 "argmax_rows_f32: {} rows x {} slices overflow the merge", rows, slices);  // argmax_slices' bound
  }
  // Rows go in the grid's y (65,535 at most a launch; the split form only runs below 128 rows).
  for (int r0 = 0; r0 < rows; r0 += 65535) {
    const int n = rows - r0 < 65535 ? rows - r0 : 65535;
    argmax::argmax_split_kernel<<<dim3(unsigned(slices), unsigned(n)), argmax::kArgmaxThreads, 0, s>>>(
        logits + int64_t(r0) * vocab, vocab, out + r0, slices == 1 ? nullptr : ws);
    FP4MOE_CUDA_CHECK_LAUNCH();
  }
}

void argmax_rows_f32_v0(const float* logits, int rows, int vocab, int32_t* out, cudaStream_t s) {
  if (rows == 0) return;
  argmax::argmax_kernel_v0<<<rows, argmax::kArgmaxV0Threads, 0, s>>>(logits, vocab, out);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::sampling
