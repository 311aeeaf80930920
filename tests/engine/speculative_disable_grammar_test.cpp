// --speculative-disable-by-batch-size with constrained requests (CPU backend, make-synthetic
// glm5-tiny, F32 KV; the vocabulary and grammars of speculative_grammar_util.hpp): a batch of
// eight JSON-schema / regex / json_object requests (one unconstrained) runs plain masked steps
// while more than N = 3 run and masked draft/verify rounds once fewer do; greedy output equals
// the plain engine's token for token and validates; seeded sampled constrained requests never
// abort, stay in their language and reproduce.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_model_backend.hpp"
#include "speculative_grammar_util.hpp"

using namespace fp4moe;
using namespace fp4moe::engine;
using namespace fp4moe::engine::testing;

namespace {

// Requests 1..n: grammar case i (every seventh unconstrained); unequal lengths and prompts.
std::vector<RequestSpec> constrained_specs(int n, bool sampled) {
  const std::vector<Case> cs = cases();
  std::vector<RequestSpec> out;
  for (int i = 0; i < n; ++i) {
    RequestSpec s;
    for (int j = 0; j < 5 + 6 * (i % 5); ++j) s.prompt.push_back((17 + 43 * j + 71 * i) % 1000);
    s.max_new_tokens = 24 + 10 * (i % 4);
    s.sampling.temperature = sampled ? 0.9f : 0.0f;
    if (sampled) {
      s.sampling.seed = 501 + uint64_t(i);
      s.sampling.has_seed = true;
    }
    s.ignore_eos = i % 2 == 1;
    if (i % 7 != 6) s.grammar = compiler().compile(cs[size_t(i) % cs.size()].spec);
    out.push_back(std::move(s));
  }
  return out;
}

std::map<uint64_t, Outcome> run_constrained(const std::vector<RequestSpec>& sp, int32_t steps, int32_t disable_by,
                                            SchedulerStats* stats) {
  RunOptions ro;
  ro.steps = steps;
  ro.disable_by = disable_by;
  return run(sp, ro, stats);
}

// No abort; every constrained request that stopped ends in EOS and validates. Returns how many stopped.
int expect_finished_and_valid(const std::vector<RequestSpec>& sp, const std::map<uint64_t, Outcome>& out) {
  return expect_valid(cases(), sp, out);
}

}  // namespace

TEST(SpeculativeDisableGrammar, ConstrainedBatchesSwitchBetweenMaskedStepsAndRoundsLosslessly) {
  const auto sp = constrained_specs(8, false);
  SchedulerStats plain_st, st;
  const auto plain = run_constrained(sp, 0, 0, &plain_st);
  EXPECT_GE(expect_finished_and_valid(sp, plain), 3);
  const auto switched = run_constrained(sp, 3, 3, &st);
  expect_finished_and_valid(sp, switched);
  for (const auto& [id, o] : plain) {
    EXPECT_EQ(switched.at(id).tokens, o.tokens) << "request " << id;
    EXPECT_EQ(switched.at(id).reason, o.reason) << "request " << id;
  }
  EXPECT_GT(st.spec_disabled_rounds, 0) << "eight running: plain masked steps";
  EXPECT_GT(st.verify_steps, 0) << "three or fewer running: rounds";
}

TEST(SpeculativeDisableGrammar, SeededSampledConstrainedRequestsNeverAbortAndReproduce) {
  const auto sp = constrained_specs(8, true);
  SchedulerStats st;
  const auto a = run_constrained(sp, 3, 3, &st);
  const auto b = run_constrained(sp, 3, 3, nullptr);
  expect_finished_and_valid(sp, a);
  for (const auto& [id, o] : a) EXPECT_EQ(b.at(id).tokens, o.tokens) << "request " << id;
  EXPECT_GT(st.spec_disabled_rounds, 0);
  EXPECT_GT(st.verify_steps, 0);
}
