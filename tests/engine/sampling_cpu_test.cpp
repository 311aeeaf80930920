#include <cmath>
#include <map>

#include <gtest/gtest.h>

#include "engine/sampling_cpu.hpp"

using namespace fp4moe::engine;

namespace {

GeneratedToken draw(std::vector<float> logits, const SamplingParams& p, int32_t index = 0, int32_t top = -1,
                    std::vector<int32_t> generated = {}) {
  SampleSpec s;
  s.params = &p;
  s.output_index = index;
  s.top_logprobs = top;
  s.generated = generated;
  return sample_logits_cpu(logits, s);
}

}  // namespace

TEST(SamplingCpu, GreedyPicksTheFirstLargestLogit) {
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_EQ(draw({1, 5, 3, 5}, p).id, 1);
  p.temperature = 1.0f;
  p.top_k = 1;
  EXPECT_EQ(draw({1, 5, 3, 5}, p).id, 1);
}

TEST(SamplingCpu, TheDrawDependsOnlyOnSeedAndIndex) {
  SamplingParams p;
  p.seed = 42;
  std::vector<float> logits(50, 0.0f);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(draw(logits, p, i).id, draw(logits, p, i).id);
  int differ = 0;
  for (int i = 0; i < 50; ++i) differ += draw(logits, p, i).id != draw(logits, p, i + 1).id;
  EXPECT_GT(differ, 30);
  EXPECT_EQ(sampling_uniform(1, 2), sampling_uniform(1, 2));
  EXPECT_NE(sampling_uniform(1, 2), sampling_uniform(2, 2));
}

TEST(SamplingCpu, FrequenciesFollowTheTemperedSoftmax) {
  SamplingParams p;
  p.temperature = 0.5f;
  p.seed = 3;
  const std::vector<float> logits = {0.0f, std::log(2.0f) * 0.5f};  // at T 0.5: probabilities 1/3, 2/3
  int ones = 0;
  const int n = 6000;
  for (int i = 0; i < n; ++i) ones += draw(logits, p, i).id == 1;
  EXPECT_NEAR(double(ones) / n, 2.0 / 3.0, 0.03);
}

TEST(SamplingCpu, TopKTopPAndMinPOnlyKeepTheirCandidates) {
  std::vector<float> logits = {0.0f, 1.0f, 2.0f, 3.0f, 4.0f};
  SamplingParams k;
  k.top_k = 2;
  SamplingParams tp;
  tp.top_p = 0.6f;  // softmax: 0.64 for id 4 alone
  SamplingParams mp;
  mp.min_p = 0.3f;  // keeps p >= 0.3 * p(4): ids 4 and 3 (e^-1 = 0.37)
  for (int i = 0; i < 300; ++i) {
    EXPECT_GE(draw(logits, k, i).id, 3);
    EXPECT_EQ(draw(logits, tp, i).id, 4);
    EXPECT_GE(draw(logits, mp, i).id, 3);
  }
}

TEST(SamplingCpu, PenaltiesLowerRepeatedTokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.frequency_penalty = 2.0f;
  EXPECT_EQ(draw({0.0f, 3.0f, 2.0f}, p, 0, -1, {1, 1}).id, 2);
  SamplingParams r;
  r.temperature = 0.0f;
  r.repetition_penalty = 2.0f;
  EXPECT_EQ(draw({0.0f, 3.0f, 2.0f}, r, 0, -1, {1}).id, 2);  // 3 / 2 < 2
  SamplingParams pr;
  pr.temperature = 0.0f;
  pr.presence_penalty = 1.5f;
  EXPECT_EQ(draw({0.0f, 3.0f, 2.0f}, pr, 0, -1, {1}).id, 2);
}

TEST(SamplingCpu, LogprobsAreTheRawLogSoftmaxBestFirst) {
  SamplingParams p;
  p.temperature = 0.0f;
  auto t = draw({0.0f, 1.0f, 2.0f}, p, 0, 2);
  const double lse = std::log(1.0 + std::exp(1.0) + std::exp(2.0));
  EXPECT_EQ(t.id, 2);
  EXPECT_NEAR(t.logprob, 2.0 - lse, 1e-5);
  ASSERT_EQ(t.top.size(), 2u);
  EXPECT_EQ(t.top[0].id, 2);
  EXPECT_EQ(t.top[1].id, 1);
  EXPECT_NEAR(t.top[1].logprob, 1.0 - lse, 1e-5);
  EXPECT_TRUE(draw({0.0f, 1.0f}, p, 0, -1).top.empty());
}
