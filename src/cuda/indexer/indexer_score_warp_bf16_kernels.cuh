// The kernel behind indexer_score_warp_bf16.hpp and indexer_score_warp_fp8.hpp (template <bool
// kFp8>: the index keys BF16 or E4M3 times index_scale; the query BF16 either way). Kernels only:
// indexer_score_warp_bf16.cu / _fp8.cu launch it, tests/ops/backend_ops_emu_test runs it through
// the CUDA emulator.
#pragma once

#include <cstddef>

#include "cuda/common/device_prims.cuh"
#include "cuda/common/row_prims.cuh"

#include "core/paged_kv.hpp"

namespace fp4moe::cuda::indexer {

inline constexpr int kScoreWarpThreads = 256;
// Dynamic shared memory of one CTA: q [heads · dim] then w [heads], FP32.
inline size_t score_warp_smem_bytes(int heads, int dim) { return size_t(heads * dim + heads) * sizeof(float); }

namespace scorewarp {
namespace {

using prims::warp_sum;
using rowprims::ld;
using rowprims::slot_of;

constexpr int kIdxKeysPerBlock = 128;

template <bool kFp8>
__global__ void indexer_kernel(const uint16_t* q, const float* w, KvLayerView L, DeviceBatch b, int heads, int dim,
                               float scale, float* scores, int64_t stride) {
  FP4MOE_DYNAMIC_SMEM(float, sq);  // [heads * dim] then w [heads]
  float* sw = sq + heads * dim;
  const int t = blockIdx.x, pos = b.positions[t], r = b.token_req[t];
  const int j0 = blockIdx.y * kIdxKeysPerBlock;
  if (j0 > pos) return;
  for (int i = threadIdx.x; i < heads * dim; i += blockDim.x) sq[i] = ld(q, int64_t(t) * heads * dim + i);
  for (int i = threadIdx.x; i < heads; i += blockDim.x) sw[i] = w[int64_t(t) * heads + i];
  __syncthreads();
  const int warps = blockDim.x / 32, wi = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint8_t* keys = static_cast<const uint8_t*>(L.index_k);
  const int64_t esz = kFp8 ? 1 : 2;
  for (int j = j0 + wi; j < min(j0 + kIdxKeysPerBlock, pos + 1); j += warps) {
    const uint8_t* k = keys + slot_of(b, r, j) * dim * esz;
    float kv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (kFp8) kv[i] = lane + 32 * i < dim ? rowprims::ld_e4m3(k, lane + 32 * i, L.index_scale) : 0.0f;
      else kv[i] = lane + 32 * i < dim ? ld(reinterpret_cast<const uint16_t*>(k), lane + 32 * i) : 0.0f;
    }
    float s = 0.0f;
    for (int h = 0; h < heads; ++h) {
      float d = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (lane + 32 * i < dim) d += sq[h * dim + lane + 32 * i] * kv[i];
      d = warp_sum(d);
      s += sw[h] * fmaxf(d * scale, 0.0f);
    }
    if (lane == 0) scores[int64_t(t) * stride + j] = s;
  }
}

}  // namespace
}  // namespace scorewarp
}  // namespace fp4moe::cuda::indexer
