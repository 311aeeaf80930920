// The indexer's score launches (the kernel: indexer_score_mma.cuh), the per-device split of a
// batch's keys over CTAs, and the FP8 query quantization. Compiled for every arch in
// CMAKE_CUDA_ARCHITECTURES (sm_90a, sm_100a, sm_120a).
#include "cuda/indexer/indexer_score_mma.cuh"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "cuda/attention/kv_device.cuh"
#include "cuda/common/cuda_check.hpp"
#include "cuda/indexer/indexer.hpp"
#include "core/error.hpp"
#include "cuda/common/device.hpp"
#include "cuda/common/launch.cuh"

namespace fp4moe::cuda::indexer {
namespace {

using score::index_score_kernel;
using score::kMaxTilesPerCta;
using score::kThreads;
using score::kTileKeys;
using score::ScoreParams;
using score::Tile;

__global__ void quantize_q_fp8_kernel(const __nv_bfloat16* q, const float* w, __nv_fp8_e4m3* q8, float* w8,
                                      int rows) {
  // One warp per (row, head): 128 values, 4 per lane.
  const int rh = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (rh >= rows * kIndexHeads) return;
  const int lane = threadIdx.x & 31;
  const __nv_bfloat16* src = q + int64_t(rh) * kIndexDim + lane * 4;
  float v[4], amax = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = __bfloat162float(src[i]);
    amax = fmaxf(amax, fabsf(v[i]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float scale = amax > 0.f ? amax / 448.f : 1.f;
  const float inv = 1.f / scale;
#pragma unroll
  for (int i = 0; i < 4; ++i) q8[int64_t(rh) * kIndexDim + lane * 4 + i] = __nv_fp8_e4m3(v[i] * inv);
  if (lane == 0) w8[rh] = w[rh] * scale;
}

// Per-device facts, read once per device (cuda/common/device: index_scores runs every decode step).
struct DeviceFacts {
  int sms = 0, smem_optin = 0;
};
DeviceFacts device_facts() {
  const cuda::DeviceInfo& d = cuda::current_device();
  return {d.sm_count, int(d.smem_per_block_optin)};
}

// The kernel's opt-in to its shared memory and its resident CTAs per SM, once per device.
template <bool kFp8, int kStages, int kG>
int ctas_per_sm() {
  using T = Tile<kFp8, kStages>;
  static cuda::DeviceOnce once;
  static int per_sm[cuda::kMaxDevices] = {};
  const int dev = cuda::current_device_ordinal();
  once([dev] {
    FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(index_score_kernel<kFp8, kStages, kG>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes));
    int n = 0;
    FP4MOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, index_score_kernel<kFp8, kStages, kG>,
                                                                    kThreads, T::kSmemBytes));
    per_sm[dev] = std::max(n, 1);
  });
  return per_sm[dev];
}

// The ring depth this device runs by default: 3 stages where a block may have their shared
// memory, else 2 (IndexerScoreArgs::ring_stages forces 2: tests cover both on one GPU).
bool three_stages(bool fp8) {
  return device_facts().smem_optin >= int(fp8 ? Tile<true, 3>::kSmemBytes : Tile<false, 3>::kSmemBytes);
}

template <bool kFp8, int kG>
int resident_ctas_of() {
  return device_facts().sms * (three_stages(kFp8) ? ctas_per_sm<kFp8, 3, kG>() : ctas_per_sm<kFp8, 2, kG>());
}
int resident_ctas(bool fp8, int group) {
  if (group == 2) return fp8 ? resident_ctas_of<true, 2>() : resident_ctas_of<false, 2>();
  return fp8 ? resident_ctas_of<true, 1>() : resident_ctas_of<false, 1>();
}

// Query tokens per CTA: the forced value, or 2 when the batch holds at least two tokens per
// request on average (prefill chunks, whose consecutive tokens share their keys), else 1.
int group_of(const IndexerScoreArgs& a) {
  if (a.tokens_per_cta > 0) return a.tokens_per_cta;
  return a.batch.num_tokens >= 2 * a.batch.num_requests ? 2 : 1;
}

template <bool kFp8, int kStages, int kG>
void launch_scores(const IndexerScoreArgs& a, cudaStream_t stream) {
  using T = Tile<kFp8, kStages>;
  const int resident = device_facts().sms * ctas_per_sm<kFp8, kStages, kG>();  // (and the smem opt-in)
  const int64_t groups = (a.batch.num_tokens + kG - 1) / kG;
  const int key_tiles = (a.max_ctx + kTileKeys - 1) / kTileKeys;
  // The grid: for max_ctx (the forced split, or the default one of the longest row).
  const int tiles_per_cta = a.tiles_per_cta > 0 ? a.tiles_per_cta : score::tiles_per_cta_for(groups, a.max_ctx, resident);
  ScoreParams p{};
  p.q = static_cast<const uint8_t*>(a.q);
  p.w = a.w;
  p.keys = static_cast<const uint8_t*>(a.layer.index_k);
  p.qo_indptr = a.batch.qo_indptr;
  p.positions = a.batch.positions;
  p.page_indptr = a.batch.page_indptr;
  p.page_indices = a.batch.page_indices;
  p.num_requests = int(a.batch.num_requests);
  p.num_tokens = int(a.batch.num_tokens);
  p.scores = a.scores;
  p.score_stride = a.score_stride;
  p.page_shift = attention::log2_exact(a.layer.page_size);
  p.tiles_per_cta = a.tiles_per_cta;  // 0: each CTA takes its token's split
  p.resident = resident;
  p.scale = 1.0f / sqrtf(float(kIndexDim)) * (kFp8 ? a.layer.index_scale : 1.0f);
  p.rope_inv_freq = a.q_rope_inv_freq;
  p.rope_dim = a.q_rope_dim;
  p.rope_attn_factor = a.q_rope_attn_factor;
  p.w_bf16 = static_cast<const uint16_t*>(a.w_bf16);
  p.w_scale = a.w_bf16_scale;
  const dim3 grid(unsigned(groups), unsigned((key_tiles + tiles_per_cta - 1) / tiles_per_cta));
  FP4MOE_CUDA_CHECK(launch_kernel(a.pdl, index_score_kernel<kFp8, kStages, kG>, grid, dim3(kThreads), T::kSmemBytes,
                                  stream, p));
}

template <bool kFp8, int kG>
void launch_scores_for(const IndexerScoreArgs& a, cudaStream_t stream) {
  a.ring_stages != 2 && three_stages(kFp8) ? launch_scores<kFp8, 3, kG>(a, stream)
                                           : launch_scores<kFp8, 2, kG>(a, stream);
}

}  // namespace

std::string indexer_can_implement(int64_t num_heads, int64_t head_dim) {
  if (num_heads != kIndexHeads || head_dim != kIndexDim)
    return "indexer: " + std::to_string(num_heads) + " heads x " + std::to_string(head_dim) +
           " unsupported (the GPU indexer is built for 32 heads x 128)";
  return "";
}

void index_scores(const IndexerScoreArgs& a, cudaStream_t stream) {
  const KvLayerView& L = a.layer;
  const KvBatchView& b = a.batch;
  FP4MOE_CHECK(a.q && (a.w || a.w_bf16) && L.index_k && a.scores && b.qo_indptr && b.positions && b.page_indptr &&
                   b.page_indices,
               "{}", "indexer scores: a required pointer is null");
  FP4MOE_CHECK(a.q_rope_dim == 0 || (L.index_elem == KvElem::BF16 && a.q_rope_inv_freq && a.q_rope_dim > 0 &&
                                     a.q_rope_dim <= kIndexDim && a.q_rope_dim % 2 == 0),
               "indexer scores: the fused query RoPE takes BF16 queries and an even rope_dim <= 128 (got {})",
               a.q_rope_dim);
  const std::string why = indexer_can_implement(kIndexHeads, L.index_dim);
  FP4MOE_CHECK(why.empty(), "{}", why);
  FP4MOE_CHECK(L.index_elem == KvElem::BF16 || L.index_elem == KvElem::FP8_E4M3, "{}",
          "indexer scores: index_k must be bf16 or fp8_e4m3");
  FP4MOE_CHECK(attention::log2_exact(L.page_size) >= 0, "{}",
          "indexer scores: page_size " + std::to_string(L.page_size) + " must be a power of two");
  FP4MOE_CHECK(b.num_tokens >= 0 && b.num_tokens < (int64_t(1) << 31) && b.num_requests >= 1, "{}",
          "indexer scores: bad token / request count");
  FP4MOE_CHECK(a.max_ctx >= 0 && a.max_ctx <= 65535 * kTileKeys, "{}", "indexer scores: max_ctx out of range");
  FP4MOE_CHECK(a.score_stride >= a.max_ctx, "{}", "indexer scores: score_stride < max_ctx");
  if (b.num_tokens == 0 || a.max_ctx == 0) return;
  FP4MOE_CHECK(a.tiles_per_cta >= 0 && a.tiles_per_cta <= kMaxTilesPerCta, "indexer scores: tiles_per_cta {} outside [0, {}]",
               a.tiles_per_cta, kMaxTilesPerCta);
  FP4MOE_CHECK(a.tokens_per_cta >= 0 && a.tokens_per_cta <= 2, "indexer scores: tokens_per_cta {} outside [0, 2]",
               a.tokens_per_cta);
  FP4MOE_CHECK(a.ring_stages == 0 || a.ring_stages == 2, "indexer scores: ring_stages {} is not 0 (the device's) or 2",
               a.ring_stages);
  const bool fp8 = L.index_elem == KvElem::FP8_E4M3;
  if (group_of(a) == 2)
    fp8 ? launch_scores_for<true, 2>(a, stream) : launch_scores_for<false, 2>(a, stream);
  else
    fp8 ? launch_scores_for<true, 1>(a, stream) : launch_scores_for<false, 1>(a, stream);
}

int index_score_tiles_per_cta(int64_t tokens, int max_ctx, KvElem index_elem, int tokens_per_cta) {
  const int g = tokens_per_cta == 2 ? 2 : 1;
  return score::tiles_per_cta_for((tokens + g - 1) / g, max_ctx, resident_ctas(index_elem == KvElem::FP8_E4M3, g));
}

void quantize_q_fp8(const void* q_bf16, const float* w, void* q_fp8, float* w_fp8, int64_t tokens,
                    cudaStream_t stream) {
  if (tokens <= 0) return;
  FP4MOE_CHECK(tokens <= (int64_t(1) << 24), "{}", "quantize_q_fp8: too many tokens");
  const int rows = int(tokens);
  const int warps = rows * kIndexHeads;
  constexpr int kBlock = 256;
  quantize_q_fp8_kernel<<<(warps * 32 + kBlock - 1) / kBlock, kBlock, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(q_bf16), w, static_cast<__nv_fp8_e4m3*>(q_fp8), w_fp8, rows);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::indexer
