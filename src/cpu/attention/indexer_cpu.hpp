// The DSA indexer (DeepSeek-V3.2 / GLM-5 "lightning indexer") over the paged index-key
// cache: per-key scores, then the top-k key positions each query attends to. Host memory
// only; the reference for cuda/indexer.
//
// Scores, for each flat token t (request r, position p = positions[t]) and key position j:
//   score[t, j] = Σ_{h = 0..n_heads-1} w[t,h] · max(0, softmax_scale · (q[t,h,:] · k_j))   j <= p
//   score[t, j] = −inf                                                                     p < j < stride
// where k_j is the index_k cache row of position j of request r decoded to FP32, the head
// sum runs in increasing h (FP32), q is the indexer query after RoPE ([T, n_heads, index_dim])
// and w the signed head weights as the model computes them: w = weights_proj(x) · n_heads^-½
// (the op does not scale w). softmax_scale is index_head_dim^-½.
//
// Top-k, for token t with n = p + 1 causal candidates (positions 0..p):
//   n <= k: the row is 0, 1, ..., n-1 followed by k − n entries of −1 (dense causal)
//   n >  k: the k candidates that come first in this order: higher score first; equal
//           scores: the lower position first; NaN ranks below every number (NaNs among
//           themselves: lower position first). Written in ascending position order.
// So a row is always a set in ascending order, padded with −1; GPU implementations may
// produce another order within a row and compare after sorting.
#pragma once

#include <cstdint>

#include "core/paged_kv.hpp"

namespace fp4moe::cpu {

struct IndexerParams {
  int64_t n_heads = 0;
  float softmax_scale = 0.0f;  // index_head_dim^-½
  int threads = 0;             // 0: default_num_threads()
};

// q [T, n_heads, layer.index_dim] FP32; w [T, n_heads] FP32; scores [T, score_stride] FP32
// with score_stride >= positions[t] + 1 for every t. layer.index_k must be present and hold
// every position <= positions[t] of each token's request (append first).
void indexer_scores_cpu(const KvLayerView& layer, const KvBatchView& batch, const float* q, const float* w,
                        const IndexerParams& params, float* scores, int64_t score_stride);

// scores [T, score_stride] as indexer_scores_cpu writes them (only columns 0..positions[t]
// are read); topk [T, k] int32 out. k >= 1.
void indexer_topk_cpu(const KvBatchView& batch, const float* scores, int64_t score_stride, int64_t k,
                      int32_t* topk, int threads = 0);

}  // namespace fp4moe::cpu
