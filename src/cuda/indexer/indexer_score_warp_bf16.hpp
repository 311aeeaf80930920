// The model runner's any-dims DSA indexer scores over a paged BF16 index-key cache (launch
// only, graph capturable): one CTA of 8 warps per (token, 128 keys), a warp per key, the query
// and head weights in shared memory. Any arch; the fallback for dims indexer.hpp's MMA kernels
// do not take (the tiny test models). CPU reference: cpu/attention/indexer_cpu.hpp
// (indexer_scores_cpu); checked by tests/ops.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/paged_kv.hpp"
#include "cuda/common/device_batch.hpp"

namespace fp4moe::cuda::indexer {

inline constexpr int kScoreWarpKeysPerBlock = 128;
inline constexpr int kScoreWarpMaxDim = 128;
inline constexpr int kScoreWarpMaxQ = 8192;  // heads · dim

// scores[t, j] = Σ_h w[t,h] · ReLU(scale · q[t,h]·k_j) for j <= positions[t] (index_k of the
// layer, BF16); q [T, heads, dim] BF16, w [T, heads] FP32. max_ctx >= positions[t] + 1.
// dim <= 128, heads · dim <= 8192. Columns past positions[t] are not written.
void indexer_scores_warp_bf16(const uint16_t* q, const float* w, const KvLayerView& layer, const DeviceBatch& b,
                              int heads, int dim, float scale, int max_ctx, float* scores, int64_t score_stride,
                              cudaStream_t s);

}  // namespace fp4moe::cuda::indexer
