// The reasoning and tool-call parsers against tests/serve/data/parser_goldens.json (written by
// gen_parser_goldens.py from SGLang's rules, independently of the parsers), one-shot and
// streamed: every golden text cut at every byte position (inside multi-byte characters and
// inside tags), fed byte by byte, and cut at random positions, must give the one-shot result.
#include <fstream>
#include <map>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "serve/parser_test_util.hpp"

namespace fp4moe::serve {
namespace {

using nlohmann::json;
using testing::counter_ids;
using testing::cut;

const json& goldens() {
  static const json g = [] {
    std::ifstream f(std::string(FP4MOE_SOURCE_DIR) + "/tests/serve/data/parser_goldens.json");
    return json::parse(f);
  }();
  return g;
}

std::shared_ptr<const ToolCatalog> catalog(const json& tools) {
  auto c = ToolCatalog::from_json(tools);
  EXPECT_TRUE(std::holds_alternative<ToolCatalog>(c));
  return std::make_shared<const ToolCatalog>(std::get<ToolCatalog>(c));
}

// Every single cut, byte by byte, and 64 random multi-cuts.
std::vector<std::vector<size_t>> cuts_of(size_t n, uint32_t seed) {
  std::vector<std::vector<size_t>> all;
  for (size_t i = 0; i <= n; ++i) all.push_back({i});
  std::vector<size_t> bytes;
  for (size_t i = 1; i < n; ++i) bytes.push_back(i);
  all.push_back(bytes);
  std::mt19937 rng(seed);
  for (int k = 0; k < 64 && n > 1; ++k) {
    std::vector<size_t> at;
    for (size_t i = 1; i < n; ++i)
      if (rng() % 5 == 0) at.push_back(i);
    all.push_back(at);
  }
  return all;
}

TEST(ParserGoldens, HaveThirtyTextsPerParser) {
  std::map<std::string, int> count;
  for (const auto& c : goldens()["tool_calls"]) ++count[c["parser"].get<std::string>()];
  for (const auto& c : goldens()["reasoning"]) ++count["reasoning:" + c["parser"].get<std::string>()];
  for (const auto& name : tool_call_format_names()) EXPECT_GE(count[name], 30) << name;
  for (const auto& name : reasoning_format_names()) EXPECT_GE(count["reasoning:" + name], 30) << name;
}

TEST(ParserGoldens, ToolCallsOneShotAndStreamed) {
  const auto tools = catalog(goldens()["tools"]);
  json extended = goldens()["tools"];
  extended.push_back({{"type", "function"}, {"function", {{"name", "get_current_weather"}}}});
  const auto tools_extended = catalog(extended);
  int index = 0;
  for (const auto& g : goldens()["tool_calls"]) {
    const std::string text = g["text"];
    const auto format = tool_call_format(g["parser"].get<std::string>());
    ASSERT_TRUE(format.has_value());
    const auto& t = g.contains("extra_tool") ? tools_extended : tools;
    SCOPED_TRACE("golden " + std::to_string(index++) + " (" + g["parser"].get<std::string>() + "): " + text);

    const ParsedToolCalls once = parse_tool_calls(*format, t, text, counter_ids());
    EXPECT_EQ(once.content, g["content"].get<std::string>());
    ASSERT_EQ(once.calls.size(), g["calls"].size());
    for (size_t i = 0; i < once.calls.size(); ++i) {
      const auto& want = g["calls"][i];
      EXPECT_EQ(once.calls[i].index, int32_t(i));
      EXPECT_EQ(once.calls[i].id, "call_" + std::to_string(i));
      EXPECT_EQ(once.calls[i].name, want["name"].get<std::string>());
      EXPECT_EQ(once.calls[i].tool_index, want["tool_index"].get<int32_t>());
      EXPECT_EQ(once.calls[i].arguments, want["arguments"].get<std::string>());
      EXPECT_TRUE(json::parse(once.calls[i].arguments).is_object());
    }
    for (const auto& at : cuts_of(text.size(), uint32_t(index))) {
      const auto streamed = testing::stream_tool_calls(*format, t, cut(text, at));
      ASSERT_EQ(streamed.shape_error, "") << "cut into " << at.size() + 1 << " pieces";
      ASSERT_EQ(streamed.parsed, once) << "cut into " << at.size() + 1 << " pieces, first at " << (at.empty() ? 0 : at[0]);
    }
  }
}

TEST(ParserGoldens, ReasoningOneShotAndStreamed) {
  int index = 0;
  for (const auto& g : goldens()["reasoning"]) {
    const std::string text = g["text"];
    const auto format = reasoning_format(g["parser"].get<std::string>());
    ASSERT_TRUE(format.has_value());
    const bool open = g["starts_open"];
    SCOPED_TRACE("golden " + std::to_string(index++) + " (" + g["parser"].get<std::string>() +
                 (open ? ", open): " : ", closed): ") + text);
    const ReasoningSplit once = separate_reasoning(*format, open, text);
    EXPECT_EQ(once.reasoning, g["reasoning"].get<std::string>());
    EXPECT_EQ(once.content, g["content"].get<std::string>());
    for (const auto& at : cuts_of(text.size(), uint32_t(index)))
      ASSERT_EQ(testing::stream_reasoning(*format, open, cut(text, at)), once) << "cut into " << at.size() + 1;
  }
}

// Random texts built from the formats' tags and fragments of them, cut at random: streamed
// equals one-shot, and every emitted call's arguments are a JSON object.
TEST(ParserProperties, RandomTagSoupStreamsLikeOneShot) {
  const std::vector<std::string> atoms = {
      "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "get_time",
      "get_weather", "search", "city", "limit", "filters", "query", "{\"a\": [1, 2]}", "42", "北京", "é", " ", "\n",
      "\\n", "<", ">", "</", "<tool_ca", "\"", "{", "}", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
      "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "function", "```json\n", "\n```", "<｜tool▁",
      "<think>", "</think>", "</thi", "x"};
  const auto tools = catalog(goldens()["tools"]);
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text;
    const int n = 1 + int(rng() % 24);
    for (int i = 0; i < n; ++i) text += atoms[rng() % atoms.size()];
    std::vector<size_t> at;
    for (size_t i = 1; i < text.size(); ++i)
      if (rng() % 4 == 0) at.push_back(i);
    for (const auto& name : tool_call_format_names()) {
      const auto format = *tool_call_format(name);
      const ParsedToolCalls once = parse_tool_calls(format, tools, text, counter_ids());
      for (const auto& c : once.calls) ASSERT_TRUE(json::parse(c.arguments).is_object()) << text;
      const auto streamed = testing::stream_tool_calls(format, tools, cut(text, at));
      ASSERT_EQ(streamed.shape_error, "") << name << ": " << text;
      ASSERT_EQ(streamed.parsed, once) << name << ": " << text;
    }
    for (const auto& name : reasoning_format_names())
      for (bool open : {false, true}) {
        const auto format = *reasoning_format(name);
        const ReasoningSplit once = separate_reasoning(format, open, text);
        ASSERT_EQ(testing::stream_reasoning(format, open, cut(text, at)), once) << name << ": " << text;
      }
  }
}

// Megabytes of content and of one argument, in 3-byte deltas: linear work (a quadratic rescan
// would take hours here), and the same result as one-shot.
TEST(ParserProperties, LongTextsInSmallDeltas) {
  const auto tools = catalog(goldens()["tools"]);
  std::string big_arg;
  for (int i = 0; i < 60000; ++i) big_arg += "line " + std::to_string(i) + " <b>é</b>\n";
  std::string text;
  for (int i = 0; i < 60000; ++i) text += "word" + std::to_string(i) + (i % 10 ? " " : "\n");
  text += "<tool_call>write_file<arg_key>path</arg_key><arg_value>a.txt</arg_value><arg_key>content</arg_key><arg_value>" +
          big_arg + "</arg_value></tool_call>";
  std::vector<size_t> at;
  for (size_t i = 3; i < text.size(); i += 3) at.push_back(i);
  const auto streamed = testing::stream_tool_calls(ToolCallFormat::kGlm47, tools, cut(text, at));
  ASSERT_EQ(streamed.parsed.calls.size(), 1u);
  EXPECT_EQ(json::parse(streamed.parsed.calls[0].arguments)["content"], big_arg);
  EXPECT_EQ(streamed.parsed, parse_tool_calls(ToolCallFormat::kGlm47, tools, text, counter_ids()));
  const std::string thought = "<think>" + big_arg + "</think>" + text;
  EXPECT_EQ(testing::stream_reasoning(ReasoningFormat::kGlm45, true, cut(thought, at)),
            separate_reasoning(ReasoningFormat::kGlm45, true, thought));
}

}  // namespace
}  // namespace fp4moe::serve
