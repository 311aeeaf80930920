// The previous three-step router, kept as the router benchmark's baseline and for tests (the
// layer calls route(), router_route.cu): bf16 -> f32 conversion, the FP32 logits GEMM (cuBLAS
// SGEMM) and the score + grouped top-k + top-k + weights kernel (one CTA per token).
#include "cuda/routing/router.hpp"

#include <cmath>

#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda {

namespace {

constexpr int kRouteThreads = 256;

__global__ void bf16_to_f32_kernel(const uint16_t* __restrict__ in, float* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __uint_as_float(uint32_t(in[i]) << 16);
}

__device__ float block_reduce(float v, bool is_max, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  __syncthreads();  // red may still be read by a previous reduction
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float r = red[0];
    for (int w = 1; w < int(blockDim.x >> 5); ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
    red[32] = r;
  }
  __syncthreads();
  return red[32];
}

// "a before b" in the selection order: higher value first, equal -> lower index first.
__device__ __forceinline__ bool ranks_before(float va, int a, float vb, int b) {
  return va > vb || (va == vb && a < b);
}

// One CTA per token. Shared: score[E] (unbiased), sel[E] (biased; -inf when its group
// is not eligible).
__global__ void __launch_bounds__(kRouteThreads)
route_topk_kernel(RouterDesc d, const float* __restrict__ logits, const float* __restrict__ bias,
                  int32_t* __restrict__ topk_ids, float* __restrict__ topk_weights) {
  extern __shared__ float smem[];
  float* score = smem;                 // [E]
  float* sel = smem + d.num_experts;   // [E]
  __shared__ float red[33];
  __shared__ float group_score[kMaxRouterGroups];
  __shared__ int group_ok[kMaxRouterGroups];
  __shared__ int slot_id[kMaxRouterTopK];

  const int E = d.num_experts;
  const int64_t t = blockIdx.x;
  const float* lg = logits + t * E;

  if (d.scoring == ScoringFunc::Softmax) {
    float mx = -INFINITY;
    for (int e = threadIdx.x; e < E; e += blockDim.x) mx = fmaxf(mx, lg[e]);
    mx = block_reduce(mx, true, red);
    float sum = 0.f;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      const float v = expf(lg[e] - mx);
      score[e] = v;
      sum += v;
    }
    sum = block_reduce(sum, false, red);
    for (int e = threadIdx.x; e < E; e += blockDim.x) score[e] = score[e] / sum;
  } else {
    for (int e = threadIdx.x; e < E; e += blockDim.x) score[e] = 1.0f / (1.0f + expf(-lg[e]));
  }
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const float v = score[e] + (bias ? bias[e] : 0.0f);
    sel[e] = isnan(v) ? -INFINITY : v;  // NaN never wins (as route_cpu)
  }
  // Non-finite logits leave slots unranked: keep every id in range whatever happens.
  for (int s = threadIdx.x; s < d.top_k; s += blockDim.x) slot_id[s] = 0;
  __syncthreads();

  // Grouped top-k: a group's score is the sum of its best two biased scores.
  const int G = E / d.n_group;
  if (d.n_group > 1) {
    for (int g = threadIdx.x; g < d.n_group; g += blockDim.x) {
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int i = 0; i < G; ++i) {
        const float v = sel[g * G + i];
        if (v > b1) { b2 = b1; b1 = v; } else if (v > b2) { b2 = v; }
      }
      const float gs = G >= 2 ? b1 + b2 : b1;
      group_score[g] = isnan(gs) ? -INFINITY : gs;
    }
    __syncthreads();
    for (int g = threadIdx.x; g < d.n_group; g += blockDim.x) {
      int rank = 0;
      for (int h = 0; h < d.n_group; ++h) rank += ranks_before(group_score[h], h, group_score[g], g);
      group_ok[g] = rank < d.topk_group;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
      if (!group_ok[e / G]) sel[e] = -INFINITY;
    __syncthreads();
  }

  // Top-k by rank: an eligible expert's slot is the number of eligible experts before it.
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const float v = sel[e];
    if (d.n_group > 1 && !group_ok[e / G]) continue;
    int rank = 0;
    for (int f = 0; f < E && rank < d.top_k; ++f) {
      if (d.n_group > 1 && !group_ok[f / G]) continue;
      rank += ranks_before(sel[f], f, v, e);
    }
    if (rank < d.top_k) slot_id[rank] = e;
  }
  __syncthreads();

  if (threadIdx.x == 0) {
    float sum = 0.f;
    for (int s = 0; s < d.top_k; ++s) sum += score[slot_id[s]];
    const float mul = d.norm_topk_prob ? d.routed_scaling / (sum + 1e-20f) : d.routed_scaling;
    for (int s = 0; s < d.top_k; ++s) {
      topk_ids[t * d.top_k + s] = slot_id[s];
      topk_weights[t * d.top_k + s] = score[slot_id[s]] * mul;
    }
  }
}

}  // namespace

void bf16_to_f32(const uint16_t* in, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 132 * 16);
  bf16_to_f32_kernel<<<unsigned(blocks), threads, 0, stream>>>(in, out, n);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void router_logits_f32(cublasHandle_t handle, const float* x, const float* w, float* logits,
                       int tokens, int hidden, int num_experts, cudaStream_t stream) {
  if (tokens <= 0) return;
  // Column-major view: logitsᵀ [E, T] = (w [E, H] row-major = [H, E] col-major)ᵀ · xᵀ [H, T].
  const float one = 1.0f, zero = 0.0f;
  FP4MOE_CUBLAS_CHECK(cublasSetStream(handle, stream));
  FP4MOE_CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, num_experts, tokens, hidden, &one, w,
                                  hidden, x, hidden, &zero, logits, num_experts));
}

void route_topk(const RouterDesc& d, const float* logits, const float* bias, int tokens,
                int32_t* topk_ids, float* topk_weights, cudaStream_t stream) {
  check_router_desc(d);
  if (tokens <= 0) return;
  const size_t smem = size_t(2) * d.num_experts * sizeof(float);
  route_topk_kernel<<<unsigned(tokens), kRouteThreads, smem, stream>>>(d, logits, bias, topk_ids, topk_weights);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda
