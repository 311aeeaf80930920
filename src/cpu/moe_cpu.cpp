// The CPU MoE layer: router -> grouped top-k -> per-expert gate_up (SiLU·up fused) -> down
// with the routing weight fused -> combine (+ shared expert). FP4 weights are decoded on the
// fly in registers (avx2_weight_dot.hpp); FP32 accumulation; parallel_for over row blocks.
#include "cpu/moe_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/threads.hpp"
#include "cpu/avx2_weight_dot.hpp"
#include "cpu/scale_tables.hpp"

namespace fp4moe {
namespace {

constexpr int64_t kTokenChunk = 1024;  // tokens per pass: bounds the h workspace
constexpr int64_t kGateUpRows = 8;     // gate rows (and as many up rows) per work item
constexpr int64_t kDownRows = 16;      // output columns per work item of the down GEMM

void validate_config(const MoeConfig& c) {
  FP4MOE_CHECK(c.hidden > 0 && c.inter > 0 && c.num_experts > 0,
               "MoE config: hidden ({}), intermediate ({}) and experts ({}) must be positive",
               c.hidden, c.inter, c.num_experts);
  FP4MOE_CHECK(c.top_k >= 1 && c.top_k <= c.num_experts, "MoE config: top_k = {} with {} experts",
               c.top_k, c.num_experts);
  FP4MOE_CHECK(c.n_group >= 1 && c.num_experts % c.n_group == 0,
               "MoE config: {} experts cannot be split into n_group = {} groups", c.num_experts, c.n_group);
  FP4MOE_CHECK(c.topk_group >= 1 && c.topk_group <= c.n_group,
               "MoE config: topk_group = {} with n_group = {}", c.topk_group, c.n_group);
  FP4MOE_CHECK(c.topk_group * (c.num_experts / c.n_group) >= c.top_k,
               "MoE config: topk_group = {} groups of {} experts hold fewer than top_k = {}",
               c.topk_group, c.num_experts / c.n_group, c.top_k);
  FP4MOE_CHECK(c.shared_inter >= 0, "MoE config: shared intermediate {} < 0", c.shared_inter);
}

void validate_stack(const ExpertStack& s, const char* what, int64_t experts, int64_t n, int64_t k) {
  FP4MOE_CHECK(s.num_experts == experts && s.n == n && s.k == k,
               "{}: weights are [{}, {}, {}], expected [{}, {}, {}]", what, s.num_experts, s.n, s.k,
               experts, n, k);
  FP4MOE_CHECK(k % 16 == 0, "{}: reduction dim {} is not a multiple of 16", what, k);
  const size_t enk = size_t(experts * n * k);
  if (s.is_view()) {
    FP4MOE_CHECK(s.parts >= 1 && n % s.parts == 0 && s.views.size() == size_t(experts * s.parts),
                 "{}: {} part views for {} experts of {} parts", what, s.views.size(), experts, s.parts);
    for (const ExpertStack::PartView& v : s.views)
      FP4MOE_CHECK(s.is_fp4() ? (v.packed && v.scales) : v.bf16 != nullptr, "{}: a part view has no data", what);
    if (s.is_fp4())
      FP4MOE_CHECK(k % s.block() == 0, "{}: reduction dim {} is not a multiple of the {} block {}", what, k,
                   weight_format_name(s.format), s.block());
  } else if (s.is_fp4()) {
    FP4MOE_CHECK(k % s.block() == 0, "{}: reduction dim {} is not a multiple of the {} block {}", what,
                 k, weight_format_name(s.format), s.block());
    FP4MOE_CHECK(s.packed.size() == enk / 2 && s.scales.size() == enk / size_t(s.block()) &&
                     s.global_scale.size() == size_t(experts),
                 "{}: {} storage sizes do not match [{}, {}, {}]", what, weight_format_name(s.format),
                 experts, n, k);
  } else {
    FP4MOE_CHECK(s.bf16.size() == enk, "{}: bf16 storage size {} != {}", what, s.bf16.size(), enk);
  }
}

void validate_layer(const MoeLayerWeights& w) {
  const MoeConfig& c = w.cfg;
  validate_config(c);
  FP4MOE_CHECK(w.router_w.size() == size_t(c.num_experts * c.hidden), "router weight has {} values, expected [{}, {}]",
               w.router_w.size(), c.num_experts, c.hidden);
  FP4MOE_CHECK(w.router_bias.empty() || w.router_bias.size() == size_t(c.num_experts),
               "router correction bias has {} values, expected {}", w.router_bias.size(), c.num_experts);
  validate_stack(w.w13, "gate_up", c.num_experts, 2 * c.inter, c.hidden);
  validate_stack(w.w2, "down", c.num_experts, c.hidden, c.inter);
  const bool has_shared = w.shared_w13.has_value() || w.shared_w2.has_value();
  FP4MOE_CHECK(has_shared == (c.shared_inter > 0) && w.shared_w13.has_value() == w.shared_w2.has_value(),
               "shared expert: config says intermediate {}, weights {}present", c.shared_inter,
               has_shared ? "" : "not ");
  if (has_shared) {
    validate_stack(*w.shared_w13, "shared gate_up", 1, 2 * c.shared_inter, c.hidden);
    validate_stack(*w.shared_w2, "shared down", 1, c.hidden, c.shared_inter);
  }
}

// Scale tables of expert e: one per part in view mode (each part has its own global
// scale), else one for the whole expert.
struct ExpertTables {
  cpu::ScaleTable t[2];
};
ExpertTables tables_for(const ExpertStack& s, int64_t e) {
  ExpertTables out{};
  if (!s.is_fp4()) return out;
  FP4MOE_CHECK(s.parts <= 2, "expert stacks of {} parts are not supported", s.parts);
  for (int64_t p = 0; p < (s.is_view() ? s.parts : 1); ++p)
    out.t[p] = cpu::make_scale_table(s.fp4_format(), s.is_view() ? s.views[size_t(e * s.parts + p)].global_scale
                                                                  : s.global_scale[size_t(e)]);
  return out;
}

// Calls f(make_row) with a typed row maker for expert e of the stack (one format dispatch).
template <class F>
void with_rows(const ExpertStack& s, int64_t e, const ExpertTables& tables, F&& f) {
  const int64_t n = s.n, k = s.k;
  if (s.is_view()) {
    const int64_t part_rows = n / s.parts;
    const ExpertStack::PartView* v = s.views.data() + e * s.parts;
    auto locate = [v, part_rows](int64_t r) { return std::pair<int64_t, int64_t>(r / part_rows, r % part_rows); };
    switch (s.format) {
      case WeightFormat::NVFP4:
        f([&, locate, k](int64_t r) {
          const auto [p, row] = locate(r);
          return cpu::Fp4Row<16>{v[p].packed + row * (k / 2), v[p].scales + row * (k / 16), tables.t[p].data()};
        });
        break;
      case WeightFormat::MXFP4:
        f([&, locate, k](int64_t r) {
          const auto [p, row] = locate(r);
          return cpu::Fp4Row<32>{v[p].packed + row * (k / 2), v[p].scales + row * (k / 32), tables.t[p].data()};
        });
        break;
      case WeightFormat::BF16:
        f([&, locate, k](int64_t r) {
          const auto [p, row] = locate(r);
          return cpu::Bf16Row{v[p].bf16 + row * k};
        });
        break;
    }
    return;
  }
  const float* table = tables.t[0].data();
  switch (s.format) {
    case WeightFormat::NVFP4:
      f([&, n, k](int64_t r) {
        const int64_t row = e * n + r;
        return cpu::Fp4Row<16>{s.packed.data() + row * (k / 2), s.scales.data() + row * (k / 16), table};
      });
      break;
    case WeightFormat::MXFP4:
      f([&, n, k](int64_t r) {
        const int64_t row = e * n + r;
        return cpu::Fp4Row<32>{s.packed.data() + row * (k / 2), s.scales.data() + row * (k / 32), table};
      });
      break;
    case WeightFormat::BF16:
      f([&, n, k](int64_t r) { return cpu::Bf16Row{s.bf16.data() + (e * n + r) * k}; });
      break;
  }
}

// One expert's share of a token chunk: its tokens, their routing weights and its h rows.
struct ExpertWork {
  const ExpertStack* w13 = nullptr;
  const ExpertStack* w2 = nullptr;
  int64_t expert = 0;
  int64_t inter = 0;
  const int32_t* tokens = nullptr;  // [m] chunk-local token rows, ascending
  const float* weights = nullptr;   // [m] routing weights; nullptr = 1 (shared expert)
  const int32_t* slots = nullptr;   // [m] row of slot_out (token * top_k + slot); with slot_out
  float* slot_out = nullptr;        // [rows, hidden]: unweighted outputs per (token, slot), or nullptr
  int64_t m = 0;
  float* h = nullptr;               // [m, inter] SiLU(gate)·up
  ExpertTables table13, table2;
};

inline float silu(float g) { return g / (1.0f + std::exp(-g)); }

// h[j, i] = SiLU(x_j · gate_i) · (x_j · up_i) for gate rows [i0, i1) of one expert.
void gate_up_rows(const ExpertWork& w, const float* x, int64_t hidden, int64_t i0, int64_t i1, bool bf16) {
  with_rows(*w.w13, w.expert, w.table13, [&](auto make_row) {
    const float* xp[cpu::kMaxTokenTile];
    float g[cpu::kMaxTokenTile], u[cpu::kMaxTokenTile];
    for (int64_t t0 = 0; t0 < w.m; t0 += cpu::kMaxTokenTile) {
      const int mt = int(std::min<int64_t>(cpu::kMaxTokenTile, w.m - t0));
      for (int j = 0; j < mt; ++j) xp[j] = x + int64_t(w.tokens[t0 + j]) * hidden;
      for (int64_t i = i0; i < i1; ++i) {
        cpu::dot_row_tile(make_row(i), hidden, xp, mt, g);
        cpu::dot_row_tile(make_row(w.inter + i), hidden, xp, mt, u);
        for (int j = 0; j < mt; ++j) {
          const float v = silu(g[j]) * u[j];
          w.h[(t0 + j) * w.inter + i] = bf16 ? round_to_bf16(v) : v;
        }
      }
    }
  });
}

// out[t_j, r] += weight_j * (h_j · down_r) for output columns [r0, r1) of one expert (with
// slot_out: slot_out[slot_j, r] = h_j · down_r instead).
void down_rows(const ExpertWork& w, float* out, int64_t hidden, int64_t r0, int64_t r1) {
  with_rows(*w.w2, w.expert, w.table2, [&](auto make_row) {
    const float* hp[cpu::kMaxTokenTile];
    float y[cpu::kMaxTokenTile];
    for (int64_t t0 = 0; t0 < w.m; t0 += cpu::kMaxTokenTile) {
      const int mt = int(std::min<int64_t>(cpu::kMaxTokenTile, w.m - t0));
      for (int j = 0; j < mt; ++j) hp[j] = w.h + (t0 + j) * w.inter;
      for (int64_t r = r0; r < r1; ++r) {
        cpu::dot_row_tile(make_row(r), w.inter, hp, mt, y);
        if (w.slot_out) {
          for (int j = 0; j < mt; ++j) w.slot_out[int64_t(w.slots[t0 + j]) * hidden + r] = y[j];
          continue;
        }
        // One fused multiply-add per term (explicit, so that a combine elsewhere can repeat it).
        for (int j = 0; j < mt; ++j) {
          float& o = out[int64_t(w.tokens[t0 + j]) * hidden + r];
          o = std::fma(w.weights ? w.weights[t0 + j] : 1.0f, y[j], o);
        }
      }
    }
  });
}

// logits[t, e] = x_t · router_w[e] (FP32), parallel over experts.
void router_logits(const MoeLayerWeights& w, const float* x, int64_t tokens, int threads, float* logits) {
  const int64_t E = w.cfg.num_experts, H = w.cfg.hidden;
  parallel_for(E, threads, 4, [&](int64_t e0, int64_t e1) {
    const float* xp[cpu::kMaxTokenTile];
    float y[cpu::kMaxTokenTile];
    for (int64_t t0 = 0; t0 < tokens; t0 += cpu::kMaxTokenTile) {
      const int mt = int(std::min<int64_t>(cpu::kMaxTokenTile, tokens - t0));
      for (int j = 0; j < mt; ++j) xp[j] = x + (t0 + j) * H;
      for (int64_t e = e0; e < e1; ++e) {
        cpu::dot_row_tile(cpu::F32Row{w.router_w.data() + e * H}, H, xp, mt, y);
        for (int j = 0; j < mt; ++j) logits[(t0 + j) * E + e] = y[j];
      }
    }
  });
}

// Routing of one token; scratch holds 2E + n_group floats and E ints.
void route_token(const MoeConfig& c, const float* logits, const float* bias, int32_t* ids, float* wts,
                 std::vector<float>& scores, std::vector<float>& sel, std::vector<float>& gscore,
                 std::vector<int32_t>& order) {
  const int64_t E = c.num_experts;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (c.scoring == ScoringFunc::Sigmoid) {
    for (int64_t e = 0; e < E; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
  } else {
    float mx = kNegInf;
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, logits[e]);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += scores[e] = std::exp(logits[e] - mx);
    const float inv = float(1.0 / sum);
    for (int64_t e = 0; e < E; ++e) scores[e] *= inv;
  }
  // Selection score: the correction bias added; NaN never wins.
  for (int64_t e = 0; e < E; ++e) {
    const float s = scores[e] + (bias ? bias[e] : 0.0f);
    sel[e] = std::isnan(s) ? kNegInf : s;
  }
  // Higher score first; equal scores: lower index first.
  auto before = [](const std::vector<float>& v) {
    return [&v](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
  };
  if (c.n_group > 1) {
    const int64_t gs = E / c.n_group;
    for (int64_t g = 0; g < c.n_group; ++g) {
      // Group score: the sum of the group's best two selection scores (one if a group has one expert).
      float b1 = kNegInf, b2 = kNegInf;
      for (int64_t e = g * gs; e < (g + 1) * gs; ++e) {
        if (sel[e] > b1) {
          b2 = b1;
          b1 = sel[e];
        } else if (sel[e] > b2) {
          b2 = sel[e];
        }
      }
      gscore[g] = gs >= 2 ? b1 + b2 : b1;
      if (std::isnan(gscore[g])) gscore[g] = kNegInf;
    }
    std::iota(order.begin(), order.begin() + c.n_group, 0);
    std::partial_sort(order.begin(), order.begin() + c.topk_group, order.begin() + c.n_group, before(gscore));
    // Experts of groups not chosen are not eligible (excluded, not merely zeroed).
    std::vector<char> keep(size_t(c.n_group), 0);
    for (int64_t j = 0; j < c.topk_group; ++j) keep[order[j]] = 1;
    int64_t n = 0;
    for (int64_t e = 0; e < E; ++e)
      if (keep[e / gs]) order[n++] = int32_t(e);
    std::partial_sort(order.begin(), order.begin() + c.top_k, order.begin() + n, before(sel));
  } else {
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + c.top_k, order.end(), before(sel));
  }
  // Weights from the unbiased scores.
  double sum = 0;
  for (int64_t j = 0; j < c.top_k; ++j) {
    ids[j] = order[j];
    wts[j] = scores[order[j]];
    sum += wts[j];
  }
  const float norm = c.norm_topk_prob ? float(1.0 / (sum + 1e-20)) : 1.0f;
  for (int64_t j = 0; j < c.top_k; ++j) wts[j] = wts[j] * norm * c.routed_scaling;
}

RoutingResult route_tokens(const MoeConfig& cfg, const float* logits, const float* bias, int64_t tokens,
                           int threads) {
  validate_config(cfg);
  FP4MOE_CHECK(tokens >= 0, "route_cpu: {} tokens", tokens);
  RoutingResult r;
  r.tokens = tokens;
  r.top_k = cfg.top_k;
  r.topk_ids.resize(size_t(tokens * cfg.top_k));
  r.topk_weights.resize(size_t(tokens * cfg.top_k));
  const int64_t E = cfg.num_experts;
  parallel_for(tokens, threads, 64, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores(static_cast<size_t>(E)), sel(static_cast<size_t>(E)),
        gscore(static_cast<size_t>(cfg.n_group));
    std::vector<int32_t> order(size_t(std::max(E, cfg.n_group)));
    for (int64_t t = t0; t < t1; ++t)
      route_token(cfg, logits + t * E, bias, r.topk_ids.data() + t * cfg.top_k,
                  r.topk_weights.data() + t * cfg.top_k, scores, sel, gscore, order);
  });
  return r;
}

// x as the GEMMs see it: BF16-rounded like the GPU path when asked (into `storage`).
const float* gemm_input(const float* x_in, int64_t n, bool bf16, int threads, std::vector<float>& storage) {
  if (!bf16) return x_in;
  storage.resize(size_t(n));
  parallel_for(n, threads, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) storage[size_t(i)] = round_to_bf16(x_in[i]);
  });
  return storage.data();
}

// What one pass over the experts computes: slots (t, j) with ids[t·top_k + j] = -1 are
// skipped; out [T, H] += Σ_j weights[t, j] · expert(x_t) (experts in ascending id, then the
// shared expert), or with slot_out: slot_out[t·top_k + j] = expert(x_t), unweighted.
struct ExpertsPass {
  const int32_t* ids = nullptr;     // [T, top_k]
  const float* weights = nullptr;   // [T, top_k]; unused with slot_out
  int64_t top_k = 0;
  bool shared = false;              // add the shared expert (not with slot_out)
  float* out = nullptr;
  float* slot_out = nullptr;
};

void validate_stacks(const MoeLayerWeights& w) {
  const MoeConfig& c = w.cfg;
  FP4MOE_CHECK(c.hidden > 0 && c.inter > 0 && c.num_experts > 0,
               "MoE config: hidden ({}), intermediate ({}) and experts ({}) must be positive", c.hidden, c.inter,
               c.num_experts);
  validate_stack(w.w13, "gate_up", c.num_experts, 2 * c.inter, c.hidden);
  validate_stack(w.w2, "down", c.num_experts, c.hidden, c.inter);
  if (w.shared_w13 && w.shared_w2) {
    validate_stack(*w.shared_w13, "shared gate_up", 1, 2 * c.shared_inter, c.hidden);
    validate_stack(*w.shared_w2, "shared down", 1, c.hidden, c.shared_inter);
  }
}

void validate_experts(const MoeLayerWeights& w, const float* x, int64_t tokens, const MoeExpertsArgs& a) {
  validate_stacks(w);
  FP4MOE_CHECK(tokens >= 0, "MoE experts: {} tokens", tokens);
  FP4MOE_CHECK(a.top_k >= 1, "MoE experts: top_k = {}", a.top_k);
  if (tokens == 0) return;
  FP4MOE_CHECK(x != nullptr && a.topk_ids != nullptr, "MoE experts: no input or no expert ids");
  const int64_t E = w.cfg.num_experts;
  for (int64_t i = 0; i < tokens * a.top_k; ++i)
    FP4MOE_CHECK(a.topk_ids[i] >= -1 && a.topk_ids[i] < E, "MoE experts: slot {} names expert {} of {}", i,
                 a.topk_ids[i], E);
}

void experts_pass(const MoeLayerWeights& w, const float* x, int64_t T, const ExpertsPass& p, int threads, bool bf16) {
  const MoeConfig& c = w.cfg;
  const int64_t H = c.hidden, E = c.num_experts, K = p.top_k;
  const bool has_shared = p.shared && !p.slot_out;
  FP4MOE_CHECK(p.slot_out || p.weights, "MoE experts: no routing weights");
  std::vector<int32_t> tok, slot, counts(static_cast<size_t>(E));
  std::vector<float> wts, hbuf;
  std::vector<int32_t> iota_tokens(size_t(std::min(T, kTokenChunk)));
  std::iota(iota_tokens.begin(), iota_tokens.end(), 0);
  for (int64_t c0 = 0; c0 < T; c0 += kTokenChunk) {
    const int64_t tc = std::min(kTokenChunk, T - c0);
    const float* xc = x + c0 * H;
    float* outc = p.out ? p.out + c0 * H : nullptr;
    float* slotc = p.slot_out ? p.slot_out + c0 * K * H : nullptr;

    // Permute by expert: per-expert token lists (ascending token), routing weight alongside.
    std::fill(counts.begin(), counts.end(), 0);
    for (int64_t i = 0; i < tc * K; ++i)
      if (p.ids[c0 * K + i] >= 0) counts[size_t(p.ids[c0 * K + i])]++;
    std::vector<int64_t> offset(size_t(E + 1), 0);
    for (int64_t e = 0; e < E; ++e) offset[e + 1] = offset[e] + counts[e];
    tok.resize(size_t(offset[E]));
    slot.resize(size_t(offset[E]));
    wts.resize(size_t(offset[E]));
    std::vector<int64_t> fill(offset.begin(), offset.end() - 1);
    for (int64_t t = 0; t < tc; ++t)
      for (int64_t j = 0; j < K; ++j) {
        const int64_t e = p.ids[(c0 + t) * K + j];
        if (e < 0) continue;
        tok[size_t(fill[e])] = int32_t(t);
        slot[size_t(fill[e])] = int32_t(t * K + j);
        wts[size_t(fill[e]++)] = p.slot_out ? 1.0f : p.weights[(c0 + t) * K + j];
      }

    // Work list: the experts hit in this chunk, then the shared expert over all tokens.
    hbuf.resize(size_t(offset[E] * c.inter + (has_shared ? tc * c.shared_inter : 0)));
    std::vector<ExpertWork> work;
    for (int64_t e = 0; e < E; ++e) {
      if (counts[e] == 0) continue;
      ExpertWork ew;
      ew.w13 = &w.w13;
      ew.w2 = &w.w2;
      ew.expert = e;
      ew.inter = c.inter;
      ew.tokens = tok.data() + offset[e];
      ew.weights = wts.data() + offset[e];
      ew.slots = slot.data() + offset[e];
      ew.slot_out = slotc;
      ew.m = counts[e];
      ew.h = hbuf.data() + offset[e] * c.inter;
      ew.table13 = tables_for(w.w13, e);
      ew.table2 = tables_for(w.w2, e);
      work.push_back(ew);
    }
    if (has_shared) {
      ExpertWork ew;
      ew.w13 = &*w.shared_w13;
      ew.w2 = &*w.shared_w2;
      ew.inter = c.shared_inter;
      ew.tokens = iota_tokens.data();
      ew.m = tc;
      ew.h = hbuf.data() + offset[E] * c.inter;
      ew.table13 = tables_for(*w.shared_w13, 0);
      ew.table2 = tables_for(*w.shared_w2, 0);
      work.push_back(ew);
    }

    // gate_up + SiLU·up: items = (expert, block of kGateUpRows gate rows).
    std::vector<std::pair<int32_t, int32_t>> items;  // (work index, first gate row)
    for (size_t i = 0; i < work.size(); ++i)
      for (int64_t r = 0; r < work[i].inter; r += kGateUpRows) items.emplace_back(int32_t(i), int32_t(r));
    parallel_for(int64_t(items.size()), threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t it = b; it < e; ++it) {
        const ExpertWork& ew = work[size_t(items[size_t(it)].first)];
        const int64_t r0 = items[size_t(it)].second;
        gate_up_rows(ew, xc, H, r0, std::min(r0 + kGateUpRows, ew.inter), bf16);
      }
    });

    // down + weighted combine: each item owns output columns [r0, r1) of every token, and
    // walks the experts in a fixed order, so the sum is deterministic and race-free.
    parallel_for((H + kDownRows - 1) / kDownRows, threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t blk = b; blk < e; ++blk) {
        const int64_t r0 = blk * kDownRows, r1 = std::min(H, r0 + kDownRows);
        for (const ExpertWork& ew : work) down_rows(ew, outc, H, r0, r1);
      }
    });
  }
}

}  // namespace

RoutingResult route_cpu(const MoeConfig& cfg, const float* logits, const float* bias, int64_t tokens) {
  return route_tokens(cfg, logits, bias, tokens, default_num_threads());
}

MoeOutput moe_forward_cpu(const MoeLayerWeights& w, const float* x_in, int64_t tokens, const CpuMoeOptions& opt) {
  validate_layer(w);
  FP4MOE_CHECK(tokens >= 0, "moe_forward_cpu: {} tokens", tokens);
  const MoeConfig& c = w.cfg;
  const int64_t H = c.hidden, E = c.num_experts, K = c.top_k, T = tokens;
  const int threads = opt.threads > 0 ? opt.threads : default_num_threads();
  MoeOutput res;
  res.out.assign(size_t(T * H), 0.0f);
  if (T == 0) {
    res.routing.top_k = K;
    return res;
  }
  std::vector<float> x_rounded;
  const float* x = gemm_input(x_in, T * H, opt.bf16_activations, threads, x_rounded);
  if (opt.router_logits) {
    res.logits.assign(opt.router_logits, opt.router_logits + T * E);
  } else {
    res.logits.resize(size_t(T * E));
    router_logits(w, x, T, threads, res.logits.data());
  }
  res.routing = route_tokens(c, res.logits.data(), w.router_bias.empty() ? nullptr : w.router_bias.data(), T, threads);
  ExpertsPass p;
  p.ids = res.routing.topk_ids.data();
  p.weights = res.routing.topk_weights.data();
  p.top_k = K;
  p.shared = c.shared_inter > 0;
  p.out = res.out.data();
  experts_pass(w, x, T, p, threads, opt.bf16_activations);
  return res;
}

namespace {

// The experts pass on caller-given routing: x rounded as the GEMMs see it, then experts_pass.
void run_experts(const MoeLayerWeights& w, const float* x_in, int64_t tokens, const ExpertsPass& p,
                 const CpuMoeOptions& opt) {
  if (tokens == 0) return;
  const int threads = opt.threads > 0 ? opt.threads : default_num_threads();
  std::vector<float> x_rounded;
  const float* x = gemm_input(x_in, tokens * w.cfg.hidden, opt.bf16_activations, threads, x_rounded);
  experts_pass(w, x, tokens, p, threads, opt.bf16_activations);
}

}  // namespace

void moe_experts_cpu(const MoeLayerWeights& w, const float* x_in, int64_t tokens, const MoeExpertsArgs& a,
                     float* out, const CpuMoeOptions& opt) {
  validate_experts(w, x_in, tokens, a);
  FP4MOE_CHECK(out != nullptr || tokens == 0, "moe_experts_cpu: no output");
  FP4MOE_CHECK(!a.shared || w.cfg.shared_inter > 0, "moe_experts_cpu: the layer has no shared expert");
  ExpertsPass p;
  p.ids = a.topk_ids;
  p.weights = a.topk_weights;
  p.top_k = a.top_k;
  p.shared = a.shared;
  p.out = out;
  run_experts(w, x_in, tokens, p, opt);
}

void moe_expert_slots_cpu(const MoeLayerWeights& w, const float* x_in, int64_t tokens, const int32_t* topk_ids,
                          int64_t top_k, float* slot_out, const CpuMoeOptions& opt) {
  validate_experts(w, x_in, tokens, {topk_ids, nullptr, top_k, false});
  FP4MOE_CHECK(slot_out != nullptr || tokens == 0, "moe_expert_slots_cpu: no output");
  ExpertsPass p;
  p.ids = topk_ids;
  p.top_k = top_k;
  p.slot_out = slot_out;
  run_experts(w, x_in, tokens, p, opt);
}

}  // namespace fp4moe
