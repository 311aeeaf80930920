#include <cmath>

#include "cuda/indexer/indexer_score_warp_fp8.hpp"
#include "cuda/indexer/indexer_score_warp_bf16.hpp"
#include "cuda/indexer/indexer_score_warp_bf16_kernels.cuh"

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda::indexer {

void indexer_scores_warp_fp8(const uint16_t* q, const float* w, const KvLayerView& layer, const DeviceBatch& b,
                             int heads, int dim, float scale, int max_ctx, float* scores, int64_t stride,
                             cudaStream_t s) {
  FP4MOE_CHECK(dim <= kScoreWarpMaxDim && heads * dim <= kScoreWarpMaxQ && layer.index_k &&
                   layer.index_elem == KvElem::FP8_E4M3 && std::isfinite(layer.index_scale) && layer.index_scale > 0,
               "indexer (runner kernel): {} heads x {} dims (dim <= 128, heads x dim <= 8192), FP8 keys with a "
               "positive finite scale ({})",
               heads, dim, layer.index_scale);
  if (b.tokens == 0) return;
  const size_t smem = score_warp_smem_bytes(heads, dim);
  static bool attr = false;
  if (!attr && smem > 48 * 1024) {
    FP4MOE_CUDA_CHECK(
        cudaFuncSetAttribute(scorewarp::indexer_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
    attr = true;
  }
  scorewarp::indexer_kernel<true><<<dim3(b.tokens, (max_ctx + kScoreWarpKeysPerBlock - 1) / kScoreWarpKeysPerBlock),
                                    kScoreWarpThreads, smem, s>>>(q, w, layer, b, heads, dim, scale, scores, stride);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::indexer
