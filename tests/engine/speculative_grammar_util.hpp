// Shared by the speculative-grammar tests (speculative_grammar_test.cpp,
// speculative_grammar_stress_test.cpp, speculative_disable_grammar_test.cpp): the tiny MTP model,
// the test's own vocabulary over its 1024 ids (0-255 the bytes, 256-1021 fragments of JSON and
// text, 1022 a special token no grammar allows, 1023 EOS), its grammar compiler, checks of
// finished texts that share no code with xgrammar (nlohmann::json, the byte-regex NFA), one engine
// run (`run`) and one check of a run's outcomes (`expect_valid`).
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../cli/cli_run_helpers.hpp"
#include "backend/cpu/cpu_model_backend.hpp"
#include "grammar/byte_regex_nfa.hpp"
#include "grammar/grammar.hpp"
#include "scheduler_test_util.hpp"

namespace fp4moe::engine::testing {
namespace {

constexpr int32_t kVocab = 1024, kSpecial = 1022, kEosId = 1023;
constexpr int32_t kRefused = 1;  // the byte 0x01: no grammar here allows it (JSON strings neither)

const std::string& tiny_dir() { return testing_cli::synthetic_model("speculative_grammar_models", "glm5-tiny"); }

const std::vector<std::string>& token_bytes() {
  static const std::vector<std::string> bytes = [] {
    std::vector<std::string> v;
    for (int b = 0; b < 256; ++b) v.push_back(std::string(1, char(b)));
    for (const char* f : {"{\"", "\":", ",\"", "\"}", "true", "false", "null", "true}", "false}", "{}", "[]", "\":\"",
                          "\",\"", "yes", "no", "maybe", " a", " b", "-1", "-0", "abc", "ab", "bc", "ca", "x\"", "yy",
                          "zzz", "\"x\"", "\"yy\"", "\"zzz\"", "\"a\":", "\"b\":", "\"c\":", "\"n\":", "zz"})
      v.push_back(f);
    const std::string alphabet = "{}[]\":,0123456789abcxyz-. ne";
    for (size_t i = 0; v.size() < size_t(kSpecial); ++i)
      v.push_back(std::string(1, alphabet[i % alphabet.size()]) + alphabet[(i / alphabet.size()) % alphabet.size()]);
    v.push_back("");  // kSpecial
    v.push_back("");  // kEosId
    return v;
  }();
  return bytes;
}

grammar::Compiler& compiler() {
  static grammar::Compiler c([] {
    grammar::Vocab v;
    v.token_bytes = token_bytes();
    v.vocab_size = kVocab;
    v.stop_ids = {kEosId};
    return v;
  }());
  return c;
}

// The independent checks of a finished output (text without the EOS).
bool valid_int_bool(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || j.size() != 2 || !j.contains("n") || !j.contains("b")) return false;
  return j["n"].is_number_integer() && j["n"].get<int64_t>() >= 0 && j["n"].get<int64_t>() <= 99 && j["b"].is_boolean();
}
size_t code_points(const std::string& utf8) {  // JSON Schema's maxLength counts characters
  size_t n = 0;
  for (unsigned char c : utf8) n += (c & 0xC0) != 0x80;
  return n;
}
bool valid_enum_object(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || j.size() != 3 || !j.contains("a") || !j.contains("b") || !j.contains("c")) return false;
  const bool a = j["a"].is_string() && (j["a"] == "x" || j["a"] == "yy" || j["a"] == "zzz");
  return a && j["b"].is_boolean() && j["c"].is_string() && code_points(j["c"].get<std::string>()) <= 4;
}
bool valid_object(const std::string& text) { return nlohmann::json::parse(text, nullptr, false).is_object(); }
bool valid_digit_list(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || j.size() != 1 || !j.contains("d") || !j["d"].is_array()) return false;
  if (j["d"].empty() || j["d"].size() > 3) return false;
  for (const auto& x : j["d"])
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > 9) return false;
  return true;
}

struct Case {
  grammar::GrammarSpec spec;
  std::function<bool(const std::string&)> valid;
};

std::vector<Case> cases() {
  auto regex = [](const char* rx) {
    const auto nfa = std::make_shared<test::ByteRegexNfa>(rx);
    return Case{{grammar::Kind::kRegex, rx, true}, [nfa](const std::string& t) { return nfa->full_match(t); }};
  };
  std::vector<Case> cs;
  cs.push_back(regex("[a-c]{3}-[0-9]{2,4}"));
  cs.push_back(Case{{grammar::Kind::kJsonSchema,
                     R"({"type":"object","properties":{"n":{"type":"integer","minimum":0,"maximum":99},)"
                     R"("b":{"type":"boolean"}},"required":["n","b"],"additionalProperties":false})",
                     true},
                    valid_int_bool});
  cs.push_back(regex("(yes|no|maybe)( [a-z]{1,5}){0,3}"));
  cs.push_back(Case{{grammar::Kind::kJsonSchema,
                     R"({"type":"object","properties":{"a":{"enum":["x","yy","zzz"]},"b":{"type":"boolean"},)"
                     R"("c":{"type":"string","maxLength":4}},"required":["a","b","c"],"additionalProperties":false})",
                     true},
                    valid_enum_object});
  cs.push_back(Case{{grammar::Kind::kJsonObject, "", false}, valid_object});
  cs.push_back(Case{{grammar::Kind::kJsonSchema,
                     R"({"type":"object","properties":{"d":{"type":"array","items":{"type":"integer","minimum":0,)"
                     R"("maximum":9},"minItems":1,"maxItems":3}},"required":["d"],"additionalProperties":false})",
                     true},
                    valid_digit_list});
  return cs;
}

// Per request: (drafted, accepted, emitted) of each of its rounds; one request per run only.
struct RoundLog : StepObserver {
  void on_step(int32_t, int32_t) override {}
  void on_moe_gemm(int32_t, std::span<const int32_t>) override {}
  void on_speculative(int32_t drafted, int32_t accepted, int32_t emitted) override {
    rounds.push_back({drafted, accepted, emitted});
  }
  std::vector<std::array<int32_t, 3>> rounds;
};

std::string text_of(const std::vector<int32_t>& tokens) {
  std::string t;
  for (int32_t id : tokens)
    if (id != kEosId) t += token_bytes()[size_t(id)];
  return t;
}

// One engine run of the tiny model on the CPU backend (1 thread, F32 KV, page size 16, chunk 64).
struct RunOptions {
  int32_t steps = 0;  // NEXTN steps; 0: plain
  bool catchup_over_verify_rows = false;
  int32_t max_running = 8;
  int32_t pages = 128;
  int32_t disable_by = 0;  // --speculative-disable-by-batch-size; 0: off
  model::DraftOverride draft_override;
  StepObserver* observer = nullptr;
};

std::map<uint64_t, Outcome> run(const std::vector<RequestSpec>& sp, const RunOptions& ro, SchedulerStats* stats = nullptr) {
  CpuModelBackendOptions o;
  o.model_dir = tiny_dir();
  o.threads = 1;
  o.kv_elem = KvElem::F32;
  o.speculative_steps = ro.steps;
  o.draft_override = ro.draft_override;
  o.catchup_over_verify_rows = ro.catchup_over_verify_rows;
  CpuModelBackend be(o);
  if (ro.observer) be.set_observer(ro.observer);
  SchedulerConfig c = config(16, ro.pages, ro.max_running, 64, 1, true);
  c.eos_ids = {kEosId};
  c.speculative_tokens = ro.steps > 0 ? ro.steps + 1 : 0;
  c.speculative_disable_by_batch_size = ro.disable_by;
  return run_all(c, sp, be, stats);
}

// Every request finished without an abort; each constrained request that stopped ends in EOS and
// its text validates (request i + 1 has case cs[(first_case + i) % cs.size()]). Returns how many
// constrained requests stopped.
int expect_valid(const std::vector<Case>& cs, const std::vector<RequestSpec>& sp, const std::map<uint64_t, Outcome>& out,
                 size_t first_case = 0) {
  int stopped = 0;
  EXPECT_EQ(out.size(), sp.size());
  for (size_t i = 0; i < sp.size(); ++i) {
    const Outcome& o = out.at(i + 1);
    const Case& c = cs[(first_case + i) % cs.size()];
    const std::string text = text_of(o.tokens);
    EXPECT_TRUE(o.finished) << "request " << i + 1;
    EXPECT_NE(o.reason, FinishReason::kAbort) << "request " << i + 1 << " (" << grammar::kind_name(c.spec.kind)
                                              << " " << c.spec.text << "): aborted: " << o.abort_message
                                              << "; text so far: " << text;
    if (!sp[i].grammar || o.reason != FinishReason::kStop) continue;
    ++stopped;
    EXPECT_EQ(o.tokens.back(), kEosId) << "request " << i + 1;
    EXPECT_TRUE(c.valid(text)) << "request " << i + 1 << " (" << grammar::kind_name(c.spec.kind) << "): " << text;
  }
  return stopped;
}

}  // namespace
}  // namespace fp4moe::engine::testing
