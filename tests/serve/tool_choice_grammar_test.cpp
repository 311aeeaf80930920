// tool_choice "required" / a named function (tool_choice_grammar.hpp): the structural tag built
// for the glm formats, compiled over a byte vocabulary, accepts exactly the tool-call texts the
// parser reads back as valid calls (checked by feeding texts byte by byte, then EOS, and by
// parsing the accepted ones with tool_call_parser); and what the encoding cannot keep exact is
// refused with the parameter named.
#include <gtest/gtest.h>

#include <random>

#include <fmt/format.h>

#include "grammar/grammar.hpp"
#include "serve/tool_choice_grammar.hpp"

namespace fp4moe::serve {
namespace {

using nlohmann::ordered_json;
constexpr int32_t kEos = 256;

grammar::Compiler& compiler() {
  static grammar::Compiler c([] {
    grammar::Vocab v;
    for (int b = 0; b < 256; ++b) v.token_bytes.push_back(std::string(1, char(b)));
    v.token_bytes.push_back("");  // EOS
    v.vocab_size = int32_t(v.token_bytes.size());
    v.stop_ids = {kEos};
    return v;
  }());
  return c;
}

const ordered_json kTools = ordered_json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
     "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 9},
     "units": {"type": "object", "properties": {"temp": {"enum": ["C", "F"]}}, "required": ["temp"]},
     "code": {"type": "string", "maxLength": 3}},
   "required": ["city"]}}},
  {"type": "function", "function": {"name": "ping"}}
])");

grammar::GrammarSpec spec_for(ToolCallFormat f, std::string named = "", bool parallel = true, bool reasoning = false,
                              const ordered_json& tools = kTools) {
  ToolChoiceGrammarRequest r;
  r.format = f;
  r.tools = &tools;
  r.named = std::move(named);
  r.parallel_tool_calls = parallel;
  r.reasoning_open = reasoning;
  auto s = tool_choice_grammar(r);
  if (auto* e = std::get_if<FieldError>(&s)) ADD_FAILURE() << e->param << ": " << e->message;
  return std::get<grammar::GrammarSpec>(s);
}

FieldError refusal(ToolCallFormat f, const ordered_json& tools, std::string named = "") {
  ToolChoiceGrammarRequest r;
  r.format = f;
  r.tools = &tools;
  r.named = std::move(named);
  auto s = tool_choice_grammar(r);
  if (!std::holds_alternative<FieldError>(s)) {
    ADD_FAILURE() << "built: " << std::get<grammar::GrammarSpec>(s).text;
    return {};
  }
  return std::get<FieldError>(s);
}

// The whole text, then EOS, accepted and the grammar done.
bool accepts(const grammar::GrammarSpec& spec, std::string_view text) {
  grammar::Matcher m(compiler().compile(spec));
  for (char c : text)
    if (!m.accept(int32_t(uint8_t(c)))) return false;
  return m.accept(kEos) && m.terminated();
}

ParsedToolCalls parsed(ToolCallFormat f, std::string_view text) {
  auto catalog = ToolCatalog::from_json(nlohmann::json::parse(kTools.dump()));
  return parse_tool_calls(f, std::make_shared<const ToolCatalog>(std::get<ToolCatalog>(catalog)), text,
                          [] { return std::string("call_x"); });
}

const std::string kWeather =
    "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Zürich \"old\" <town>\n&co</arg_value>"
    "<arg_key>days</arg_key><arg_value>3</arg_value>"
    "<arg_key>units</arg_key><arg_value>{\"temp\":\"C\"}</arg_value></tool_call>";

TEST(ToolChoiceGrammar, Glm47RequiredAcceptsCallsTheParserReadsBack) {
  const auto spec = spec_for(ToolCallFormat::kGlm47);
  EXPECT_TRUE(accepts(spec, kWeather));
  EXPECT_TRUE(accepts(spec, "<tool_call>ping</tool_call>"));
  EXPECT_TRUE(accepts(spec, kWeather + "<tool_call>ping</tool_call>"));  // several calls
  EXPECT_TRUE(accepts(spec, "<tool_call>get_weather<arg_key>city</arg_key><arg_value></arg_value></tool_call>"));
  const ParsedToolCalls p = parsed(ToolCallFormat::kGlm47, kWeather + "<tool_call>ping</tool_call>");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.content, "");
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city": "Zürich \"old\" <town>\n&co", "days": 3, "units": {"temp": "C"}})");
  EXPECT_EQ(p.calls[1].arguments, "{}");
}

TEST(ToolChoiceGrammar, Glm47RequiredRefusesWhatIsNotAValidCall) {
  const auto spec = spec_for(ToolCallFormat::kGlm47);
  EXPECT_FALSE(accepts(spec, ""));                                    // at least one call
  EXPECT_FALSE(accepts(spec, "Sure.<tool_call>ping</tool_call>"));    // no text before the calls
  EXPECT_FALSE(accepts(spec, "<tool_call>pong</tool_call>"));         // not a tool
  EXPECT_FALSE(accepts(spec, "<tool_call>get_weather</tool_call>"));  // city is required
  const std::string city = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>P</arg_value>";
  EXPECT_TRUE(accepts(spec, city + "</tool_call>"));
  EXPECT_FALSE(accepts(spec, city + "<arg_key>days</arg_key><arg_value>three</arg_value></tool_call>"));
  EXPECT_FALSE(accepts(spec, city + "<arg_key>days</arg_key><arg_value>10</arg_value></tool_call>"));  // maximum 9
  EXPECT_FALSE(accepts(spec, city + "<arg_key>days</arg_key><arg_value>\"3\"</arg_value></tool_call>"));
  EXPECT_FALSE(accepts(spec, city + "<arg_key>wind</arg_key><arg_value>3</arg_value></tool_call>"));  // not a property
  EXPECT_FALSE(accepts(spec, city + "<arg_key>units</arg_key><arg_value>{\"temp\":\"K\"}</arg_value></tool_call>"));
  // JSON values: at most one whitespace character between tokens (xgrammar's structural tags
  // allow no less); raw strings: none added.
  EXPECT_TRUE(accepts(spec, city + "<arg_key>units</arg_key><arg_value>{\"temp\": \"C\"}</arg_value></tool_call>"));
  EXPECT_FALSE(accepts(spec, city + "<arg_key>units</arg_key><arg_value>{\"temp\":  \"C\"}</arg_value></tool_call>"));
  // glm47: no whitespace between the parts (bounded output).
  EXPECT_FALSE(accepts(spec, "<tool_call>ping\n</tool_call>"));
  // A length-bounded raw string: at most maxLength characters, no '<'.
  EXPECT_TRUE(accepts(spec, city + "<arg_key>code</arg_key><arg_value>é\"x</arg_value></tool_call>"));
  EXPECT_FALSE(accepts(spec, city + "<arg_key>code</arg_key><arg_value>abcd</arg_value></tool_call>"));
  EXPECT_FALSE(accepts(spec, city + "<arg_key>code</arg_key><arg_value>a<b</arg_value></tool_call>"));
}

// Bounds past xgrammar's unrolling threshold (128): the repetition and the closing tag are one
// regex (a counted edge), exact at both ends, with multi-byte characters counted as one.
TEST(ToolChoiceGrammar, LargeLengthBoundsOnARawStringAreExact) {
  const ordered_json tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "note", "parameters": {
      "type": "object", "properties": {"text": {"type": "string", "minLength": 130, "maxLength": 200}},
      "required": ["text"]}}}])");
  const auto spec = spec_for(ToolCallFormat::kGlm47, "", true, false, tools);
  auto call = [](const std::string& v) { return "<tool_call>note<arg_key>text</arg_key><arg_value>" + v + "</arg_value></tool_call>"; };
  std::string e200;
  for (int i = 0; i < 200; ++i) e200 += i % 2 ? "é" : "a";
  EXPECT_TRUE(accepts(spec, call(std::string(130, 'x'))));
  EXPECT_TRUE(accepts(spec, call(std::string(200, 'x'))));
  EXPECT_TRUE(accepts(spec, call(e200)));
  EXPECT_FALSE(accepts(spec, call(std::string(129, 'x'))));
  EXPECT_FALSE(accepts(spec, call(std::string(201, 'x'))));
  EXPECT_FALSE(accepts(spec, call(e200 + "a")));
  EXPECT_FALSE(accepts(spec, call(std::string(150, 'x') + "<" + std::string(10, 'x'))));
}

TEST(ToolChoiceGrammar, ParallelToolCallsFalseAndANamedFunctionAllowOneCall) {
  const auto single = spec_for(ToolCallFormat::kGlm47, "", false);
  EXPECT_TRUE(accepts(single, "<tool_call>ping</tool_call>"));
  EXPECT_FALSE(accepts(single, "<tool_call>ping</tool_call><tool_call>ping</tool_call>"));
  const auto named = spec_for(ToolCallFormat::kGlm47, "ping");
  EXPECT_TRUE(accepts(named, "<tool_call>ping</tool_call>"));
  EXPECT_FALSE(accepts(named, kWeather));
  EXPECT_FALSE(accepts(named, "<tool_call>ping</tool_call><tool_call>ping</tool_call>"));
  const auto weather = spec_for(ToolCallFormat::kGlm47, "get_weather");
  EXPECT_TRUE(accepts(weather, kWeather));
  EXPECT_FALSE(accepts(weather, "<tool_call>ping</tool_call>"));
}

TEST(ToolChoiceGrammar, Glm45TakesItsNewlineLayout) {
  const auto spec = spec_for(ToolCallFormat::kGlm45);
  const std::string text =
      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
      "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>\n<tool_call>ping\n</tool_call>";
  EXPECT_TRUE(accepts(spec, text));
  const ParsedToolCalls p = parsed(ToolCallFormat::kGlm45, text);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].arguments, R"({"city": "Paris", "days": 2})");
  EXPECT_FALSE(accepts(spec, "<tool_call>ping\n\n\n</tool_call>"));  // whitespace is bounded
}

TEST(ToolChoiceGrammar, AnOpenReasoningBlockComesFirst) {
  const auto spec = spec_for(ToolCallFormat::kGlm47, "", true, true);
  EXPECT_TRUE(accepts(spec, "Let me think <b>.\n</think><tool_call>ping</tool_call>"));
  EXPECT_TRUE(accepts(spec, "</think><tool_call>ping</tool_call>"));
  EXPECT_FALSE(accepts(spec, "<tool_call>ping</tool_call>"));  // still inside the reasoning
  EXPECT_FALSE(accepts(spec, "thought</think>"));              // no call
}

TEST(ToolChoiceGrammar, RefusesWhatTheEncodingCannotKeepExact) {
  auto tools_with = [](const char* params) {
    return ordered_json::parse(std::string(R"([{"type": "function", "function": {"name": "f", "parameters": )") + params +
                               "}}]");
  };
  struct Case {
    const char* params;
    const char* param;
  } cases[] = {
      {R"({"type": "object", "properties": {"x": {"type": ["string", "integer"]}}})", "properties.x"},
      {R"({"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}, {"type": "null"}]}}})", "properties.x"},
      {R"({"type": "object", "properties": {"x": {"enum": ["a", 1]}}})", "properties.x"},
      {R"({"type": "object", "properties": {"x": {"type": "string", "pattern": "a+"}}})", "properties.x.pattern"},
      {R"({"type": "object", "properties": {"x": {"type": "string", "format": "email"}}})", "properties.x.format"},
      {R"({"type": "object", "properties": {"x": {"const": "a</arg_value>"}}})", "properties.x.const"},
      {R"({"type": "object", "properties": {"x": {"type": "string", "format": "date"}}})", "properties.x.format"},
      {R"({"type": "object", "properties": {"x": {"type": "integer"}}, "minProperties": 1})", "minProperties"},
      {R"({"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["y"]})", "parameters.required"},
      {R"({"type": "object", "properties": {"a b": {"type": "integer"}}})", "parameters.properties"},
      {R"({"type": "object", "properties": {"x": {"$ref": "#/$defs/s"}}, "$defs": {"s": {"type": "string"}}})",
       "properties.x.$ref"},
      {R"({"type": "array"})", "parameters.type"},
      {R"({"type": "object", "properties": {"x": {"not": {}}}})", "tools[0].function.parameters"},
  };
  for (const Case& c : cases) {
    const FieldError e = refusal(ToolCallFormat::kGlm47, tools_with(c.params));
    EXPECT_NE(e.param.find(c.param), std::string::npos) << c.params << " -> " << e.param << ": " << e.message;
    EXPECT_FALSE(e.message.empty());
  }
  // deepseek formats: their markers are special tokens.
  const FieldError ds = refusal(ToolCallFormat::kDeepSeekV31, kTools);
  EXPECT_EQ(ds.param, "tool_choice");
  EXPECT_NE(ds.message.find("special tokens"), std::string::npos);
  EXPECT_EQ(refusal(ToolCallFormat::kGlm47, kTools, "nope").param, "tool_choice");
  // Nested strings are JSON strings: their patterns and bounds stay.
  (void)spec_for(ToolCallFormat::kGlm47, "", true, false,
                 tools_with(R"({"type": "object", "properties": {"o": {"type": "object", "properties": {
                    "s": {"type": "string", "pattern": "[a-z]+"}}}}})"));
}

}  // namespace
}  // namespace fp4moe::serve

namespace fp4moe::serve {
namespace {

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = uint8_t(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (size_t k = 1; k < n; ++k) {
      if ((uint8_t(s[i + k]) & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3f);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += n;
  }
  return true;
}

// Random walks through the grammar (every allowed token equally likely): each finished text is
// valid UTF-8 and parses back into one call whose arguments have the schema's JSON types.
TEST(ToolChoiceGrammar, RandomWalksParseBack) {
  // Raw strings bounded (an unbounded one ends only on `</arg_value>`, which a uniform walk
  // practically never writes); JSON strings nested in an object end at their quote.
  const ordered_json tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "w", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 6}, "mode": {"enum": ["a b", "日本"]},
    "days": {"type": "integer", "minimum": -99999, "maximum": 99999}, "units": {"type": "object", "properties": {"s": {"type": "string"},
    "n": {"type": "number", "minimum": -1000, "maximum": 1000}}, "required": ["s"]}}, "required": ["city"]}}}])");
  const auto spec = spec_for(ToolCallFormat::kGlm47, "w", true, false, tools);
  auto catalog = std::make_shared<const ToolCatalog>(
      std::get<ToolCatalog>(ToolCatalog::from_json(nlohmann::json::parse(tools.dump()))));
  std::mt19937 rng(5);
  std::vector<uint32_t> mask(size_t(grammar::mask_words(compiler().vocab_size())));
  int finished = 0;
  for (int walk = 0; walk < 300; ++walk) {
    grammar::Matcher m(compiler().compile(spec));
    std::string text;
    for (int step = 0; step < 400 && !m.terminated(); ++step) {
      m.fill_mask(mask);
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < compiler().vocab_size(); ++t)
        if (mask[size_t(t / 32)] >> (t % 32) & 1u) allowed.push_back(t);
      ASSERT_FALSE(allowed.empty()) << text;
      const int32_t t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      ASSERT_TRUE(m.accept(t));
      if (t < 256) text += char(t);
    }
    if (!m.terminated()) continue;
    ++finished;
    ASSERT_TRUE(valid_utf8(text)) << nlohmann::json(text).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace) << " " << [&] { std::string h; for (unsigned char c : text) if (c >= 0x80) h += fmt::format("{:02x} ", c); return h; }();
    const ParsedToolCalls p = parse_tool_calls(ToolCallFormat::kGlm47, catalog, text, [] { return std::string("c"); });
    ASSERT_EQ(p.calls.size(), 1u) << text;
    const auto args = nlohmann::json::parse(p.calls[0].arguments);
    ASSERT_TRUE(args["city"].is_string()) << text;
    if (args.contains("days")) EXPECT_TRUE(args["days"].is_number_integer()) << text;
    if (args.contains("units")) EXPECT_TRUE(args["units"].is_object()) << text;
    if (args.contains("mode")) EXPECT_TRUE(args["mode"] == "a b" || args["mode"] == "日本") << text;
    EXPECT_LE(args["city"].get<std::string>().size(), 6u * 4) << text;
  }
  EXPECT_GT(finished, 100);
}

}  // namespace
}  // namespace fp4moe::serve
