// A few thousand mutated tokenizer.json files, random byte strings and mutated chat templates
// in the normal test build (the real fuzzers are fuzz/tokenizer_json_fuzz.cpp and
// fuzz/chat_template_fuzz.cpp, run by tools/fuzz.sh). Each input must give a result that
// satisfies the invariants, or an error of the expected type with a one-line message —
// never a crash or another exception type.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "text/detokenizer.hpp"
#include "text/jinja/interpreter.hpp"
#include "text/jinja/parser.hpp"
#include "text/text_test_util.hpp"
#include "text/tokenizer.hpp"
#include "text/unicode.hpp"

namespace fp4moe::text {
namespace {

using testing::data_dir;
using testing::read_file;
using testing::read_json;

void mutate(std::string& s, std::mt19937_64& rng, const std::vector<std::string>& tokens) {
  const int n = 1 + int(rng() % 4);
  for (int i = 0; i < n; ++i) {
    const size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 5) {
      case 0: if (pos < s.size()) s[pos] = char(rng()); break;
      case 1: s.insert(pos, tokens[rng() % tokens.size()]); break;
      case 2: if (pos < s.size()) s.erase(pos, 1 + rng() % 12); break;
      case 3: if (pos < s.size()) s.insert(pos, s.substr(pos, 1 + rng() % 24)); break;
      case 4: if (rng() % 8 == 0) s.resize(pos); break;
    }
  }
}

bool code_point_count_is_one(const std::string& s) {
  if (s.empty()) return false;
  size_t i = 0;
  next_code_point(s, i);
  return i == s.size();
}

// A small valid tokenizer.json: the first merges of a test tokenizer and the tokens they use.
std::string small_tokenizer_json(const std::string& name) {
  auto doc = nlohmann::json::parse(read_file(data_dir() + "/" + name + "/tokenizer.json"));
  auto merges = doc["model"]["merges"];
  merges.erase(merges.begin() + std::min<long>(40, long(merges.size())), merges.end());
  std::set<std::string> keep;
  for (const auto& m : merges) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m;
      a = s.substr(0, s.find(' '));
      b = s.substr(s.find(' ') + 1);
    } else {
      a = m[0];
      b = m[1];
    }
    keep.insert({a, b, a + b});
  }
  for (const auto& t : doc["added_tokens"]) keep.insert(t["content"].get<std::string>());
  nlohmann::json vocab = nlohmann::json::object();
  for (auto it = doc["model"]["vocab"].begin(); it != doc["model"]["vocab"].end(); ++it)
    if (keep.count(it.key()) || code_point_count_is_one(it.key())) vocab[it.key()] = it.value();
  doc["model"]["vocab"] = vocab;
  doc["model"]["merges"] = merges;
  // Added tokens outside the cut vocabulary get other ids than the file says (a load error
  // since issue 37): they keep no declared id.
  for (auto& t : doc["added_tokens"])
    if (!vocab.contains(t["content"].get<std::string>())) t.erase("id");
  // A post-processor naming an id that was cut is dropped (it would not load).
  std::set<int64_t> ids;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) ids.insert(it.value().get<int64_t>());
  bool dangling = false;
  const std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& node) {
    if (node.is_array()) {
      for (const auto& v : node) walk(v);
    } else if (node.is_object()) {
      for (auto it = node.begin(); it != node.end(); ++it) {
        if (it.key() == "ids" && it.value().is_array()) {
          for (const auto& id : it.value()) dangling |= !ids.count(id.get<int64_t>());
        } else {
          walk(it.value());
        }
      }
    }
  };
  walk(doc["post_processor"]);
  if (dangling) doc["post_processor"] = nullptr;
  return doc.dump();
}

std::string random_text(std::mt19937_64& rng) {
  static const std::vector<std::string> pieces = {"Hello", " world", "日本", "👍🏽", "\r\n", "\t", "  ", "123", "<|im_start|>",
                                                  "<|endoftext|>", "<think>", "é", "e\xcc\x81", "\xff", "\xe2\x82",
                                                  "'s", "ﬁx", "[single]", " <mask> "};
  std::string s;
  const int n = int(rng() % 12);
  for (int i = 0; i < n; ++i) {
    if (rng() % 4 == 0) {
      s += char(rng());
    } else {
      s += pieces[rng() % pieces.size()];
    }
  }
  return s;
}

void check_encoding(const Tokenizer& tok, const std::string& text) {
  const std::vector<int32_t> ids = tok.encode(text, true);
  for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.vocab_size()) << id;
  const std::string decoded = tok.decode(ids, false);
  ASSERT_TRUE(is_valid_utf8(decoded));
  StreamingDetokenizer d(tok, false);
  std::string streamed;
  for (int32_t id : ids) streamed += d.push(id);
  streamed += d.finish();
  ASSERT_EQ(streamed, decoded);
}

TEST(TextFuzzSmokeTest, MutatedTokenizerJson) {
  std::mt19937_64 rng(77);
  const std::vector<std::string> tokens = {
      "\"type\"", "\"Split\"", "\"ByteLevel\"", "\"Sequence\"", "\"Digits\"", "\"NFC\"", "\"Regex\"", "\"String\"",
      "\"Isolated\"", "\"Removed\"", "\"Contiguous\"", "\"merges\"", "\"vocab\"", "\"added_tokens\"", "true", "false",
      "null", "{", "}", "[", "]", ",", ":", "\"", "-1", "16777216", "\"\\\\p{L}\"", "\"(\"", "\"\\\\\"", "\"a b\""};
  std::vector<std::string> bases;
  for (const char* name : {"qwen_style", "glm_style", "gpt2_digits", "behaviors", "chars_unk"})
    bases.push_back(small_tokenizer_json(name));
  int ok = 0, rejected = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    std::string json = bases[size_t(iter) % bases.size()];
    if (iter % 5 != 0) mutate(json, rng, tokens);
    try {
      const Tokenizer tok = Tokenizer::from_json(json, "smoke.json");
      check_encoding(tok, random_text(rng));
      if (HasFatalFailure()) return;
      ++ok;
    } catch (const Error& e) {
      const std::string msg = e.what();
      ASSERT_EQ(msg.find('\n'), std::string::npos) << msg;
      ASSERT_EQ(msg.rfind("smoke.json: ", 0), 0u) << msg;
      ++rejected;
    }
  }
  EXPECT_GT(ok, 300);
  EXPECT_GT(rejected, 300);
}

TEST(TextFuzzSmokeTest, RandomBytesThroughEveryTestTokenizer) {
  std::mt19937_64 rng(9);
  for (const char* name : {"glm_style", "qwen_style", "deepseek_style", "gpt2_digits", "behaviors", "chars_unk"}) {
    const Tokenizer tok = Tokenizer::from_dir(data_dir() + "/" + name);
    for (int iter = 0; iter < 300; ++iter) {
      check_encoding(tok, random_text(rng));
      if (HasFatalFailure()) return;
    }
  }
}

TEST(TextFuzzSmokeTest, MutatedChatTemplates) {
  std::mt19937_64 rng(123);
  const std::vector<std::string> tokens = {"{%", "%}", "{{", "}}", "{#", "#}", "-%}", "{%-", " if ", " for x in ",
                                           " endfor ", " endif ", " set ", " = ", "|", " is ", "(", ")", "[", "]",
                                           "'", "\"", ".", ",", "loop.", "macro ", "ns.", " and ", " not ", "~",
                                           "\n", "  ", "raise_exception(", "::-1", "**"};
  std::vector<std::string> sources;
  for (const auto& p : read_json(data_dir() + "/templates/probes.json").at("probes"))
    sources.push_back(p.at("template").get<std::string>());
  for (const char* f : {"qwen_style.jinja", "glm_style.jinja", "constructs.jinja", "agentic/glm5_style.jinja",
                        "agentic/deepseek_v31_style.jinja"})
    sources.push_back(read_file(data_dir() + "/templates/" + f));
  const auto goldens = read_json(data_dir() + "/templates/goldens.json");
  std::vector<std::pair<std::string, jinja::Value>> ctx;
  ctx.emplace_back("messages", jinja::Value::data(goldens.at("conversations").at("parallel_tool_calls")));
  ctx.emplace_back("tools", jinja::Value::data(goldens.at("tools")));
  ctx.emplace_back("add_generation_prompt", jinja::Value::boolean(true));
  jinja::RenderLimits limits;
  limits.max_steps = 20000;
  limits.max_output_bytes = 1 << 20;
  limits.max_memory_bytes = 16 << 20;
  int ok = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string src = sources[size_t(iter) % sources.size()];
    mutate(src, rng, tokens);
    try {
      jinja::render(jinja::parse_template(src), ctx, limits);
      ++ok;
    } catch (const jinja::TemplateError& e) {
      ASSERT_EQ(e.message.find('\n'), std::string::npos) << e.message;
      ASSERT_EQ(e.message.rfind("line ", 0), 0u) << e.message;
      ++rejected;
    }
  }
  EXPECT_GT(ok, 300);
  EXPECT_GT(rejected, 300);
}

}  // namespace
}  // namespace fp4moe::text
