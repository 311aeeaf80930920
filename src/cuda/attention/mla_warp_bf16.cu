#include "cuda/attention/mla_warp_bf16.hpp"
#include "cuda/attention/mla_warp_bf16_kernels.cuh"

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda::attention {

static_assert(kMlaWarpWarps == mlawarp::kAttnWarps && kMlaWarpMaxCkv == 32 * mlawarp::kMaxC &&
              kMlaWarpMaxKpe == 32 * mlawarp::kMaxR);

void kv_append_bf16(const KvLayerView& layer, const DeviceBatch& b, const uint16_t* ckv, int64_t cs,
                    const uint16_t* kpe, int64_t ks, const uint16_t* ik, cudaStream_t s) {
  FP4MOE_CHECK(layer.elem == KvElem::BF16 && (!layer.index_k || layer.index_elem == KvElem::BF16),
               "the GPU runner's cache append takes a BF16 cache");
  if (b.tokens == 0) return;
  mlawarp::kv_append_kernel<false><<<b.tokens, mlawarp::kKvAppendRunnerThreads, 0, s>>>(layer, b, ckv, cs, kpe, ks, ik);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void mla_attention_warp_bf16(const uint16_t* q_lat, const uint16_t* q_pe, int64_t pts, int64_t phs,
                             const KvLayerView& layer, const DeviceBatch& b, int heads, float sm_scale,
                             const int32_t* topk, int topk_k, uint16_t* out, cudaStream_t s) {
  FP4MOE_CHECK(layer.ckv_dim % 32 == 0 && layer.ckv_dim <= kMlaWarpMaxCkv && layer.kpe_dim <= kMlaWarpMaxKpe &&
                   layer.elem == KvElem::BF16,
               "MLA attention (runner kernel): latent {} (a multiple of 32, <= 1024) + rope {} (<= 128), BF16 cache",
               layer.ckv_dim, layer.kpe_dim);
  if (b.tokens == 0) return;
  mlawarp::mla_kernel<false><<<dim3(b.tokens, heads), kMlaWarpWarps * 32, 0, s>>>(q_lat, q_pe, pts, phs, layer, b, heads,
                                                                          sm_scale, topk, topk_k, out);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::attention
