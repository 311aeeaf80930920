// The model runner's small CUDA kernels, for any dims of the GLM-5 / DeepSeek-V3 family
// (the tiny test models as well as GLM-5's own): embedding rows, norms, RoPE from positions,
// the cache append, absorbed MLA attention over the paged BF16 latent cache (dense causal or
// over a top-k slot list), the indexer's scores, SiLU·up, residual adds, greedy argmax.
// Each is one launch, enqueue only, no host sync; every per-step array is read from device
// memory (positions, page tables), so a captured graph replays with new step data.
// Activations are BF16 (bits in uint16_t) between ops, FP32 in the residual stream and in
// every reduction. The CPU backend (src/model) is the reference of every op.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/paged_kv.hpp"

namespace fp4moe::engine::gpu {

// The step's batch on the device (core/paged_kv.hpp's KvBatchView) plus the request of every
// flat token (token_req[t] = r with qo_indptr[r] <= t < qo_indptr[r+1]).
struct DeviceBatch {
  int32_t tokens = 0, requests = 0;
  const int32_t* qo_indptr = nullptr;     // [R + 1]
  const int32_t* positions = nullptr;     // [T]
  const int32_t* kv_len = nullptr;        // [R]
  const int32_t* page_indptr = nullptr;   // [R + 1]
  const int32_t* page_indices = nullptr;  // [..]
  const int32_t* token_req = nullptr;     // [T]
  int32_t page_size = 0;
};

// x[t, :] = FP32(table[tokens[t], :]); table BF16 (f32_table false) or F32, [vocab, H].
void embed_rows(const void* table, bool f32_table, const int32_t* tokens, int T, int H, float* x, cudaStream_t s);

// y = RMSNorm(x) · w (FP32 math), x FP32 or BF16 with a row stride, y BF16 with a row stride.
void rms_norm(const float* x, int64_t x_stride, int rows, int dim, const float* w, float eps, uint16_t* y,
              int64_t y_stride, cudaStream_t s);
void rms_norm(const uint16_t* x, int64_t x_stride, int rows, int dim, const float* w, float eps, uint16_t* y,
              int64_t y_stride, cudaStream_t s);
// y = LayerNorm(x) · w + b over contiguous BF16 rows (in place allowed).
void layer_norm(const uint16_t* x, int rows, int dim, const float* w, const float* b, float eps, uint16_t* y,
                cudaStream_t s);

// RoPE in place on `heads` vectors per token: x[t · token_stride + h · head_stride + offset
// + (0 .. rope_dim)], angle_i = inv_freq[i] · positions[t] (FP32), cos/sin × attn_factor;
// interleaved pairs (2i, 2i+1) or halves (i, i + rope_dim/2) — model/model_config.hpp.
void rope(uint16_t* x, int T, int heads, int64_t token_stride, int64_t head_stride, int offset, int rope_dim,
          const int32_t* positions, const float* inv_freq, float attn_factor, bool interleaved, cudaStream_t s);

// The step's keys into their slots (BF16 cache only): ckv [T, ckv_dim] (row stride ckv_stride),
// kpe [T, kpe_dim] (kpe_stride), index_k [T, index_dim] contiguous or null.
void kv_append_bf16(const KvLayerView& layer, const DeviceBatch& b, const uint16_t* ckv, int64_t ckv_stride,
                    const uint16_t* kpe, int64_t kpe_stride, const uint16_t* index_k, cudaStream_t s);

// Absorbed MLA: out[t, h] = Σ_j softmax_j(sm_scale · (q_lat[t,h]·ckv_j + q_pe[t,h]·kpe_j)) ckv_j
// over keys j = positions 0..positions[t] of t's request (topk_slots null), or over the first
// min(topk_k, positions[t] + 1) cache slots of topk_slots[t] (−1 entries skipped).
// q_lat [T, heads, ckv_dim] BF16; q_pe at q_pe + t·pe_token_stride + h·pe_head_stride (BF16);
// out [T, heads, ckv_dim] BF16. ckv_dim <= 1024, kpe_dim <= 128.
void mla_attention(const uint16_t* q_lat, const uint16_t* q_pe, int64_t pe_token_stride, int64_t pe_head_stride,
                   const KvLayerView& layer, const DeviceBatch& b, int heads, float sm_scale, const int32_t* topk_slots,
                   int topk_k, uint16_t* out, cudaStream_t s);

// scores[t, j] = Σ_h w[t,h] · ReLU(scale · q[t,h]·k_j) for j <= positions[t] (index_k of the
// layer, BF16); q [T, heads, dim] BF16, w [T, heads] FP32. max_ctx >= positions[t] + 1.
// heads · dim <= 8192.
void indexer_scores(const uint16_t* q, const float* w, const KvLayerView& layer, const DeviceBatch& b, int heads,
                    int dim, float scale, int max_ctx, float* scores, int64_t score_stride, cudaStream_t s);

// h[r, i] = SiLU(g[r, i]) · u[r, i]: g at g + r·g_stride, u at u + r·u_stride, h [rows, n].
void silu_mul(const uint16_t* g, int64_t g_stride, const uint16_t* u, int64_t u_stride, uint16_t* h, int rows, int n,
              cudaStream_t s);
// x[i] += o[i] (n values).
void add_into(float* x, const uint16_t* o, int64_t n, cudaStream_t s);
void add_into(float* x, const float* o, int64_t n, cudaStream_t s);
// y[i] = FP32(x[i]) · scale.
void bf16_to_f32_scaled(const uint16_t* x, float* y, int64_t n, float scale, cudaStream_t s);
// dst[i, :] = src[rows[i], :] (BF16 [*, dim]).
void gather_rows(const uint16_t* src, int dim, const int32_t* rows, int n, uint16_t* dst, cudaStream_t s);
// BF16 copy of FP32 rows: y[r, :dim] = bf16(x[r, :dim]).
void f32_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t s);

// Dense-over-experts MoE combine (the BF16-experts fallback): out[t] = Σ_j wts[t,j] · y[ids[t,j], t]
// over k slots (y [E, T, H] FP32), + shared[t] when not null (FP32 [T, H]).
void moe_dense_combine(const float* y, const int32_t* ids, const float* wts, const float* shared, int T, int k, int H,
                       float* out, cudaStream_t s);

// out[r] = argmax_v logits[r, v] (ties: the lower id; NaN never wins).
void argmax_rows(const float* logits, int rows, int vocab, int32_t* out, cudaStream_t s);

}  // namespace fp4moe::engine::gpu
