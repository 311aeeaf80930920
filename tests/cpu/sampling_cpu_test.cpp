// sample_cpu: greedy, temperature / top-k / top-p / min-p, seeds, penalties, logprobs.
#include <cmath>
#include <map>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "cpu/sampling_cpu.hpp"

using namespace fp4moe;
using cpu::SamplingParams;

namespace {

cpu::SampledToken draw(const std::vector<float>& l, const SamplingParams& p, uint64_t step = 0,
                       const std::vector<int32_t>& prompt = {}, const std::vector<int32_t>& out = {}) {
  return cpu::sample_cpu(l.data(), int64_t(l.size()), p, prompt, out, step);
}

// Frequencies of 20000 draws (steps 0..19999).
std::map<int32_t, double> frequencies(const std::vector<float>& l, const SamplingParams& p) {
  std::map<int32_t, double> f;
  for (uint64_t s = 0; s < 20000; ++s) f[draw(l, p, s).token] += 1.0 / 20000;
  return f;
}

}  // namespace

TEST(SamplingCpu, GreedyTakesTheHighestLogitAndTheLowerIdOnTies) {
  SamplingParams p;
  EXPECT_EQ(draw({0.1f, 3.0f, -1.0f, 3.0f}, p).token, 1);
  EXPECT_EQ(draw({-5.0f}, p).token, 0);
}

TEST(SamplingCpu, SameSeedAndStepSameTokenOtherSeedsVary) {
  std::vector<float> l(100);
  for (int i = 0; i < 100; ++i) l[size_t(i)] = std::sin(float(i));
  SamplingParams p;
  p.temperature = 1.0f;
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

TEST(SamplingCpu, TemperatureSamplingFollowsTheSoftmax) {
  const std::vector<float> l = {0.0f, std::log(2.0f), std::log(5.0f), -INFINITY};  // p = 1/8, 2/8, 5/8, 0
  SamplingParams p;
  p.temperature = 1.0f;
  auto f = frequencies(l, p);
  EXPECT_NEAR(f[0], 0.125, 0.015);
  EXPECT_NEAR(f[1], 0.25, 0.015);
  EXPECT_NEAR(f[2], 0.625, 0.015);
  EXPECT_EQ(f.count(3), 0u);
  p.temperature = 0.5f;  // p ∝ 1, 4, 25
  f = frequencies(l, p);
  EXPECT_NEAR(f[2], 25.0 / 30, 0.015);
}

TEST(SamplingCpu, TopKTopPMinPTruncate) {
  const std::vector<float> l = {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;  // {3, 2}: 0.4 / 0.7, 0.3 / 0.7
  auto f = frequencies(l, p);
  EXPECT_EQ(f.size(), 2u);
  EXPECT_NEAR(f[3], 4.0 / 7, 0.015);
  p.top_k = 0;
  p.top_p = 0.65f;  // 0.4 < 0.65 <= 0.7: {3, 2}
  f = frequencies(l, p);
  EXPECT_EQ(f.size(), 2u);
  p.top_p = 0.3f;  // the best alone
  EXPECT_EQ(frequencies(l, p).size(), 1u);
  p.top_p = 1.0f;
  p.min_p = 0.45f;  // p >= 0.18: {3, 2, 1}
  f = frequencies(l, p);
  EXPECT_EQ(f.size(), 3u);
  EXPECT_EQ(f.count(0), 0u);
  p.top_k = 1;  // top_k 1 with temperature is greedy
  p.min_p = 0.0f;
  EXPECT_EQ(frequencies(l, p).size(), 1u);
}

TEST(SamplingCpu, PenaltiesFollowTheVllmDefinitions) {
  SamplingParams p;
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

TEST(SamplingCpu, LogprobsOfTheChosenTokenAndTheTopN) {
  const std::vector<float> l = {1.0f, 3.0f, 2.0f, 3.0f};
  SamplingParams p;
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

TEST(SamplingCpu, RejectsOutOfRangeParameters) {
  for (auto edit : std::vector<void (*)(SamplingParams&)>{
           [](SamplingParams& p) { p.temperature = -0.1f; }, [](SamplingParams& p) { p.top_p = 0.0f; },
           [](SamplingParams& p) { p.top_p = 1.5f; }, [](SamplingParams& p) { p.min_p = 2.0f; },
           [](SamplingParams& p) { p.top_k = -1; }, [](SamplingParams& p) { p.repetition_penalty = 0.0f; },
           [](SamplingParams& p) { p.logprobs_top_n = 21; }}) {
    SamplingParams p;
    edit(p);
    EXPECT_THROW(cpu::validate_sampling(p), Error);
  }
}
