// Device helpers over core/paged_kv.hpp's batch view (device pointers): the request of a flat
// token, and the cache slot of a request's position (power-of-two page sizes).
#pragma once

#include <cstdint>

namespace fp4moe::cuda::attention {

// r with qo_indptr[r] <= t < qo_indptr[r + 1] (binary search; qo_indptr non-decreasing).
__device__ __forceinline__ int request_of(const int32_t* qo_indptr, int num_requests, int t) {
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

}  // namespace fp4moe::cuda::attention
