// Constrained requests inside speculative rounds (issue 42) through the engine's scheduler on the
// CPU backend (make-synthetic glm5-tiny with its MTP layer, F32 KV): greedy JSON-schema, regex
// and json_object requests, mixed with unconstrained ones, give the plain engine's tokens with
// NEXTN (the MTP layer's own drafts, masked; and forced drafts, some of which the grammar
// refuses), every finished output validates with a checker that shares no code with xgrammar,
// a refused draft ends the draft chain before it (the drafted counts), seeded sampled
// constrained requests stay in their language and reproduce, and their tokens have the plain
// engine's distribution (a two-sample chi-square: rejection sampling stays lossless with masks).
//
// The grammar vocabulary is the test's own over the model's 1024 ids: 0-255 the bytes, 256-1021
// fragments of JSON and text (several bytes each, so drafts and masks cross token boundaries),
// 1022 a special token (no grammar allows it), 1023 EOS.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_model_backend.hpp"
#include "speculative_grammar_util.hpp"

using namespace fp4moe;
using namespace fp4moe::engine;
using namespace fp4moe::engine::testing;

namespace {

// Requests 1..n: case i % cases (every seventh unconstrained), greedy unless `sampled`; every
// second one with ignore_eos, every third with logprobs.
std::vector<RequestSpec> specs(int n, bool sampled) {
  const std::vector<Case> cs = cases();
  std::vector<RequestSpec> out;
  for (int i = 0; i < n; ++i) {
    RequestSpec s;
    for (int j = 0; j < 5 + 7 * (i % 4); ++j) s.prompt.push_back((13 + 41 * j + 89 * i) % 1000);
    s.max_new_tokens = 40 + 8 * (i % 3);
    s.sampling.temperature = sampled ? 0.9f : 0.0f;
    if (sampled) {
      s.sampling.seed = 77 + uint64_t(i);
      s.sampling.has_seed = true;
    }
    s.ignore_eos = i % 2 == 1;  // the grammar still ends the text at EOS (Matcher::terminated)
    s.sampling.logprobs_top_n = i % 3 == 0 ? 2 : -1;  // logprobs of the masked distribution
    if (i % 7 != 6) s.grammar = compiler().compile(cs[size_t(i) % cs.size()].spec);
    out.push_back(std::move(s));
  }
  return out;
}

std::map<uint64_t, Outcome> run(const std::vector<RequestSpec>& sp, int32_t steps, model::DraftOverride override = {},
                                RoundLog* log = nullptr, SchedulerStats* stats = nullptr) {
  RunOptions ro;
  ro.steps = steps;
  ro.draft_override = std::move(override);
  ro.observer = log;
  return engine::testing::run(sp, ro, stats);
}

// The shared checks over this file's cases (request i + 1 has case first_case + i).
int expect_valid(const std::vector<RequestSpec>& sp, const std::map<uint64_t, Outcome>& out, size_t first_case = 0) {
  return engine::testing::expect_valid(cases(), sp, out, first_case);
}

void expect_same(const std::map<uint64_t, Outcome>& a, const std::map<uint64_t, Outcome>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [id, o] : a) {
    const Outcome& p = b.at(id);
    EXPECT_EQ(o.tokens, p.tokens) << "request " << id;
    EXPECT_EQ(o.reason, p.reason) << "request " << id;
    EXPECT_EQ(o.usage.completion_tokens, p.usage.completion_tokens) << "request " << id;
    EXPECT_EQ(o.logprobs, p.logprobs) << "request " << id;
  }
}

// Forced drafts: the plain run's tokens, every fourth one kRefused (the grammar refuses it) and every fifth one the next id (the grammar may allow it; the target then rejects it).
model::DraftOverride forced(const std::map<uint64_t, Outcome>& plain) {
  return [&plain](uint64_t id, uint64_t idx, int32_t mtp) {
    const auto& toks = plain.at(id).tokens;
    const int32_t t = idx < toks.size() ? toks[idx] : mtp;
    if (idx % 4 == 3) return kRefused;
    return idx % 5 == 4 ? (t + 1) % kSpecial : t;
  };
}

}  // namespace

TEST(SpeculativeGrammar, GreedyConstrainedOutputEqualsThePlainEngineAndValidates) {
  const auto sp = specs(14, false);
  const auto plain = run(sp, 0);
  EXPECT_GE(expect_valid(sp, plain), 8) << "most constrained requests end within their tokens";
  for (int32_t n : {1, 3}) {
    SCOPED_TRACE("NEXTN steps " + std::to_string(n));
    SchedulerStats st;
    RoundLog log;
    const auto own = run(sp, n, {}, &log, &st);  // the MTP layer's drafts from masked rows
    expect_same(own, plain);
    expect_valid(sp, own);
    EXPECT_GT(st.verify_steps, 0);
    int64_t drafted = 0, accepted = 0;
    for (const auto& r : log.rounds) drafted += r[0], accepted += r[1];
    RecordProperty("own_drafts_accepted_n" + std::to_string(n), std::to_string(accepted) + " / " + std::to_string(drafted));
    const auto forced_run = run(sp, n, forced(plain), nullptr, &st);
    expect_same(forced_run, plain);
    expect_valid(sp, forced_run);
    int64_t tokens = 0, verify = 0;
    for (const auto& [id, o] : forced_run) tokens += o.usage.completion_tokens, verify += o.usage.spec_verify_steps;
    if (n == 3) {
      EXPECT_LT(verify, tokens * 3 / 4) << "forced drafts: many rounds emit several tokens";
    }
  }
}

// One constrained request at a time, forced drafts whose every fourth is refused by the grammar:
// each round's drafted count is the run of allowed drafts before the first refused one (capped
// by the steps and the tokens left; a draft that ends the text, EOS, ends the chain after it).
TEST(SpeculativeGrammar, ADraftTheGrammarRefusesEndsTheDraftChainBeforeIt) {
  constexpr int32_t kSteps = 3;
  const auto all = specs(6, false);
  int64_t short_chains = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const std::vector<RequestSpec> one = {all[i]};
    const auto plain = run(one, 0);
    auto refused = [](uint64_t idx) { return idx % 4 == 3; };
    RoundLog log;
    const auto spec = run(one, kSteps,
                          [&plain, &refused](uint64_t id, uint64_t idx, int32_t mtp) {
                            const auto& toks = plain.at(id).tokens;
                            return refused(idx) ? kRefused : idx < toks.size() ? toks[idx] : mtp;
                          },
                          &log);
    expect_same(spec, plain);
    expect_valid(one, spec, i);
    const std::vector<int32_t>& toks = plain.at(1).tokens;
    uint64_t o = 1;  // the first round follows the prefill step's token
    ASSERT_FALSE(log.rounds.empty());
    for (const auto& [drafted, accepted, emitted] : log.rounds) {
      const int64_t max_new = std::min<int64_t>(kSteps + 1, one[0].max_new_tokens - int64_t(o));
      int32_t want = 0;
      while (want < max_new - 1 && !refused(o + uint64_t(want))) {
        ++want;
        if (toks[o + uint64_t(want) - 1] == kEosId) break;
      }
      EXPECT_EQ(drafted, want) << "round at output index " << o;
      EXPECT_EQ(accepted, want) << "the plain run's tokens are the target's choices";
      short_chains += want < std::min<int64_t>(kSteps, max_new - 1);
      o += uint64_t(emitted);
    }
    EXPECT_EQ(o, toks.size());
  }
  EXPECT_GT(short_chains, 5);
}

// Seeded sampled constrained requests under NEXTN: every output in its language, the same tokens
// on a second run (rejection sampling against the masked distributions; its losslessness is
// argued in model/speculative.hpp and tested for the unmasked case in tests/model).
TEST(SpeculativeGrammar, SeededSampledConstrainedRequestsStayInTheirLanguageAndReproduce) {
  const auto sp = specs(14, true);
  SchedulerStats st;
  const auto a = run(sp, 3, {}, nullptr, &st);
  EXPECT_GE(expect_valid(sp, a), 5);
  EXPECT_GT(st.verify_steps, 0);
  expect_same(run(sp, 3), a);
}

// Lossless with masks: 400 seeded sampled requests with one constrained prompt without NEXTN,
// 400 with other seeds and NEXTN 2 (all prompts in one step, then every round a draft/verify
// round); the tokens drawn after the prompt step (output indices 1-3: accepted drafts, residual
// and bonus draws under NEXTN) have the same distribution. A two-sample chi-square over the
// (index, token) cells with >= 10 draws pooled (rarer cells merged) is held to its 0.001 quantile
// (Wilson-Hilferty); the seeds are fixed, so the test is deterministic.
TEST(SpeculativeGrammar, SampledConstrainedTokensHaveThePlainDistribution) {
  constexpr int kRequests = 400;
  const Case c = cases()[0];  // [a-c]{3}-[0-9]{2,4}
  const grammar::GrammarPtr g = compiler().compile(c.spec);
  std::vector<RequestSpec> sp;
  for (int i = 0; i < kRequests; ++i) {
    RequestSpec s;
    s.prompt = {17, 250, 3, 99, 512};
    s.max_new_tokens = 4;
    s.sampling.temperature = 1.0f;
    s.sampling.seed = 1000 + uint64_t(i);
    s.sampling.has_seed = true;
    s.grammar = g;
    sp.push_back(std::move(s));
  }
  auto counts = [&](int32_t steps, RoundLog* log, uint64_t seed_shift) {
    for (auto& s : sp) s.sampling.seed += seed_shift;
    CpuModelBackendOptions o;
    o.model_dir = tiny_dir();
    o.threads = 1;
    o.kv_elem = KvElem::F32;
    o.speculative_steps = steps;
    CpuModelBackend be(o);
    if (log) be.set_observer(log);
    SchedulerConfig cfg = config(16, 1024, kRequests, 4096, 1, true);
    cfg.eos_ids = {kEosId};
    cfg.speculative_tokens = steps > 0 ? steps + 1 : 0;
    const auto out = run_all(cfg, sp, be);
    std::map<std::pair<int, int32_t>, int> n;
    for (const auto& [id, oc] : out) {
      EXPECT_NE(oc.reason, FinishReason::kAbort);
      for (int k = 1; k < 4 && k < int(oc.tokens.size()); ++k) ++n[{k, oc.tokens[size_t(k)]}];
    }
    return n;
  };
  RoundLog log;
  const auto plain = counts(0, nullptr, 0), spec = counts(2, &log, 1u << 20);
  int64_t drafted = 0, accepted = 0;
  for (const auto& r : log.rounds) drafted += r[0], accepted += r[1];
  EXPECT_GT(accepted, drafted / 10) << "drafts are accepted";
  EXPECT_LT(accepted, drafted) << "and rejected (the residual draws)";
  std::map<std::pair<int, int32_t>, std::pair<int, int>> cells;
  for (const auto& [k, v] : plain) cells[k].first += v;
  for (const auto& [k, v] : spec) cells[k].second += v;
  double chi2 = 0.0;
  int df = -1;
  int64_t rest_a = 0, rest_b = 0;
  auto add = [&](int64_t a, int64_t b) {
    if (a + b == 0) return;
    chi2 += double(a - b) * double(a - b) / double(a + b);
    ++df;
  };
  for (const auto& [k, ab] : cells) {
    if (ab.first + ab.second >= 10) {
      add(ab.first, ab.second);
    } else {
      rest_a += ab.first, rest_b += ab.second;
    }
  }
  add(rest_a, rest_b);
  ASSERT_GE(df, 3) << "too few cells for a test";
  const double z = 3.09, h = 2.0 / (9.0 * df);
  const double limit = df * std::pow(1.0 - h + z * std::sqrt(h), 3.0);
  EXPECT_LT(chi2, limit) << df << " degrees of freedom";
  RecordProperty("chi2", std::to_string(chi2) + " df " + std::to_string(df) + " limit " + std::to_string(limit));
  RecordProperty("accepted_of_drafted", std::to_string(accepted) + " / " + std::to_string(drafted));
}
