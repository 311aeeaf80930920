// The device check's structured requests (tools/device/structured_check.py: a JSON schema closed
// by `]}`, the regex `[0-9]{3}-[a-z]{4}( OK| NO)`) on the trained model in the tree
// (models/glm5-mini-py) with its own tokenizer, through the engine on the CPU backend, with
// NEXTN in both catch-up forms (over the emitted pairs; over every verify row, the cuda
// backend's form): sampled requests over several seeds and settings never abort and every text
// validates; greedy constrained NEXTN equals greedy constrained plain, token for token.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_model_backend.hpp"
#include "trained_structured_util.hpp"

using namespace fp4moe;
using namespace fp4moe::engine;
using namespace fp4moe::engine::testing;

namespace {

struct Setting {
  int32_t steps = 0;  // NEXTN steps; 0: plain
  bool rows = false;  // catch-up over every verify row (the cuda form)
  int32_t max_running = 1;
  std::string name() const {
    return steps == 0 ? "plain" : "NEXTN " + std::to_string(steps) + (rows ? ", catch-up over verify rows" : ", catch-up over pairs") +
                                      ", max_running " + std::to_string(max_running);
  }
};

std::map<uint64_t, Outcome> run(const std::vector<RequestSpec>& sp, const Setting& s, const std::vector<int32_t>& eos) {
  CpuModelBackendOptions o;
  o.model_dir = trained_model_dir();
  o.threads = 1;
  o.kv_elem = KvElem::F32;
  o.speculative_steps = s.steps;
  o.catchup_over_verify_rows = s.rows;
  CpuModelBackend be(o);
  SchedulerConfig c = config(16, 256, s.max_running, 256, 1, true);
  c.eos_ids = eos;
  c.speculative_tokens = s.steps > 0 ? s.steps + 1 : 0;
  return run_all(c, sp, be);
}

const TrainedStructured& trained() {
  static const TrainedStructured t(4096);
  return t;
}

}  // namespace

TEST(SpeculativeGrammarTrained, SampledStructuredRequestsNeverAbortAndValidate) {
  const TrainedStructured& t = trained();
  const auto sp = structured_requests(t, true, 8);
  int stopped = 0;
  for (const Setting s : {Setting{0, false, 1}, Setting{3, false, 1}, Setting{3, true, 1}, Setting{3, true, 4},
                          Setting{1, true, 1}}) {
    stopped += expect_structured_valid(t, sp, run(sp, s, t.eos), s.name());
  }
  EXPECT_GE(stopped, 30) << "most requests end within their tokens";
}

TEST(SpeculativeGrammarTrained, GreedyStructuredNextnEqualsPlain) {
  const TrainedStructured& t = trained();
  const auto sp = structured_requests(t, false, 1);
  const auto plain = run(sp, Setting{}, t.eos);
  EXPECT_EQ(expect_structured_valid(t, sp, plain, "plain"), 2);
  for (const Setting s : {Setting{3, false, 1}, Setting{3, true, 1}, Setting{2, true, 2}}) {
    const auto spec = run(sp, s, t.eos);
    expect_structured_valid(t, sp, spec, s.name());
    for (const auto& [id, o] : plain) EXPECT_EQ(spec.at(id).tokens, o.tokens) << s.name() << ": request " << id;
  }
}

// What a round does to a request's matcher (model/speculative.cpp: drafts accepted, then rolled
// back): at every position of every text of a plain sampled run, accepting the next 1 .. 4 tokens
// (EOS included) and rolling them back leaves the same mask and the same terminated state, and
// the text's own tokens are accepted afterwards.
TEST(SpeculativeGrammarTrained, MatcherAcceptAndRollbackOfDraftsRestoresItsState) {
  const TrainedStructured& t = trained();
  const auto sp = structured_requests(t, true, 8);
  const auto plain = run(sp, Setting{}, t.eos);
  const int32_t W = grammar::mask_words(4096);
  int64_t checked = 0;
  for (size_t i = 0; i < sp.size(); ++i) {
    const std::vector<int32_t>& toks = plain.at(i + 1).tokens;
    grammar::Matcher m(sp[i].grammar);
    std::vector<uint32_t> before(static_cast<size_t>(W)), after(static_cast<size_t>(W));
    for (size_t p = 0; p < toks.size(); ++p) {
      m.fill_mask(before);
      const bool term = m.terminated();
      for (size_t j = 1; j <= 4 && p + j <= toks.size(); ++j) {
        int32_t accepted = 0;
        for (size_t q = p; q < p + j; ++q) accepted += m.accept(toks[q]);
        ASSERT_EQ(accepted, int32_t(j)) << "request " << i + 1 << " at " << p;
        m.rollback(accepted);
        m.fill_mask(after);
        ASSERT_EQ(after, before) << "request " << i + 1 << ": the mask after accepting " << j << " tokens at " << p
                                 << " and rolling them back";
        ASSERT_EQ(m.terminated(), term);
        ++checked;
      }
      ASSERT_TRUE(m.accept(toks[p])) << "request " << i + 1 << " token " << p;
    }
  }
  EXPECT_GT(checked, 500);
}
