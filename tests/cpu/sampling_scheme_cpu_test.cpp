// cpu/sampling_scheme*: the Philox draw (known answers, open interval), and the host twin of the
// device sampler against cpu::sample_cpu (greedy and logprobs identical; the same truncation
// sets; the draw follows the softmax of the kept set; ties to the lower id; fixed by seed+step).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "core/error.hpp"
#include "cpu/sampling_cpu.hpp"
#include "cpu/sampling_scheme.hpp"
#include "cpu/sampling_scheme_cpu.hpp"

namespace fp4moe::test {
namespace {

std::vector<float> random_logits(size_t n, uint64_t seed, float scale = 3.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

TEST(SamplingScheme, PhiloxKnownAnswers) {  // Random123's kat_vectors for philox4x32-10
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

TEST(SamplingScheme, UniformIsOpenAndDependsOnSeedStepAndToken) {
  EXPECT_EQ(cpu::bits_to_open_uniform(0u), 1.0f / 16777216.0f);
  EXPECT_EQ(cpu::bits_to_open_uniform(0xffffffffu), 1.0f - 1.0f / 16777216.0f);
  const uint32_t a = cpu::sample_bits(7, 3, 100);
  EXPECT_EQ(a, cpu::sample_bits(7, 3, 100));
  EXPECT_NE(a, cpu::sample_bits(8, 3, 100));
  EXPECT_NE(a, cpu::sample_bits(7, 4, 100));
  EXPECT_NE(a, cpu::sample_bits(7, 3, 101));
  EXPECT_NE(cpu::sample_bits(7, uint64_t(3) << 32, 100), a);  // the step's high word counts
}

TEST(SamplingScheme, OrderKeyRoundTripsAndOrders) {
  const float vals[] = {-INFINITY, -3.5f, -0.0f, 0.0f, 1e-30f, 2.0f, INFINITY};
  for (size_t i = 0; i < std::size(vals); ++i) {
    EXPECT_EQ(cpu::float_from_order_key(cpu::float_order_key(vals[i])), vals[i]);
    if (i) {
      EXPECT_LT(cpu::float_order_key(vals[i - 1]), cpu::float_order_key(vals[i]));
    }
  }
  EXPECT_EQ(cpu::float_order_key(NAN), 0u);
}

TEST(SamplingScheme, GreedyAndLogprobsEqualSampleCpu) {
  const int64_t V = 5000;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    auto l = random_logits(size_t(V), seed);
    cpu::SamplingRowParams p;
    p.logprobs_top_n = 5;
    if (seed % 2) p.repetition_penalty = 1.3f;
    if (seed % 3) p.frequency_penalty = 0.4f, p.presence_penalty = 0.2f;
    std::vector<int32_t> prompt = {1, 2, 3, int32_t(seed)}, output = {5, 5, 9, int32_t(seed * 7 % V)};
    const auto ref = cpu::sample_cpu(l.data(), V, cpu::to_sampling_params(p), prompt, output, 0);
    const auto got = cpu::sample_scheme_cpu(l.data(), V, p, prompt, output, 0);
    EXPECT_EQ(got.token, ref.token);
    EXPECT_NEAR(got.logprob, ref.logprob, 1e-5f);
    ASSERT_EQ(got.top.size(), ref.top.size());
    for (size_t i = 0; i < ref.top.size(); ++i) {
      EXPECT_EQ(got.top[i].first, ref.top[i].first);
      EXPECT_NEAR(got.top[i].second, ref.top[i].second, 1e-5f);
    }
  }
}

// The kept set by the definition (cpu/sampling_cpu.hpp): rank prefix cut by top-k, top-p, min-p.
size_t kept_by_definition(const std::vector<float>& x, const cpu::SamplingRowParams& p) {
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

TEST(SamplingScheme, TruncationKeepsTheDefinedPrefix) {
  const int64_t V = 3000;
  int checked = 0;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    auto l = random_logits(size_t(V), seed + 100, 2.0f);
    cpu::SamplingRowParams p;
    p.temperature = 0.8f;
    p.top_k = seed % 4 == 0 ? 0 : int32_t(1 + seed * 37 % 500);
    p.top_p = seed % 3 == 0 ? 1.0f : 0.5f + 0.01f * float(seed);
    p.min_p = seed % 5 == 0 ? 0.02f : 0.0f;
    p.seed = seed;
    const auto got = cpu::sample_scheme_cpu(l.data(), V, p, {}, {}, 0);
    if (got.cut_margin < 1e-6) continue;  // a boundary within rounding: either answer is right
    std::vector<float> x(l);
    for (float& v : x) v = v / p.temperature;
    EXPECT_EQ(size_t(got.kept), kept_by_definition(x, p)) << "seed " << seed;
    ++checked;
  }
  EXPECT_GE(checked, 35);
}

TEST(SamplingScheme, DrawFollowsTheSoftmaxOfTheKeptSet) {
  const std::vector<float> l = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -3.0f};
  cpu::SamplingRowParams p;
  p.temperature = 1.0f;
  p.top_k = 4;
  p.seed = 1234;
  std::vector<double> prob(4);
  double z = 0;
  for (int i = 0; i < 4; ++i) z += prob[size_t(i)] = std::exp(double(l[size_t(i)]));
  const int n = 40000;
  std::vector<int> count(l.size(), 0);
  for (int s = 0; s < n; ++s) ++count[size_t(cpu::sample_scheme_cpu(l.data(), int64_t(l.size()), p, {}, {}, uint64_t(s)).token)];
  for (size_t i = 0; i < 4; ++i) {
    const double q = prob[i] / z, sd = std::sqrt(q * (1 - q) / n);
    EXPECT_NEAR(double(count[i]) / n, q, 5 * sd) << "token " << i;
  }
  EXPECT_EQ(count[4] + count[5], 0);
}

TEST(SamplingScheme, TiesGoToTheLowerIdAndSeedsRepeat) {
  std::vector<float> l(100, -5.0f);
  l[10] = l[20] = l[30] = 4.0f;
  cpu::SamplingRowParams p;
  EXPECT_EQ(cpu::sample_scheme_cpu(l.data(), 100, p, {}, {}, 0).token, 10);  // greedy
  p.temperature = 1.0f;
  p.top_k = 2;  // keeps 10 and 20 of the three equal maxima
  std::map<int, int> seen;
  for (int s = 0; s < 200; ++s) ++seen[cpu::sample_scheme_cpu(l.data(), 100, p, {}, {}, uint64_t(s)).token];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[10], 0);
  EXPECT_GT(seen[20], 0);
  p.top_k = 0;
  p.seed = 99;
  const int a = cpu::sample_scheme_cpu(l.data(), 100, p, {}, {}, 5).token;
  EXPECT_EQ(a, cpu::sample_scheme_cpu(l.data(), 100, p, {}, {}, 5).token);
}

TEST(SamplingScheme, BadParametersSayWhy) {
  std::vector<float> l(10, 0.0f);
  cpu::SamplingRowParams p;
  p.top_p = 0.0f;
  EXPECT_THROW(cpu::sample_scheme_cpu(l.data(), 10, p, {}, {}, 0), Error);
  p = {};
  p.logprobs_top_n = 21;
  EXPECT_THROW(cpu::sample_scheme_cpu(l.data(), 10, p, {}, {}, 0), Error);
  p = {};
  EXPECT_THROW(cpu::sample_scheme_cpu(l.data(), 0, p, {}, {}, 0), Error);
}

// Grammar masks (cpu::apply_token_bitmask, the CUDA runner's token_bitmask_f32 reference): the
// scheme over a masked row draws only allowed tokens in every mode, including a top-k / top-n
// larger than the allowed set and penalties on -inf logits; with one token allowed, that token
// with logprob 0. The GPU runner's masked steps are compared with this (gpu_token_mask_test).
TEST(SamplingScheme, MaskedRowsDrawOnlyAllowedTokensInEveryMode) {
  const int64_t V = 1000;
  std::mt19937_64 g(99);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<cpu::SamplingRowParams> modes(5);
  modes[1].temperature = 0.7f, modes[1].top_p = 0.9f, modes[1].logprobs_top_n = 5;
  modes[2].temperature = 1.0f, modes[2].top_k = 20, modes[2].min_p = 0.05f, modes[2].repetition_penalty = 1.3f,
  modes[2].presence_penalty = 0.5f, modes[2].frequency_penalty = 0.3f, modes[2].logprobs_top_n = 0;
  modes[3].repetition_penalty = 1.5f, modes[3].logprobs_top_n = 3;
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
        cpu::SamplingRowParams p = modes[m];
        p.seed = uint64_t(trial) * 31 + m;
        const auto s = cpu::sample_scheme_cpu(l.data(), V, p, prompt, output, uint64_t(trial));
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

}  // namespace
}  // namespace fp4moe::test
