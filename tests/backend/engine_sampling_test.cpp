// The engine's SampleSpec through cpu::sample_cpu (which has its own tests).
#include <cmath>

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "cpu/sampling_cpu.hpp"
#include "backend/sampling_cpu.hpp"

using namespace fp4moe::engine;

// The spec's params reach cpu::sample_cpu as they are: top_k 1 is greedy at any temperature,
// the seed and logprobs come through.
TEST(EngineSampling, TheSpecsParamsReachTheCpuSampler) {
  SamplingParams p;
  p.temperature = 1.3f;
  p.top_k = 1;
  SampleSpec s;
  s.params = &p;
  const std::vector<float> logits = {0.0f, 2.0f, 1.9f, -1.0f};
  for (int32_t i = 0; i < 20; ++i) {
    s.output_index = i;
    EXPECT_EQ(sample_row_cpu(logits.data(), 4, s).id, 1) << "top_k 1: greedy";
  }
  p.top_k = 0;
  EXPECT_THROW(sample_row_cpu(logits.data(), 4, s), fp4moe::Error) << "top_k 0 is refused, not 'off'";
  p.top_k = -1;
  p.seed = 9;
  p.logprobs_top_n = 3;
  const auto t = sample_row_cpu(logits.data(), 4, s);
  EXPECT_EQ(t.top.size(), 3u);
  const auto again = fp4moe::cpu::sample_cpu(logits.data(), 4, p, {}, {}, uint64_t(s.output_index));
  EXPECT_EQ(t.id, again.token);
}

TEST(EngineSampling, TheDrawDependsOnlyOnSeedAndOutputIndex) {
  SamplingParams p;
  p.seed = 42;
  std::vector<float> logits(64, 0.0f);
  SampleSpec s;
  s.params = &p;
  int differ = 0;
  for (int32_t i = 0; i < 64; ++i) {
    s.output_index = i;
    const int32_t a = sample_row_cpu(logits.data(), 64, s).id;
    EXPECT_EQ(a, sample_row_cpu(logits.data(), 64, s).id);
    s.output_index = i + 1;
    differ += a != sample_row_cpu(logits.data(), 64, s).id;
  }
  EXPECT_GT(differ, 40);
}

TEST(EngineSampling, LogprobsComeBackBestFirst) {
  SamplingParams p;
  p.temperature = 0.0f;
  SampleSpec s;
  p.logprobs_top_n = 2;
  s.params = &p;
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f};
  const auto t = sample_row_cpu(logits.data(), 3, s);
  EXPECT_EQ(t.id, 2);
  ASSERT_EQ(t.top.size(), 2u);
  EXPECT_EQ(t.top[0].id, 2);
  EXPECT_EQ(t.top[1].id, 1);
  EXPECT_NEAR(t.logprob, 2.0 - std::log(1.0 + std::exp(1.0) + std::exp(2.0)), 1e-5);
}
