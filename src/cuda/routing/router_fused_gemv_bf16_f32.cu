// Router, small T: logits = x · Wᵀ (x BF16, W FP32, FP32 FMAs) as a memory-bound GEMV, and
// the selection fused into the same launch.
//
// Grid (ceil(E / kEpc), ceil(T / kTb)); 256 threads. A CTA owns kEpc experts and kTb tokens
// over the whole hidden dim: thread i takes the 8-element chunks i, i + 256, ... of the row
// (two float4 of W per expert, one uint4 of x per token), kU chunks per batch so that all
// of a batch's W loads are in flight together; FMAs in FP32 into acc[kTb][kEpc]; then a
// warp shuffle tree and an 8-warp sum in smem (fixed order: deterministic). The CTA writes
// its kTb x kEpc logits, fences, and counts itself on the token block's counter; the last
// CTA of the block runs select_token_warp for its tokens (one warp per token) and resets
// the counter to 0, so the next launch (or graph replay) starts from 0 without a memset.
#include "cuda/routing/router_launch.hpp"
#include "cuda/routing/router_select_warp.cuh"

#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda::router_detail {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;

__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

// acc += Σ_i x[i] w[i] over one 8-element chunk, i ascending.
__device__ __forceinline__ float dot8(uint4 xv, float4 w0, float4 w1, float acc) {
  acc = fmaf(bf16_lo(xv.x), w0.x, acc);
  acc = fmaf(bf16_hi(xv.x), w0.y, acc);
  acc = fmaf(bf16_lo(xv.y), w0.z, acc);
  acc = fmaf(bf16_hi(xv.y), w0.w, acc);
  acc = fmaf(bf16_lo(xv.z), w1.x, acc);
  acc = fmaf(bf16_hi(xv.z), w1.y, acc);
  acc = fmaf(bf16_lo(xv.w), w1.z, acc);
  acc = fmaf(bf16_hi(xv.w), w1.w, acc);
  return acc;
}

template <int kTb, int kEpc, int kU, int kPerLane>
__global__ void __launch_bounds__(kThreads)
router_fused_gemv_kernel(RouterDesc d, const uint16_t* __restrict__ x, const float* __restrict__ w,
                         const float* __restrict__ bias, int T, int K, float* __restrict__ logits,
                         int32_t* __restrict__ ids, float* __restrict__ wts, unsigned* __restrict__ counters) {
  extern __shared__ float scratch[];           // [kWarps][select_scratch_floats(E)]
  __shared__ float red[kWarps][kTb * kEpc];    // per-warp sums
  __shared__ bool is_last;
  const int E = d.num_experts;
  const int e0 = int(blockIdx.x) * kEpc, t0 = int(blockIdx.y) * kTb;
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  const int nchunks = K / 8;

  float acc[kTb][kEpc];
#pragma unroll
  for (int t = 0; t < kTb; ++t)
#pragma unroll
    for (int e = 0; e < kEpc; ++e) acc[t][e] = 0.0f;

  for (int c0 = int(threadIdx.x); c0 < nchunks; c0 += kThreads * kU) {
    float4 wv[kU][kEpc][2];  // (kU chunks) x (kEpc experts) x 8 floats
    uint4 xv[kU][kTb];       // (kU chunks) x (kTb tokens) x 8 bf16
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = c0 + u * kThreads;
#pragma unroll
      for (int e = 0; e < kEpc; ++e) {
        const bool ok = c < nchunks && e0 + e < E;
        const float4* p = reinterpret_cast<const float4*>(w + int64_t(e0 + e) * K + int64_t(c) * 8);
        wv[u][e][0] = ok ? __ldg(p) : make_float4(0.f, 0.f, 0.f, 0.f);
        wv[u][e][1] = ok ? __ldg(p + 1) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int t = 0; t < kTb; ++t) {
        const bool ok = c < nchunks && t0 + t < T;
        xv[u][t] = ok ? __ldg(reinterpret_cast<const uint4*>(x + int64_t(t0 + t) * K + int64_t(c) * 8))
                      : make_uint4(0u, 0u, 0u, 0u);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int t = 0; t < kTb; ++t)
#pragma unroll
        for (int e = 0; e < kEpc; ++e) acc[t][e] = dot8(xv[u][t], wv[u][e][0], wv[u][e][1], acc[t][e]);
  }

#pragma unroll
  for (int t = 0; t < kTb; ++t)
#pragma unroll
    for (int e = 0; e < kEpc; ++e) {
      float v = acc[t][e];
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) red[warp][t * kEpc + e] = v;
    }
  __syncthreads();
  if (int(threadIdx.x) < kTb * kEpc) {
    const int t = int(threadIdx.x) / kEpc, e = int(threadIdx.x) % kEpc;
    if (t0 + t < T && e0 + e < E) {
      float s = red[0][threadIdx.x];
#pragma unroll
      for (int i = 1; i < kWarps; ++i) s += red[i][threadIdx.x];
      logits[int64_t(t0 + t) * E + e0 + e] = s;
    }
  }

  // The last CTA of this token block selects (threadFenceReduction pattern).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(&counters[blockIdx.y], 1u) == gridDim.x - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  const int nt = min(kTb, T - t0);
  float* my_scratch = scratch + warp * select_scratch_floats(E);
  for (int t = warp; t < nt; t += kWarps) {
    const float* lg = logits + int64_t(t0 + t) * E;
    select_token_warp<kPerLane>(
        d, [lg](int e) { return __ldcg(lg + e); }, bias, my_scratch, ids + int64_t(t0 + t) * d.top_k,
        wts + int64_t(t0 + t) * d.top_k);
  }
  if (threadIdx.x == 0) counters[blockIdx.y] = 0u;
}

// (tokens per CTA, experts per CTA, chunks per batch) by T; see README.md.
struct FusedShape {
  int tb, epc;
};
FusedShape fused_shape(int tokens) {
  if (tokens <= 1) return {1, 2};
  if (tokens <= 2) return {2, 2};
  if (tokens <= 4) return {4, 2};
  if (tokens <= 8) return {8, 2};
  return {8, 4};
}

template <int kTb, int kEpc, int kU, int kPerLane>
void launch(const RouterDesc& d, const uint16_t* x, const float* w, const float* bias, int T, int K,
            float* logits, int32_t* ids, float* wts, unsigned* counters, cudaStream_t st) {
  const dim3 grid(unsigned((d.num_experts + kEpc - 1) / kEpc), unsigned((T + kTb - 1) / kTb));
  const size_t smem = size_t(kWarps) * select_scratch_floats(d.num_experts) * sizeof(float);
  router_fused_gemv_kernel<kTb, kEpc, kU, kPerLane>
      <<<grid, kThreads, smem, st>>>(d, x, w, bias, T, K, logits, ids, wts, counters);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

template <int kPerLane>
void launch_by_shape(const RouterDesc& d, const uint16_t* x, const float* w, const float* bias, int T, int K,
                     float* logits, int32_t* ids, float* wts, unsigned* counters, cudaStream_t st) {
  const FusedShape s = fused_shape(T);
  if (s.tb == 1) return launch<1, 2, 3, kPerLane>(d, x, w, bias, T, K, logits, ids, wts, counters, st);
  if (s.tb == 2) return launch<2, 2, 3, kPerLane>(d, x, w, bias, T, K, logits, ids, wts, counters, st);
  if (s.tb == 4) return launch<4, 2, 2, kPerLane>(d, x, w, bias, T, K, logits, ids, wts, counters, st);
  if (s.epc == 2) return launch<8, 2, 2, kPerLane>(d, x, w, bias, T, K, logits, ids, wts, counters, st);
  return launch<8, 4, 1, kPerLane>(d, x, w, bias, T, K, logits, ids, wts, counters, st);
}

}  // namespace

int fused_token_blocks(int tokens) {
  const int tb = fused_shape(tokens).tb;
  return (tokens + tb - 1) / tb;
}

void launch_fused_gemv(const RouterDesc& d, const uint16_t* x, const float* w, const float* bias, int tokens,
                       int hidden, float* logits, int32_t* ids, float* wts, unsigned* counters, cudaStream_t st) {
  if (d.num_experts <= 256)
    launch_by_shape<8>(d, x, w, bias, tokens, hidden, logits, ids, wts, counters, st);
  else
    launch_by_shape<32>(d, x, w, bias, tokens, hidden, logits, ids, wts, counters, st);
}

}  // namespace fp4moe::cuda::router_detail
