// Top-k of each indexer row by radix select: one CTA of 1024 threads per row. Scores map to an
// order-preserving uint32 key; three histogram passes (11 + 11 + 10 bits) narrow the k-th key
// down to its exact value T (stopping early once a bin holds exactly what is still needed),
// then one gather pass in position order takes every key above T and the first `need` keys
// equal to T (the lower position wins ties), writing positions ascending. Rows whose context
// is <= k take all positions. Compiled for every arch in CMAKE_CUDA_ARCHITECTURES.
#include <cub/block/block_scan.cuh>

#include <string>

#include "cuda/attention/kv_device.cuh"
#include "cuda/common/cuda_check.hpp"
#include "cuda/indexer/indexer.hpp"
#include "core/error.hpp"

namespace fp4moe::cuda::indexer {
namespace {

constexpr int kThreads = 1024;
constexpr int kBins = 2048;  // 11 bits

// Larger float -> larger key (-0 < +0); NaN -> 0, below every number (cpu/attention's rule).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct TopKParams {
  const float* scores;
  int64_t score_stride;
  const int32_t* qo_indptr;
  const int32_t* positions;
  const int32_t* page_indptr;
  const int32_t* page_indices;
  int num_requests;
  int top_k;
  int32_t* out_pos;
  int32_t* out_slot;
  int page_shift;
};

__device__ __forceinline__ void emit(const TopKParams& p, const int32_t* pages, int row, int n, int pos) {
  p.out_pos[int64_t(row) * p.top_k + n] = pos;
  if (p.out_slot) p.out_slot[int64_t(row) * p.top_k + n] = pos < 0 ? -1 : int32_t(attention::slot_of(pages, p.page_shift, pos));
}

__global__ void __launch_bounds__(kThreads) topk_radix_kernel(const TopKParams p) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int hist[kBins];
  __shared__ uint32_t s_prefix, s_mask;
  __shared__ int s_need, s_done;

  const int row = blockIdx.x;  // flat token
  const int ctx = p.positions[row] + 1;
  const int32_t* pages =
      p.out_slot ? p.page_indices + p.page_indptr[attention::request_of(p.qo_indptr, p.num_requests, row)] : nullptr;
  const int k = p.top_k;
  const int tid = threadIdx.x;
  const float* s = p.scores + int64_t(row) * p.score_stride;

  if (ctx <= k) {  // dense: every position, then -1 padding
    for (int i = tid; i < k; i += kThreads) emit(p, pages, row, i, i < ctx ? i : -1);
    return;
  }

  if (tid == 0) {
    s_prefix = 0;
    s_mask = 0;
    s_need = k;
    s_done = 0;
  }
  constexpr int kShift[3] = {21, 10, 0};
  constexpr int kBits[3] = {11, 11, 10};
#pragma unroll 1
  for (int pass = 0; pass < 3; ++pass) {
    for (int b = tid; b < kBins; b += kThreads) hist[b] = 0;
    __syncthreads();
    if (s_done) break;
    const uint32_t prefix = s_prefix, mask = s_mask;
    const int shift = kShift[pass];
    const uint32_t digit_mask = (1u << kBits[pass]) - 1;
    // Warp-aggregated: lanes with the same digit add once (scores crowd a few top-bit bins).
    for (int base = 0; base < ctx; base += kThreads) {
      const int i = base + tid;
      int digit = -1;
      if (i < ctx) {
        const uint32_t key = order_key(s[i]);
        if ((key & mask) == prefix) digit = int((key >> shift) & digit_mask);
      }
      const unsigned peers = __match_any_sync(0xffffffffu, digit);
      if (digit >= 0 && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[digit], __popc(peers));
    }
    __syncthreads();
    // Counts from the top bin down: thread t owns bins (2047 - 2t) and (2046 - 2t).
    const int hi = kBins - 1 - 2 * tid;
    const int c0 = hist[hi], c1 = hist[hi - 1];
    int above = 0;
    Scan(scan_tmp).ExclusiveSum(c0 + c1, above);  // keys in bins above `hi`
    const int need = s_need;
    int bin = -1, above_bin = 0;
    if (above < need && above + c0 >= need) bin = hi, above_bin = above;
    else if (above + c0 < need && above + c0 + c1 >= need) bin = hi - 1, above_bin = above + c0;
    __syncthreads();  // everyone has read s_need
    if (bin >= 0) {
      s_prefix = prefix | (uint32_t(bin) << shift);
      s_mask = mask | (digit_mask << shift);
      s_need = need - above_bin;
      s_done = (hist[bin] == need - above_bin);  // the whole bin is taken: no tie to resolve
    }
    __syncthreads();
  }

  // Gather in position order: keys whose masked value is above the prefix, then the first
  // `need` ones equal to it.
  const uint32_t prefix = s_prefix, mask = s_mask;
  const int need = s_need;
  int taken_eq = 0, written = 0;  // running totals (uniform across the block)
  for (int base = 0; base < ctx; base += kThreads) {
    const int i = base + tid;
    int gt = 0, eq = 0;
    if (i < ctx) {
      const uint32_t key = order_key(s[i]) & mask;
      gt = key > prefix;
      eq = key == prefix;
    }
    int eq_rank = 0, eq_total = 0;
    Scan(scan_tmp).ExclusiveSum(eq, eq_rank, eq_total);
    __syncthreads();
    const int take = gt | (eq && taken_eq + eq_rank < need);
    int out_rank = 0, out_total = 0;
    Scan(scan_tmp).ExclusiveSum(take, out_rank, out_total);
    __syncthreads();
    if (take) emit(p, pages, row, written + out_rank, i);
    taken_eq += eq_total;
    written += out_total;
  }
}

}  // namespace

void top_k(const TopKArgs& a, cudaStream_t stream) {
  const KvBatchView& b = a.batch;
  FP4MOE_CHECK(a.scores && a.out_pos && b.qo_indptr && b.positions, "{}", "indexer top-k: a required pointer is null");
  FP4MOE_CHECK(a.top_k >= 1 && a.top_k <= kMaxTopK, "{}",
          "indexer top-k: k = " + std::to_string(a.top_k) + " outside [1, " + std::to_string(kMaxTopK) + "]");
  FP4MOE_CHECK(!a.out_slot || (b.page_indptr && b.page_indices), "{}", "indexer top-k: slots need the page table");
  FP4MOE_CHECK(!a.out_slot || attention::log2_exact(a.page_size) >= 0, "{}",
          "indexer top-k: page_size " + std::to_string(a.page_size) + " must be a power of two");
  FP4MOE_CHECK(b.num_tokens >= 0 && b.num_tokens < (int64_t(1) << 31) && b.num_requests >= 1, "{}",
          "indexer top-k: bad token / request count");
  if (b.num_tokens == 0) return;
  TopKParams p{a.scores,  a.score_stride, b.qo_indptr, b.positions, b.page_indptr, b.page_indices, int(b.num_requests),
               a.top_k,   a.out_pos,      a.out_slot,  a.out_slot ? attention::log2_exact(a.page_size) : 0};
  topk_radix_kernel<<<unsigned(b.num_tokens), kThreads, 0, stream>>>(p);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::indexer
