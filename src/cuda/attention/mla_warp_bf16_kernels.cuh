// The kernels behind mla_warp_bf16.hpp and mla_warp_fp8.hpp (template <bool kFp8>: the cache
// elements BF16 or E4M3 times the layer's scale; queries and outputs BF16 either way). Kernels
// only: mla_warp_bf16.cu / mla_warp_fp8.cu launch them, tests/ops/backend_ops_emu_test runs them
// through the CUDA emulator.
#pragma once

#include "cuda/common/device_prims.cuh"
#include "cuda/common/row_prims.cuh"

#include "core/paged_kv.hpp"

namespace fp4moe::cuda::attention {
namespace mlawarp {

inline constexpr int kKvAppendRunnerThreads = 128;

namespace {

using prims::warp_sum;
using rowprims::ld;
using rowprims::slot_of;
using rowprims::st;

constexpr int kAttnWarps = 4;
constexpr int kMaxC = 32;  // ckv_dim / 32 per lane (ckv_dim <= 1024)
constexpr int kMaxR = 4;   // kpe_dim / 32 per lane, rounded up (kpe_dim <= 128)

// kFp8: the cache arrays are E4M3 with the layer's per-array scales (st_e4m3), else BF16 copies.
template <bool kFp8>
__global__ void kv_append_kernel(KvLayerView L, DeviceBatch b, const uint16_t* ckv, int64_t cs, const uint16_t* kpe,
                                 int64_t ks, const uint16_t* ik) {
  const int t = blockIdx.x;
  const int64_t slot = slot_of(b, b.token_req[t], b.positions[t]);
  if (slot < 0 || slot >= L.num_pages * L.page_size) return;
  if constexpr (kFp8) {
    const float ic = 1.0f / L.ckv_scale, ip = 1.0f / L.kpe_scale, ii = 1.0f / L.index_scale;
    uint8_t* dc = static_cast<uint8_t*>(L.ckv) + slot * L.ckv_dim;
    uint8_t* dk = static_cast<uint8_t*>(L.kpe) + slot * L.kpe_dim;
    for (int i = threadIdx.x; i < L.ckv_dim; i += blockDim.x) rowprims::st_e4m3(dc, i, ld(ckv, t * cs + i), ic);
    for (int i = threadIdx.x; i < L.kpe_dim; i += blockDim.x) rowprims::st_e4m3(dk, i, ld(kpe, t * ks + i), ip);
    if (ik && L.index_k) {
      uint8_t* di = static_cast<uint8_t*>(L.index_k) + slot * L.index_dim;
      for (int i = threadIdx.x; i < L.index_dim; i += blockDim.x)
        rowprims::st_e4m3(di, i, ld(ik, int64_t(t) * L.index_dim + i), ii);
    }
  } else {
    uint16_t* dc = static_cast<uint16_t*>(L.ckv) + slot * L.ckv_dim;
    uint16_t* dk = static_cast<uint16_t*>(L.kpe) + slot * L.kpe_dim;
    for (int i = threadIdx.x; i < L.ckv_dim; i += blockDim.x) dc[i] = ckv[t * cs + i];
    for (int i = threadIdx.x; i < L.kpe_dim; i += blockDim.x) dk[i] = kpe[t * ks + i];
    if (ik && L.index_k) {
      uint16_t* di = static_cast<uint16_t*>(L.index_k) + slot * L.index_dim;
      for (int i = threadIdx.x; i < L.index_dim; i += blockDim.x) di[i] = ik[int64_t(t) * L.index_dim + i];
    }
  }
}

// One cache element as FP32: BF16, or E4M3 times the array's scale.
template <bool kFp8>
__device__ __forceinline__ float ld_cache(const void* base, int64_t i, float scale) {
  if constexpr (kFp8) return rowprims::ld_e4m3(static_cast<const uint8_t*>(base), i, scale);
  else return ld(static_cast<const uint16_t*>(base), i);
}

template <bool kFp8>
__global__ void __launch_bounds__(kAttnWarps * 32) mla_kernel(const uint16_t* q_lat, const uint16_t* q_pe, int64_t pts,
                                                             int64_t phs, KvLayerView L, DeviceBatch b, int heads,
                                                             float scale, const int32_t* topk, int topk_k, uint16_t* out) {
  const int t = blockIdx.x, h = blockIdx.y, w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int C = int(L.ckv_dim), R = int(L.kpe_dim), nc = C / 32;
  float q[kMaxC], qr[kMaxR], acc[kMaxC];
  const uint16_t* ql = q_lat + (int64_t(t) * heads + h) * C;
  const uint16_t* qp = q_pe + t * pts + h * phs;
#pragma unroll
  for (int i = 0; i < kMaxC; ++i) {
    q[i] = i < nc ? ld(ql, lane + 32 * i) : 0.0f;
    acc[i] = 0.0f;
  }
#pragma unroll
  for (int i = 0; i < kMaxR; ++i) qr[i] = lane + 32 * i < R ? ld(qp, lane + 32 * i) : 0.0f;
  const int r = b.token_req[t], pos = b.positions[t];
  const int n = topk ? min(topk_k, pos + 1) : pos + 1;
  float m = -INFINITY, l = 0.0f;
  const size_t esz = kFp8 ? 1 : 2;
  const uint8_t* ckv = static_cast<const uint8_t*>(L.ckv);
  const uint8_t* kpe = static_cast<const uint8_t*>(L.kpe);
  for (int j = w; j < n; j += kAttnWarps) {
    const int64_t slot = topk ? int64_t(topk[int64_t(t) * topk_k + j]) : slot_of(b, r, j);
    if (slot < 0) continue;
    const uint8_t* kc = ckv + slot * C * esz;
    const uint8_t* kp = kpe + slot * R * esz;
    float kv[kMaxC];
    float d = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxC; ++i) {
      kv[i] = i < nc ? ld_cache<kFp8>(kc, lane + 32 * i, L.ckv_scale) : 0.0f;
      d += q[i] * kv[i];
    }
#pragma unroll
    for (int i = 0; i < kMaxR; ++i)
      if (lane + 32 * i < R) d += qr[i] * ld_cache<kFp8>(kp, lane + 32 * i, L.kpe_scale);
    const float sc = warp_sum(d) * scale;
    const float mn = fmaxf(m, sc);
    const float corr = __expf(m - mn), p = __expf(sc - mn);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < kMaxC; ++i) acc[i] = acc[i] * corr + p * kv[i];
    m = mn;
  }
  __shared__ float sm[kAttnWarps], sl[kAttnWarps];
  __shared__ float sacc[kAttnWarps][kMaxC * 32];
  if (lane == 0) {
    sm[w] = m;
    sl[w] = l;
  }
#pragma unroll
  for (int i = 0; i < kMaxC; ++i)
    if (i < nc) sacc[w][lane + 32 * i] = acc[i];
  __syncthreads();
  float M = -INFINITY;
  for (int i = 0; i < kAttnWarps; ++i) M = fmaxf(M, sm[i]);
  float Lsum = 0.0f;
  for (int i = 0; i < kAttnWarps; ++i) Lsum += sl[i] > 0.0f ? sl[i] * __expf(sm[i] - M) : 0.0f;
  uint16_t* o = out + (int64_t(t) * heads + h) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float v = 0.0f;
    for (int i = 0; i < kAttnWarps; ++i)
      if (sl[i] > 0.0f) v += sacc[i][c] * __expf(sm[i] - M);
    st(o, c, Lsum > 0.0f ? v / Lsum : 0.0f);
  }
}

}  // namespace
}  // namespace mlawarp
}  // namespace fp4moe::cuda::attention
