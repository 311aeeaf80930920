#include "backend/decode_rows.hpp"

#include "core/error.hpp"

namespace fp4moe::engine {

KvBatchView DecodeRows::view(const KvBatchView& b) const {
  const int64_t T = b.num_tokens;
  return KvBatchView{T, T, qo.data(), b.positions, kv_len.data(), page_indptr.data(), pages.data()};
}

DecodeRows decode_rows(const KvBatchView& b, int64_t page_size) {
  FP4MOE_CHECK(page_size >= 1, "decode_rows: page size {}", page_size);
  DecodeRows d;
  d.qo.push_back(0);
  d.page_indptr.push_back(0);
  for (int64_t r = 0; r < b.num_requests; ++r) {
    const int32_t p0 = b.page_indptr[r], np = b.page_indptr[r + 1] - p0;
    for (int32_t t = b.qo_indptr[r]; t < b.qo_indptr[r + 1]; ++t) {
      const int32_t len = b.positions[t] + 1;
      FP4MOE_CHECK(len >= 1 && len <= b.kv_len[r], "decode_rows: token {} of request {} at position {} (kv_len {})", t,
                   r, b.positions[t], b.kv_len[r]);
      const int32_t need = int32_t((len + page_size - 1) / page_size);
      FP4MOE_CHECK(need <= np, "decode_rows: request {} has {} pages, position {} needs {}", r, np, len - 1, need);
      d.qo.push_back(t + 1);
      d.kv_len.push_back(len);
      d.pages.insert(d.pages.end(), b.page_indices + p0, b.page_indices + p0 + need);
      d.page_indptr.push_back(int32_t(d.pages.size()));
    }
  }
  return d;
}

}  // namespace fp4moe::engine
