// Device helpers over core/paged_kv.hpp's batch view (device pointers): the request of a flat
// token, the cache slot of a request's position (power-of-two page sizes), and the slot each new
// token of a step is written to (the cache writes: kv_append, cuda/indexer's index_key_prep).
#pragma once

#include <cstdint>

#include "core/paged_kv.hpp"
#include "cuda/attention/kv_dims.hpp"

namespace fp4moe::cuda::attention {

// r with qo_indptr[r] <= t < qo_indptr[r + 1] (qo_indptr non-decreasing; empty requests are
// skipped). A decode row (request t owns exactly token t) costs two independent loads; any other
// token a binary search, log2(num_requests) dependent loads, the latency chain in front of a
// small-batch kernel's first key.
__device__ __forceinline__ int request_of(const int32_t* qo_indptr, int num_requests, int t) {
  if (t < num_requests && qo_indptr[t] == t && qo_indptr[t + 1] == t + 1) return t;
  int lo = 0, hi = num_requests - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (qo_indptr[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Slot of position pos in a request whose page table starts at `pages`.
__device__ __forceinline__ int64_t slot_of(const int32_t* pages, int page_shift, int pos) {
  return (int64_t(pages[pos >> page_shift]) << page_shift) + (pos & ((1 << page_shift) - 1));
}

// Where a step's new tokens go in one layer's pool: the batch's device arrays, the page shift and
// the pool's size (kv_token_slots fills it on the host).
struct KvTokenSlots {
  const int32_t* qo_indptr;
  const int32_t* positions;
  const int32_t* page_indptr;
  const int32_t* page_indices;
  int num_requests;
  int tokens;
  int page_shift;
  int64_t num_slots;
};
inline KvTokenSlots kv_token_slots(const KvLayerView& L, const KvBatchView& b) {
  return {b.qo_indptr,         b.positions,   b.page_indptr, b.page_indices, int(b.num_requests), int(b.num_tokens),
          log2_exact(L.page_size), L.num_pages * L.page_size};
}
// The slot of flat token t, or -1 when it lies outside the pool (never to be written).
__device__ __forceinline__ int64_t token_slot(const KvTokenSlots& m, int t) {
  const int r = request_of(m.qo_indptr, m.num_requests, t);
  const int64_t slot = slot_of(m.page_indices + m.page_indptr[r], m.page_shift, m.positions[t]);
  return slot >= 0 && slot < m.num_slots ? slot : -1;
}

}  // namespace fp4moe::cuda::attention
