// A step's new tokens over several requests, for the cache-write tests (index_key_prep's and
// kv_latent_prep's, on the emulator and the GPU): requests of new_tokens[i] tokens at the end of
// ctx[i] positions each, their pages shuffled over a pool with 3 pages no request owns, and the
// GLM-5-like RoPE both kernels apply (64 dims, attention factor 1.25).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/paged_kv.hpp"
#include "model/model_config.hpp"

namespace fp4moe::test {

struct NewTokensBatch {
  int64_t page_size = 16, num_pages = 0;
  std::vector<int32_t> qo_indptr, positions, kv_len, page_indptr, page_indices;
  model::RopeSpec rope;
  int64_t tokens() const { return int64_t(positions.size()); }
  KvBatchView batch() const {
    return {int64_t(kv_len.size()), tokens(), qo_indptr.data(), positions.data(), kv_len.data(), page_indptr.data(),
            page_indices.data()};
  }
  int64_t slot(int64_t t) const {
    const int64_t r = std::upper_bound(qo_indptr.begin(), qo_indptr.end(), int32_t(t)) - qo_indptr.begin() - 1;
    return kv_slot(batch(), page_size, r, positions[size_t(t)]);
  }
};

inline void fill_new_tokens_batch(NewTokensBatch& c, const std::vector<int>& ctx, const std::vector<int>& new_tokens,
                                  int rope_dim, std::mt19937_64& g) {
  c.rope.dim = rope_dim;
  c.rope.attention_factor = 1.25f;
  for (int i = 0; i < rope_dim / 2; ++i) c.rope.inv_freq.push_back(float(1.0 / std::pow(10000.0, 2.0 * i / rope_dim)));
  c.qo_indptr = {0};
  c.page_indptr = {0};
  int64_t pages = 0;
  for (size_t r = 0; r < ctx.size(); ++r) pages += (ctx[r] + c.page_size - 1) / c.page_size;
  std::vector<int32_t> pool(size_t(pages + 3));  // 3 pages no request owns
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = int32_t(i);
  std::shuffle(pool.begin(), pool.end(), g);
  size_t next = 0;
  for (size_t r = 0; r < ctx.size(); ++r) {
    for (int p = ctx[r] - new_tokens[r]; p < ctx[r]; ++p) c.positions.push_back(p);
    c.qo_indptr.push_back(int32_t(c.positions.size()));
    c.kv_len.push_back(ctx[r]);
    for (int64_t i = 0; i < (ctx[r] + c.page_size - 1) / c.page_size; ++i) c.page_indices.push_back(pool[next++]);
    c.page_indptr.push_back(int32_t(c.page_indices.size()));
  }
  c.num_pages = int64_t(pool.size());
}

}  // namespace fp4moe::test
