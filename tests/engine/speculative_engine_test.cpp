// Speculative decoding through the engine's scheduler on the CPU backend (make-synthetic
// glm5-tiny, F32 KV): greedy requests in mixed batches (prefills of late arrivals riding with
// draft/verify rounds; chunked prompts) give the plain engine's tokens, finish reasons and
// lengths, including a stop id inside an accepted run and max_tokens inside a round; seeded
// sampled requests reproduce their tokens alone and in a batch. A random-weight MTP layer rarely
// proposes the target's token, so most cases force drafts with the backend's test hook
// (`draft_override`): the plain run's tokens, every fourth one wrong.
#include <gtest/gtest.h>

#include "../cli/cli_run_helpers.hpp"
#include "backend/cpu/cpu_model_backend.hpp"
#include "scheduler_test_util.hpp"

using namespace fp4moe;
using namespace fp4moe::engine;
using namespace fp4moe::engine::testing;

namespace {

const std::string& tiny_dir() { return testing_cli::synthetic_model("speculative_engine_models", "glm5-tiny"); }

SchedulerConfig cfg(int32_t spec_tokens, int32_t chunk = 64, int32_t pages = 128) {
  SchedulerConfig c = config(16, pages, 4, chunk, 1, true);
  c.eos_ids = {};
  c.speculative_tokens = spec_tokens;
  return c;
}

std::vector<RequestSpec> greedy_specs() {
  std::vector<RequestSpec> specs;
  for (int i = 0; i < 5; ++i) {
    RequestSpec s;
    for (int j = 0; j < 6 + 9 * i; ++j) s.prompt.push_back((11 + 53 * j + 97 * i) % 1024);
    s.sampling.temperature = 0.0f;
    s.max_new_tokens = 9 + 5 * i;
    specs.push_back(s);
  }
  return specs;
}

std::map<uint64_t, Outcome> run(const std::vector<RequestSpec>& specs, int32_t steps,
                                const std::map<uint64_t, Outcome>* drafts_from = nullptr, int32_t chunk = 64,
                                SchedulerStats* stats = nullptr, int32_t pages = 128) {
  CpuModelBackendOptions o;
  o.model_dir = tiny_dir();
  o.threads = 1;
  o.kv_elem = KvElem::F32;
  o.speculative_steps = steps;
  if (drafts_from)
    o.draft_override = [drafts_from](uint64_t id, uint64_t idx, int32_t mtp) {
      const auto& toks = drafts_from->at(id).tokens;
      const int32_t t = idx < toks.size() ? toks[idx] : mtp;
      return idx % 4 == 3 ? (t + 1) % 1024 : t;
    };
  CpuModelBackend be(o);
  return run_all(cfg(steps > 0 ? steps + 1 : 0, chunk, pages), specs, be, stats);
}

void expect_same(const std::map<uint64_t, Outcome>& a, const std::map<uint64_t, Outcome>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [id, o] : a) {
    const Outcome& p = b.at(id);
    EXPECT_EQ(o.tokens, p.tokens) << "request " << id;
    EXPECT_EQ(o.reason, p.reason) << "request " << id;
    EXPECT_EQ(o.matched, p.matched) << "request " << id;
    EXPECT_EQ(o.usage.completion_tokens, p.usage.completion_tokens) << "request " << id;
  }
}

}  // namespace

TEST(SpeculativeEngine, GreedyMixedBatchesEqualThePlainEngine) {
  const auto specs = greedy_specs();
  const auto plain = run(specs, 0);
  for (int32_t n : {1, 3}) {
    SchedulerStats st;
    const auto own = run(specs, n, nullptr, 64, &st);  // the MTP layer's own drafts (mostly rejected)
    expect_same(own, plain);
    EXPECT_GT(st.verify_steps, 0);
    const auto forced = run(specs, n, &plain, 64, &st);  // accepts and rejects
    expect_same(forced, plain);
    int64_t tokens = 0, verify = 0;
    for (const auto& [id, o] : forced) tokens += o.usage.completion_tokens, verify += o.usage.spec_verify_steps;
    if (n == 3) {
      EXPECT_LT(verify, tokens / 2) << "forced drafts: most rounds emit several tokens";
    }
  }
  // Chunked prompts (8 tokens per step) ride along with draft/verify rounds of earlier requests.
  expect_same(run(specs, 3, &plain, 8), run(specs, 0, nullptr, 8));
}

TEST(SpeculativeEngine, AStopIdInsideAnAcceptedRunAndMaxTokensInsideARoundEndTheRequestThere) {
  auto specs = greedy_specs();
  const auto plain0 = run(specs, 0);
  // Request 1: stop at its 7th token (output index 6: the middle of the second 4-token round);
  // request 2: max_tokens 7 (the second round is cut to 2 tokens).
  const auto& toks = plain0.at(1).tokens;
  size_t k = 6;
  while (std::find(toks.begin(), toks.begin() + int64_t(k), toks[k]) != toks.begin() + int64_t(k)) ++k;
  specs[0].stop_ids = {toks[k]};
  specs[1].max_new_tokens = 7;
  const auto plain = run(specs, 0);
  ASSERT_EQ(plain.at(1).tokens.size(), k + 1);
  ASSERT_EQ(plain.at(1).reason, FinishReason::kStop);
  const auto spec = run(specs, 3, &plain0);
  expect_same(spec, plain);
  EXPECT_EQ(spec.at(1).matched, toks[k]);
  EXPECT_EQ(spec.at(2).tokens.size(), 7u);
}

// A pool of 8 pages (128 tokens) for 5 requests of up to 71 tokens, two of them sharing a
// 32-token prefix: requests are retracted and recomputed, and prefix pages come from the radix
// cache (their MTP KV rows written by the request that computed them); the greedy tokens stay
// the plain engine's on a large pool.
TEST(SpeculativeEngine, RetractionsAndSharedPrefixesUnderPagePressureKeepTheTokens) {
  auto specs = greedy_specs();
  specs[4].prompt.assign(specs[3].prompt.begin(), specs[3].prompt.begin() + 32);
  specs[4].prompt.push_back(7);
  const auto plain = run(specs, 0);
  SchedulerStats st;
  const auto spec = run(specs, 3, &plain, 64, &st, 8);
  expect_same(spec, plain);
  EXPECT_GT(st.retractions, 0);
  EXPECT_GT(st.cached_tokens, 0);
}

// A seeded sampled request reproduces its tokens under the same schedule. Across schedules it
// need not: a token that follows a draft is drawn by the accept / residual streams, one that a
// mixed prefill round produced by the plain sampler's (both distributed as the target's).
TEST(SpeculativeEngine, SeededSampledRequestsReproduceTheirTokensUnderTheSameSchedule) {
  auto specs = greedy_specs();
  for (auto& s : specs) {
    s.sampling.temperature = 0.9f;
    s.sampling.top_k = 40;
    s.sampling.seed = 1234 + s.prompt.size();
    s.sampling.has_seed = true;
  }
  const auto batch = run(specs, 3);
  const auto again = run(specs, 3);
  expect_same(batch, again);
  const auto alone = run({specs[2]}, 3), alone_again = run({specs[2]}, 3);
  EXPECT_EQ(alone.at(1).tokens, alone_again.at(1).tokens);
  EXPECT_EQ(alone.at(1).usage.completion_tokens, specs[2].max_new_tokens);
}
