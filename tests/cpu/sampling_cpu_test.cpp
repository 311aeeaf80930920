// cpu::sample_cpu, the engine's one draw (core/sampling_scheme.hpp): the Philox stream (known
// answers, open interval), greedy and its ties, seeds, the Gumbel-max draw against the softmax
// of the kept set (chi-square, over steps, over seeds, over token ids), truncation against its
// definition, penalties, logprobs against a double-precision reference, the reported margins
// against brute force, the margin rule under perturbed logits, masked rows, refusals.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "cpu/sampling_cpu.hpp"
#include "core/sampling_scheme.hpp"

namespace fp4moe::test {
namespace {

using cpu::SamplingParams;

cpu::SampledToken draw(const std::vector<float>& l, const SamplingParams& p, uint64_t step = 0,
                       const std::vector<int32_t>& prompt = {}, const std::vector<int32_t>& out = {}) {
  return cpu::sample_cpu(l.data(), int64_t(l.size()), p, prompt, out, step);
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

std::vector<float> random_logits(size_t n, uint64_t seed, float scale = 3.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// The chi-square critical value of `dof` degrees of freedom at p = 1e-4 (Wilson–Hilferty:
// z = 3.719). Every statistical test below is deterministic (fixed seeds); the bound says how
// unlikely a pass would be for a draw that does not follow the distribution.
double chi2_critical(int dof) {
  const double k = dof, z = 3.719, a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// Σ (observed − expected)² / expected over the bins with expected > 0; an observation in a
// bin with expected 0 is a failure by itself (returns infinity).
double chi2(const std::vector<int64_t>& count, const std::vector<double>& prob, int64_t n) {
  double s = 0.0;
  for (size_t i = 0; i < count.size(); ++i) {
    if (prob[i] == 0.0) {
      if (count[i]) return INFINITY;
      continue;
    }
    const double e = prob[i] * double(n);
    s += (double(count[i]) - e) * (double(count[i]) - e) / e;
  }
  return s;
}

std::vector<double> softmax(const std::vector<float>& l, float t) {
  std::vector<double> p(l.size());
  double z = 0.0;
  for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp(double(l[i]) / t);
  for (double& v : p) v /= z;
  return p;
}

TEST(SamplingCpu, PhiloxKnownAnswers) {  // Random123's kat_vectors for philox4x32-10
  const cpu::Philox4 z = cpu::philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(z.v[0], 0x6627e8d5u);
  EXPECT_EQ(z.v[1], 0xe169c58du);
  EXPECT_EQ(z.v[2], 0xbc57ac4cu);
  EXPECT_EQ(z.v[3], 0x9b00dbd8u);
  const uint32_t f = 0xffffffffu;
  const cpu::Philox4 o = cpu::philox4x32_10(f, f, f, f, f, f);
  EXPECT_EQ(o.v[0], 0x408f276du);
  EXPECT_EQ(o.v[1], 0x41c83b0eu);
  EXPECT_EQ(o.v[2], 0xa20bc7c6u);
  EXPECT_EQ(o.v[3], 0x6d5451fdu);
}

TEST(SamplingCpu, UniformsAreOpenAndDependOnSeedStepAndToken) {
  EXPECT_EQ(cpu::bits_to_open_uniform(0u), 1.0f / 16777216.0f);
  EXPECT_EQ(cpu::bits_to_open_uniform(0xffffffffu), 1.0f - 1.0f / 16777216.0f);
  const uint32_t a = cpu::sample_bits(7, 3, 100);
  EXPECT_EQ(a, cpu::sample_bits(7, 3, 100));
  EXPECT_NE(a, cpu::sample_bits(8, 3, 100));
  EXPECT_NE(a, cpu::sample_bits(7, 4, 100));
  EXPECT_NE(a, cpu::sample_bits(7, 3, 101));
  EXPECT_NE(cpu::sample_bits(7, uint64_t(3) << 32, 100), a);  // the step's high word counts
  EXPECT_NE(cpu::sample_bits(uint64_t(7) << 32, 3, 100), a);  // and the seed's
  // The Gumbel part of a key stays inside [−kGumbelBound, kGumbelBound] at both ends of the grid
  // (the one-pass skip relies on it).
  for (uint32_t bits : {0u, 0xffffffffu}) {
    const float g = cpu::gumbel_key(0.0f, bits);
    EXPECT_LT(std::abs(g), cpu::kGumbelBound) << bits;
  }
  // sampling_uniform (speculative decoding's streams): [0, 1), 100 bins, chi-square.
  std::vector<int64_t> bins(100, 0);
  const int64_t n = 100000;
  for (int64_t s = 0; s < n; ++s) {
    const double u = cpu::sampling_uniform(uint64_t(s % 7), uint64_t(s));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ++bins[size_t(u * 100)];
  }
  EXPECT_LT(chi2(bins, std::vector<double>(100, 0.01), n), chi2_critical(99));
  EXPECT_NE(cpu::sampling_uniform(1, 2), cpu::sampling_uniform(2, 2));
  EXPECT_NE(cpu::sampling_uniform(1, 2), cpu::sampling_uniform(1, 3));
}

TEST(SamplingCpu, OrderKeyRoundTripsAndOrders) {
  const float vals[] = {-INFINITY, -3.5f, -0.0f, 0.0f, 1e-30f, 2.0f, INFINITY};
  for (size_t i = 0; i < std::size(vals); ++i) {
    EXPECT_EQ(cpu::float_from_order_key(cpu::float_order_key(vals[i])), vals[i]);
    if (i) {
      EXPECT_LT(cpu::float_order_key(vals[i - 1]), cpu::float_order_key(vals[i]));
    }
  }
  EXPECT_EQ(cpu::float_order_key(NAN), 0u);
}

TEST(SamplingCpu, GreedyTakesTheHighestLogitAndTheLowerIdOnTies) {
  EXPECT_EQ(draw({0.1f, 3.0f, -1.0f, 3.0f}, greedy()).token, 1);
  EXPECT_EQ(draw({-5.0f}, greedy()).token, 0);
  SamplingParams p;  // top_k 1 is greedy at any temperature
  p.temperature = 1.7f;
  p.top_k = 1;
  for (uint64_t s = 0; s < 50; ++s) EXPECT_EQ(draw({0.1f, 3.0f, 2.9f, 3.0f}, p, s).token, 1);
}

TEST(SamplingCpu, SameSeedAndStepSameTokenOtherSeedsVary) {
  std::vector<float> l(100);
  for (int i = 0; i < 100; ++i) l[size_t(i)] = std::sin(float(i));
  SamplingParams p;
  p.seed = 42;
  std::vector<int32_t> a, b, c;
  for (uint64_t s = 0; s < 50; ++s) {
    a.push_back(draw(l, p, s).token);
    b.push_back(draw(l, p, s).token);
  }
  p.seed = 43;
  for (uint64_t s = 0; s < 50; ++s) c.push_back(draw(l, p, s).token);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

// The draw follows softmax(logit / T): over the steps of one seed, over the seeds at one step
// (every request's first token), at two temperatures; a -inf logit is never drawn.
TEST(SamplingCpu, TemperatureDrawFollowsTheSoftmaxChiSquare) {
  const std::vector<float> l = {0.0f, std::log(2.0f), std::log(5.0f), -1.0f, 1.5f, -INFINITY};
  for (float t : {1.0f, 0.5f}) {
    SamplingParams p;
    p.temperature = t;
    const std::vector<double> want = softmax(l, t);
    const int64_t n = 30000;
    std::vector<int64_t> by_step(l.size(), 0), by_seed(l.size(), 0);
    p.seed = 77;
    for (int64_t s = 0; s < n; ++s) ++by_step[size_t(draw(l, p, uint64_t(s)).token)];
    for (int64_t s = 0; s < n; ++s) {
      p.seed = uint64_t(s) * 0x9E3779B97F4A7C15ull;
      ++by_seed[size_t(draw(l, p, 0).token)];
    }
    EXPECT_LT(chi2(by_step, want, n), chi2_critical(4)) << "T " << t << ", over steps";
    EXPECT_LT(chi2(by_seed, want, n), chi2_critical(4)) << "T " << t << ", over seeds";
  }
}

// Over the token ids: 256 equal logits, every token equally likely (the four words of one
// Philox call serve four neighbouring tokens; this sees a bias between them).
TEST(SamplingCpu, EqualLogitsDrawEveryTokenUniformlyChiSquare) {
  const std::vector<float> l(256, 0.25f);
  SamplingParams p;
  p.seed = 5;
  const int64_t n = 40000;
  std::vector<int64_t> count(l.size(), 0);
  for (int64_t s = 0; s < n; ++s) ++count[size_t(draw(l, p, uint64_t(s)).token)];
  EXPECT_LT(chi2(count, std::vector<double>(l.size(), 1.0 / 256), n), chi2_critical(255));
}

TEST(SamplingCpu, DrawFollowsTheSoftmaxOfTheKeptSetChiSquare) {
  const std::vector<float> l = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -3.0f};
  SamplingParams p;
  p.top_k = 4;
  p.seed = 1234;
  std::vector<double> want(l.size(), 0.0);
  double z = 0;
  for (size_t i = 0; i < 4; ++i) z += want[i] = std::exp(double(l[i]));
  for (double& v : want) v /= z;
  const int64_t n = 40000;
  std::vector<int64_t> count(l.size(), 0);
  for (int64_t s = 0; s < n; ++s) ++count[size_t(draw(l, p, uint64_t(s)).token)];
  EXPECT_LT(chi2(count, want, n), chi2_critical(3));
  // sampling_distribution (speculative decoding's p) is this distribution.
  const std::vector<double> d = cpu::sampling_distribution(l.data(), int64_t(l.size()), p, {}, {});
  for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(d[i], want[i], 1e-12) << i;
}

TEST(SamplingCpu, TopKTopPMinPTruncate) {
  const std::vector<float> l = {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)};
  auto support = [&](const SamplingParams& p) {
    std::set<int32_t> s;
    for (uint64_t i = 0; i < 2000; ++i) s.insert(draw(l, p, i).token);
    return s;
  };
  SamplingParams p;
  p.top_k = 2;  // {3, 2}
  EXPECT_EQ(support(p), (std::set<int32_t>{2, 3}));
  p.top_k = -1;
  p.top_p = 0.65f;  // 0.4 < 0.65 <= 0.7: {3, 2}
  EXPECT_EQ(support(p), (std::set<int32_t>{2, 3}));
  p.top_p = 0.3f;  // the best alone
  EXPECT_EQ(support(p), (std::set<int32_t>{3}));
  p.top_p = 1.0f;
  p.min_p = 0.45f;  // p >= 0.18: {3, 2, 1}
  EXPECT_EQ(support(p), (std::set<int32_t>{1, 2, 3}));
}

// The kept set by the definition: rank prefix cut by top-k, top-p (double masses), min-p.
size_t kept_by_definition(const std::vector<float>& x, const SamplingParams& p) {
  std::vector<int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  const double m = x[order[0]];
  std::vector<double> pr(x.size());
  for (size_t i = 0; i < x.size(); ++i) pr[i] = std::exp(double(x[order[i]]) - m);
  size_t n = p.top_k > 0 ? std::min(x.size(), size_t(p.top_k)) : x.size();
  const double mass = std::accumulate(pr.begin(), pr.begin() + ptrdiff_t(n), 0.0);
  if (p.top_p < 1.0f) {
    double c = 0;
    for (size_t i = 0; i < n; ++i)
      if ((c += pr[i] / mass) >= p.top_p) {
        n = i + 1;
        break;
      }
  }
  size_t k = 1;
  while (k < n && pr[k] >= double(p.min_p) * pr[0]) ++k;
  return k;
}

TEST(SamplingCpu, TruncationKeepsTheDefinedPrefix) {
  const int64_t V = 3000;
  int checked = 0;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    auto l = random_logits(size_t(V), seed + 100, 2.0f);
    SamplingParams p;
    p.temperature = 0.8f;
    p.top_k = seed % 4 == 0 ? -1 : int32_t(1 + seed * 37 % 500);
    p.top_p = seed % 3 == 0 ? 1.0f : 0.5f + 0.01f * float(seed);
    p.min_p = seed % 5 == 0 ? 0.02f : 0.0f;
    p.seed = seed;
    const auto got = draw(l, p);
    if (got.cut_margin < 1e-6) continue;  // a boundary within rounding: either answer is right
    std::vector<float> x(l);
    for (float& v : x) v = v / p.temperature;
    EXPECT_EQ(size_t(got.kept), kept_by_definition(x, p)) << "seed " << seed;
    ++checked;
  }
  EXPECT_GE(checked, 35);
}

// Top-p / min-p without top-k sort only the rank order's prefix they end in (1,024 tokens, four
// times as many while the cut lies beyond, the whole vocabulary last): a peaked distribution
// ends in the first prefix, a flat one in a longer one or the full sort. The kept set is the
// definition's either way, and the sparse distribution lists exactly the first `kept` tokens
// of the rank order.
TEST(SamplingCpu, TruncationWithoutTopKSortsOnlyThePrefixItNeeds) {
  const int64_t V = 20000;
  int checked = 0;
  for (uint64_t seed = 0; seed < 36; ++seed) {
    const float scale = seed % 3 == 0 ? 9.0f : seed % 3 == 1 ? 2.5f : 0.3f;  // nucleus ~tens, ~thousands, most
    auto l = random_logits(size_t(V), seed + 500, scale);
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_p = seed % 4 == 3 ? 1.0f : 0.6f + 0.01f * float(seed);
    p.min_p = seed % 4 >= 2 ? (seed % 2 ? 0.05f : 0.3f) : 0.0f;
    p.seed = seed;
    const auto got = draw(l, p);
    if (got.cut_margin < 1e-6) continue;  // a boundary within rounding: either answer is right
    const size_t want = kept_by_definition(l, p);
    EXPECT_EQ(size_t(got.kept), want) << "seed " << seed;
    const auto d = cpu::sampling_distribution_sparse(l.data(), V, p, {}, {});
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + ptrdiff_t(want), order.end(),
                      [&](int a, int b) { return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b); });
    std::vector<int32_t> first(order.begin(), order.begin() + ptrdiff_t(want));
    std::sort(first.begin(), first.end());
    EXPECT_EQ(d.ids, first) << "seed " << seed;
    ++checked;
  }
  EXPECT_GE(checked, 30);
}

TEST(SamplingCpu, PenaltiesFollowTheVllmDefinitions) {
  SamplingParams p = greedy();
  // repetition: seen tokens (prompt or output): positive logits divided, negative multiplied.
  p.repetition_penalty = 2.0f;
  EXPECT_EQ(draw({3.0f, 2.0f, 0.0f}, p, 0, {0}, {}).token, 1);        // 3 / 2 = 1.5 < 2
  EXPECT_EQ(draw({-1.0f, -1.5f, -3.0f}, p, 0, {}, {0}).token, 1);     // -1 * 2 = -2 < -1.5
  p.repetition_penalty = 1.0f;
  // presence: once per token in the output; frequency: per occurrence. The prompt does not count.
  p.presence_penalty = 0.6f;
  EXPECT_EQ(draw({1.0f, 0.5f}, p, 0, {}, {0}).token, 1);
  EXPECT_EQ(draw({1.0f, 0.5f}, p, 0, {0, 0, 0}, {}).token, 0);
  p.presence_penalty = 0.0f;
  p.frequency_penalty = 0.2f;
  EXPECT_EQ(draw({1.0f, 0.5f}, p, 0, {}, {0, 0}).token, 0);     // 1 - 0.4 = 0.6 > 0.5
  EXPECT_EQ(draw({1.0f, 0.5f}, p, 0, {}, {0, 0, 0}).token, 1);  // 1 - 0.6 = 0.4 < 0.5
}

// Logprobs against log-softmax in double (the fixed-point total differs by <= V · 2^-40
// relative, far below float's 6e-8): of the chosen token and the top n (ties: lower id),
// after penalties, at the temperature (temperature 1 when greedy).
TEST(SamplingCpu, LogprobsMatchADoubleLogSoftmax) {
  {
    const std::vector<float> l = {1.0f, 3.0f, 2.0f, 3.0f};
    SamplingParams p = greedy();
    p.logprobs_top_n = 3;
    const auto s = draw(l, p);
    double z = 0;
    for (float x : l) z += std::exp(double(x));
    EXPECT_EQ(s.token, 1);
    EXPECT_NEAR(s.logprob, 3.0 - std::log(z), 1e-6);
    ASSERT_EQ(s.top.size(), 3u);
    EXPECT_EQ(s.top[0].first, 1);
    EXPECT_EQ(s.top[1].first, 3);  // tie: lower id first
    EXPECT_EQ(s.top[2].first, 2);
    EXPECT_NEAR(s.top[2].second, 2.0 - std::log(z), 1e-6);
  }
  const int64_t V = 5000;
  for (uint64_t seed = 0; seed < 12; ++seed) {
    auto l = random_logits(size_t(V), seed);
    SamplingParams p;
    p.temperature = seed % 3 == 0 ? 0.0f : 0.7f;
    p.logprobs_top_n = 5;
    p.seed = seed;
    const auto s = draw(l, p);
    const float t = p.greedy() ? 1.0f : p.temperature;
    std::vector<double> x(l.begin(), l.end());
    double mx = -INFINITY, z = 0.0;
    for (double& v : x) mx = std::max(mx, v = double(float(v) / t));
    for (double v : x) z += std::exp(v - mx);
    const double lse = mx + std::log(z);
    EXPECT_NEAR(s.logprob, x[size_t(s.token)] - lse, 1e-5) << seed;
    ASSERT_EQ(s.top.size(), 5u);
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                      [&](int a, int b) { return x[size_t(a)] > x[size_t(b)] || (x[size_t(a)] == x[size_t(b)] && a < b); });
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(s.top[i].first, order[i]);
      EXPECT_NEAR(s.top[i].second, x[size_t(order[i])] - lse, 1e-5);
    }
    const auto again = cpu::logprobs_of(l.data(), V, p, {}, {}, s.token);
    EXPECT_EQ(again.logprob, s.logprob);
  }
}

// draw_margin is the winner's key minus the runner-up's over the kept set, computed here by
// brute force over every kept token (sample_cpu skips tokens that cannot matter).
TEST(SamplingCpu, DrawMarginIsTheGapToTheRunnerUp) {
  const int64_t V = 4000;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    auto l = random_logits(size_t(V), seed + 500, 2.5f);
    SamplingParams p;
    p.temperature = 0.9f;
    p.top_k = seed % 2 ? 300 : -1;
    p.seed = seed * 11;
    const uint64_t step = seed + 3;
    const auto s = draw(l, p, step);
    std::vector<std::pair<float, int32_t>> keys;
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b); });
    const size_t kept = p.top_k > 0 ? size_t(p.top_k) : size_t(V);
    for (size_t r = 0; r < kept; ++r) {
      const int32_t i = order[r];
      keys.emplace_back(cpu::gumbel_key(l[size_t(i)] / p.temperature, cpu::sample_bits(p.seed, step, uint32_t(i))), i);
    }
    std::sort(keys.begin(), keys.end(), [](auto a, auto b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    EXPECT_EQ(s.token, keys[0].second) << seed;
    EXPECT_EQ(s.draw_margin, double(keys[0].first) - double(keys[1].first)) << seed;
    EXPECT_EQ(s.kept, int64_t(kept));
  }
}

// The margin rule (cpu/sampling_cpu.hpp, stable_draw): logits moved by up to d per token
// (what another backend's lm_head may give) keep the token wherever the rule says so — and
// the rule must not be vacuous: most draws qualify at a small d.
TEST(SamplingCpu, StableDrawsSurviveLogitsWithinTheMargin) {
  const int64_t V = 2000;
  std::mt19937_64 g(3);
  int stable = 0, total = 0;
  for (uint64_t trial = 0; trial < 120; ++trial) {
    auto l = random_logits(size_t(V), trial + 900, 2.0f);
    SamplingParams p;
    p.temperature = trial % 3 == 0 ? 1.0f : 0.6f;
    p.top_k = trial % 4 == 1 ? 50 : -1;
    p.top_p = trial % 4 == 2 ? 0.9f : 1.0f;
    p.min_p = trial % 4 == 3 ? 0.05f : 0.0f;
    p.seed = trial;
    const double dl = trial % 2 ? 1e-3 : 1e-5;  // |Δlogit|
    const double d = dl / double(p.temperature);
    const auto base = draw(l, p, trial);
    std::uniform_real_distribution<float> jitter(-float(dl), float(dl));
    std::vector<float> moved(l);
    for (float& v : moved) v += jitter(g);
    const auto other = draw(moved, p, trial);
    ++total;
    if (!cpu::stable_draw(base, d * 1.01)) continue;  // 1 % for the float rounding of v + jitter
    ++stable;
    EXPECT_EQ(other.token, base.token) << "trial " << trial << " margin " << base.draw_margin;
  }
  EXPECT_GT(stable, total / 2) << "the rule should hold for most draws at these d (top-k boundaries are the tight ones)";
}

// Comparisons of x alone (greedy's top two, top-k's boundary) are decided the same by every
// backend with the same floats, exact ties included (the lower id): stable at d = 0 whatever
// their gap; with d > 0 only when the gap exceeds 2d.
TEST(SamplingCpu, RankMarginsOfGreedyAndTopK) {
  const std::vector<float> tie = {1.0f, 3.0f, -2.0f, 3.0f};
  const auto g = draw(tie, greedy());
  EXPECT_EQ(g.token, 1);
  EXPECT_EQ(g.rank_margin, 0.0);
  EXPECT_TRUE(cpu::stable_draw(g, 0.0));
  EXPECT_FALSE(cpu::stable_draw(g, 1e-6));
  const auto clear = draw({1.0f, 3.0f, -2.0f, 2.5f}, greedy());
  EXPECT_EQ(clear.rank_margin, 0.5);
  EXPECT_TRUE(cpu::stable_draw(clear, 0.2));
  EXPECT_FALSE(cpu::stable_draw(clear, 0.3));
  SamplingParams p;  // top-k 2 over {3, 2.5, 2.5, ...}: the boundary is a tie
  p.top_k = 2;
  const auto k = draw({3.0f, 2.5f, 2.5f, -1.0f}, p, 4);
  EXPECT_EQ(k.rank_margin, 0.0);
  EXPECT_EQ(k.kept, 2);
  EXPECT_NE(k.token, 2) << "the tie at the boundary keeps the lower id";
  EXPECT_FALSE(cpu::stable_draw(k, 1e-3));
}

// Grammar masks (cpu::apply_token_bitmask, the CUDA runner's token_bitmask_f32 reference): a
// masked row draws only allowed tokens in every mode, including a top-k / top-n larger than
// the allowed set and penalties on -inf logits; with one token allowed, that token with
// logprob 0. The GPU runner's masked steps are compared with this (gpu_token_mask_test).
TEST(SamplingCpu, MaskedRowsDrawOnlyAllowedTokensInEveryMode) {
  const int64_t V = 1000;
  std::mt19937_64 g(99);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<SamplingParams> modes(5);
  modes[0].temperature = 0.0f;
  modes[1].temperature = 0.7f, modes[1].top_p = 0.9f, modes[1].logprobs_top_n = 5;
  modes[2].temperature = 1.0f, modes[2].top_k = 20, modes[2].min_p = 0.05f, modes[2].repetition_penalty = 1.3f,
  modes[2].presence_penalty = 0.5f, modes[2].frequency_penalty = 0.3f, modes[2].logprobs_top_n = 0;
  modes[3].temperature = 0.0f, modes[3].repetition_penalty = 1.5f, modes[3].logprobs_top_n = 3;
  modes[4].temperature = 1.5f;
  const std::vector<int32_t> prompt = {3, 17, 17, 400}, output = {5, 17};
  for (int allowed_n : {1, 6}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> l(static_cast<size_t>(V));
      for (float& x : l) x = u(g);
      std::vector<uint32_t> mask(static_cast<size_t>((V + 31) / 32), 0u);
      std::set<int32_t> ok;
      while (int(ok.size()) < allowed_n) ok.insert(int32_t(g() % uint64_t(V)));
      ok.insert(17);  // a penalised token among them sometimes
      if (allowed_n == 1) ok = {*ok.begin()};
      for (int32_t t : ok) mask[size_t(t) >> 5] |= 1u << (t & 31);
      ASSERT_EQ(cpu::apply_token_bitmask(l.data(), V, mask.data()), int64_t(ok.size()));
      for (size_t m = 0; m < modes.size(); ++m) {
        SamplingParams p = modes[m];
        p.seed = uint64_t(trial) * 31 + m;
        const auto s = cpu::sample_cpu(l.data(), V, p, prompt, output, uint64_t(trial));
        EXPECT_TRUE(ok.count(s.token)) << "mode " << m << " trial " << trial << ": token " << s.token;
        if (p.logprobs_top_n < 0) continue;
        EXPECT_TRUE(std::isfinite(s.logprob)) << "mode " << m;
        if (ok.size() == 1) {
          EXPECT_NEAR(s.logprob, 0.0f, 1e-6f) << "mode " << m;
        }
      }
    }
  }
}

// One meaning of top_k everywhere (SGLang's): -1 off, >= 1 kept; 0 and < -1 refused.
TEST(SamplingCpu, RejectsOutOfRangeParameters) {
  for (auto edit : std::vector<void (*)(SamplingParams&)>{
           [](SamplingParams& p) { p.temperature = -0.1f; }, [](SamplingParams& p) { p.temperature = NAN; },
           [](SamplingParams& p) { p.top_p = 0.0f; }, [](SamplingParams& p) { p.top_p = 1.5f; },
           [](SamplingParams& p) { p.min_p = 2.0f; }, [](SamplingParams& p) { p.top_k = 0; },
           [](SamplingParams& p) { p.top_k = -2; }, [](SamplingParams& p) { p.repetition_penalty = 0.0f; },
           [](SamplingParams& p) { p.logprobs_top_n = 21; }, [](SamplingParams& p) { p.logprobs_top_n = -2; }}) {
    SamplingParams p;
    edit(p);
    EXPECT_THROW(cpu::validate_sampling(p), Error);
    std::vector<float> l(10, 0.0f);
    EXPECT_THROW(draw(l, p), Error);
  }
  SamplingParams p;
  p.top_k = 0;
  try {
    cpu::validate_sampling(p);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_k must be -1 (off) or at least 1, got 0"), std::string::npos) << e.what();
  }
  p.top_k = -1;
  EXPECT_NO_THROW(cpu::validate_sampling(p));
  p.top_k = 1 << 30;  // larger than any vocabulary: off in effect
  EXPECT_NO_THROW(draw(std::vector<float>(10, 0.0f), p));
  std::vector<float> l(10, 0.0f);
  EXPECT_THROW(cpu::sample_cpu(l.data(), 0, SamplingParams{}, {}, {}, 0), Error);
}

}  // namespace
}  // namespace fp4moe::test
