// Router, large T: logits = x · Wᵀ (x BF16, W FP32, FP32 FMAs) as a tiled SIMT GEMM, then
// one selection kernel.
//
// GEMM CTA tile (BM = 16 kTm tokens) x (BN = 128 experts) x (BK = 8), 256 threads as 16 x 16,
// each thread (kTm tokens) x 8 experts in registers (two halves of the tile, so that its
// shared-memory reads are float4/float2 broadcasts). x (converted to FP32 on the way in) and
// W are staged transposed in shared memory, double buffered: the next k-tile is loaded into
// registers while the current one is multiplied. Split-K over gridDim.z when the tile grid
// alone leaves the GPU idle: split s writes out[s] = its partial [T, E]; the selection kernel
// sums the splits in order 0..S-1 (deterministic) and writes the logits.
#include <algorithm>

#include "cuda/routing/router_launch.hpp"
#include "cuda/routing/router_select_warp.cuh"

#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda::router_detail {
namespace {

constexpr int kThreads = 256, kBn = 128, kBk = 8, kPad = 4;
constexpr int kMaxSplits = 64;
constexpr int kTargetCtas = 2 * 132;  // two CTAs per SM of an H200
constexpr int kSelectThreads = 128;   // 4 tokens per selection CTA

template <int kTm>
__global__ void __launch_bounds__(kThreads)
router_tiled_gemm_kernel(const uint16_t* __restrict__ x, const float* __restrict__ w, int T, int E, int K,
                         int k_chunk, float* __restrict__ out) {
  constexpr int kBm = 16 * kTm;
  constexpr int kAElems = kBm * kBk / kThreads;  // bf16 per thread per k-tile: kTm / 2
  static_assert(kTm == 4 || kTm == 8, "tile rows per thread");
  __shared__ __align__(16) float As[2][kBk][kBm + kPad];  // (BK, BM) x tile, FP32
  __shared__ __align__(16) float Bs[2][kBk][kBn + kPad];  // (BK, BN) W tile

  const int tid = int(threadIdx.x), tx = tid % 16, ty = tid / 16;
  const int m0 = int(blockIdx.x) * kBm, n0 = int(blockIdx.y) * kBn;
  const int kb = int(blockIdx.z) * k_chunk, ke = min(K, kb + k_chunk);  // both multiples of 8

  // Loader coordinates: A row / k offset, B row / k offset.
  const int a_row = tid / (kBk / kAElems), a_k = (tid % (kBk / kAElems)) * kAElems;
  const int b_row = tid / 2, b_k = (tid % 2) * 4;
  const bool a_ok = m0 + a_row < T, b_ok = n0 + b_row < E;
  const uint16_t* a_src = x + int64_t(a_ok ? m0 + a_row : 0) * K + a_k;
  const float* b_src = w + int64_t(b_ok ? n0 + b_row : 0) * K + b_k;

  float a_reg[kAElems];
  float4 b_reg;
  auto load_tile = [&](int k0) {
    if constexpr (kAElems == 4) {
      const uint2 v = a_ok ? __ldg(reinterpret_cast<const uint2*>(a_src + k0)) : make_uint2(0u, 0u);
      a_reg[0] = __uint_as_float(v.x << 16);
      a_reg[1] = __uint_as_float(v.x & 0xffff0000u);
      a_reg[2] = __uint_as_float(v.y << 16);
      a_reg[3] = __uint_as_float(v.y & 0xffff0000u);
    } else {
      const uint32_t v = a_ok ? __ldg(reinterpret_cast<const unsigned int*>(a_src + k0)) : 0u;
      a_reg[0] = __uint_as_float(v << 16);
      a_reg[1] = __uint_as_float(v & 0xffff0000u);
    }
    b_reg = b_ok ? __ldg(reinterpret_cast<const float4*>(b_src + k0)) : make_float4(0.f, 0.f, 0.f, 0.f);
  };
  auto store_tile = [&](int buf) {
#pragma unroll
    for (int i = 0; i < kAElems; ++i) As[buf][a_k + i][a_row] = a_reg[i];
    Bs[buf][b_k + 0][b_row] = b_reg.x;
    Bs[buf][b_k + 1][b_row] = b_reg.y;
    Bs[buf][b_k + 2][b_row] = b_reg.z;
    Bs[buf][b_k + 3][b_row] = b_reg.w;
  };

  float acc[kTm][8];  // (kTm tokens) x (8 experts)
#pragma unroll
  for (int i = 0; i < kTm; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

  int buf = 0;
  if (kb < ke) {
    load_tile(kb);
    store_tile(0);
  }
  __syncthreads();
  for (int k0 = kb; k0 < ke; k0 += kBk) {
    const bool more = k0 + kBk < ke;
    if (more) load_tile(k0 + kBk);
#pragma unroll
    for (int kk = 0; kk < kBk; ++kk) {
      float a[kTm], b[8];
      constexpr int kHalf = kTm / 2;
      if constexpr (kHalf == 4) {
        const float4 a0 = *reinterpret_cast<const float4*>(&As[buf][kk][ty * 4]);
        const float4 a1 = *reinterpret_cast<const float4*>(&As[buf][kk][kBm / 2 + ty * 4]);
        a[0] = a0.x, a[1] = a0.y, a[2] = a0.z, a[3] = a0.w;
        a[4] = a1.x, a[5] = a1.y, a[6] = a1.z, a[7] = a1.w;
      } else {
        const float2 a0 = *reinterpret_cast<const float2*>(&As[buf][kk][ty * 2]);
        const float2 a1 = *reinterpret_cast<const float2*>(&As[buf][kk][kBm / 2 + ty * 2]);
        a[0] = a0.x, a[1] = a0.y, a[2] = a1.x, a[3] = a1.y;
      }
      const float4 b0 = *reinterpret_cast<const float4*>(&Bs[buf][kk][tx * 4]);
      const float4 b1 = *reinterpret_cast<const float4*>(&Bs[buf][kk][kBn / 2 + tx * 4]);
      b[0] = b0.x, b[1] = b0.y, b[2] = b0.z, b[3] = b0.w;
      b[4] = b1.x, b[5] = b1.y, b[6] = b1.z, b[7] = b1.w;
#pragma unroll
      for (int i = 0; i < kTm; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    if (more) store_tile(buf ^ 1);
    __syncthreads();
    buf ^= 1;
  }

  float* o = out + int64_t(blockIdx.z) * T * E;
#pragma unroll
  for (int i = 0; i < kTm; ++i) {
    const int m = m0 + (i < kTm / 2 ? ty * (kTm / 2) + i : kBm / 2 + ty * (kTm / 2) + i - kTm / 2);
    if (m >= T) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = n0 + h * (kBn / 2) + tx * 4;
      float* row = o + int64_t(m) * E;
      if (E % 4 == 0 && n + 3 < E) {
        *reinterpret_cast<float4*>(row + n) =
            make_float4(acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2], acc[i][4 * h + 3]);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (n + j < E) row[n + j] = acc[i][4 * h + j];
      }
    }
  }
}

// One warp per token: logits = Σ_s partials[s] (s ascending) when splits > 1, then select.
template <int kPerLane>
__global__ void __launch_bounds__(kSelectThreads)
router_select_kernel(RouterDesc d, const float* __restrict__ partials, int splits, int T,
                     const float* __restrict__ bias, float* __restrict__ logits, int32_t* __restrict__ ids,
                     float* __restrict__ wts) {
  extern __shared__ float scratch[];  // [warps][select_scratch_floats(E)]
  const int warp = int(threadIdx.x >> 5);
  const int t = int(blockIdx.x) * (kSelectThreads / 32) + warp;
  if (t >= T) return;  // whole warps leave: select_token_warp needs full warps
  const int E = d.num_experts;
  float* lg = logits + int64_t(t) * E;
  float* my_scratch = scratch + warp * select_scratch_floats(E);
  auto logit = [=](int e) {
    if (!partials) return lg[e];
    const float* p = partials + int64_t(t) * E + e;
    float v = p[0];
    for (int s = 1; s < splits; ++s) v += p[int64_t(s) * T * E];
    lg[e] = v;
    return v;
  };
  select_token_warp<kPerLane>(d, logit, bias, my_scratch, ids + int64_t(t) * d.top_k, wts + int64_t(t) * d.top_k);
}

template <int kTm>
void launch_gemm(const TiledPlan& p, const uint16_t* x, const float* w, int T, int E, int K, float* out,
                 cudaStream_t st) {
  const dim3 grid(unsigned((T + 16 * kTm - 1) / (16 * kTm)), unsigned((E + kBn - 1) / kBn), unsigned(p.splits));
  router_tiled_gemm_kernel<kTm><<<grid, kThreads, 0, st>>>(x, w, T, E, K, p.k_chunk, out);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

int tile_rows_per_thread(int tokens) { return tokens <= 96 ? 4 : 8; }

}  // namespace

int tiled_max_splits(int tokens, int num_experts) {
  const int bm = 16 * tile_rows_per_thread(tokens);
  const int64_t tiles = int64_t((tokens + bm - 1) / bm) * ((num_experts + kBn - 1) / kBn);
  return int(std::clamp<int64_t>(kTargetCtas / std::max<int64_t>(tiles, 1), 1, kMaxSplits));
}

TiledPlan tiled_plan(int tokens, int num_experts, int hidden) {
  TiledPlan p;
  p.tm = tile_rows_per_thread(tokens);
  const int s = tiled_max_splits(tokens, num_experts);
  p.k_chunk = ((hidden + s - 1) / s + kBk - 1) / kBk * kBk;
  p.splits = (hidden + p.k_chunk - 1) / p.k_chunk;
  return p;
}

void launch_tiled_gemm(const TiledPlan& p, const uint16_t* x, const float* w, int tokens, int num_experts,
                       int hidden, float* out, cudaStream_t st) {
  if (p.tm == 4)
    launch_gemm<4>(p, x, w, tokens, num_experts, hidden, out, st);
  else
    launch_gemm<8>(p, x, w, tokens, num_experts, hidden, out, st);
}

void launch_select(const RouterDesc& d, const float* partials, int splits, int tokens, const float* bias,
                   float* logits, int32_t* ids, float* wts, cudaStream_t st) {
  constexpr int kWarps = kSelectThreads / 32;
  const unsigned blocks = unsigned((tokens + kWarps - 1) / kWarps);
  const size_t smem = size_t(kWarps) * select_scratch_floats(d.num_experts) * sizeof(float);
  if (d.num_experts <= 256)
    router_select_kernel<8><<<blocks, kSelectThreads, smem, st>>>(d, partials, splits, tokens, bias, logits, ids, wts);
  else
    router_select_kernel<32><<<blocks, kSelectThreads, smem, st>>>(d, partials, splits, tokens, bias, logits, ids, wts);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::router_detail
