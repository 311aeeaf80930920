#include "engine/dist/rank_weights.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace fp4moe::dist {
namespace {

void check_owned(const ExpertStack& s, const char* what) {
  FP4MOE_CHECK(!s.is_view(), "{}: slicing needs an owned expert stack, not checkpoint views", what);
}

// Copies columns [c0, c1) of a row-major [rows, cols] byte matrix of `elem`-byte items.
template <typename T>
void copy_cols(const std::vector<T>& src, int64_t rows, int64_t cols, int64_t c0, int64_t c1, std::vector<T>& dst) {
  for (int64_t r = 0; r < rows; ++r)
    dst.insert(dst.end(), src.begin() + r * cols + c0, src.begin() + r * cols + c1);
}

// Rows of one expert: a function of (expert, row range) appending to the output stack.
void append_rows(const ExpertStack& s, int64_t e, int64_t r0, int64_t r1, ExpertStack& out) {
  const int64_t k = s.k;
  if (s.is_fp4()) {
    const int64_t pk = k / 2, sk = k / s.block();
    out.packed.insert(out.packed.end(), s.packed.begin() + (e * s.n + r0) * pk, s.packed.begin() + (e * s.n + r1) * pk);
    out.scales.insert(out.scales.end(), s.scales.begin() + (e * s.n + r0) * sk, s.scales.begin() + (e * s.n + r1) * sk);
  } else {
    out.bf16.insert(out.bf16.end(), s.bf16.begin() + (e * s.n + r0) * k, s.bf16.begin() + (e * s.n + r1) * k);
  }
}

ExpertStack empty_like(const ExpertStack& s, int64_t experts, int64_t n, int64_t k) {
  ExpertStack o;
  o.format = s.format;
  o.num_experts = experts;
  o.n = n;
  o.k = k;
  return o;
}

}  // namespace

ExpertStack slice_experts(const ExpertStack& s, Range r) {
  check_owned(s, "slice_experts");
  FP4MOE_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= s.num_experts, "slice_experts: [{}, {}) of {} experts",
               r.begin, r.end, s.num_experts);
  ExpertStack o = empty_like(s, r.size(), s.n, s.k);
  for (int64_t e = r.begin; e < r.end; ++e) {
    append_rows(s, e, 0, s.n, o);
    if (s.is_fp4()) o.global_scale.push_back(s.global_scale[size_t(e)]);
  }
  return o;
}

ExpertStack slice_gate_up(const ExpertStack& s, Range r) {
  check_owned(s, "slice_gate_up");
  const int64_t I = s.n / 2;
  FP4MOE_CHECK(s.n % 2 == 0 && r.begin >= 0 && r.begin <= r.end && r.end <= I, "slice_gate_up: rows [{}, {}) of {}",
               r.begin, r.end, I);
  ExpertStack o = empty_like(s, s.num_experts, 2 * r.size(), s.k);
  for (int64_t e = 0; e < s.num_experts; ++e) {
    append_rows(s, e, r.begin, r.end, o);
    append_rows(s, e, I + r.begin, I + r.end, o);
  }
  o.global_scale = s.global_scale;
  return o;
}

ExpertStack slice_down(const ExpertStack& s, Range r) {
  check_owned(s, "slice_down");
  const int64_t k = s.k;
  FP4MOE_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= k, "slice_down: columns [{}, {}) of {}", r.begin, r.end, k);
  ExpertStack o = empty_like(s, s.num_experts, s.n, r.size());
  if (s.is_fp4()) {
    const int64_t b = s.block();
    FP4MOE_CHECK(r.begin % b == 0 && r.end % b == 0, "slice_down: columns [{}, {}) cut a {}-column scale block",
                 r.begin, r.end, b);
    copy_cols(s.packed, s.num_experts * s.n, k / 2, r.begin / 2, r.end / 2, o.packed);
    copy_cols(s.scales, s.num_experts * s.n, k / b, r.begin / b, r.end / b, o.scales);
    o.global_scale = s.global_scale;
  } else {
    copy_cols(s.bf16, s.num_experts * s.n, k, r.begin, r.end, o.bf16);
  }
  return o;
}

MoeLayerWeights rank_moe_layer(const MoeLayerWeights& w, const RankShard& shard, bool with_shared) {
  MoeLayerWeights o;
  o.cfg = w.cfg;
  o.cfg.num_experts = shard.experts.size();
  o.cfg.inter = shard.expert_inter.size();
  o.router_w = w.router_w;
  o.router_bias = w.router_bias;
  o.w13 = slice_gate_up(slice_experts(w.w13, shard.experts), shard.expert_inter);
  o.w2 = slice_down(slice_experts(w.w2, shard.experts), shard.expert_inter);
  o.cfg.shared_inter = 0;
  if (with_shared && w.shared_w13 && w.shared_w2 && shard.shared_inter.size() > 0) {
    o.shared_w13 = slice_gate_up(*w.shared_w13, shard.shared_inter);
    o.shared_w2 = slice_down(*w.shared_w2, shard.shared_inter);
    o.cfg.shared_inter = shard.shared_inter.size();
  }
  return o;
}

}  // namespace fp4moe::dist
