#include "engine/dist/ep_maps.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.hpp"

namespace fp4moe::dist {

std::vector<Range> token_blocks(int64_t tokens, int64_t ranks, int64_t granule) {
  FP4MOE_CHECK(tokens >= 0 && ranks >= 1 && granule >= 1, "token_blocks: {} tokens, {} ranks, granule {}", tokens,
               ranks, granule);
  const int64_t groups = (tokens + granule - 1) / granule;
  std::vector<Range> out;
  for (int64_t r = 0; r < ranks; ++r) {
    const Range g = split_block(groups, ranks, r);
    out.push_back({std::min(tokens, g.begin * granule), std::min(tokens, g.end * granule)});
  }
  return out;
}

namespace {

// Exclusive prefix sums of counts[row·N + 0..N) per row (offsets within one rank's buffer).
std::vector<int64_t> offsets_per_rank(const std::vector<int64_t>& counts, int64_t n) {
  std::vector<int64_t> off(counts.size());
  for (int64_t a = 0; a < n; ++a) {
    int64_t acc = 0;
    for (int64_t b = 0; b < n; ++b) {
      off[size_t(a * n + b)] = acc;
      acc += counts[size_t(a * n + b)];
    }
  }
  return off;
}

}  // namespace

DispatchPlan plan_dispatch(const EpRouting& rt, const std::vector<Range>& experts, int64_t num_experts,
                           int64_t granule) {
  const int64_t N = int64_t(experts.size()), T = rt.tokens, K = rt.top_k;
  FP4MOE_CHECK(N >= 1 && T >= 0 && K >= 1, "dispatch: {} ranks, {} tokens, top_k {}", N, T, K);
  FP4MOE_CHECK(T == 0 || (rt.ids && rt.weights), "dispatch: no routing");
  // owner[e]: the rank holding expert e; the blocks must tile [0, E).
  std::vector<int32_t> owner(size_t(num_experts), -1);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t e = experts[size_t(r)].begin; e < experts[size_t(r)].end; ++e) {
      FP4MOE_CHECK(e >= 0 && e < num_experts && owner[size_t(e)] < 0, "dispatch: expert {} owned twice or out of [0, {})",
                   e, num_experts);
      owner[size_t(e)] = int32_t(r);
    }
  for (int64_t e = 0; e < num_experts; ++e) FP4MOE_CHECK(owner[size_t(e)] >= 0, "dispatch: expert {} has no owner", e);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = rt.ids[t * K + j];
      FP4MOE_CHECK(e >= 0 && e < num_experts, "dispatch: token {} slot {} names expert {} of {}", t, j, e, num_experts);
      for (int64_t i = 0; i < j; ++i)
        FP4MOE_CHECK(rt.ids[t * K + i] != e, "dispatch: token {} chooses expert {} twice", t, e);
      FP4MOE_CHECK(std::isfinite(rt.weights[t * K + j]), "dispatch: token {} slot {} has weight {}", t, j,
                   rt.weights[t * K + j]);
    }

  DispatchPlan p;
  p.ranks = N;
  p.tokens = T;
  p.top_k = K;
  p.experts = experts;
  p.token_owner = token_blocks(T, N, granule);

  // Dispatch: per (s, d) the tokens of s with an expert on d, ascending.
  p.send_tokens.assign(size_t(N * N), {});
  for (int64_t s = 0; s < N; ++s)
    for (int64_t t = p.token_owner[size_t(s)].begin; t < p.token_owner[size_t(s)].end; ++t) {
      std::vector<char> to(size_t(N), 0);
      for (int64_t j = 0; j < K; ++j) to[size_t(owner[size_t(rt.ids[t * K + j])])] = 1;
      for (int64_t d = 0; d < N; ++d)
        if (to[size_t(d)]) p.send_tokens[size_t(s * N + d)].push_back(int32_t(t));
    }
  p.send_counts.resize(size_t(N * N));
  p.recv_counts.resize(size_t(N * N));
  for (int64_t s = 0; s < N; ++s)
    for (int64_t d = 0; d < N; ++d) {
      const int64_t c = int64_t(p.send_tokens[size_t(s * N + d)].size());
      p.send_counts[size_t(s * N + d)] = c;
      p.recv_counts[size_t(d * N + s)] = c;
    }
  p.send_offsets = offsets_per_rank(p.send_counts, N);
  p.recv_offsets = offsets_per_rank(p.recv_counts, N);

  // On each d: local ids per received row, grouping by local expert, the send-back order.
  std::vector<int64_t> back_row_of(size_t(T * K), -1);  // (t, j) -> row within the d→s segment, then fixed up
  std::vector<int32_t> back_rank_of(size_t(T * K), -1);
  p.recv_rows.assign(size_t(N), 0);
  p.local_ids.resize(size_t(N));
  p.expert_entries.resize(size_t(N));
  p.expert_offsets.resize(size_t(N));
  p.back_entries.resize(size_t(N));
  p.back_send_counts.assign(size_t(N * N), 0);
  p.back_recv_counts.assign(size_t(N * N), 0);
  for (int64_t d = 0; d < N; ++d) {
    const Range own = experts[size_t(d)];
    std::vector<int32_t>& ids = p.local_ids[size_t(d)];
    int64_t row = 0;
    for (int64_t s = 0; s < N; ++s) {
      int64_t seg = 0;
      for (const int32_t t : p.send_tokens[size_t(s * N + d)]) {
        for (int64_t j = 0; j < K; ++j) {
          const int32_t e = rt.ids[t * K + j];
          const bool mine = own.contains(e);
          ids.push_back(mine ? int32_t(e - own.begin) : -1);
          if (!mine) continue;
          p.back_entries[size_t(d)].push_back(int32_t(row * K + j));
          back_row_of[size_t(t * K + j)] = seg++;
          back_rank_of[size_t(t * K + j)] = int32_t(d);
        }
        ++row;
      }
      p.back_send_counts[size_t(d * N + s)] = seg;
      p.back_recv_counts[size_t(s * N + d)] = seg;
    }
    p.recv_rows[size_t(d)] = row;
    // Group (row, slot) by local expert, rows ascending (a counting sort).
    std::vector<int64_t>& off = p.expert_offsets[size_t(d)];
    off.assign(size_t(own.size() + 1), 0);
    for (const int32_t le : ids)
      if (le >= 0) off[size_t(le + 1)]++;
    std::partial_sum(off.begin(), off.end(), off.begin());
    std::vector<int64_t> fill(off.begin(), off.end() - 1);
    p.expert_entries[size_t(d)].resize(size_t(off.back()));
    for (int64_t i = 0; i < int64_t(ids.size()); ++i)
      if (ids[size_t(i)] >= 0) p.expert_entries[size_t(d)][size_t(fill[size_t(ids[size_t(i)])]++)] = int32_t(i);
  }
  p.back_send_offsets = offsets_per_rank(p.back_send_counts, N);
  p.back_recv_offsets = offsets_per_rank(p.back_recv_counts, N);
  p.back_rows.assign(size_t(N), 0);
  for (int64_t s = 0; s < N; ++s)
    for (int64_t d = 0; d < N; ++d) p.back_rows[size_t(s)] += p.back_recv_counts[size_t(s * N + d)];

  // Combine terms: per token its slots in ascending expert id, rows in the source's buffer.
  p.combine.resize(size_t(T * K));
  std::vector<int64_t> order(static_cast<size_t>(K));
  for (int64_t s = 0; s < N; ++s)
    for (int64_t t = p.token_owner[size_t(s)].begin; t < p.token_owner[size_t(s)].end; ++t) {
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return rt.ids[t * K + a] < rt.ids[t * K + b]; });
      for (int64_t i = 0; i < K; ++i) {
        const int64_t j = order[size_t(i)];
        const int64_t d = back_rank_of[size_t(t * K + j)];
        p.combine[size_t(t * K + i)] = {p.back_recv_offsets[size_t(s * N + d)] + back_row_of[size_t(t * K + j)],
                                        rt.weights[t * K + j]};
      }
    }
  return p;
}

void combine_rows(const DispatchPlan& p, int64_t s, const float* back, int64_t hidden, float* out) {
  FP4MOE_CHECK(s >= 0 && s < p.ranks, "combine: rank {} of {}", s, p.ranks);
  const Range own = p.token_owner[size_t(s)];
  const int64_t K = p.top_k;
  for (int64_t t = own.begin; t < own.end; ++t) {
    float* o = out + (t - own.begin) * hidden;
    std::fill(o, o + hidden, 0.0f);
    for (int64_t i = 0; i < K; ++i) {
      const CombineTerm& c = p.combine[size_t(t * K + i)];
      const float* y = back + c.back_row * hidden;
      for (int64_t h = 0; h < hidden; ++h) o[h] = std::fma(c.weight, y[h], o[h]);
    }
  }
}

}  // namespace fp4moe::dist
