#include <algorithm>
#include <set>

#include "core/error.hpp"
#include "scheduler_test_util.hpp"

using namespace fp4moe;
using namespace fp4moe::engine;
using namespace fp4moe::engine::testing;

namespace {

// A mix: greedy, seeded temperature with top-k / top-p / min-p, penalties, logprobs, ignore_eos.
std::vector<RequestSpec> mixed_requests(int32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<RequestSpec> specs;
  for (int32_t i = 0; i < n; ++i) {
    RequestSpec s;
    s.prompt = random_prompt(rng, 1 + int32_t(rng() % 60));
    if (i % 5 == 1) s.prompt = specs[0].prompt;  // shared prompts for the prefix cache
    s.max_new_tokens = 5 + int32_t(rng() % 36);
    s.sampling.seed = 1000 + uint64_t(i);
    s.sampling.has_seed = true;
    if (i % 2 == 1) {
      s.sampling.temperature = 0.8f;
      s.sampling.top_k = 20;
      s.sampling.top_p = 0.9f;
    }
    if (i % 3 == 2) {
      s.sampling.frequency_penalty = 0.5f;
      s.sampling.repetition_penalty = 1.2f;
      s.sampling.min_p = 0.05f;
      s.sampling.temperature = 1.0f;
    }
    if (i % 4 == 0) s.sampling.logprobs_top_n = 2;
    s.ignore_eos = i % 6 == 5;
    specs.push_back(std::move(s));
  }
  return specs;
}

void expect_same(const std::map<uint64_t, Outcome>& got, const std::map<uint64_t, Outcome>& ref, const char* what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (auto& [id, r] : ref) {
    const Outcome& g = got.at(id);
    EXPECT_TRUE(g.finished) << what << " request " << id;
    EXPECT_EQ(g.tokens, r.tokens) << what << " request " << id;
    EXPECT_EQ(g.logprobs, r.logprobs) << what << " request " << id;
    EXPECT_EQ(g.reason, r.reason) << what << " request " << id;
    EXPECT_EQ(g.usage.completion_tokens, int32_t(r.tokens.size())) << what << " request " << id;
    EXPECT_EQ(g.usage.prompt_tokens, r.usage.prompt_tokens) << what << " request " << id;
  }
}

}  // namespace

TEST(Scheduler, OutputsDoNotDependOnBatchingPagingChunkingOrRetraction) {
  const auto specs = mixed_requests(24, 7);
  const auto ref = run_alone(specs);
  int stops = 0;
  for (auto& [id, r] : ref) stops += r.reason == FinishReason::kStop;
  EXPECT_GT(stops, 0) << "the reference run should end some requests on EOS";
  struct Case {
    const char* name;
    SchedulerConfig cfg;
    bool expect_retraction;
  };
  const Case cases[] = {
      {"tiny pool, radix, chunk 16", config(4, 40, 8, 16, 1, true), true},
      {"page 1, K 4", config(1, 4096, 6, 7, 4, true), false},
      {"large pages, no radix, K 8", config(16, 512, 32, 512, 8, false), false},
      {"tiny pool, chunk 8, K 3", config(4, 30, 16, 8, 3, true), true},
      {"tiny pool, no radix, K 2", config(2, 60, 24, 5, 2, false), true},
  };
  for (const Case& c : cases) {
    FakeBackend be(fake_options());
    SchedulerStats st;
    auto got = run_all(c.cfg, specs, be, &st);
    expect_same(got, ref, c.name);
    if (c.expect_retraction) {
      EXPECT_GT(st.retractions, 0) << c.name;
    }
    EXPECT_EQ(st.pages_used, 0) << c.name;
    EXPECT_EQ(st.pages_free + st.pages_cached, st.pages_total) << c.name;
  }
}

TEST(Scheduler, AdmissionRespectsTheRunningCap) {
  const auto specs = mixed_requests(10, 3);
  FakeBackend be(fake_options());
  int32_t most = 0;
  run_all(config(4, 1024, 3, 64, 1, true), specs, be, nullptr, [&](Scheduler& s, int) {
    EXPECT_LE(s.stats().running, 3);
    most = std::max(most, s.stats().running);
  });
  EXPECT_EQ(most, 3);
}

TEST(Scheduler, AdmissionWaitsForPages) {
  // 10 pages of 4 tokens; each 15-token prompt needs 4 pages (16 positions + the first decode token).
  auto specs = uniform_requests(3, 15, 8, 1);
  FakeBackend be(fake_options());
  bool checked = false;
  run_all(config(4, 10, 8, 64, 1, false), specs, be, nullptr, [&](Scheduler& s, int round) {
    if (round == 0) {
      EXPECT_EQ(s.stats().running, 2);
      EXPECT_EQ(s.stats().waiting, 1);
      checked = true;
    }
  });
  EXPECT_TRUE(checked);
}

TEST(Scheduler, ChunkedPrefillStaysWithinTheBudgetAndRidesWithDecode) {
  std::mt19937 rng(5);
  RequestSpec decoder, prompt;
  decoder.prompt = random_prompt(rng, 3);
  decoder.max_new_tokens = 30;
  decoder.ignore_eos = true;
  prompt.prompt = random_prompt(rng, 50);
  prompt.max_new_tokens = 4;
  prompt.ignore_eos = true;
  RecordingBackend be(fake_options());
  const int32_t chunk = 8;
  auto got = run_all(config(4, 256, 4, chunk, 1, true), {decoder, prompt}, be);
  int mixed = 0, chunks = 0;
  for (auto& rows : be.steps) {
    int32_t prefill = 0;
    bool decode = false, has_chunk = false;
    for (auto& r : rows) {
      if (r.id == 2 && r.start < 50) {
        prefill += r.count;
        has_chunk = true;
        EXPECT_EQ(r.samples, r.start + r.count == 50);
      }
      if (r.id == 1 && r.start >= 3) decode = true;
    }
    EXPECT_LE(prefill, chunk);
    chunks += has_chunk;
    mixed += has_chunk && decode;
  }
  EXPECT_EQ(chunks, 7);  // ceil(50 / 8)
  EXPECT_GE(mixed, 6);   // every chunk after the first rides along with request 1's decode
  EXPECT_EQ(got[1].tokens.size(), 30u);
  EXPECT_EQ(got[2].tokens.size(), 4u);
}

TEST(Scheduler, MultiStepDecodeStopsEachRequestAtItsOwnLimit) {
  auto specs = uniform_requests(3, 6, 20, 9);
  for (auto& s : specs) s.sampling.temperature = 0.0f;
  specs[0].max_new_tokens = 3;
  const auto free_run = run_alone(specs);
  // Request 3 stops on its 5th token (an id that does not occur earlier in its output).
  const auto& t3 = free_run.at(3).tokens;
  size_t stop_at = 4;
  while (std::find(t3.begin(), t3.begin() + int64_t(stop_at), t3[stop_at]) != t3.begin() + int64_t(stop_at)) ++stop_at;
  specs[2].stop_ids = {t3[stop_at]};

  RecordingBackend be(fake_options());
  SchedulerStats st;
  auto got = run_all(config(4, 256, 8, 64, 8, true), specs, be, &st);
  EXPECT_EQ(got[1].tokens, free_run.at(1).tokens);
  EXPECT_EQ(got[1].reason, FinishReason::kLength);
  EXPECT_EQ(got[2].tokens, free_run.at(2).tokens);
  EXPECT_EQ(got[3].reason, FinishReason::kStop);
  EXPECT_EQ(got[3].matched, t3[stop_at]);
  EXPECT_EQ(got[3].tokens, std::vector<int32_t>(t3.begin(), t3.begin() + int64_t(stop_at) + 1));
  // Each request was computed exactly once per token it produced (none ran past its end).
  std::map<uint64_t, int> rows;
  for (auto& step : be.steps)
    for (auto& r : step) rows[r.id] += 1;
  EXPECT_EQ(rows[1], 3);
  EXPECT_EQ(rows[2], 20);
  EXPECT_EQ(rows[3], int(stop_at) + 1);
  // One prefill round, then 19 decode tokens in rounds of up to 8 steps.
  EXPECT_EQ(st.rounds, 1 + 3);
  std::sort(be.released.begin(), be.released.end());
  EXPECT_EQ(be.released, (std::vector<uint64_t>{1, 2, 3}));  // each told to the backend once, at its end
}

TEST(Scheduler, RequestsThatFinishInOneRoundLeaveTheBackendInOneCall) {
  // Three requests of one length run in lockstep and finish in the same round; a fourth, longer
  // one finishes later, alone.
  auto specs = uniform_requests(4, 6, 5, 21);
  for (auto& s : specs) s.ignore_eos = true;
  specs[3].max_new_tokens = 9;
  RecordingBackend be(fake_options());
  run_all(config(4, 256, 4, 64, 1, false), specs, be);
  ASSERT_EQ(be.release_calls.size(), 2u);
  std::sort(be.release_calls[0].begin(), be.release_calls[0].end());
  EXPECT_EQ(be.release_calls[0], (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(be.release_calls[1], std::vector<uint64_t>{4});
}

TEST(Scheduler, CancellationAbortsWaitingAndRunningRequestsAndFreesTheirPages) {
  const auto specs = uniform_requests(3, 9, 40, 11);
  RecordingBackend be(fake_options());
  be.init_kv(64, 4, 64 + 2, 2);
  Scheduler s(config(4, 64, 2, 64, 1, false), be);
  std::map<uint64_t, std::vector<OutputEvent>> events;
  EventSink sink = [&](uint64_t id, OutputEvent&& ev) { events[id].push_back(std::move(ev)); };
  for (uint64_t id = 1; id <= 3; ++id) s.add(id, specs[id - 1]);
  s.run_round(sink);
  s.run_round(sink);
  ASSERT_EQ(s.stats().running, 2);
  ASSERT_EQ(s.stats().waiting, 1);
  const int32_t used = s.stats().pages_used;
  EXPECT_TRUE(s.cancel(1, "client went away", sink));
  EXPECT_TRUE(s.cancel(3, "client went away", sink));
  EXPECT_FALSE(s.cancel(99, "unknown", sink));
  s.check_invariants();
  EXPECT_LT(s.stats().pages_used, used);
  EXPECT_EQ(s.stats().running, 1);
  EXPECT_EQ(s.stats().waiting, 0);
  for (uint64_t id : {1, 3}) {
    ASSERT_FALSE(events[id].empty());
    EXPECT_TRUE(events[id].back().finished);
    EXPECT_EQ(events[id].back().reason, FinishReason::kAbort);
    EXPECT_EQ(events[id].back().abort_message, "client went away");
  }
  EXPECT_EQ(events[1].back().usage.completion_tokens, 2);
  EXPECT_EQ(be.released, std::vector<uint64_t>{1});  // request 3 never ran
  while (!s.idle()) s.run_round(sink);
  s.check_invariants();
  EXPECT_EQ(s.stats().pages_free, 64);
}

TEST(Scheduler, PrefixReuseSkipsCachedPagesAndKeepsOutputs) {
  std::mt19937 rng(13);
  RequestSpec a;
  a.prompt = random_prompt(rng, 40);
  a.max_new_tokens = 12;
  a.ignore_eos = true;
  RequestSpec b = a;  // same prompt, different sampling: the prefix is shared, the outputs differ
  b.sampling.temperature = 0.7f;
  b.sampling.seed = 5;
  b.sampling.has_seed = true;
  const auto ref = run_alone({a, b});

  FakeBackend be(fake_options());
  be.init_kv(256, 4, 64 + 4, 4);
  Scheduler s(config(4, 256, 4, 64, 1, true), be);
  std::map<uint64_t, Outcome> out;
  EventSink sink = [&](uint64_t id, OutputEvent&& ev) {
    for (auto& t : ev.tokens) out[id].tokens.push_back(t.id);
    if (ev.finished) out[id].usage = ev.usage;
  };
  s.add(1, a);
  while (!s.idle()) s.run_round(sink);
  const int64_t prefill_first = s.stats().prefill_tokens;
  s.add(2, b);
  while (!s.idle()) s.run_round(sink);
  s.check_invariants();
  EXPECT_EQ(out[1].tokens, ref.at(1).tokens);
  EXPECT_EQ(out[2].tokens, ref.at(2).tokens);
  EXPECT_EQ(out[1].usage.cached_tokens, 0);
  EXPECT_EQ(out[2].usage.cached_tokens, 36);  // 9 whole pages: the last prompt token is always computed
  EXPECT_EQ(s.stats().prefill_tokens - prefill_first, 4);
  EXPECT_EQ(s.stats().cached_tokens, 36);
  EXPECT_GT(s.stats().pages_cached, 0);
  const int32_t cached = s.stats().pages_cached;
  EXPECT_EQ(s.flush_cache(), cached);
  EXPECT_EQ(s.stats().pages_free, 256);
}

TEST(Scheduler, RetractionRequeuesTheNewestAndItProducesTheSameTokens) {
  // 12 pages of 2 tokens: two requests of 4 + 18 tokens each fit alone, not together.
  auto specs = uniform_requests(2, 4, 18, 17);
  specs[1].sampling.temperature = 0.9f;
  specs[1].sampling.seed = 77;
  specs[1].sampling.has_seed = true;
  specs[1].sampling.logprobs_top_n = 3;
  const auto ref = run_alone(specs);
  for (bool radix : {false, true}) {
    FakeBackend be(fake_options());
    SchedulerStats st;
    bool retracted_second = false;
    auto got = run_all(config(2, 12, 2, 64, 1, radix), specs, be, &st, [&](Scheduler& s, int) {
      if (s.stats().retractions > 0 && s.stats().waiting == 1) retracted_second = true;
    });
    EXPECT_GE(st.retractions, 1);
    EXPECT_TRUE(retracted_second);
    EXPECT_EQ(got[1].tokens, ref.at(1).tokens);
    EXPECT_EQ(got[2].tokens, ref.at(2).tokens);
    EXPECT_EQ(got[2].logprobs, ref.at(2).logprobs);
    EXPECT_EQ(st.pages_used, 0);
  }
}

TEST(Scheduler, RejectsRequestsThatCannotFitAndBadConfigs) {
  FakeBackend be(fake_options());
  be.init_kv(8, 4, 100, 4);
  Scheduler s(config(4, 8, 4, 64, 1, true), be);
  RequestSpec big;
  big.prompt.assign(30, 1);
  big.max_new_tokens = 3;  // 33 > 32 pool tokens
  EXPECT_THROW(s.add(1, big), Error);
  RequestSpec empty;
  EXPECT_THROW(s.add(2, empty), Error);
  EXPECT_THROW(Scheduler(config(4, 8, 0, 64, 1, true), be), Error);
  EXPECT_THROW(Scheduler(config(4, 8, 4, 64, 0, true), be), Error);
}
