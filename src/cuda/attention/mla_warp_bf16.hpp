// The model runner's any-dims MLA over a paged BF16 latent cache (launch only, graph
// capturable; every per-step array is read from device memory): the cache append of a step's
// keys, and absorbed MLA with one CTA of kMlaWarpWarps warps per (token, head), keys split over
// the warps, an online softmax per warp merged at the end. Any arch; the fallback for dims the
// tuned kernels (mla.hpp / mla_decode.hpp / FlashInfer) do not take, e.g. the tiny test models.
// CPU references: cpu/attention/kv_cache_cpu.hpp (kv_append_cpu), cpu/attention/mla_cpu.hpp
// (mla_attention_cpu); checked by tests/ops.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/paged_kv.hpp"
#include "cuda/common/device_batch.hpp"

namespace fp4moe::cuda::attention {

inline constexpr int kMlaWarpWarps = 4;
inline constexpr int kMlaWarpMaxCkv = 1024;  // ckv_dim: a multiple of 32, at most this
inline constexpr int kMlaWarpMaxKpe = 128;   // kpe_dim at most this

// The step's keys into their slots (BF16 cache only): ckv [T, ckv_dim] (row stride ckv_stride),
// kpe [T, kpe_dim] (kpe_stride), index_k [T, index_dim] contiguous or null. Tokens whose slot is
// outside the pool write nothing.
void kv_append_bf16(const KvLayerView& layer, const DeviceBatch& b, const uint16_t* ckv, int64_t ckv_stride,
                    const uint16_t* kpe, int64_t kpe_stride, const uint16_t* index_k, cudaStream_t s);

// Absorbed MLA: out[t, h] = Σ_j softmax_j(sm_scale · (q_lat[t,h]·ckv_j + q_pe[t,h]·kpe_j)) ckv_j
// over keys j = positions 0..positions[t] of t's request (topk_slots null), or over the first
// min(topk_k, positions[t] + 1) cache slots of topk_slots[t] (−1 entries skipped).
// q_lat [T, heads, ckv_dim] BF16; q_pe at q_pe + t·pe_token_stride + h·pe_head_stride (BF16);
// out [T, heads, ckv_dim] BF16. ckv_dim <= 1024 (a multiple of 32), kpe_dim <= 128.
void mla_attention_warp_bf16(const uint16_t* q_lat, const uint16_t* q_pe, int64_t pe_token_stride,
                             int64_t pe_head_stride, const KvLayerView& layer, const DeviceBatch& b, int heads,
                             float sm_scale, const int32_t* topk_slots, int topk_k, uint16_t* out, cudaStream_t s);

}  // namespace fp4moe::cuda::attention
