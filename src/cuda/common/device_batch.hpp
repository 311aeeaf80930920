// One step's batch on the device as the runner's small kernels read it: core/paged_kv.hpp's
// KvBatchView (device pointers, int32 sizes) plus the request of every flat token
// (token_req[t] = r with qo_indptr[r] <= t < qo_indptr[r+1]) and the cache's page size.
// Plain data: host code fills it, kernels take it by value.
#pragma once

#include <cstdint>

namespace fp4moe::cuda {

struct DeviceBatch {
  int32_t tokens = 0, requests = 0;
  const int32_t* qo_indptr = nullptr;     // [R + 1]
  const int32_t* positions = nullptr;     // [T]
  const int32_t* kv_len = nullptr;        // [R]
  const int32_t* page_indptr = nullptr;   // [R + 1]
  const int32_t* page_indices = nullptr;  // [..]
  const int32_t* token_req = nullptr;     // [T]
  int32_t page_size = 0;
};

}  // namespace fp4moe::cuda
