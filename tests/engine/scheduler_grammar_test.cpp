// Constrained requests through the scheduler over the fake backend: the grammar masks filled
// while the backend runs its forward (SchedulerConfig::overlap_token_masks, the default with a
// backend that waits for them) give exactly the tokens of the masks filled before the step,
// for greedy and seeded sampling, mixed with unconstrained requests and prefill chunks; and the
// outputs are in their grammar's language.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "engine/scheduler_test_util.hpp"
#include "grammar/grammar.hpp"

namespace fp4moe::engine::testing {
namespace {

// The fake backend's vocabulary: ids 0-255 are the bytes, 256 EOS, 257-259 specials.
grammar::Compiler& compiler() {
  static grammar::Compiler c([] {
    grammar::Vocab v;
    for (int b = 0; b < 256; ++b) v.token_bytes.push_back(std::string(1, char(b)));
    for (int k = 256; k < 260; ++k) v.token_bytes.push_back("");
    v.vocab_size = 260;
    v.stop_ids = {kEos};
    return v;
  }());
  return c;
}

struct Case {
  grammar::GrammarSpec spec;
  std::string full_match;  // a std::regex over the output text ("" : not checked here)
};

Case make_case(grammar::Kind kind, const char* text, const char* full_match) {
  Case c;
  c.spec.kind = kind;
  c.spec.text = text;
  c.full_match = full_match;
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> cs;
  cs.push_back(make_case(grammar::Kind::kRegex, "[a-c]{3}-[0-9]{2,4}", "[a-c]{3}-[0-9]{2,4}"));
  cs.push_back(make_case(grammar::Kind::kRegex, "(yes|no|maybe)( [a-z]{1,5}){0,3}", "(yes|no|maybe)( [a-z]{1,5}){0,3}"));
  cs.push_back(make_case(grammar::Kind::kJsonSchema,
                         R"({"type":"object","properties":{"n":{"type":"integer","minimum":0,"maximum":99},)"
                         R"("b":{"type":"boolean"}},"required":["n","b"],"additionalProperties":false})",
                         R"(\{"n":(0|[1-9][0-9]?),"b":(true|false)\})"));
  cs.push_back(make_case(grammar::Kind::kEbnf, "root ::= \"(\" [0-9]+ (\",\" [0-9]+)* \")\"", R"(\([0-9]+(,[0-9]+)*\))"));
  return cs;
}

std::vector<RequestSpec> specs(uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<Case> cs = cases();
  std::vector<RequestSpec> out;
  for (int i = 0; i < 24; ++i) {
    RequestSpec s;
    s.prompt = random_prompt(rng, 3 + int32_t(rng() % 40));
    s.max_new_tokens = 48;
    s.sampling.seed = rng();
    s.sampling.has_seed = true;
    s.sampling.temperature = i % 3 == 0 ? 0.0f : 1.0f;  // greedy and seeded sampling
    if (i % 4 != 3) s.grammar = compiler().compile(cs[size_t(i) % cs.size()].spec);  // every 4th unconstrained
    out.push_back(std::move(s));
  }
  return out;
}

// Counts the steps whose masks were still being filled when step() began.
class GateCountingBackend : public FakeBackend {
 public:
  using FakeBackend::FakeBackend;
  void step(const StepBatch& batch, std::vector<GeneratedToken>& out) override {
    gated += batch.await_token_masks != nullptr;
    FakeBackend::step(batch, out);
  }
  int64_t gated = 0;
};

std::map<uint64_t, Outcome> run(const std::vector<RequestSpec>& sp, bool overlap, int32_t delay_us) {
  FakeBackendOptions o = fake_options();
  o.step_delay_us = delay_us;
  GateCountingBackend be(o);
  SchedulerConfig cfg = config(4, 1024, 8, 24, 1, true);  // 8 running, prefill chunks of 24 tokens
  cfg.overlap_token_masks = overlap;
  auto out = run_all(cfg, sp, be);
  if (overlap)
    EXPECT_GT(be.gated, 20);  // constrained steps overlapped their fill
  else
    EXPECT_EQ(be.gated, 0);
  return out;
}

TEST(SchedulerGrammar, MasksFilledDuringTheForwardGiveTheSameTokens) {
  ASSERT_TRUE(FakeBackend(fake_options()).info().overlaps_token_masks);
  for (uint32_t seed : {1u, 2u, 3u}) {
    const std::vector<RequestSpec> sp = specs(seed);
    const auto before = run(sp, false, 0);
    const auto during = run(sp, true, 300);  // a forward long enough for the fill to run inside it
    ASSERT_EQ(before.size(), sp.size());
    ASSERT_EQ(during.size(), sp.size());
    int constrained_stopped = 0;
    for (size_t i = 0; i < sp.size(); ++i) {
      const Outcome& a = before.at(i + 1);
      const Outcome& b = during.at(i + 1);
      SCOPED_TRACE("seed " + std::to_string(seed) + " request " + std::to_string(i + 1));
      EXPECT_EQ(a.tokens, b.tokens);
      EXPECT_EQ(a.reason, b.reason);
      EXPECT_TRUE(a.finished && b.finished);
      EXPECT_NE(a.reason, FinishReason::kAbort);
      if (!sp[i].grammar) continue;
      // In the language: the text before EOS fully matches (when the grammar ended it).
      if (a.reason != FinishReason::kStop) continue;
      ++constrained_stopped;
      std::string text;
      for (int32_t t : a.tokens)
        if (t < 256) text += char(t);
      EXPECT_EQ(a.tokens.back(), kEos);
      const std::string rx = cases()[i % cases().size()].full_match;
      EXPECT_TRUE(std::regex_match(text, std::regex(rx))) << text << " !~ " << rx;
    }
    EXPECT_GE(constrained_stopped, 6);  // most constrained requests end within 48 tokens
  }
}

}  // namespace
}  // namespace fp4moe::engine::testing
