// Greedy argmax of FP32 logit rows (the runner's greedy-only path; launch only, graph
// capturable): one CTA of 1,024 threads per row, a strided scan then a shared-memory tree.
// Ties: the lower id; NaN never wins; a row of NaNs gives 0. CPU reference:
// cpu/row_ops_cpu.hpp (argmax_rows_cpu); checked by tests/ops.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace fp4moe::cuda::sampling {

// out[r] = argmax_v logits[r, v] (logits [rows, vocab], contiguous).
void argmax_rows_f32(const float* logits, int rows, int vocab, int32_t* out, cudaStream_t s);

}  // namespace fp4moe::cuda::sampling
