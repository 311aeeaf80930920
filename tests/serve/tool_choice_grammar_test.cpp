// tool_choice "required" / a named function (tool_choice_grammar.hpp): the structural tag built
// for the glm formats, compiled over a byte vocabulary, accepts exactly the tool-call texts the
// parser reads back as valid calls (checked by feeding texts byte by byte, then EOS, and by
// parsing the accepted ones with tool_call_parser); and what the encoding cannot keep exact is
// refused with the parameter named.
#include <gtest/gtest.h>

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
  EXPECT_FALSE(accepts(spec, city + "<arg_key>units</arg_key><arg_value>{\"temp\": \"C\"}</arg_value></tool_call>"));
  // glm47: no whitespace between the parts (bounded output).
  EXPECT_FALSE(accepts(spec, "<tool_call>ping\n</tool_call>"));
  // A length-bounded raw string: at most maxLength characters, no '<'.
  EXPECT_TRUE(accepts(spec, city + "<arg_key>code</arg_key><arg_value>é\"x</arg_value></tool_call>"));
  EXPECT_FALSE(accepts(spec, city + "<arg_key>code</arg_key><arg_value>abcd</arg_value></tool_call>"));
  EXPECT_FALSE(accepts(spec, city + "<arg_key>code</arg_key><arg_value>a<b</arg_value></tool_call>"));
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
      {R"({"type": "object", "properties": {"a b": {"type": "integer"}}})", "parameters.properties"},
      {R"({"type": "object", "properties": {"x": {"$ref": "#/$defs/s"}}, "$defs": {"s": {"type": "string"}}})",
       "properties.x.$ref"},
      {R"({"type": "object", "additionalProperties": {"type": "string"}})", "additionalProperties"},
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
