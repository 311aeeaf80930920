#include "backend/spec_round_plan.hpp"

#include <algorithm>

#include "backend/decode_rows.hpp"
#include "core/error.hpp"

namespace fp4moe::engine {

SpecRoundPlan plan_spec_round(const model::GreedyRoundInput& in, int64_t ps, int64_t vocab) {
  const int64_t R = int64_t(in.start.size()), N = in.max_drafts;
  FP4MOE_CHECK(R >= 1, "spec round: no requests");
  FP4MOE_CHECK(N >= 1, "spec round: {} draft steps (>= 1)", N);
  for (const auto* v : {&in.last_token, &in.first_draft, &in.num_drafts, &in.max_new})
    FP4MOE_CHECK(int64_t(v->size()) == R, "spec round: an array has {} entries for {} requests", v->size(), R);
  FP4MOE_CHECK(int64_t(in.pages.size()) == R, "spec round: pages for {} of {} requests", in.pages.size(), R);
  FP4MOE_CHECK(in.stop_ids.empty() || int64_t(in.stop_ids.size()) == R, "spec round: stop ids for {} of {} requests",
               in.stop_ids.size(), R);
  int32_t longest = 0;
  for (int64_t r = 0; r < R; ++r) {
    const int32_t n = in.num_drafts[size_t(r)];
    FP4MOE_CHECK(in.max_new[size_t(r)] >= 1, "spec round: request {}: max_new {} (>= 1)", r, in.max_new[size_t(r)]);
    FP4MOE_CHECK(n >= 0 && n <= N && n <= in.max_new[size_t(r)] - 1,
                 "spec round: request {}: {} drafts (0 .. min({}, max_new - 1))", r, n, N);
    FP4MOE_CHECK(n == 0 || (in.first_draft[size_t(r)] >= 0 && in.first_draft[size_t(r)] < vocab),
                 "spec round: request {}: first draft {} outside the vocabulary", r, in.first_draft[size_t(r)]);
    FP4MOE_CHECK(in.start[size_t(r)] >= 0 && int64_t(in.pages[size_t(r)].size()) * ps >= in.start[size_t(r)] + n + 1,
                 "spec round: request {}: {} pages hold {} positions, the round writes {}", r, in.pages[size_t(r)].size(),
                 int64_t(in.pages[size_t(r)].size()) * ps, in.start[size_t(r)] + n + 1);
    longest = std::max(longest, n);
  }
  FP4MOE_CHECK(longest < 2 || in.draft_hidden, "spec round: no draft hidden states for requests that draft twice");

  SpecRoundPlan p;
  p.requests = R;
  p.max_drafts = N;
  p.drafts_init.assign(static_cast<size_t>(R * N), -1);
  for (int64_t r = 0; r < R; ++r)
    if (in.num_drafts[size_t(r)] > 0) p.drafts_init[size_t(r * N)] = in.first_draft[size_t(r)];
  for (int32_t k = 0; k + 1 < longest; ++k) {
    SpecRoundStep st;
    std::vector<int32_t> w, src, dst, prev;
    st.qo.push_back(0);
    st.page_indptr.push_back(0);
    for (int64_t r = 0; r < R; ++r) {
      if (in.num_drafts[size_t(r)] <= k + 1) continue;
      if (k > 0) {
        const std::vector<int32_t>& before = p.who.back();
        prev.push_back(int32_t(std::find(before.begin(), before.end(), int32_t(r)) - before.begin()));
      }
      w.push_back(int32_t(r));
      src.push_back(int32_t(r * N + k));
      dst.push_back(int32_t(r * N + k + 1));
      st.tokens.push_back(0);
      st.positions.push_back(in.start[size_t(r)] + k);
      st.qo.push_back(int32_t(st.tokens.size()));
      st.kv_len.push_back(in.start[size_t(r)] + k + 1);
      st.pages.insert(st.pages.end(), in.pages[size_t(r)].begin(), in.pages[size_t(r)].end());
      st.page_indptr.push_back(int32_t(st.pages.size()));
      st.rows.push_back(int32_t(st.tokens.size()) - 1);
    }
    p.drafts.push_back(std::move(st));
    p.who.push_back(std::move(w));
    p.src.push_back(std::move(src));
    p.dst.push_back(std::move(dst));
    p.prev.push_back(std::move(prev));
  }
  // Verify: the multi-token batch, then decode rows over it.
  SpecRoundStep flat;
  flat.qo.push_back(0);
  flat.page_indptr.push_back(0);
  for (int64_t r = 0; r < R; ++r) {
    const int32_t n = in.num_drafts[size_t(r)];
    p.verify_offset.push_back(int32_t(flat.tokens.size()));
    for (int32_t k = 0; k <= n; ++k) {
      flat.tokens.push_back(k == 0 ? in.last_token[size_t(r)] : 0);
      p.verify_src.push_back(k == 0 ? -1 : int32_t(r * N + k - 1));
      flat.positions.push_back(in.start[size_t(r)] + k);
    }
    flat.qo.push_back(int32_t(flat.tokens.size()));
    flat.kv_len.push_back(in.start[size_t(r)] + n + 1);
    flat.pages.insert(flat.pages.end(), in.pages[size_t(r)].begin(), in.pages[size_t(r)].end());
    flat.page_indptr.push_back(int32_t(flat.pages.size()));
  }
  const KvBatchView fb = flat.batch();
  const DecodeRows d = decode_rows(fb, ps);
  const KvBatchView v = d.view(fb);
  p.verify.tokens = flat.tokens;
  p.verify.positions = flat.positions;
  p.verify.qo.assign(v.qo_indptr, v.qo_indptr + v.num_requests + 1);
  p.verify.kv_len.assign(v.kv_len, v.kv_len + v.num_requests);
  p.verify.page_indptr.assign(v.page_indptr, v.page_indptr + v.num_requests + 1);
  p.verify.pages.assign(v.page_indices, v.page_indices + v.page_indptr[v.num_requests]);
  for (int32_t i = 0; i < int32_t(flat.tokens.size()); ++i) p.verify.rows.push_back(i);
  p.catchup = p.verify;  // logits of every row: rows 0 .. R - 1 patched to the requests' last emitted
  return p;
}

}  // namespace fp4moe::engine
