// MLA attention in the expanded (non-absorbed) form, as prefill computes it: the keys' nope
// part and the values are expanded from the cached latent with kv_b_proj, per head:
//
//   [k_nope_j[h] ; v_j[h]] = kv_b[h] · ckv_j          (kv_b rows h·(nope+v) .. (h+1)·(nope+v))
//   s_j = sm_scale · (q_nope[t,h] · k_nope_j[h] + q_rope[t,h] · kpe_j)   for j in S(t)
//   out[t,h] = Σ_j softmax(s)_j · v_j[h]                                  [v_dim]
//
// with S(t) as in mla_cpu.hpp (dense causal, or the given top-k positions). ckv_j / kpe_j
// are read from the paged cache (decoded to FP32), so this form and the absorbed one see the
// same keys; they differ only by FP32 rounding. Host memory only.
#pragma once

#include <cstdint>

#include "core/paged_kv.hpp"
#include "cpu/linear_cpu.hpp"

namespace fp4moe::cpu {

struct MlaExpandedParams {
  int64_t num_heads = 0, nope_dim = 0, v_dim = 0;
  float sm_scale = 0.0f;
  const int32_t* topk = nullptr;  // [T, topk_k] key positions; nullptr = dense causal
  int64_t topk_k = 0;
  int threads = 0;
};

// q_nope [T, H, nope], q_rope [T, H, layer.kpe_dim], out [T, H, v_dim] (FP32).
// kv_b: [H * (nope + v), layer.ckv_dim].
void mla_attention_expanded_cpu(const KvLayerView& layer, const KvBatchView& batch, const LinearView& kv_b,
                                const float* q_nope, const float* q_rope, const MlaExpandedParams& params, float* out);

}  // namespace fp4moe::cpu
