// The CPU MoE layer against a plain FP64 implementation written here (own decode, own
// routing, simple loops in doubles), plus routing tie-rule tests on constructed inputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "cpu/moe_cpu.hpp"

using namespace fp4moe;

namespace {

// ---------------------------------------------------------------- FP64 reference decode
double ref_e2m1(int code) {
  static const double kMag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8) ? -kMag[code & 7] : kMag[code & 7];
}
double ref_e4m3(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  const double v = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1 + m / 8.0) * std::pow(2.0, e - 7);
  return s ? -v : v;
}
double ref_e8m0(uint8_t c) { return std::pow(2.0, int(c) - 127); }

// Expert e of a stack as a dense [n, k] double matrix.
std::vector<double> ref_dense(const ExpertStack& s, int64_t e) {
  std::vector<double> d(size_t(s.n * s.k));
  for (int64_t r = 0; r < s.n; ++r)
    for (int64_t k = 0; k < s.k; ++k) {
      const int64_t i = (e * s.n + r) * s.k + k;
      if (s.format == WeightFormat::BF16) {
        d[size_t(r * s.k + k)] = bf16_to_float(s.bf16[size_t(i)]);
        continue;
      }
      const uint8_t byte = s.packed[size_t(i / 2)];
      const int code = (k % 2 == 0) ? (byte & 15) : (byte >> 4);
      const int64_t blk = s.format == WeightFormat::NVFP4 ? 16 : 32;
      const uint8_t sc = s.scales[size_t(((e * s.n + r) * s.k + k) / blk)];
      const double scale = s.format == WeightFormat::NVFP4 ? ref_e4m3(sc) * double(s.global_scale[size_t(e)])
                                                           : ref_e8m0(sc);
      d[size_t(r * s.k + k)] = ref_e2m1(code) * scale;
    }
  return d;
}

struct RefRouting {
  std::vector<int32_t> ids;
  std::vector<double> weights;
};

// Straightforward routing: full sorts, doubles.
RefRouting ref_route(const MoeConfig& c, const std::vector<double>& logits, const float* bias) {
  const int64_t E = c.num_experts;
  std::vector<double> score(static_cast<size_t>(E)), sel(static_cast<size_t>(E));
  if (c.scoring == ScoringFunc::Sigmoid) {
    for (int64_t e = 0; e < E; ++e) score[e] = 1 / (1 + std::exp(-logits[e]));
  } else {
    const double mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += score[e] = std::exp(logits[e] - mx);
    for (auto& s : score) s /= sum;
  }
  for (int64_t e = 0; e < E; ++e) sel[e] = score[e] + (bias ? bias[e] : 0.0);
  std::vector<bool> eligible(static_cast<size_t>(E), true);
  if (c.n_group > 1) {
    const int64_t gs = E / c.n_group;
    std::vector<std::pair<double, int64_t>> groups;  // (-score, group) sorts best first, lower id on ties
    for (int64_t g = 0; g < c.n_group; ++g) {
      std::vector<double> v(sel.begin() + g * gs, sel.begin() + (g + 1) * gs);
      std::sort(v.rbegin(), v.rend());
      groups.push_back({-(v[0] + (gs > 1 ? v[1] : 0.0)), g});
    }
    std::sort(groups.begin(), groups.end());
    std::fill(eligible.begin(), eligible.end(), false);
    for (int64_t j = 0; j < c.topk_group; ++j)
      for (int64_t e = groups[j].second * gs; e < (groups[j].second + 1) * gs; ++e) eligible[e] = true;
  }
  std::vector<std::pair<double, int32_t>> cand;
  for (int64_t e = 0; e < E; ++e)
    if (eligible[e]) cand.push_back({-sel[e], int32_t(e)});
  std::sort(cand.begin(), cand.end());
  RefRouting r;
  double sum = 0;
  for (int64_t j = 0; j < c.top_k; ++j) {
    r.ids.push_back(cand[j].second);
    r.weights.push_back(score[cand[j].second]);
    sum += r.weights.back();
  }
  for (auto& w : r.weights) w = w / (c.norm_topk_prob ? sum : 1.0) * c.routed_scaling;
  return r;
}

struct RefOutput {
  std::vector<int32_t> ids;      // [T, k]
  std::vector<double> weights;   // [T, k]
  std::vector<double> out;       // [T, H]
};

double rnd_bf16(double v, bool on) { return on ? double(round_to_bf16(float(v))) : v; }

// One expert's FFN in doubles: down · (SiLU(gate · x) ⊙ (up · x)).
void ref_expert(const std::vector<double>& w13, const std::vector<double>& w2, int64_t H, int64_t I,
                const std::vector<double>& x, double weight, bool bf16, double* out) {
  std::vector<double> h(static_cast<size_t>(I));
  for (int64_t i = 0; i < I; ++i) {
    double g = 0, u = 0;
    for (int64_t k = 0; k < H; ++k) {
      g += w13[size_t(i * H + k)] * x[size_t(k)];
      u += w13[size_t((I + i) * H + k)] * x[size_t(k)];
    }
    h[size_t(i)] = rnd_bf16(g / (1 + std::exp(-g)) * u, bf16);
  }
  for (int64_t r = 0; r < H; ++r) {
    double y = 0;
    for (int64_t i = 0; i < I; ++i) y += w2[size_t(r * I + i)] * h[size_t(i)];
    out[r] += weight * y;
  }
}

RefOutput ref_forward(const MoeLayerWeights& w, const std::vector<float>& x, int64_t T, bool bf16) {
  const MoeConfig& c = w.cfg;
  const int64_t H = c.hidden, E = c.num_experts, I = c.inter;
  std::vector<std::vector<double>> d13(static_cast<size_t>(E)), d2(static_cast<size_t>(E));
  std::vector<bool> decoded(static_cast<size_t>(E), false);
  RefOutput r;
  r.out.assign(size_t(T * H), 0.0);
  std::vector<double> sh13, sh2;
  if (c.shared_inter > 0) {
    sh13 = ref_dense(*w.shared_w13, 0);
    sh2 = ref_dense(*w.shared_w2, 0);
  }
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> xt(static_cast<size_t>(H));
    for (int64_t k = 0; k < H; ++k) xt[size_t(k)] = rnd_bf16(x[size_t(t * H + k)], bf16);
    std::vector<double> logits(static_cast<size_t>(E), 0.0);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t k = 0; k < H; ++k) logits[e] += double(w.router_w[size_t(e * H + k)]) * xt[size_t(k)];
    RefRouting rt = ref_route(c, logits, w.router_bias.empty() ? nullptr : w.router_bias.data());
    for (int64_t j = 0; j < c.top_k; ++j) {
      const int32_t e = rt.ids[size_t(j)];
      if (!decoded[size_t(e)]) {
        d13[size_t(e)] = ref_dense(w.w13, e);
        d2[size_t(e)] = ref_dense(w.w2, e);
        decoded[size_t(e)] = true;
      }
      ref_expert(d13[size_t(e)], d2[size_t(e)], H, I, xt, rt.weights[size_t(j)], bf16, r.out.data() + t * H);
    }
    if (c.shared_inter > 0) ref_expert(sh13, sh2, H, c.shared_inter, xt, 1.0, bf16, r.out.data() + t * H);
    r.ids.insert(r.ids.end(), rt.ids.begin(), rt.ids.end());
    r.weights.insert(r.weights.end(), rt.weights.begin(), rt.weights.end());
  }
  return r;
}

// ---------------------------------------------------------------- random layers
// Random FP4 stacks are random packed bytes with random valid scales: every such byte
// pattern is a valid FP4 matrix (includes -0, ±6 and a few subnormal / zero E4M3 scales).
ExpertStack random_stack(WeightFormat f, int64_t E, int64_t n, int64_t k, std::mt19937& rng) {
  ExpertStack s;
  s.format = f;
  s.num_experts = E;
  s.n = n;
  s.k = k;
  const double target = 1.0 / std::sqrt(double(k));  // element std ~ 1/sqrt(K)
  if (f == WeightFormat::BF16) {
    std::normal_distribution<float> nd(0.0f, float(target));
    s.bf16.resize(size_t(E * n * k));
    for (auto& v : s.bf16) v = float_to_bf16(nd(rng));
    return s;
  }
  std::uniform_int_distribution<int> byte(0, 255), pct(0, 99);
  s.packed.resize(size_t(E * n * k / 2));
  for (auto& b : s.packed) b = uint8_t(byte(rng));
  s.scales.resize(size_t(E * n * k / s.block()));
  // Random E2M1 has rms ~ 3.2: pick the block scales so the elements come out ~ target.
  if (f == WeightFormat::NVFP4) {
    std::uniform_int_distribution<int> normal(0x30, 0x40), sub(0x00, 0x07);  // E4M3 0.5..2; subnormals
    for (auto& c : s.scales) c = uint8_t(pct(rng) < 3 ? sub(rng) : normal(rng));
    std::uniform_real_distribution<float> g(0.5f, 1.5f);
    s.global_scale.resize(size_t(E));
    for (auto& v : s.global_scale) v = float(target / 3.2) * g(rng);
  } else {
    const int base = 127 + int(std::lround(std::log2(target / 3.2)));
    std::uniform_int_distribution<int> e8(base - 1, base + 1);
    for (auto& c : s.scales) c = uint8_t(e8(rng));
    s.global_scale.assign(size_t(E), 1.0f);
  }
  return s;
}

enum class Routing { SigmoidGrouped, SoftmaxNorm, SoftmaxNoNorm };

constexpr int64_t kColdA = 5, kColdB = 17, kHot = 3;  // experts forced cold / hot via feature 0

MoeLayerWeights random_layer(Routing routing, WeightFormat f, bool shared, int64_t H, int64_t I, uint32_t seed) {
  std::mt19937 rng(seed);
  MoeLayerWeights w;
  MoeConfig& c = w.cfg;
  c.hidden = H;
  c.inter = I;
  c.num_experts = 32;
  c.top_k = 4;
  if (routing == Routing::SigmoidGrouped) {  // GLM-5 / DeepSeek-V3 style
    c.scoring = ScoringFunc::Sigmoid;
    c.n_group = 4;
    c.topk_group = 2;
    c.norm_topk_prob = true;
    c.routed_scaling = 2.5f;
  } else {  // Qwen3 style
    c.scoring = ScoringFunc::Softmax;
    c.norm_topk_prob = routing == Routing::SoftmaxNorm;
  }
  c.shared_inter = shared ? I : 0;
  std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(float(H)));
  w.router_w.resize(size_t(c.num_experts * H));
  for (auto& v : w.router_w) v = nd(rng);
  // Feature 0 of x is ~3 for every token: these router entries make experts always cold / hot.
  w.router_w[size_t(kColdA * H)] = -8.0f;
  w.router_w[size_t(kColdB * H)] = -8.0f;
  w.router_w[size_t(kHot * H)] = 8.0f;
  if (routing == Routing::SigmoidGrouped) {
    std::uniform_real_distribution<float> b(-0.1f, 0.1f);
    w.router_bias.resize(size_t(c.num_experts));
    for (auto& v : w.router_bias) v = b(rng);
  }
  w.w13 = random_stack(f, c.num_experts, 2 * I, H, rng);
  w.w2 = random_stack(f, c.num_experts, H, I, rng);
  if (shared) {
    w.shared_w13 = random_stack(f, 1, 2 * I, H, rng);
    w.shared_w2 = random_stack(f, 1, H, I, rng);
  }
  return w;
}

std::vector<float> random_x(int64_t T, int64_t H, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(T * H));
  for (auto& v : x) v = nd(rng);
  for (int64_t t = 0; t < T; ++t) x[size_t(t * H)] = 3.0f + 0.1f * nd(rng);
  return x;
}

double rel_err(const std::vector<float>& out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double(out[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

// ---------------------------------------------------------------- layer vs FP64
struct Case {
  Routing routing;
  WeightFormat format;
  bool shared;
  int64_t tokens;
};

std::string case_name(const testing::TestParamInfo<Case>& i) {
  const char* r[] = {"SigmoidGrouped", "SoftmaxNorm", "SoftmaxNoNorm"};
  return std::string(r[int(i.param.routing)]) + "_" + std::string(weight_format_name(i.param.format)) +
         (i.param.shared ? "_Shared" : "_NoShared") + "_T" + std::to_string(i.param.tokens);
}

class MoeCpuVsFp64 : public testing::TestWithParam<Case> {};

TEST_P(MoeCpuVsFp64, MatchesReference) {
  const Case p = GetParam();
  const int64_t H = 192, I = 96;
  const MoeLayerWeights w = random_layer(p.routing, p.format, p.shared, H, I, 1234u + uint32_t(p.tokens));
  const std::vector<float> x = random_x(p.tokens, H, 99u + uint32_t(p.tokens));
  for (bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "bf16 activations" : "fp32 activations");
    CpuMoeOptions opt;
    opt.bf16_activations = bf16;
    MoeOutput got = moe_forward_cpu(w, x.data(), p.tokens, opt);
    const RefOutput ref = ref_forward(w, x, p.tokens, bf16);
    ASSERT_EQ(got.routing.tokens, p.tokens);
    ASSERT_EQ(got.routing.top_k, w.cfg.top_k);
    ASSERT_EQ(got.routing.topk_ids, ref.ids);
    double wnum = 0, wden = 0;
    for (size_t i = 0; i < ref.weights.size(); ++i) {
      wnum += std::pow(got.routing.topk_weights[i] - ref.weights[i], 2);
      wden += ref.weights[i] * ref.weights[i];
    }
    // Weights: FP32 logits/sigmoid/softmax vs FP64, a few ulp.
    EXPECT_LT(std::sqrt(wnum / wden), 1e-5);
    // FP32 accumulation over K <= 192 of random-sign terms: ~sqrt(K)·2^-24 ≈ 1e-6 relative.
    // With BF16 activations both sides round x and h to BF16, but a float h lying within
    // ~1e-7 of a BF16 rounding midpoint may round the other way (probability ~5e-5 per
    // element, one BF16 ulp = 2^-8 each): ~3e-5 of the output norm at T=1000. Hence 2e-4.
    EXPECT_LT(rel_err(got.out, ref.out), bf16 ? 2e-4 : 1e-5);
    if (p.tokens >= 1000) {  // the cold experts got no token, the hot one (nearly) every token
      std::vector<int64_t> count(size_t(w.cfg.num_experts), 0);
      for (int32_t id : got.routing.topk_ids) count[size_t(id)]++;
      EXPECT_EQ(count[kColdA], 0);
      EXPECT_EQ(count[kColdB], 0);
      if (p.routing == Routing::SigmoidGrouped)  // its group may lose to two others' best pairs
        EXPECT_GT(count[kHot], p.tokens / 2);
      else
        EXPECT_EQ(count[kHot], p.tokens);
    }
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> v;
  for (Routing r : {Routing::SigmoidGrouped, Routing::SoftmaxNorm, Routing::SoftmaxNoNorm})
    for (WeightFormat f : {WeightFormat::NVFP4, WeightFormat::MXFP4, WeightFormat::BF16})
      for (bool shared : {true, false})
        for (int64_t T : {int64_t(1), int64_t(1000)}) v.push_back({r, f, shared, T});
  return v;
}
INSTANTIATE_TEST_SUITE_P(All, MoeCpuVsFp64, testing::ValuesIn(all_cases()), case_name);

TEST(MoeCpu, ReductionTailAndTokenTiles) {
  // I = 80: the down GEMM's K % 32 == 16 tail; T = 37 exercises every token-tile size.
  for (WeightFormat f : {WeightFormat::NVFP4, WeightFormat::BF16}) {
    const MoeLayerWeights w = random_layer(Routing::SigmoidGrouped, f, true, 128, 80, 7u);
    const std::vector<float> x = random_x(37, 128, 8u);
    CpuMoeOptions opt;
    opt.bf16_activations = false;
    MoeOutput got = moe_forward_cpu(w, x.data(), 37, opt);
    const RefOutput ref = ref_forward(w, x, 37, false);
    EXPECT_EQ(got.routing.topk_ids, ref.ids);
    EXPECT_LT(rel_err(got.out, ref.out), 1e-5);  // FP32 vs FP64 accumulation, as above
  }
}

TEST(MoeCpu, DeterministicAcrossThreadCounts) {
  const MoeLayerWeights w = random_layer(Routing::SigmoidGrouped, WeightFormat::NVFP4, true, 192, 96, 3u);
  const std::vector<float> x = random_x(200, 192, 4u);
  CpuMoeOptions one, two, five;
  one.threads = 1;
  two.threads = 2;
  five.threads = 5;
  const MoeOutput a = moe_forward_cpu(w, x.data(), 200, one);
  const MoeOutput b = moe_forward_cpu(w, x.data(), 200, two);
  const MoeOutput c = moe_forward_cpu(w, x.data(), 200, five);
  EXPECT_EQ(a.out, b.out);  // bitwise: every output element is summed in one fixed order
  EXPECT_EQ(a.out, c.out);
  EXPECT_EQ(a.routing.topk_ids, b.routing.topk_ids);
}

// The layer returns the logits it routed on; routing on given logits (what the GPU tests do with
// the GPU's) reproduces the run when they are its own, and follows them when they differ.
TEST(MoeCpu, RoutesOnGivenLogits) {
  const MoeLayerWeights w = random_layer(Routing::SigmoidGrouped, WeightFormat::NVFP4, true, 192, 96, 13u);
  const int64_t T = 9, E = w.cfg.num_experts, k = w.cfg.top_k;
  const std::vector<float> x = random_x(T, 192, 14u);
  const MoeOutput own = moe_forward_cpu(w, x.data(), T);
  ASSERT_EQ(own.logits.size(), size_t(T * E));
  CpuMoeOptions opt;
  opt.router_logits = own.logits.data();
  const MoeOutput again = moe_forward_cpu(w, x.data(), T, opt);
  EXPECT_EQ(again.out, own.out);
  EXPECT_EQ(again.routing.topk_ids, own.routing.topk_ids);
  std::vector<float> forced(size_t(T * E), -5.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) forced[size_t(t * E + (E - 1 - j))] = 5.0f;  // the last k experts win
  opt.router_logits = forced.data();
  const MoeOutput f = moe_forward_cpu(w, x.data(), T, opt);
  EXPECT_EQ(f.logits, forced);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) EXPECT_GE(f.routing.topk_ids[size_t(t * k + j)], E - k) << t;
}

TEST(MoeCpu, Bf16ActivationsRoundXAndH) {
  const MoeLayerWeights w = random_layer(Routing::SoftmaxNorm, WeightFormat::NVFP4, false, 192, 96, 5u);
  const std::vector<float> x = random_x(50, 192, 6u);
  CpuMoeOptions on, off;
  off.bf16_activations = false;
  const MoeOutput a = moe_forward_cpu(w, x.data(), 50, on);
  const MoeOutput b = moe_forward_cpu(w, x.data(), 50, off);
  std::vector<double> bd(b.out.begin(), b.out.end());
  // BF16 has 8 significant bits: rounding x and h moves the output by ~2^-9 relative.
  const double d = rel_err(a.out, bd);
  EXPECT_GT(d, 1e-4);
  EXPECT_LT(d, 2e-2);
}

TEST(MoeCpu, ZeroTokensAndBadLayers) {
  MoeLayerWeights w = random_layer(Routing::SigmoidGrouped, WeightFormat::NVFP4, true, 64, 32, 9u);
  MoeOutput empty = moe_forward_cpu(w, nullptr, 0);
  EXPECT_TRUE(empty.out.empty());
  EXPECT_TRUE(empty.routing.topk_ids.empty());
  std::vector<float> x = random_x(2, 64, 1u);

  MoeLayerWeights bad = w;
  bad.router_w.pop_back();
  EXPECT_THROW(moe_forward_cpu(bad, x.data(), 2), Error);
  bad = w;
  bad.w2.n = 32;
  EXPECT_THROW(moe_forward_cpu(bad, x.data(), 2), Error);
  bad = w;
  bad.cfg.topk_group = 5;
  EXPECT_THROW(moe_forward_cpu(bad, x.data(), 2), Error);
  bad = w;
  bad.shared_w2.reset();
  EXPECT_THROW(moe_forward_cpu(bad, x.data(), 2), Error);
  bad = w;
  bad.w13.scales.pop_back();
  EXPECT_THROW(moe_forward_cpu(bad, x.data(), 2), Error);
}

// ---------------------------------------------------------------- routing rules
MoeConfig route_cfg(int64_t E, int64_t k, ScoringFunc s, int64_t n_group = 1, int64_t topk_group = 1) {
  MoeConfig c;
  c.hidden = 16;
  c.inter = 16;
  c.num_experts = E;
  c.top_k = k;
  c.scoring = s;
  c.n_group = n_group;
  c.topk_group = topk_group;
  return c;
}

TEST(RouteCpu, TiesGoToTheLowerExpertId) {
  MoeConfig c = route_cfg(8, 3, ScoringFunc::Sigmoid);
  const std::vector<float> equal(8, 0.25f);
  EXPECT_EQ(route_cpu(c, equal.data(), nullptr, 1).topk_ids, (std::vector<int32_t>{0, 1, 2}));
  const std::vector<float> l = {1, 3, 3, 2, 3, 0, 2, 3};
  EXPECT_EQ(route_cpu(c, l.data(), nullptr, 1).topk_ids, (std::vector<int32_t>{1, 2, 4}));
  c.scoring = ScoringFunc::Softmax;
  EXPECT_EQ(route_cpu(c, l.data(), nullptr, 1).topk_ids, (std::vector<int32_t>{1, 2, 4}));
  // A tie made by the bias: expert 6 (logit 2, +bias) ties expert 1's biased score exactly.
  c.scoring = ScoringFunc::Sigmoid;
  std::vector<float> zero(8, 0.0f);
  std::vector<float> bias(8, 0.0f);
  bias[6] = 0.5f;
  bias[1] = 0.5f;
  const RoutingResult r = route_cpu(c, zero.data(), bias.data(), 1);
  EXPECT_EQ(r.topk_ids, (std::vector<int32_t>{1, 6, 0}));
}

TEST(RouteCpu, GroupTiesGoToTheLowerGroupAndOtherGroupsAreExcluded) {
  // 4 experts in 2 groups, 1 group kept. Equal group scores: group 0 wins.
  MoeConfig c = route_cfg(4, 2, ScoringFunc::Sigmoid, 2, 1);
  const std::vector<float> l = {0.5f, -0.5f, -0.5f, 0.5f};
  EXPECT_EQ(route_cpu(c, l.data(), nullptr, 1).topk_ids, (std::vector<int32_t>{0, 1}));
  // Negative selection scores in the kept group: the other group's experts are excluded
  // (as DeepSeek-V3's reference masks them with -inf), not treated as score 0.
  const std::vector<float> zero(4, 0.0f);
  const std::vector<float> bias = {-5.0f, -6.0f, -5.5f, -7.0f};  // group scores -10 vs -11.5
  EXPECT_EQ(route_cpu(c, zero.data(), bias.data(), 1).topk_ids, (std::vector<int32_t>{0, 1}));
}

TEST(RouteCpu, GroupScoreIsTheSumOfTheBestTwo) {
  // Group 0: {0.9, 0.0, 0.0} (best single, sum of top-2 low); group 1: {0.6, 0.6, 0.0}.
  MoeConfig c = route_cfg(6, 1, ScoringFunc::Sigmoid, 2, 1);
  std::vector<float> zero(6, 0.0f);
  const std::vector<float> bias = {0.4f, -0.5f, -0.5f, 0.1f, 0.1f, -0.5f};  // +0.5 = sigmoid(0)
  const RoutingResult r = route_cpu(c, zero.data(), bias.data(), 1);
  EXPECT_EQ(r.topk_ids, (std::vector<int32_t>{3}));  // group 1 (1.2) beats group 0 (0.9)
}

TEST(RouteCpu, WeightsFromUnbiasedScoresNormalisedAndScaled) {
  MoeConfig c = route_cfg(4, 2, ScoringFunc::Sigmoid);
  c.routed_scaling = 2.5f;
  const std::vector<float> l = {0.0f, 1.0f, 2.0f, -1.0f};
  const std::vector<float> bias = {10.0f, 0.0f, 0.0f, 0.0f};  // expert 0 selected only by the bias
  RoutingResult r = route_cpu(c, l.data(), bias.data(), 1);
  ASSERT_EQ(r.topk_ids, (std::vector<int32_t>{0, 2}));
  const double s0 = 0.5, s2 = 1 / (1 + std::exp(-2.0));
  EXPECT_NEAR(r.topk_weights[0], 2.5 * s0 / (s0 + s2), 1e-6);
  EXPECT_NEAR(r.topk_weights[1], 2.5 * s2 / (s0 + s2), 1e-6);
  c.norm_topk_prob = false;
  r = route_cpu(c, l.data(), bias.data(), 1);
  EXPECT_NEAR(r.topk_weights[0], 2.5 * s0, 1e-6);
  EXPECT_NEAR(r.topk_weights[1], 2.5 * s2, 1e-6);
}

TEST(RouteCpu, RandomLogitsMatchReference) {
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (ScoringFunc s : {ScoringFunc::Sigmoid, ScoringFunc::Softmax}) {
    MoeConfig c = route_cfg(64, 6, s, 8, 3);
    c.norm_topk_prob = s == ScoringFunc::Sigmoid;
    const int64_t T = 500;
    std::vector<float> logits(size_t(T * 64)), bias(64);
    for (auto& v : logits) v = nd(rng);
    for (auto& v : bias) v = 0.05f * nd(rng);
    const RoutingResult r = route_cpu(c, logits.data(), bias.data(), T);
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<double> lt(logits.begin() + t * 64, logits.begin() + (t + 1) * 64);
      const RefRouting ref = ref_route(c, lt, bias.data());
      for (int64_t j = 0; j < 6; ++j) {
        ASSERT_EQ(r.topk_ids[size_t(t * 6 + j)], ref.ids[size_t(j)]) << "token " << t;
        EXPECT_NEAR(r.topk_weights[size_t(t * 6 + j)], ref.weights[size_t(j)], 1e-6);
      }
    }
  }
}

TEST(RouteCpu, NanLogitsNeverWin) {
  MoeConfig c = route_cfg(4, 2, ScoringFunc::Sigmoid);
  const std::vector<float> l = {NAN, 0.0f, 1.0f, NAN};
  EXPECT_EQ(route_cpu(c, l.data(), nullptr, 1).topk_ids, (std::vector<int32_t>{2, 1}));
}

}  // namespace
