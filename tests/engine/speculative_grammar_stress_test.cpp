// Stress of constrained requests in speculative (NEXTN) rounds, on the CPU backend with the
// round's MTP catch-up in both forms: over the emitted pairs (the CPU's own) and over every
// verify row (CpuModelBackendOptions::catchup_over_verify_rows: the cuda backend's form,
// SpecSteps::catchup_over_verify_rows), so that the host round takes the paths the cuda backend
// takes. Sampled requests (temperature 0.7-1.0, top_p, top_k, many seeds), greedy ones, forced
// drafts that hit the grammar's final token at every draft slot of a round, EOS right after it,
// a premature EOS and a draft the grammar refuses there, ignore_eos on and off: never an abort,
// every finished text valid under a checker that shares no code with xgrammar, greedy text equal
// to the plain engine's. Two of the grammars are the device check's (tools/device/
// structured_check.py): a regex whose text ends in a two-byte word, a schema closed by `]}`.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <utility>
#include <span>
#include <string_view>

#include "backend/cpu/cpu_model_backend.hpp"
#include "speculative_grammar_util.hpp"
#include "trained_structured_util.hpp"

using namespace fp4moe;
using namespace fp4moe::engine;
using namespace fp4moe::engine::testing;

namespace {

constexpr const char* kCodeRegex = kStructuredRegex;  // structured_check.py's

// JSON numbers outside strings made small, kind kept (an integer -> 1 or -1, any other -> 1.5):
// a grammar allows integers of any length and exponents of any size, nlohmann::json reads them
// as doubles or refuses them.
std::string tame_numbers(const std::string& text) {
  std::string out;
  bool in_string = false;
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) out += text[++i];
      else if (c == '"') in_string = false;
      ++i;
    } else if (c == '"') {
      in_string = true;
      out += c;
      ++i;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      size_t e = i + (c == '-');
      bool integer = true;
      while (e < text.size() && std::string_view("0123456789.eE+-").find(text[e]) != std::string_view::npos) {
        integer = integer && text[e] >= '0' && text[e] <= '9';
        ++e;
      }
      out += integer ? (c == '-' ? "-1" : "1") : "1.5";
      i = e;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

bool valid_module(const std::string& text) {  // structured_check.py's schema, written out
  const auto j = nlohmann::json::parse(tame_numbers(text), nullptr, false);
  if (!j.is_object() || j.size() != 3 || !j.contains("name") || !j.contains("count") || !j.contains("tags")) return false;
  if (!j["name"].is_string() || code_points(j["name"].get<std::string>()) > 16) return false;
  if (!j["count"].is_number_integer() || !j["tags"].is_array() || j["tags"].size() > 3) return false;
  for (const auto& t : j["tags"])
    if (!t.is_string() || (t != "a" && t != "b" && t != "c")) return false;
  return true;
}

std::vector<Case> stress_cases() {
  std::vector<Case> cs = cases();
  cs[4].valid = [](const std::string& t) { return nlohmann::json::parse(tame_numbers(t), nullptr, false).is_object(); };
  const auto nfa = std::make_shared<test::ByteRegexNfa>(kCodeRegex);
  Case rx, module;
  rx.spec.kind = grammar::Kind::kRegex;
  rx.spec.text = kCodeRegex;
  rx.valid = [nfa](const std::string& t) { return nfa->full_match(t); };
  cs.push_back(std::move(rx));
  module.spec.kind = grammar::Kind::kJsonSchema;
  module.spec.text = kStructuredSchema;  // structured_check.py's (trained_structured_util.hpp)
  module.valid = valid_module;
  cs.push_back(std::move(module));
  return cs;
}

// Request i (id i + 1): stress case i % cases; sampled ones cycle through temperature 0.7 / 0.85 /
// 1.0, top_p 1 / 0.9, top_k off / 20 with seed seed0 + i; ignore_eos on every second.
std::vector<RequestSpec> stress_specs(int n, bool sampled, uint64_t seed0) {
  const std::vector<Case> cs = stress_cases();
  std::vector<RequestSpec> out;
  for (int i = 0; i < n; ++i) {
    RequestSpec s;
    for (int j = 0; j < 4 + 5 * (i % 3); ++j) s.prompt.push_back((29 + 37 * j + 71 * i) % 1000);
    s.max_new_tokens = 48 + 8 * (i % 3);
    s.sampling.temperature = 0.0f;
    if (sampled) {
      s.sampling.temperature = std::array<float, 3>{0.7f, 0.85f, 1.0f}[size_t(i) % 3];
      s.sampling.top_p = (i / 3) % 2 ? 0.9f : 1.0f;
      s.sampling.top_k = (i / 6) % 2 ? 20 : -1;
      s.sampling.seed = seed0 + uint64_t(i);
      s.sampling.has_seed = true;
    }
    s.ignore_eos = i % 2 == 1;
    s.grammar = compiler().compile(cs[size_t(i) % cs.size()].spec);
    out.push_back(std::move(s));
  }
  return out;
}

// The stress runs keep their pool of 256 pages of 16 (the other speculative-grammar tests: 128).
RunOptions stress_run() {
  RunOptions ro;
  ro.pages = 256;
  return ro;
}

std::string describe(const RunOptions& ro) {
  return "NEXTN steps " + std::to_string(ro.steps) +
         (ro.catchup_over_verify_rows ? ", catch-up over every verify row (cuda form)" : ", catch-up over emitted pairs") +
         ", max_running " + std::to_string(ro.max_running) + (ro.draft_override ? ", forced drafts" : "");
}

// The stress cases' checks (request i: stress case i % cases). Returns how many stopped.
int expect_valid(const std::vector<RequestSpec>& sp, const std::map<uint64_t, Outcome>& out) {
  return engine::testing::expect_valid(stress_cases(), sp, out);
}

void expect_same_tokens(const std::map<uint64_t, Outcome>& a, const std::map<uint64_t, Outcome>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [id, o] : a) {
    EXPECT_EQ(o.tokens, b.at(id).tokens) << "request " << id;
    EXPECT_EQ(o.reason, b.at(id).reason) << "request " << id;
  }
}

// Forced drafts from a reference run's tokens, with the round boundaries shifted by `shift`
// (a refused draft at output index shift ends that round's chain there, so that over shift =
// 0 .. N the text's final token falls on every draft slot of a round) and, per `twist`, near
// the end of the text (the index e of its EOS): 0 none (the final token, then EOS, drafted
// right); 1 a premature EOS drafted for the final token (the grammar refuses it); 2 a refused
// byte drafted for EOS; 3 a wrong allowed-looking token for the final one (the next id).
model::DraftOverride forced(const std::map<uint64_t, Outcome>& ref, uint64_t shift, int twist) {
  return [&ref, shift, twist](uint64_t id, uint64_t idx, int32_t mtp) {
    const auto& toks = ref.at(id).tokens;
    if (idx == shift) return kRefused;
    if (idx >= toks.size()) return mtp;
    const bool ends = toks.back() == kEosId;
    const uint64_t e = toks.size() - 1;
    if (ends && twist == 1 && e >= 1 && idx == e - 1) return kEosId;
    if (ends && twist == 2 && idx == e) return kRefused;
    if (ends && twist == 3 && e >= 1 && idx == e - 1) return (toks[idx] + 1) % kSpecial;
    return toks[idx];
  };
}

}  // namespace

// The sampled stress: 2 x 24 requests over 8 grammars and 12 sampling settings, batched (8
// running) and one at a time, NEXTN 1 and 3, both catch-up forms: no abort, every text valid.
TEST(SpeculativeGrammarStress, SampledConstrainedRequestsNeverAbortAndValidate) {
  for (uint64_t seed0 : {1000u, 5000u}) {
    const auto sp = stress_specs(24, true, seed0);
    for (const bool rows : {false, true})
      for (const int32_t steps : {1, 3})
        for (const int32_t running : {8, 1}) {
          RunOptions ro = stress_run();
          ro.steps = steps;
          ro.catchup_over_verify_rows = rows;
          ro.max_running = running;
          SCOPED_TRACE(describe(ro) + ", seeds from " + std::to_string(seed0));
          SchedulerStats st;
          const auto out = run(sp, ro, &st);
          EXPECT_GE(expect_valid(sp, out), 8) << "many requests end in EOS within their tokens";
          EXPECT_GT(st.verify_steps, 0);
        }
  }
}

// Greedy constrained requests: NEXTN's text is the plain engine's, in both catch-up forms, with
// the MTP's own drafts and with forced drafts that place the final token at every draft slot,
// EOS right after it, a premature EOS, a refused byte for EOS, a wrong final token.
TEST(SpeculativeGrammarStress, GreedyConstrainedTextEqualsThePlainEngineAtEveryRoundBoundary) {
  const auto sp = stress_specs(16, false, 0);
  const auto plain = run(sp, stress_run());
  EXPECT_GE(expect_valid(sp, plain), 8);
  for (const bool rows : {false, true})
    for (const int32_t steps : {1, 3}) {
      RunOptions ro = stress_run();
      ro.steps = steps;
      ro.catchup_over_verify_rows = rows;
      {
        SCOPED_TRACE(describe(ro));
        const auto own = run(sp, ro);
        expect_same_tokens(own, plain);
        expect_valid(sp, own);
      }
      for (uint64_t shift = 0; shift <= uint64_t(steps); ++shift)
        for (int twist = 0; twist < 4; ++twist) {
          ro.draft_override = forced(plain, shift + 1, twist);  // index 0 is the prefill step's
          SCOPED_TRACE(describe(ro) + ", shift " + std::to_string(shift) + ", twist " + std::to_string(twist));
          const auto out = run(sp, ro);
          expect_same_tokens(out, plain);
          expect_valid(sp, out);
        }
    }
}

// Sampled requests with forced drafts: the tokens of the same requests' plain sampled run
// (mostly the target's likely choices, so that rounds accept several and reach the text's end
// inside a round), shifted and twisted as above: no abort, every text valid.
TEST(SpeculativeGrammarStress, SampledConstrainedRequestsWithForcedDraftsNeverAbort) {
  const auto sp = stress_specs(16, true, 300);
  const auto plain = run(sp, stress_run());
  EXPECT_GE(expect_valid(sp, plain), 6);
  for (const bool rows : {false, true}) {
    RunOptions ro = stress_run();
    ro.steps = 3;
    ro.catchup_over_verify_rows = rows;
    for (uint64_t shift = 0; shift <= 3; ++shift)
      for (int twist = 0; twist < 4; ++twist) {
        ro.draft_override = forced(plain, shift + 1, twist);
        SCOPED_TRACE(describe(ro) + ", shift " + std::to_string(shift) + ", twist " + std::to_string(twist));
        expect_valid(sp, run(sp, ro));
      }
  }
}

namespace {

// Steps whose target logits are 0 everywhere but `value` (NaN unless given) at token `nan_at`
// (the MTP's are 0).
class NanLogitSteps final : public model::SpecSteps {
 public:
  explicit NanLogitSteps(int32_t nan_at, float value = std::nanf("")) : nan_at_(nan_at), value_(value) {
    cfg_.vocab = 64;
    cfg_.hidden = 4;
  }
  const model::MlaModelConfig& config() const override { return cfg_; }
  int64_t page_size() const override { return 16; }
  void verify(const TensorView& tokens, const KvBatchView&, const std::vector<int32_t>& rows, const TensorView& logits,
              float* hidden) override {
    float* l = logits.ptr<float>();
    std::fill(l, l + rows.size() * size_t(cfg_.vocab), 0.0f);
    for (size_t i = 0; i < rows.size(); ++i) l[i * size_t(cfg_.vocab) + size_t(nan_at_)] = value_;
    std::fill(hidden, hidden + tokens.size(0) * cfg_.hidden, 0.0f);
  }
  void mtp(const TensorView& tokens, const float*, const KvBatchView&, const std::vector<int32_t>& rows,
           const TensorView& logits, float* h_out) override {
    std::fill(logits.ptr<float>(), logits.ptr<float>() + rows.size() * size_t(cfg_.vocab), 0.0f);
    std::fill(h_out, h_out + tokens.size(0) * cfg_.hidden, 0.0f);
  }

 private:
  model::MlaModelConfig cfg_;
  int32_t nan_at_;
  float value_;
};

// Allows only `token`, once.
class OneTokenConstraint final : public model::TokenConstraint {
 public:
  explicit OneTokenConstraint(int32_t token) : token_(token) {}
  void fill_mask(std::span<uint32_t> mask) override {
    std::fill(mask.begin(), mask.end(), 0u);
    if (!done_) mask[size_t(token_ / 32)] |= 1u << (token_ % 32);
  }
  bool accept(int32_t t) override { return !done_ && t == token_ && (done_ = true); }
  bool terminated() const override { return done_; }
  void rollback(int32_t n) override { done_ = done_ && n == 0; }

 private:
  int32_t token_;
  bool done_ = false;
};

}  // namespace

// The diagnostics of a round that emits a token outside its grammar mask (the case the cuda
// backend's aborted requests would be, with non-finite logits where the mask allows): a warn
// line with the round's trace, and on_round's trace says which row, that the token is outside,
// and that the allowed token's logit is not finite.
TEST(SpeculativeGrammarStress, ARoundEmittingOutsideItsMaskSaysWhyInTheLog) {
  NanLogitSteps steps(5);
  model::MtpSpeculator spec(steps, 3);
  std::vector<model::RoundTrace> traces;
  spec.on_round = [&](const model::RoundTrace& t) { traces.push_back(t); };
  OneTokenConstraint c(5);
  const std::vector<int32_t> pages = {0}, prompt = {1, 2, 3};
  model::SpecRequest rq;
  rq.id = 7;
  rq.start = 3;
  rq.last_token = 3;
  rq.pages = pages;
  rq.max_new = 4;
  rq.sampling.temperature = 0.0f;
  rq.prompt = prompt;
  rq.output_index = 1;
  rq.constraint = &c;
  ::testing::internal::CaptureStderr();
  const auto res = spec.round({rq});
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(res.size(), 1u);
  ASSERT_EQ(res[0].tokens.size(), 1u) << "no MTP state yet: the round is the bonus token only";
  EXPECT_NE(res[0].tokens[0].token, 5) << "a NaN logit never wins (sample_cpu's rule)";
  ASSERT_EQ(traces.size(), 1u);
  const model::RoundTrace& t = traces[0];
  EXPECT_EQ(t.id, 7u);
  ASSERT_EQ(t.inside.size(), 1u);
  EXPECT_FALSE(t.inside[0]);
  EXPECT_EQ(t.allowed[0], 1);
  EXPECT_EQ(t.nonfinite[0], 1);
  EXPECT_TRUE(t.emitted_outside_mask());
  EXPECT_NE(log.find("speculative round: a token outside its grammar mask: request 7 at output index 1"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("1 non-finite"), std::string::npos) << log;
  EXPECT_FALSE(c.terminated()) << "the round leaves the constraint as it found it";
}

namespace {

// Allows tokens a and b at every position, forever.
class TwoTokenConstraint final : public model::TokenConstraint {
 public:
  TwoTokenConstraint(int32_t a, int32_t b) : a_(a), b_(b) {}
  void fill_mask(std::span<uint32_t> mask) override {
    std::fill(mask.begin(), mask.end(), 0u);
    mask[size_t(a_ / 32)] |= 1u << (a_ % 32);
    mask[size_t(b_ / 32)] |= 1u << (b_ % 32);
  }
  bool accept(int32_t t) override { return (t == a_ || t == b_) && ++accepted >= 0; }
  bool terminated() const override { return false; }
  void rollback(int32_t n) override { accepted -= n; }
  int32_t accepted = 0;

 private:
  int32_t a_, b_;
};

}  // namespace

// A sampled constrained round over target logits with a NaN at one of the two allowed tokens, or
// a +inf at one: the NaN counts as -inf, the +inf takes all the mass (sample_cpu's rules), so
// every emitted token is token 9 (before, the rejection step's distribution was NaN and
// draw_from gave the vocabulary's last token, outside the mask: an abort).
TEST(SpeculativeGrammarStress, SampledRoundsTreatNonFiniteLogitsAsThePlainSamplerDoes) {
  for (const auto& [at, value] : {std::pair<int32_t, float>{5, std::nanf("")},
                                  std::pair<int32_t, float>{9, std::numeric_limits<float>::infinity()}}) {
    SCOPED_TRACE("logit " + std::to_string(value) + " at token " + std::to_string(at));
    NanLogitSteps steps(at, value);
    model::MtpSpeculator spec(steps, 3);
    std::vector<model::RoundTrace> traces;
    spec.on_round = [&](const model::RoundTrace& t) { traces.push_back(t); };
    const std::vector<int32_t> pages = {0}, prompt = {1, 2, 3};
    const std::vector<float> hidden(3 * 4, 0.0f);
    spec.add_target_rows(7, 0, prompt, hidden.data(), 9, pages);  // the MTP state at position 2: drafts from 3 on
    spec.run_queued();
    TwoTokenConstraint c(5, 9);
    int64_t drafted = 0, emitted = 0;
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      model::SpecRequest rq;
      rq.id = 7;
      rq.start = 3;
      rq.last_token = 9;
      rq.pages = pages;
      rq.max_new = 4;
      rq.sampling.temperature = 1.0f;
      rq.sampling.seed = seed;
      rq.sampling.has_seed = true;
      rq.prompt = prompt;
      rq.output_index = 1;
      rq.constraint = &c;
      spec.add_target_rows(7, 0, prompt, hidden.data(), 9, pages);  // the same MTP state every time
      spec.run_queued();
      const auto res = spec.round({rq});
      drafted += res[0].drafted;
      for (const auto& t : res[0].tokens) EXPECT_EQ(t.token, 9) << "seed " << seed;
      emitted += int64_t(res[0].tokens.size());
      EXPECT_EQ(c.accepted, 0) << "the round leaves the constraint as it found it";
    }
    EXPECT_GT(drafted, 20) << "rounds drafted (and so ran the rejection step)";
    for (const auto& t : traces) EXPECT_FALSE(t.emitted_outside_mask()) << t.describe();
    EXPECT_GT(emitted, 20);
  }
}
