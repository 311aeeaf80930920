// The combine of the runner's BF16-experts fallback (every expert ran on every token, cuBLAS
// strided batched): out[t] = Σ_j wts[t,j] · y[ids[t,j], t] over the k routed slots, FP32, slot
// order, + the shared expert's row when given. One CTA per token (launch only, graph
// capturable). CPU reference: cpu/row_ops_cpu.hpp (moe_dense_combine_cpu); checked by tests/ops.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace fp4moe::cuda {

// y [E, T, H] FP32, ids / wts [T, k], shared FP32 [T, H] or null, out FP32 [T, H].
void moe_dense_combine_f32(const float* y, const int32_t* ids, const float* wts, const float* shared, int T, int k,
                           int H, float* out, cudaStream_t s);

}  // namespace fp4moe::cuda
