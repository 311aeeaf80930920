#include "core/paged_kv.hpp"

#include "core/error.hpp"

namespace fp4moe {

std::string_view kv_elem_name(KvElem e) {
  switch (e) {
    case KvElem::F32: return "f32";
    case KvElem::BF16: return "bf16";
    case KvElem::FP8_E4M3: return "fp8_e4m3";
  }
  return "?";
}

void validate_kv_batch(const KvBatchView& b, int64_t page_size, int64_t num_pages) {
  FP4MOE_CHECK(page_size >= 1 && num_pages >= 0, "KV batch: page size {} / {} pages", page_size, num_pages);
  FP4MOE_CHECK(b.num_requests >= 0 && b.num_tokens >= 0, "KV batch: {} requests, {} tokens", b.num_requests,
               b.num_tokens);
  if (b.num_requests == 0) {
    FP4MOE_CHECK(b.num_tokens == 0, "KV batch: {} tokens but no request", b.num_tokens);
    return;
  }
  FP4MOE_CHECK(b.qo_indptr && b.kv_len && b.page_indptr && b.page_indices && (b.positions || b.num_tokens == 0),
               "KV batch: a required array is null");
  FP4MOE_CHECK(b.qo_indptr[0] == 0 && b.qo_indptr[b.num_requests] == b.num_tokens,
               "KV batch: qo_indptr runs from {} to {}, expected 0 to {}", b.qo_indptr[0],
               b.qo_indptr[b.num_requests], b.num_tokens);
  FP4MOE_CHECK(b.page_indptr[0] == 0, "KV batch: page_indptr[0] = {}, expected 0", b.page_indptr[0]);
  for (int64_t r = 0; r < b.num_requests; ++r) {
    FP4MOE_CHECK(b.qo_indptr[r] <= b.qo_indptr[r + 1], "KV batch: qo_indptr decreases at request {}", r);
    FP4MOE_CHECK(b.page_indptr[r] <= b.page_indptr[r + 1], "KV batch: page_indptr decreases at request {}", r);
    const int64_t len = b.kv_len[r];
    const int64_t pages = b.page_indptr[r + 1] - b.page_indptr[r];
    FP4MOE_CHECK(len >= 0 && pages * page_size >= len,
                 "KV batch: request {} has kv_len {} but {} pages of {} tokens", r, len, pages, page_size);
    for (int64_t i = b.page_indptr[r]; i < b.page_indptr[r + 1]; ++i)
      FP4MOE_CHECK(b.page_indices[i] >= 0 && b.page_indices[i] < num_pages,
                   "KV batch: request {} uses page {} of a pool of {}", r, b.page_indices[i], num_pages);
    for (int64_t t = b.qo_indptr[r]; t < b.qo_indptr[r + 1]; ++t)
      FP4MOE_CHECK(b.positions[t] >= 0 && b.positions[t] < len,
                   "KV batch: token {} of request {} is at position {}, outside its kv_len {}", t, r,
                   b.positions[t], len);
  }
}

void kv_slots_of_positions(const KvBatchView& b, int64_t page_size, int64_t request, const int32_t* positions,
                           int64_t n, int32_t* out) {
  FP4MOE_CHECK(request >= 0 && request < b.num_requests, "request {} of a batch of {}", request, b.num_requests);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t p = positions[i];
    FP4MOE_CHECK(p >= -1 && p < b.kv_len[request], "position {} of request {} (kv_len {})", p, request,
                 b.kv_len[request]);
    out[i] = p < 0 ? -1 : int32_t(kv_slot(b, page_size, request, p));
  }
}

void kv_token_requests(const KvBatchView& b, int32_t* out) {
  for (int64_t r = 0; r < b.num_requests; ++r)
    for (int64_t t = b.qo_indptr[r]; t < b.qo_indptr[r + 1]; ++t) out[t] = int32_t(r);
}

}  // namespace fp4moe
