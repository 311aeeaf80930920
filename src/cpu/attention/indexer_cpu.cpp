// DSA indexer scores and top-k over the paged index-key cache.
#include "cpu/attention/indexer_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/error.hpp"
#include "core/threads.hpp"
#include "cpu/attention/kv_cache_cpu.hpp"
#include "cpu/vec_avx2.hpp"

namespace fp4moe::cpu {
namespace {
constexpr int64_t kKeyBlock = 64;
}

void indexer_scores_cpu(const KvLayerView& L, const KvBatchView& b, const float* q, const float* w,
                        const IndexerParams& prm, float* scores, int64_t stride) {
  validate_kv_batch(b, L.page_size, L.num_pages);
  FP4MOE_CHECK(L.index_k && L.index_dim >= 1, "indexer_scores_cpu: the layer has no index_k array");
  FP4MOE_CHECK(prm.n_heads >= 1, "indexer_scores_cpu: {} heads", prm.n_heads);
  const int64_t T = b.num_tokens, H = prm.n_heads, D = L.index_dim;
  std::vector<int32_t> req(static_cast<size_t>(T));
  kv_token_requests(b, req.data());
  for (int64_t t = 0; t < T; ++t)
    FP4MOE_CHECK(b.positions[t] < stride, "indexer_scores_cpu: token {} at position {} needs a score row of {} > {}",
                 t, b.positions[t], b.positions[t] + 1, stride);
  const int threads = prm.threads > 0 ? prm.threads : default_num_threads();
  // Work items: (token, block of key positions).
  std::vector<int64_t> first(static_cast<size_t>(T + 1), 0);
  for (int64_t t = 0; t < T; ++t) first[size_t(t + 1)] = first[size_t(t)] + (b.positions[t] + kKeyBlock) / kKeyBlock;
  parallel_for(first[size_t(T)], threads, grain_for(kKeyBlock * H * D), [&](int64_t i0, int64_t i1) {
    std::vector<float> k(static_cast<size_t>(D));
    int64_t t = std::upper_bound(first.begin(), first.end(), i0) - first.begin() - 1;
    for (int64_t item = i0; item < i1; ++item) {
      while (item >= first[size_t(t + 1)]) ++t;
      const int64_t p = b.positions[t], r = req[size_t(t)];
      const int64_t j0 = (item - first[size_t(t)]) * kKeyBlock, j1 = std::min(p + 1, j0 + kKeyBlock);
      float* row = scores + t * stride;
      for (int64_t j = j0; j < j1; ++j) {
        kv_decode(L.index_elem, L.index_scale, L.index_k, kv_slot(b, L.page_size, r, j) * D, D, k.data());
        float acc = 0.0f;
        for (int64_t h = 0; h < H; ++h)
          acc += w[t * H + h] * std::max(0.0f, prm.softmax_scale * dot_f32(q + (t * H + h) * D, k.data(), D));
        row[j] = acc;
      }
      if (j1 == p + 1)
        std::fill(row + p + 1, row + stride, -std::numeric_limits<float>::infinity());
    }
  });
}

void indexer_topk_cpu(const KvBatchView& b, const float* scores, int64_t stride, int64_t k, int32_t* topk,
                      int threads) {
  FP4MOE_CHECK(k >= 1, "indexer_topk_cpu: k = {}", k);
  FP4MOE_CHECK(b.num_tokens == 0 || b.positions, "indexer_topk_cpu: no positions");
  for (int64_t t = 0; t < b.num_tokens; ++t)
    FP4MOE_CHECK(b.positions[t] >= 0 && b.positions[t] < stride,
                 "indexer_topk_cpu: token {} at position {} with score rows of {}", t, b.positions[t], stride);
  parallel_for(b.num_tokens, threads > 0 ? threads : default_num_threads(), 4, [&](int64_t t0, int64_t t1) {
    std::vector<int32_t> idx;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = int64_t(b.positions[t]) + 1;
      int32_t* out = topk + t * k;
      if (n <= k) {
        for (int64_t i = 0; i < k; ++i) out[i] = i < n ? int32_t(i) : -1;
        continue;
      }
      const float* s = scores + t * stride;
      idx.resize(size_t(n));
      std::iota(idx.begin(), idx.end(), 0);
      // Higher score first; equal: lower position first; NaN below every number.
      auto before = [s](int32_t a, int32_t c) {
        const bool na = std::isnan(s[a]), nc = std::isnan(s[c]);
        if (na != nc) return nc;
        if (!na && s[a] != s[c]) return s[a] > s[c];
        return a < c;
      };
      std::nth_element(idx.begin(), idx.begin() + (k - 1), idx.end(), before);
      std::sort(idx.begin(), idx.begin() + k);
      std::copy(idx.begin(), idx.begin() + k, out);
    }
  });
}

}  // namespace fp4moe::cpu
