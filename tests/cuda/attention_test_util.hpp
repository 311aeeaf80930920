// Helpers shared by the GPU attention / indexer / KV-append tests: the CUDA-free ones
// (attention_case.hpp: random paged batches, error measures) and device copies of the batch
// view and the cache.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "cuda/attention_case.hpp"
#include "cuda/moe_test_util.hpp"

namespace fp4moe::test {

// The MLA kernels (FlashInfer's SM90 ones) need an sm_90 GPU.
inline bool sm90_available() {
  if (!cuda::device_available()) return false;
  int dev = 0, major = 0;
  FP4MOE_CUDA_CHECK(cudaGetDevice(&dev));
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major == 9;
}
#define FP4MOE_SKIP_WITHOUT_SM90()                                           \
  do {                                                                       \
    if (!::fp4moe::test::sm90_available()) GTEST_SKIP() << "needs an sm_90 GPU"; \
  } while (0)

// Device copies of a case's batch view (and its cache arrays).
struct DeviceBatch {
  DeviceArray<int32_t> qo_indptr, positions, kv_len, page_indptr, page_indices;
  int64_t requests, tokens;
  explicit DeviceBatch(const PagedCase& c)
      : qo_indptr(c.qo_indptr), positions(c.positions), kv_len(c.kv_len), page_indptr(c.page_indptr),
        page_indices(c.page_indices), requests(int64_t(c.kv_len.size())), tokens(c.tokens()) {}
  KvBatchView view() const {
    return {requests, tokens, qo_indptr.ptr, positions.ptr, kv_len.ptr, page_indptr.ptr, page_indices.ptr};
  }
};

struct DeviceCache {
  DeviceArray<uint8_t> ckv, kpe, index_k;
  KvLayerView L;
  explicit DeviceCache(PagedCase& c) : ckv(c.ckv), kpe(c.kpe), index_k(c.index_k), L(c.layer()) {
    L.ckv = ckv.ptr;
    L.kpe = kpe.ptr;
    L.index_k = index_k.ptr;
  }
};

}  // namespace fp4moe::test
