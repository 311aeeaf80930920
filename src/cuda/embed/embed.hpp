// Row lookups of the model runner (launch only, graph capturable): the embedding rows of a
// step's tokens into the FP32 residual stream, and a BF16 row gather (the last token of each
// request before the lm_head). 16-byte loads, several per thread in flight, one or more CTAs per
// row where the dims allow (H a multiple of 4, dim of 8, 16-byte-aligned buffers); else one CTA
// per row, scalar. CPU reference: cpu/row_ops_cpu.hpp
// (embed_rows_cpu, gather_rows_cpu); checked by tests/ops.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace fp4moe::cuda::embed {

// x[t, :] = FP32(table[tokens[t], :]); table BF16 (f32_table false) or F32, [vocab, H].
void embed_rows(const void* table, bool f32_table, const int32_t* tokens, int T, int H, float* x, cudaStream_t s);

// dst[i, :] = src[rows[i], :] (BF16 [*, dim]).
void gather_rows(const uint16_t* src, int dim, const int32_t* rows, int n, uint16_t* dst, cudaStream_t s);

// The previous forms (one CTA per row, a strided scalar loop), for `fp4moe bench rows` before /
// after only (and the launches' fallback for rows that are not 16-byte friendly).
void embed_rows_v0(const void* table, bool f32_table, const int32_t* tokens, int T, int H, float* x, cudaStream_t s);
void gather_rows_v0(const uint16_t* src, int dim, const int32_t* rows, int n, uint16_t* dst, cudaStream_t s);

}  // namespace fp4moe::cuda::embed
