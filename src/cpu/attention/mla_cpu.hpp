// MLA attention over the paged latent cache, weight-absorbed form (DeepSeek-V3 / GLM-5
// decode; FlashInfer's BatchMLAPagedAttention computes the same). Host memory only; the
// reference for cuda/attention.
//
// The caller has folded W_UK into the query (q_latent[h] = W_UK[h]ᵀ · q_nope[h]) and applies
// W_UV to the output afterwards; this op sees only the latent space:
//
//   for each flat token t (request r, position p = positions[t]) and head h:
//     S(t)    = the key positions attended: dense: [0, p]; sparse: the entries j >= 0 of
//               topk[t, 0..topk_k) (entries -1 are padding and skipped)
//     s_j     = sm_scale * (q_latent[t,h,:] · ckv_j + q_rope[t,h,:] · kpe_j)   for j in S(t)
//               where ckv_j / kpe_j are the cache rows of position j of request r, decoded to
//               FP32 (kv_decode)
//     m       = max_j s_j;  Z = Σ_j exp(s_j − m)
//     out[t,h,:] = Σ_j exp(s_j − m) / Z · ckv_j                         [ckv_dim]
//     lse[t,h]   = m + ln Z   (natural log)
//   An empty S(t) gives out = 0 and lse = −inf.
//   FP32 throughout; j is visited in increasing position order for dense and in list order
//   for sparse (the result does not depend on the order beyond FP32 rounding).
//
// Sparse entries must be unique, and each must satisfy 0 <= j <= p (causal) — violations
// throw fp4moe::Error. The indexer's top-k (indexer_cpu.hpp) produces such lists.
// sm_scale is the model's softmax scale: (qk_nope_head_dim + qk_rope_head_dim)^-½, times
// mscale² for YaRN (DeepSeek-V3).
#pragma once

#include <cstdint>

#include "core/paged_kv.hpp"

namespace fp4moe::cpu {

struct MlaAttentionParams {
  int64_t num_heads = 0;
  float sm_scale = 0.0f;
  const int32_t* topk = nullptr;  // [T, topk_k] key positions (sparse); nullptr = dense causal
  int64_t topk_k = 0;
  int threads = 0;                // 0: default_num_threads()
};

// q_latent [T, num_heads, layer.ckv_dim], q_rope [T, num_heads, layer.kpe_dim] (FP32, row-major);
// out [T, num_heads, layer.ckv_dim] FP32; lse [T, num_heads] FP32 or nullptr.
// Every position in S(t) must already be in the cache (append first).
void mla_attention_cpu(const KvLayerView& layer, const KvBatchView& batch, const float* q_latent,
                       const float* q_rope, const MlaAttentionParams& params, float* out, float* lse);

}  // namespace fp4moe::cpu
