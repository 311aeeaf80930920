// RoPE in place from per-token positions (launch only, graph capturable): the MLA rope part,
// the latent key's rope part and the indexer's, interleaved pairs or halves. One CTA per token.
// CPU reference: cpu/row_ops_cpu.hpp (rope_rows_cpu); checked by tests/ops.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace fp4moe::cuda::rope {

// RoPE in place on `heads` vectors per token: x[t · token_stride + h · head_stride + offset
// + (0 .. rope_dim)], angle_i = inv_freq[i] · positions[t] (FP32), cos/sin × attn_factor;
// interleaved pairs (2i, 2i+1) or halves (i, i + rope_dim/2) — model/model_config.hpp.
void rope(uint16_t* x, int T, int heads, int64_t token_stride, int64_t head_stride, int offset, int rope_dim,
          const int32_t* positions, const float* inv_freq, float attn_factor, bool interleaved, cudaStream_t s);

}  // namespace fp4moe::cuda::rope
