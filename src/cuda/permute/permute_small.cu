// The fused small-batch permutation: ONE launch for count -> scan -> stable ranks -> maps
// -> gather, when T*R <= kPermuteFusedMaxPairs (decode). No memset, no scratch, no host sync.
//
// Every CTA rebuilds the whole (small) permutation in shared memory — it costs a few
// hundred shared-memory operations, less than a dependent launch — so no CTA waits for
// another: CTA 0 writes offsets, row_pair, pair_row and row_weight; CTA c gathers the rows
// of pairs p = c, c + grid, ... Ranks are exact and stable (by pair index inside an expert):
// per round of 256 pairs, __match_any_sync ranks a pair among the earlier lanes of its warp
// with the same expert, and a per-(warp, expert) count table, scanned over the 8 warps in
// warp order, ranks it among the earlier warps. Same results as the chunked path, bit for bit.
#include <algorithm>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/permute/permute_launch.hpp"
#include "cuda/permute/permute_pairs.cuh"

namespace fp4moe::cuda::permute_detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGatherCtas = 256;
static_assert(kPermuteFusedMaxPairs % kThreads == 0);

// Exclusive scan of v over the block (kThreads threads); returns the exclusive prefix,
// *total gets the block total.
__device__ __forceinline__ int block_exclusive_scan(int v, int* warp_sum, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += n;
  }
  if (lane == 31) warp_sum[warp] = inc;
  __syncthreads();
  int before = 0, all = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const int s = warp_sum[w];
    before += w < warp ? s : 0;
    all += s;
  }
  __syncthreads();  // warp_sum may be reused
  *total = all;
  return before + inc - v;
}

__global__ void __launch_bounds__(kThreads)
permute_small_kernel(PairSource src, int pairs, int num_all, int32_t* __restrict__ offsets,
                     int32_t* __restrict__ row_pair, int32_t* __restrict__ pair_row, float* __restrict__ row_weight,
                     const uint4* __restrict__ x, uint4* __restrict__ x_perm, int vecs_per_row) {
  extern __shared__ int smem[];
  int* base = smem;              // [num_all]: counts, then the next free row of each expert
  int* hist = smem + num_all;    // [kWarps, num_all]: per-round counts, then prefixes
  __shared__ int s_expert[kPermuteFusedMaxPairs];
  __shared__ int s_dest[kPermuteFusedMaxPairs];
  __shared__ int warp_sum[kWarps];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  for (int e = tid; e < num_all; e += kThreads) base[e] = 0;
  for (int i = tid; i < kWarps * num_all; i += kThreads) hist[i] = 0;
  __syncthreads();
  for (int p = tid; p < pairs; p += kThreads) {
    const int e = src.expert(p);
    s_expert[p] = e;
    if (e >= 0) atomicAdd(&base[e], 1);  // counts: order-independent
  }
  __syncthreads();

  // offsets = exclusive scan of the counts; each thread scans a run of consecutive experts.
  const int per = (num_all + kThreads - 1) / kThreads;
  const int e0 = min(tid * per, num_all), e1 = min(e0 + per, num_all);
  int run = 0;
  for (int e = e0; e < e1; ++e) run += base[e];
  int total = 0;
  int pre = block_exclusive_scan(run, warp_sum, &total);
  for (int e = e0; e < e1; ++e) {
    const int c = base[e];
    base[e] = pre;
    if (blockIdx.x == 0) offsets[e] = pre;
    pre += c;
  }
  if (blockIdx.x == 0 && tid == 0) offsets[num_all] = total;
  __syncthreads();

  // Stable ranks, kThreads pairs per round.
  const unsigned lt_mask = (1u << lane) - 1u;
  const unsigned gt_mask = lane == 31 ? 0u : (0xffffffffu << (lane + 1));
  for (int r0 = 0; r0 < pairs; r0 += kThreads) {
    const int p = r0 + tid;
    const int e = p < pairs ? s_expert[p] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int wrank = __popc(peers & lt_mask);
    const bool leader = (peers & gt_mask) == 0;  // highest lane of its group
    if (e >= 0 && leader) hist[warp * num_all + e] = __popc(peers);
    __syncthreads();
    for (int ee = tid; ee < num_all; ee += kThreads) {  // column scan over the warps, in order
      int next = base[ee];
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const int c = hist[w * num_all + ee];
        if (c) hist[w * num_all + ee] = next;
        next += c;
      }
      base[ee] = next;
    }
    __syncthreads();
    if (e >= 0) s_dest[p] = hist[warp * num_all + e] + wrank;
    __syncthreads();
    if (e >= 0 && leader) hist[warp * num_all + e] = 0;
    __syncwarp();
  }
  __syncthreads();

  if (blockIdx.x == 0)
    for (int p = tid; p < pairs; p += kThreads) {
      const int e = s_expert[p];
      if (e < 0) continue;
      const int dest = s_dest[p];
      row_pair[dest] = p;
      pair_row[p] = dest;
      row_weight[dest] = src.weight(p);
    }
  if (x == nullptr) return;
  for (int p = blockIdx.x; p < pairs; p += gridDim.x) {
    if (s_expert[p] < 0) continue;
    const uint4* from = x + int64_t(p / src.rows_per_token) * vecs_per_row;
    uint4* to = x_perm + int64_t(s_dest[p]) * vecs_per_row;
    for (int v = tid; v < vecs_per_row; v += kThreads) to[v] = from[v];
  }
}

}  // namespace

void launch_permute_small(const PermuteArgs& a, cudaStream_t stream) {
  const int R = a.top_k + a.extra_experts, pairs = a.tokens * R, num_all = a.num_experts + a.extra_experts;
  FP4MOE_CHECK(pairs >= 1 && pairs <= kPermuteFusedMaxPairs && num_all <= kMaxPermuteExperts,
               "permute: fused path called with {} pairs", pairs);
  const PairSource src{a.topk_ids, a.topk_weights, a.top_k, R, a.num_experts};
  const size_t smem = sizeof(int) * size_t(num_all) * (1 + kWarps);
  const int grid = a.x ? std::min(pairs, kMaxGatherCtas) : 1;
  permute_small_kernel<<<grid, kThreads, smem, stream>>>(
      src, pairs, num_all, a.expert_offsets, a.row_pair, a.pair_row, a.row_weight,
      reinterpret_cast<const uint4*>(a.x), reinterpret_cast<uint4*>(a.x_perm), a.hidden / 8);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::permute_detail
