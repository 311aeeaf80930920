// Permutation: the dispatch between the fused small path (permute_small.cu) and the chunked
// large path here (per-expert counts -> one-CTA scan -> stable ranks, scatter of the maps),
// the row gather. The combine is in combine.cu. See permute.hpp for the order contract.
#include "cuda/permute/permute.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/permute/permute_launch.hpp"
#include "cuda/permute/permute_pairs.cuh"

namespace fp4moe::cuda {

namespace {

constexpr int kRankThreads = 256;
constexpr int kScanThreads = 1024;
static_assert(kPermuteChunk % kRankThreads == 0);

int num_chunks(int64_t pairs) { return int((pairs + kPermuteChunk - 1) / kPermuteChunk); }

// counts[c, e] = number of pairs of chunk c routed to expert e.
__global__ void __launch_bounds__(kRankThreads)
chunk_count_kernel(PairSource src, int pairs, int E, int32_t* __restrict__ counts) {
  extern __shared__ int cnt[];  // [E]
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  const int begin = blockIdx.x * kPermuteChunk, end = min(begin + kPermuteChunk, pairs);
  for (int p = begin + threadIdx.x; p < end; p += blockDim.x) {
    const int e = src.expert(p);
    if (e >= 0) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[int64_t(blockIdx.x) * E + e] = cnt[e];
}

// One CTA: base[c, e] = offsets[e] + sum_{c' < c} counts[c', e]; offsets = exclusive scan
// of the per-expert totals; offsets[E] = pairs.
__global__ void __launch_bounds__(kScanThreads)
scan_kernel(const int32_t* __restrict__ counts, int chunks, int E, int32_t* __restrict__ base,
            int32_t* __restrict__ offsets) {
  __shared__ int warp_sum[kScanThreads / 32];
  const int e = threadIdx.x, lane = e & 31, warp = e >> 5;
  int total = 0;
  if (e < E)
    for (int c = 0; c < chunks; ++c) {
      base[int64_t(c) * E + e] = total;
      total += counts[int64_t(c) * E + e];
    }
  // Block-wide inclusive scan of total.
  int v = total;
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  if (lane == 31) warp_sum[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int w = warp_sum[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += n;
    }
    warp_sum[lane] = w;
  }
  __syncthreads();
  const int inclusive = v + (warp > 0 ? warp_sum[warp - 1] : 0);
  const int exclusive = inclusive - total;
  if (e < E) {
    offsets[e] = exclusive;
    if (e == E - 1) offsets[E] = inclusive;
    for (int c = 0; c < chunks; ++c) base[int64_t(c) * E + e] += exclusive;
  }
}

// Stable rank of every pair inside its expert; writes both maps and the row weights.
__global__ void __launch_bounds__(kRankThreads)
rank_scatter_kernel(PairSource src, int pairs, int E,
                    const int32_t* __restrict__ base, int32_t* __restrict__ row_pair,
                    int32_t* __restrict__ pair_row, float* __restrict__ row_weight) {
  extern __shared__ int running[];  // [E]: next free row of expert e
  __shared__ int s_ids[kRankThreads];
  for (int e = threadIdx.x; e < E; e += blockDim.x) running[e] = base[int64_t(blockIdx.x) * E + e];
  __syncthreads();
  const int tid = threadIdx.x;
  for (int round = 0; round < kPermuteChunk / kRankThreads; ++round) {
    const int p = blockIdx.x * kPermuteChunk + round * kRankThreads + tid;
    const int e = p < pairs ? src.expert(p) : -1;
    s_ids[tid] = e;
    __syncthreads();
    int rank = 0;
    bool last = true;
    if (e >= 0)
      for (int j = 0; j < kRankThreads; ++j) {
        const bool same = s_ids[j] == e;
        rank += same && j < tid;
        last = last && !(same && j > tid);
      }
    const int dest = e >= 0 ? running[e] + rank : -1;
    __syncthreads();  // every read of running[] is done
    if (e >= 0) {
      row_pair[dest] = p;
      pair_row[p] = dest;
      row_weight[dest] = src.weight(p);
      if (last) running[e] = dest + 1;
    }
    __syncthreads();
  }
}

__global__ void gather_rows_kernel(const uint4* __restrict__ x, const int32_t* __restrict__ row_pair,
                                   int rows_per_token, int vecs_per_row, uint4* __restrict__ x_perm) {
  const int64_t r = blockIdx.x;
  const int64_t t = row_pair[r] / rows_per_token;
  const uint4* src = x + t * vecs_per_row;
  uint4* dst = x_perm + r * vecs_per_row;
  for (int v = threadIdx.x; v < vecs_per_row; v += blockDim.x) dst[v] = src[v];
}

__global__ void fill_zero_kernel(int32_t* p, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) p[i] = 0;
}

__global__ void fill_offsets_kernel(int32_t* offsets, int rows) {
  offsets[0] = 0;
  offsets[1] = rows;
}

}  // namespace

size_t permute_scratch_bytes(int64_t max_pairs, int num_experts) {
  return size_t(2) * size_t(num_chunks(std::max<int64_t>(max_pairs, 1))) * size_t(num_experts) * sizeof(int32_t);
}

void build_permutation(const PermuteArgs& a, cudaStream_t stream) {
  FP4MOE_CHECK(a.extra_experts >= 0 && a.extra_experts <= kMaxPermuteExtraExperts,
               "permute: {} extra experts; supported 0..{}", a.extra_experts, kMaxPermuteExtraExperts);
  const int64_t all64 = int64_t(a.num_experts) + a.extra_experts;
  FP4MOE_CHECK(a.num_experts >= 1 && all64 <= kMaxPermuteExperts, "permute: {} + {} experts; supported 1..{} in all",
               a.num_experts, a.extra_experts, kMaxPermuteExperts);
  FP4MOE_CHECK(a.tokens >= 0 && a.top_k >= 0, "permute: negative tokens or top_k");
  const int R = a.top_k + a.extra_experts;
  const int64_t pairs64 = int64_t(a.tokens) * R;
  FP4MOE_CHECK(pairs64 < (int64_t(1) << 31), "permute: {} pairs overflow int32", pairs64);
  FP4MOE_CHECK(!a.x || (a.x_perm && a.hidden > 0 && a.hidden % 8 == 0),
               "permute: fused gather needs x_perm and hidden % 8 == 0 (hidden = {})", a.hidden);
  const int pairs = int(pairs64), E = int(all64);
  if (pairs == 0) {
    fill_zero_kernel<<<1, 256, 0, stream>>>(a.expert_offsets, E + 1);
    FP4MOE_CUDA_CHECK_LAUNCH();
    return;
  }
  if (pairs <= kPermuteFusedMaxPairs) {
    permute_detail::launch_permute_small(a, stream);
    return;
  }
  const PairSource src{a.topk_ids, a.topk_weights, a.top_k, R, a.num_experts};
  const int chunks = num_chunks(pairs);
  int32_t* counts = static_cast<int32_t*>(a.scratch);  // [chunks, E]
  int32_t* base = counts + int64_t(chunks) * E;        // [chunks, E]
  const size_t smem = sizeof(int) * E;
  chunk_count_kernel<<<chunks, kRankThreads, smem, stream>>>(src, pairs, E, counts);
  FP4MOE_CUDA_CHECK_LAUNCH();
  scan_kernel<<<1, kScanThreads, 0, stream>>>(counts, chunks, E, base, a.expert_offsets);
  FP4MOE_CUDA_CHECK_LAUNCH();
  rank_scatter_kernel<<<chunks, kRankThreads, smem, stream>>>(src, pairs, E, base, a.row_pair, a.pair_row,
                                                              a.row_weight);
  FP4MOE_CUDA_CHECK_LAUNCH();
  if (a.x) gather_rows_bf16(a.x, a.row_pair, pairs, R, a.hidden, a.x_perm, stream);
}

void gather_rows_bf16(const uint16_t* x, const int32_t* row_pair, int rows, int rows_per_token, int hidden,
                      uint16_t* x_perm, cudaStream_t stream) {
  FP4MOE_CHECK(hidden % 8 == 0, "gather: hidden = {} is not a multiple of 8", hidden);
  if (rows <= 0) return;
  const int vecs = hidden / 8;
  const int threads = std::min(256, (vecs + 31) / 32 * 32);
  gather_rows_kernel<<<unsigned(rows), threads, 0, stream>>>(reinterpret_cast<const uint4*>(x), row_pair,
                                                             rows_per_token, vecs, reinterpret_cast<uint4*>(x_perm));
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void fill_single_expert_offsets(int32_t* offsets, int rows, cudaStream_t stream) {
  fill_offsets_kernel<<<1, 1, 0, stream>>>(offsets, rows);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda
