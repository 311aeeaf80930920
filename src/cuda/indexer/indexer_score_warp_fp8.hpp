// The model runner's any-dims DSA indexer scores over a paged FP8 (E4M3) index-key cache: the
// op of indexer_score_warp_bf16.hpp (the same kernel, template kFp8) with each key decoded as
// e4m3 · index_scale; the query stays BF16 (FP32 products), as the CPU reference reads it
// (cpu/attention/indexer_cpu.hpp over the decoded keys). Any arch; the fallback for dims
// indexer.hpp's MMA kernels do not take (the tiny test models). Checked by tests/ops.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/paged_kv.hpp"
#include "cuda/common/device_batch.hpp"

namespace fp4moe::cuda::indexer {

// indexer_scores_warp_bf16's op with layer.index_elem FP8_E4M3 (index_scale positive, finite).
void indexer_scores_warp_fp8(const uint16_t* q, const float* w, const KvLayerView& layer, const DeviceBatch& b,
                             int heads, int dim, float scale, int max_ctx, float* scores, int64_t score_stride,
                             cudaStream_t s);

}  // namespace fp4moe::cuda::indexer
