// CPU references of the model runner's small GPU ops (cuda/norm, rope, embed, elementwise,
// permute/dense_combine_f32, sampling/argmax_f32, step): same addressing and argument meaning as
// the launch functions, host memory, results before any BF16 rounding (FP32 out, the sums in
// FP64), so a test compares the GPU's BF16 / FP32 output against the exact value within the
// rounding the GPU's types imply (tests/ops/ops_cases.hpp derives each bound). The MLA,
// cache-append and indexer references are cpu/attention's.
#pragma once

#include <cstdint>

namespace fp4moe::cpu {

// y[r, i] = w[i] · x[r, i] / sqrt(mean_i x[r, i]² + eps); x rows at x + r · x_stride.
void rms_norm_rows_cpu(const float* x, int64_t x_stride, int64_t rows, int64_t dim, const float* w, float eps,
                       float* y);
// y[r, i] = (x[r, i] − mean) / sqrt(var + eps) · w[i] + b[i] (biased variance), contiguous rows.
void layer_norm_rows_cpu(const float* x, int64_t rows, int64_t dim, const float* w, const float* b, float eps,
                         float* y);
// RoPE in place on x[t · token_stride + h · head_stride + offset + (0 .. rope_dim)]: angle_i =
// inv_freq[i] · positions[t] rounded to FP32 (as the GPU forms it), cos / sin in FP64 ×
// attn_factor; interleaved pairs (2i, 2i+1) or halves (i, i + rope_dim / 2).
void rope_rows_cpu(float* x, int64_t T, int64_t heads, int64_t token_stride, int64_t head_stride, int64_t offset,
                   int64_t rope_dim, const int32_t* positions, const float* inv_freq, float attn_factor,
                   bool interleaved);
// x[t, :] = table[tokens[t], :] as FP32 (table BF16 bits, or FP32 when f32_table), [vocab, H].
void embed_rows_cpu(const void* table, bool f32_table, const int32_t* tokens, int64_t T, int64_t H, float* x);
// dst[i, :] = src[rows[i], :], BF16 bits [*, dim].
void gather_rows_cpu(const uint16_t* src, int64_t dim, const int32_t* rows, int64_t n, uint16_t* dst);
// h[r, i] = SiLU(g[r, i]) · u[r, i] (g, u FP32 with row strides), h FP32 [rows, n].
void silu_mul_cpu(const float* g, int64_t g_stride, const float* u, int64_t u_stride, float* h, int64_t rows,
                  int64_t n);
// x[i] += o[i] in FP32 (one rounding, the GPU's add).
void add_into_cpu(float* x, const float* o, int64_t n);
// y[i] = FP32(x[i]) · scale (one FP32 product).
void bf16_to_f32_scaled_cpu(const uint16_t* x, float* y, int64_t n, float scale);
// y[i] = bf16(x[i]), round to nearest even (NaN stays NaN).
void f32_to_bf16_cpu(const float* x, uint16_t* y, int64_t n);
// out[t, i] = Σ_j wts[t, j] · y[ids[t, j], t, i] (+ shared[t, i]), y [E, T, H], FP64 sum.
void moe_dense_combine_cpu(const float* y, const int32_t* ids, const float* wts, const float* shared, int64_t T,
                           int64_t k, int64_t H, float* out);
// out[r] = the lowest v with logits[r, v] the largest non-NaN value; 0 for a row of NaNs.
void argmax_rows_cpu(const float* logits, int64_t rows, int64_t vocab, int32_t* out);
// counts[e] = #{(t, j) : active[token_req[t]] != 0, ids[t · k + j] == e}, e < E.
void count_experts_cpu(const int32_t* ids, int64_t T, int64_t k, const int32_t* token_req, const int32_t* active,
                       int64_t E, int32_t* counts);
// out[i] = min(max(qo_indptr[i] − r0, 0), n) for i in 0..R.
void chunk_qo_indptr_cpu(const int32_t* qo_indptr, int32_t R, int32_t r0, int32_t n, int32_t* out);

}  // namespace fp4moe::cpu
