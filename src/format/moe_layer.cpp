// Per-expert access to FP4 expert stacks in the owned layout's terms (moe_layer.hpp).
#include "format/moe_layer.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "core/threads.hpp"
#include "format/codecs.hpp"

namespace fp4moe {

Fp4ExpertRows::Fp4ExpertRows(const ExpertStack& s, int64_t e)
    : e_(e), k_(s.k), block_(s.block()), nv_(s.format == WeightFormat::NVFP4) {
  FP4MOE_CHECK(s.is_fp4() && e >= 0 && e < s.num_experts, "expert rows: expert {} of a {} stack of {} experts", e,
               weight_format_name(s.format), s.num_experts);
  const int64_t parts = s.is_view() ? s.parts : 1;
  FP4MOE_CHECK(parts >= 1 && s.n % parts == 0, "expert rows: {} rows in {} parts", s.n, parts);
  n_part_ = s.n / parts;
  const size_t packed_part = size_t(n_part_ * (k_ / 2)), scales_part = size_t(n_part_ * (k_ / block_));
  if (s.is_view()) {
    FP4MOE_CHECK(s.views.size() == size_t(s.num_experts * parts), "expert rows: {} part views for {} experts x {} parts",
                 s.views.size(), s.num_experts, parts);
    float g_max = 0.0f;
    for (int64_t p = 0; p < parts; ++p) g_max = std::max(g_max, s.views[size_t(e * parts + p)].global_scale);
    global_ = g_max;
    for (int64_t p = 0; p < parts; ++p) {
      const ExpertStack::PartView& v = s.views[size_t(e * parts + p)];
      FP4MOE_CHECK(v.packed && v.scales, "expert rows: expert {} part {} has no FP4 data", e, p);
      packed_.push_back(v.packed);
      scales_.push_back(v.scales);
      ratio_.push_back(nv_ && v.global_scale != g_max ? v.global_scale / g_max : 1.0f);
    }
    return;
  }
  // (MXFP4 stacks may leave the globals out: 1.)
  FP4MOE_CHECK(s.packed.size() == size_t(s.num_experts) * packed_part &&
                   s.scales.size() == size_t(s.num_experts) * scales_part &&
                   (s.global_scale.size() == size_t(s.num_experts) || (!nv_ && s.global_scale.empty())),
               "expert rows: the stack's arrays do not match [{}, {}, {}]", s.num_experts, s.n, s.k);
  packed_.push_back(s.packed.data() + size_t(e) * packed_part);
  scales_.push_back(s.scales.data() + size_t(e) * scales_part);
  ratio_.push_back(1.0f);
  global_ = s.global_scale.empty() ? 1.0f : s.global_scale[size_t(e)];
}

uint8_t Fp4ExpertRows::slow_scale(int64_t r, int64_t kb) const {
  const uint8_t s = raw_scales(r)[kb];
  FP4MOE_CHECK(!is_nan(s), "expert {}: a NaN block scale (code 0x{:02x}) at row {}, block {}", e_, s, r, kb);
  const float ratio = ratio_[size_t(r / n_part_)];
  // < 1: rescaled scales never exceed 448 (Checkpoint::load_moe_layer's rule)
  return ratio == 1.0f ? s : e4m3_from_float(e4m3_to_float(s) * ratio);
}

void Fp4ExpertRows::scales_row(int64_t r, uint8_t* out) const {
  const uint8_t* raw = raw_scales(r);
  const int64_t nb = k_ / block_;
  if (!rescaled(r)) {
    std::memcpy(out, raw, size_t(nb));
    for (int64_t kb = 0; kb < nb; ++kb)
      if (is_nan(raw[kb])) slow_scale(r, kb);  // throws
    return;
  }
  for (int64_t kb = 0; kb < nb; ++kb) out[kb] = slow_scale(r, kb);
}

ExpertStack owned_expert_stack(const ExpertStack& s) {
  if (!s.is_view()) return s;
  ExpertStack o;
  o.format = s.format;
  o.num_experts = s.num_experts;
  o.n = s.n;
  o.k = s.k;
  o.input_scale = s.input_scale;
  const int64_t E = s.num_experts, parts = s.parts;
  FP4MOE_CHECK(parts >= 1 && s.n % parts == 0 && s.views.size() == size_t(E * parts),
               "expert stack: {} part views for {} experts x {} parts of {} rows", s.views.size(), E, parts, s.n);
  if (!s.is_fp4()) {
    const size_t part = size_t(s.n / parts * s.k);
    o.bf16.resize(size_t(E * parts) * part);
    parallel_for(E * parts, default_num_threads(), 1, [&](int64_t b, int64_t end) {
      for (int64_t i = b; i < end; ++i) {
        FP4MOE_CHECK(s.views[size_t(i)].bf16, "expert stack: expert {} part {} has no BF16 data", i / parts, i % parts);
        std::memcpy(o.bf16.data() + size_t(i) * part, s.views[size_t(i)].bf16, part * 2);
      }
    });
    return o;
  }
  const size_t row_packed = size_t(s.k / 2), row_scales = size_t(s.k / s.block());
  o.packed.resize(size_t(E * s.n) * row_packed);
  o.scales.resize(size_t(E * s.n) * row_scales);
  o.global_scale.assign(size_t(E), 1.0f);
  parallel_for(E, default_num_threads(), 1, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) {
      const Fp4ExpertRows x(s, e);
      for (int64_t r = 0; r < s.n; ++r) {
        const size_t row = size_t(e * s.n + r);
        std::memcpy(o.packed.data() + row * row_packed, x.packed(r), row_packed);
        x.scales_row(r, o.scales.data() + row * row_scales);
      }
      o.global_scale[size_t(e)] = x.global_scale();
    }
  });
  return o;
}

}  // namespace fp4moe
