// The engine's sampling knobs mapped onto cpu::sample_cpu (which has its own tests).
#include <cmath>

#include <gtest/gtest.h>

#include "engine/sampling_cpu.hpp"

using namespace fp4moe::engine;

TEST(EngineSampling, EngineKnobsMapOntoTheCpuOp) {
  SamplingParams p;
  p.top_k = -1;
  EXPECT_EQ(cpu_sampling(p, -1).top_k, 0);  // off
  EXPECT_EQ(cpu_sampling(p, -1).temperature, 1.0f);
  p.top_k = 1;                               // the engine's greedy
  EXPECT_EQ(cpu_sampling(p, -1).temperature, 0.0f);
  p.top_k = 5;
  p.temperature = 0.7f;
  p.seed = 9;
  const auto c = cpu_sampling(p, 3);
  EXPECT_EQ(c.top_k, 5);
  EXPECT_EQ(c.temperature, 0.7f);
  EXPECT_EQ(c.seed, 9u);
  EXPECT_EQ(c.logprobs_top_n, 3);
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
  s.params = &p;
  s.top_logprobs = 2;
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f};
  const auto t = sample_row_cpu(logits.data(), 3, s);
  EXPECT_EQ(t.id, 2);
  ASSERT_EQ(t.top.size(), 2u);
  EXPECT_EQ(t.top[0].id, 2);
  EXPECT_EQ(t.top[1].id, 1);
  EXPECT_NEAR(t.logprob, 2.0 - std::log(1.0 + std::exp(1.0) + std::exp(2.0)), 1e-5);
}
