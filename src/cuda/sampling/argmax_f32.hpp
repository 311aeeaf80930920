// Greedy argmax of FP32 logit rows (the runner's greedy-only path; launch only, graph
// capturable). Ties: the lower id; NaN never wins; a row of NaNs gives 0. At small row counts a
// row is split over several CTAs (about 512 CTAs in all, 4,096 values at least each) whose
// results the last CTA merges through a caller-owned workspace; from 128 rows on, or without a
// workspace, one CTA per row. Either way 16-byte loads, several per thread in flight at once
// (argmax_f32_kernels.cuh). Deterministic: an exact max over (value, id) keys. CPU reference:
// cpu/row_ops_cpu.hpp (argmax_rows_cpu); checked by tests/ops.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace fp4moe::cuda::sampling {

// Workspace bytes that serve every launch of any rows and vocab (a few KB). It must be zeroed
// once when allocated; every launch leaves it zeroed. One launch at a time per workspace.
size_t argmax_rows_f32_workspace_bytes();

// out[r] = argmax_v logits[r, v] (logits [rows, vocab], contiguous). workspace: nullptr (one CTA
// per row) or argmax_rows_f32_workspace_bytes() zeroed bytes (the split form at small row counts).
void argmax_rows_f32(const float* logits, int rows, int vocab, int32_t* out, void* workspace, size_t workspace_bytes,
                     cudaStream_t s);
// One CTA per row (no workspace).
inline void argmax_rows_f32(const float* logits, int rows, int vocab, int32_t* out, cudaStream_t s) {
  argmax_rows_f32(logits, rows, vocab, out, nullptr, 0, s);
}

// The previous form (one CTA of 1,024 threads per row, a strided scalar scan), for
// `fp4moe bench rows` before / after only; the engine does not use it.
void argmax_rows_f32_v0(const float* logits, int rows, int vocab, int32_t* out, cudaStream_t s);

}  // namespace fp4moe::cuda::sampling
