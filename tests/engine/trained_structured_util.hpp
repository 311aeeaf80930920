// The device check's structured requests (tools/device/structured_check.py) on the trained model
// in the tree (models/glm5-mini-py: vocab 4096, EOS id 0), through the engine's scheduler on any
// backend: its chat prompt, a JSON-schema request (a name of at most 16 characters, an integer,
// up to 3 tags of a / b / c; the text closes with `]}`) and a regex request
// (`[0-9]{3}-[a-z]{4}( OK| NO)`), greedy and sampled over several seeds and settings; the
// finished texts are checked by code that shares nothing with xgrammar (nlohmann::json and the
// schema's rules written out; the byte-regex NFA of tests/grammar).
// Used by tests/engine/speculative_grammar_trained_test.cpp (CPU) and
// tests/backend/gpu_speculative_grammar_test.cpp (CUDA).
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>
#include <string>
#include <vector>

#include "engine/scheduler_test_util.hpp"
#include "grammar/byte_regex_nfa.hpp"
#include "grammar/grammar.hpp"
#include "text/tokenizer.hpp"

namespace fp4moe::engine::testing {

inline std::string trained_model_dir() { return std::string(FP4MOE_SOURCE_DIR) + "/models/glm5-mini-py"; }

constexpr const char* kStructuredRegex = "[0-9]{3}-[a-z]{4}( OK| NO)";
constexpr const char* kStructuredSchema =
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":16},"count":{"type":"integer"},)"
    R"("tags":{"type":"array","items":{"type":"string","enum":["a","b","c"]},"maxItems":3}},)"
    R"("required":["name","count","tags"],"additionalProperties":false})";

// The model's tokenizer and a grammar compiler over it as the server builds one (server.cpp:
// stop ids = the tokenizer's EOS ids, special tokens have no bytes, the model's logit width).
struct TrainedStructured {
  text::Tokenizer tok;
  std::unique_ptr<grammar::Compiler> compiler;
  grammar::GrammarPtr schema, regex;
  std::vector<int32_t> prompt;  // "<|user|>Describe a Python module as JSON.<|assistant|>"
  std::vector<int32_t> eos;

  explicit TrainedStructured(int32_t model_vocab) : tok(text::Tokenizer::from_dir(trained_model_dir())) {
    grammar::Vocab v;
    v.vocab_size = model_vocab;
    v.stop_ids = tok.stop_ids();
    for (int32_t id = 0; id < tok.vocab_size(); ++id)
      v.token_bytes.push_back(tok.is_special(id) ? std::string() : std::string(tok.token_bytes(id)));
    eos = v.stop_ids;
    compiler = std::make_unique<grammar::Compiler>(v);
    schema = compiler->compile({grammar::Kind::kJsonSchema, kStructuredSchema, true});
    regex = compiler->compile({grammar::Kind::kRegex, kStructuredRegex, true});
    prompt = tok.encode("<|user|>Describe a Python module as JSON.<|assistant|>", false);
  }

  std::string text(const std::vector<int32_t>& tokens) const { return tok.decode(tokens, true); }
};

// structured_check.py's schema, written out (integers of any length: the grammar allows them).
inline bool valid_structured_schema(const std::string& text) {
  std::string tame;  // integers outside strings -> 1 (nlohmann reads long ones as doubles)
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      tame += c;
      if (c == '\\' && i + 1 < text.size()) tame += text[++i];
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true, tame += c;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      size_t e = i + 1;
      bool integer = true;
      while (e < text.size() && std::string_view("0123456789.eE+-").find(text[e]) != std::string_view::npos)
        integer = integer && text[e] >= '0' && text[e] <= '9', ++e;
      tame += integer ? "1" : "1.5";
      i = e - 1;
    } else {
      tame += c;
    }
  }
  const auto j = nlohmann::json::parse(tame, nullptr, false);
  if (!j.is_object() || j.size() != 3 || !j.contains("name") || !j.contains("count") || !j.contains("tags")) return false;
  if (!j["name"].is_string() || !j["count"].is_number_integer() || !j["tags"].is_array() || j["tags"].size() > 3)
    return false;
  size_t chars = 0;
  for (unsigned char ch : j["name"].get<std::string>()) chars += (ch & 0xC0) != 0x80;
  if (chars > 16) return false;
  for (const auto& t : j["tags"])
    if (!t.is_string() || (t != "a" && t != "b" && t != "c")) return false;
  return true;
}

inline bool valid_structured_regex(const std::string& text) {
  static const test::ByteRegexNfa nfa(kStructuredRegex);
  return nfa.full_match(text);
}

// Requests: for each seed, a schema request (max 96 tokens) and a regex one (max 32), as
// structured_check.py sends them; sampled ones cycle temperature 0.7 / 0.9 / 1.0, top_p 1 / 0.9,
// top_k off / 40 (seed 0 with temperature 0.9 and no truncation first: the script's setting).
inline std::vector<RequestSpec> structured_requests(const TrainedStructured& t, bool sampled, int seeds) {
  std::vector<RequestSpec> out;
  for (int i = 0; i < seeds; ++i)
    for (int kind = 0; kind < 2; ++kind) {
      RequestSpec s;
      s.prompt = t.prompt;
      s.max_new_tokens = kind == 0 ? 96 : 32;
      s.grammar = kind == 0 ? t.schema : t.regex;
      s.sampling.temperature = 0.0f;
      if (sampled) {
        s.sampling.temperature = i == 0 ? 0.9f : std::array<float, 3>{0.7f, 0.9f, 1.0f}[size_t(i) % 3];
        s.sampling.top_p = i % 4 == 3 ? 0.9f : 1.0f;
        s.sampling.top_k = i % 5 == 4 ? 40 : -1;
        s.sampling.seed = uint64_t(1 + i);
        s.sampling.has_seed = true;
      }
      s.ignore_eos = i % 2 == 1 && sampled;
      out.push_back(std::move(s));
    }
  return out;
}

// No abort (the message printed), every stopped text valid; returns how many stopped. Request
// 2i + 1 is seed i's schema request, 2i + 2 its regex request.
inline int expect_structured_valid(const TrainedStructured& t, const std::vector<RequestSpec>& sp,
                                   const std::map<uint64_t, Outcome>& out, const std::string& what) {
  int stopped = 0;
  EXPECT_EQ(out.size(), sp.size()) << what;
  for (size_t i = 0; i < sp.size(); ++i) {
    const Outcome& o = out.at(i + 1);
    const bool schema = i % 2 == 0;
    const std::string text = t.text(o.tokens);
    std::ostringstream ids;
    for (int32_t id : o.tokens) ids << id << ' ';
    const std::string desc = what + ": request " + std::to_string(i + 1) + (schema ? " (json_schema" : " (regex") +
                             ", T " + std::to_string(sp[i].sampling.temperature) + ", seed " +
                             std::to_string(sp[i].sampling.seed) + "): text " + text + " | tokens " + ids.str();
    if (std::getenv("FP4MOE_STRUCTURED_PRINT")) std::printf("%s | finish %d\n", desc.c_str(), int(o.reason));
    EXPECT_TRUE(o.finished) << desc;
    EXPECT_NE(o.reason, FinishReason::kAbort) << desc << " | aborted: " << o.abort_message;
    if (o.reason != FinishReason::kStop) continue;
    ++stopped;
    EXPECT_TRUE(schema ? valid_structured_schema(text) : valid_structured_regex(text)) << desc;
  }
  return stopped;
}

}  // namespace fp4moe::engine::testing
