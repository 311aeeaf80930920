// A host paged KV pool with random page tables, for the CPU attention op tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "core/paged_kv.hpp"

namespace fp4moe::test {

// R requests with their own lengths; each request's new tokens are its last `new_tokens[r]`
// positions (a prefill chunk, or one decode token). Pages are handed out in a shuffled order
// so that no request's pages are contiguous.
struct PagedBatch {
  int64_t page_size = 1, num_pages = 0;
  std::vector<int32_t> qo_indptr, positions, kv_len, page_indptr, page_indices;
  std::vector<uint8_t> ckv, kpe, index_k;
  KvLayerView layer;

  PagedBatch(const std::vector<int32_t>& lens, const std::vector<int32_t>& new_tokens, int64_t page_size_,
             int64_t ckv_dim, int64_t kpe_dim, int64_t index_dim, KvElem elem, KvElem index_elem, uint32_t seed)
      : page_size(page_size_) {
    std::mt19937 rng(seed);
    int64_t pages = 0;
    for (int32_t l : lens) pages += (l + page_size - 1) / page_size;
    num_pages = pages + 3;  // a few spare pages never referenced
    std::vector<int32_t> perm(static_cast<size_t>(num_pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    qo_indptr = {0};
    page_indptr = {0};
    size_t next = 0;
    for (size_t r = 0; r < lens.size(); ++r) {
      kv_len.push_back(lens[r]);
      for (int32_t p = lens[r] - new_tokens[r]; p < lens[r]; ++p) positions.push_back(p);
      qo_indptr.push_back(int32_t(positions.size()));
      for (int64_t i = 0; i < (lens[r] + page_size - 1) / page_size; ++i) page_indices.push_back(perm[next++]);
      page_indptr.push_back(int32_t(page_indices.size()));
    }
    ckv.assign(size_t(num_pages * page_size * ckv_dim) * kv_elem_size(elem), 0xEE);  // poison
    kpe.assign(size_t(num_pages * page_size * kpe_dim) * kv_elem_size(elem), 0xEE);
    if (index_dim) index_k.assign(size_t(num_pages * page_size * index_dim) * kv_elem_size(index_elem), 0xEE);
    layer.ckv = ckv.data();
    layer.kpe = kpe.data();
    layer.index_k = index_dim ? index_k.data() : nullptr;
    layer.num_pages = num_pages;
    layer.page_size = page_size;
    layer.ckv_dim = ckv_dim;
    layer.kpe_dim = kpe_dim;
    layer.index_dim = index_dim;
    layer.elem = elem;
    layer.index_elem = index_elem;
  }

  // The batch of this step's tokens.
  KvBatchView batch() const {
    return {int64_t(kv_len.size()), int64_t(positions.size()), qo_indptr.data(), positions.data(),
            kv_len.data(), page_indptr.data(), page_indices.data()};
  }
  // A batch holding every position of every request (to fill the whole cache in one append).
  struct Full {
    std::vector<int32_t> qo, pos;
  };
  Full full_positions() const {
    Full f;
    f.qo = {0};
    for (int32_t l : kv_len) {
      for (int32_t p = 0; p < l; ++p) f.pos.push_back(p);
      f.qo.push_back(int32_t(f.pos.size()));
    }
    return f;
  }
  KvBatchView full_batch(const Full& f) const {
    return {int64_t(kv_len.size()), int64_t(f.pos.size()), f.qo.data(), f.pos.data(),
            kv_len.data(), page_indptr.data(), page_indices.data()};
  }
};

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace fp4moe::test
