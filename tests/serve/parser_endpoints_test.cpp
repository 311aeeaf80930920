// /parse_function_call and /separate_reasoning (pure functions and over HTTP), the chat
// handler's helpers (which parsers run, the finished message, the streamed deltas) and the
// parser flags.
#include <chrono>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "serve/chat_output_parser.hpp"
#include "serve/parser_endpoints.hpp"
#include "serve/parser_routes.hpp"
#include "serve/parser_test_util.hpp"

namespace fp4moe::serve {
namespace {

using nlohmann::json;
using testing::counter_ids;

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
  {"type": "function", "function": {"name": "get_time"}}])");

std::shared_ptr<const ToolCatalog> tools() {
  return std::make_shared<const ToolCatalog>(std::get<ToolCatalog>(ToolCatalog::from_json(kTools)));
}

json ok(const std::variant<json, ApiError>& r) {
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << e->message;
  return std::holds_alternative<json>(r) ? std::get<json>(r) : json();
}
ApiError refused(const std::variant<json, ApiError>& r) {
  EXPECT_TRUE(std::holds_alternative<ApiError>(r));
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

TEST(ParseFunctionCall, ReturnsSglangShape) {
  json body = {{"tool_call_parser", "glm47"}, {"tools", kTools},
               {"text", "Let me check.\n<tool_call>get_weather<arg_key>city</arg_key><arg_value>北京</arg_value>"
                        "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call><tool_call>get_time</tool_call>"}};
  EXPECT_EQ(ok(parse_function_call_endpoint(body.dump())),
            json::parse(R"({"normal_text": "Let me check.", "calls": [
              {"tool_index": 0, "name": "get_weather", "parameters": "{\"city\": \"北京\", \"days\": 3}"},
              {"tool_index": 1, "name": "get_time", "parameters": "{}"}]})"));
  // DeepSeek V3.1, a call to a function not in the tools (dropped) and a malformed one (content).
  body = {{"tool_call_parser", "deepseekv31"}, {"tools", kTools},
          {"text", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>nope<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
                   "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{oops<｜tool▁call▁end｜><｜tool▁calls▁end｜>"}};
  EXPECT_EQ(ok(parse_function_call_endpoint(body.dump())),
            (json{{"normal_text", "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{oops<｜tool▁call▁end｜>"},
                  {"calls", json::array()}}));
}

TEST(ParseFunctionCall, WithoutToolsReturnsTheTextWhole) {
  const std::string text = "x <tool_call>get_time</tool_call>";
  for (const json& t : {json::array(), json(nullptr)}) {
    json body = {{"tool_call_parser", "glm45"}, {"text", text}, {"tools", t}};
    EXPECT_EQ(ok(parse_function_call_endpoint(body.dump())), (json{{"normal_text", text}, {"calls", json::array()}}));
  }
}

TEST(ParseFunctionCall, RefusesBadBodiesNamingTheField) {
  auto param_of = [](const json& body) { return refused(parse_function_call_endpoint(body.dump())).param; };
  EXPECT_EQ(param_of({{"text", "x"}, {"tool_call_parser", "hermes"}, {"tools", kTools}}), "tool_call_parser");
  EXPECT_EQ(param_of({{"text", "x"}, {"tools", kTools}}), "tool_call_parser");
  EXPECT_EQ(param_of({{"tool_call_parser", "glm47"}, {"tools", kTools}}), "text");
  EXPECT_EQ(param_of({{"text", 3}, {"tool_call_parser", "glm47"}}), "text");
  EXPECT_EQ(param_of({{"text", "x"}, {"tool_call_parser", "glm47"}, {"tools", "all"}}), "tools");
  EXPECT_EQ(param_of({{"text", "x"}, {"tool_call_parser", "glm47"}, {"tools", {{{"type", "function"}, {"function", json::object()}}}}}),
            "tools[0].function.name");
  EXPECT_EQ(param_of({{"text", "x"}, {"tool_call_parser", "glm47"}, {"tools", {{{"type", "retrieval"}}}}}), "tools[0].type");
  const ApiError e = refused(parse_function_call_endpoint(R"({"text": "x", "tool_call_parser": "hermes"})"));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.message, "unknown tool_call_parser 'hermes' (valid: glm47, glm45, deepseekv3, deepseekv31)");
  EXPECT_EQ(e.to_json()["error"]["param"], "tool_call_parser");
  EXPECT_EQ(refused(parse_function_call_endpoint("{not json")).status, 400);
  EXPECT_EQ(refused(parse_function_call_endpoint("[1]")).status, 400);
}

TEST(SeparateReasoning, SplitsWithTheParsersDefault) {
  auto call = [](const char* parser, const char* text) {
    return ok(separate_reasoning_endpoint(json{{"reasoning_parser", parser}, {"text", text}}.dump()));
  };
  EXPECT_EQ(call("deepseek-r1", "abc</think>def"), (json{{"text", "def"}, {"reasoning_text", "abc"}}));
  EXPECT_EQ(call("deepseek-r1", "no close"), (json{{"text", ""}, {"reasoning_text", "no close"}}));
  EXPECT_EQ(call("glm45", "<think>a</think>b"), (json{{"text", "b"}, {"reasoning_text", "a"}}));
  EXPECT_EQ(call("glm45", "plain answer"), (json{{"text", "plain answer"}, {"reasoning_text", ""}}));
  EXPECT_EQ(call("deepseek-v3", "<think>r</think>c"), (json{{"text", "c"}, {"reasoning_text", "r"}}));
  const ApiError e = refused(separate_reasoning_endpoint(R"({"text": "x", "reasoning_parser": "qwen3"})"));
  EXPECT_EQ(e.param, "reasoning_parser");
  EXPECT_EQ(e.message, "unknown reasoning_parser 'qwen3' (valid: glm45, deepseek-r1, deepseek-v3)");
  EXPECT_EQ(refused(separate_reasoning_endpoint(R"({"text": "x"})")).param, "reasoning_parser");
  EXPECT_EQ(refused(separate_reasoning_endpoint(R"({"reasoning_parser": "glm45"})")).param, "text");
}

TEST(ParserRoutes, ServeBothEndpointsOverHttp) {
  HttpServer http(HttpLimits{});
  register_parser_routes(
      http, [](http::Response& r, const json& j) { r.set_content(j.dump(), "application/json"); },
      [](http::Response& r, const ApiError& e) {
        r.status = e.status;
        r.set_content(e.to_json().dump(), "application/json");
      });
  ASSERT_TRUE(http.bind("127.0.0.1", 0));
  std::thread server([&] { http.run(); });
  httplib::Client client("127.0.0.1", http.port());
  auto r = client.Post("/separate_reasoning", R"({"text": "<think>a</think>b", "reasoning_parser": "glm45"})",
                       "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body), (json{{"text", "b"}, {"reasoning_text", "a"}}));
  r = client.Post("/parse_function_call", R"({"text": "x", "tool_call_parser": "nope", "tools": []})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "tool_call_parser");
  http.stop();
  server.join();
}

TEST(ParserFlags, ValidateNamesInOneLine) {
  ParserFlags f;
  EXPECT_EQ(parse_parser_flags("", "", f), "");
  EXPECT_FALSE(f.reasoning || f.tool_calls);
  EXPECT_EQ(parse_parser_flags("glm45", "glm47", f), "");
  EXPECT_EQ(f.reasoning, ReasoningFormat::kGlm45);
  EXPECT_EQ(f.tool_calls, ToolCallFormat::kGlm47);
  EXPECT_EQ(parse_parser_flags("qwen3", "", f),
            "--reasoning-parser: unknown parser 'qwen3' (valid: glm45, deepseek-r1, deepseek-v3)");
  EXPECT_EQ(parse_parser_flags("", "glm", f),
            "--tool-call-parser: unknown parser 'glm' (valid: glm47, glm45, deepseekv3, deepseekv31)");
}

TEST(ChatParsing, FollowsSglangsRules) {
  ParserFlags flags{ReasoningFormat::kGlm45, ToolCallFormat::kGlm47};
  const json none;
  auto p = chat_parsing(flags, true, none, "<|assistant|>", tools(), false);
  EXPECT_EQ(p.reasoning, ReasoningFormat::kGlm45);
  EXPECT_TRUE(p.reasoning_starts_open);  // glm45: on unless enable_thinking is false
  EXPECT_EQ(p.tool_calls, ToolCallFormat::kGlm47);
  p = chat_parsing(flags, true, {{"enable_thinking", false}}, "<|assistant|><think></think>", tools(), false);
  EXPECT_FALSE(p.reasoning_starts_open);
  EXPECT_FALSE(chat_parsing(flags, false, none, "", tools(), false).reasoning.has_value());  // separate_reasoning=false
  EXPECT_FALSE(chat_parsing(flags, true, none, "", tools(), true).tool_calls.has_value());    // tool_choice none
  EXPECT_FALSE(chat_parsing(flags, true, none, "", nullptr, false).tool_calls.has_value());   // no tools
  flags.reasoning = ReasoningFormat::kDeepSeekV3;  // off unless thinking is true, or the prompt opened <think>
  EXPECT_FALSE(chat_parsing(flags, true, none, "x", nullptr, false).reasoning_starts_open);
  EXPECT_TRUE(chat_parsing(flags, true, {{"thinking", true}}, "x", nullptr, false).reasoning_starts_open);
  EXPECT_TRUE(chat_parsing(flags, true, none, "<｜Assistant｜><think>\n", nullptr, false).reasoning_starts_open);
  flags.reasoning = ReasoningFormat::kDeepSeekR1;  // always
  EXPECT_TRUE(chat_parsing(flags, true, {{"enable_thinking", false}}, "x", nullptr, false).reasoning_starts_open);
}

TEST(ChatOutput, FinishedMessageWithReasoningAndToolCalls) {
  ChatParsing p{ReasoningFormat::kGlm45, true, ToolCallFormat::kGlm47, tools()};
  const std::string text =
      "<think>I need the weather.</think>Checking.\n<tool_call>get_weather<arg_key>city</arg_key>"
      "<arg_value>Paris</arg_value></tool_call>";
  const ChatMessageParts parts = parse_chat_output(p, text, counter_ids());
  EXPECT_EQ(chat_message_json(p, parts), json::parse(R"({"role": "assistant", "content": "Checking.",
    "reasoning_content": "I need the weather.", "tool_calls": [{"id": "call_0", "type": "function",
    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]})"));
  EXPECT_EQ(chat_finish_reason("stop", true), "tool_calls");
  EXPECT_EQ(chat_finish_reason("length", true), "length");
  EXPECT_EQ(chat_finish_reason("stop", false), "stop");
  // Only a call: content is null. No reasoning parser: no reasoning_content.
  ChatParsing q{std::nullopt, false, ToolCallFormat::kGlm47, tools()};
  EXPECT_EQ(chat_message_json(q, parse_chat_output(q, "<tool_call>get_time</tool_call>", counter_ids())),
            json::parse(R"({"role": "assistant", "content": null, "tool_calls": [{"id": "call_0", "type": "function",
              "function": {"name": "get_time", "arguments": "{}"}}]})"));
  ChatParsing plain;
  EXPECT_EQ(chat_message_json(plain, parse_chat_output(plain, "<think>x</think>", counter_ids())),
            (json{{"role", "assistant"}, {"content", "<think>x</think>"}}));
}

TEST(ChatOutput, StreamedDeltasAssembleToTheFinishedMessage) {
  ChatParsing p{ReasoningFormat::kGlm45, true, ToolCallFormat::kGlm47, tools()};
  const std::string text =
      "<think>Two calls: é 北京.</think>Sure.\n\n<tool_call>get_weather<arg_key>city</arg_key><arg_value>北京"
      "</arg_value><arg_key>days</arg_key><arg_value>2</arg_value></tool_call>\n<tool_call>get_time</tool_call>";
  const ChatMessageParts want = parse_chat_output(p, text, counter_ids());
  ASSERT_EQ(want.tool_calls.size(), 2u);
  for (size_t step : {size_t(1), size_t(3), size_t(7), text.size()}) {
    ChatStreamParser stream(p, counter_ids());
    std::vector<json> deltas;
    for (size_t i = 0; i < text.size(); i += step)
      for (auto& d : stream.push(std::string_view(text).substr(i, step))) deltas.push_back(std::move(d));
    for (auto& d : stream.finish()) deltas.push_back(std::move(d));
    EXPECT_TRUE(stream.has_tool_calls());
    ChatMessageParts got;
    for (const json& d : deltas) {
      ASSERT_EQ(d.size(), 1u) << d;
      if (d.contains("reasoning_content")) got.reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("content")) got.content += d["content"].get<std::string>();
      if (!d.contains("tool_calls")) continue;
      const json& c = d["tool_calls"][0];
      if (c.contains("id")) {  // the first delta of a call: index, id, type, name, arguments ""
        EXPECT_EQ(c["index"], got.tool_calls.size());
        EXPECT_EQ(c["type"], "function");
        EXPECT_EQ(c["function"]["arguments"], "");
        got.tool_calls.push_back({c["index"], -1, c["id"], c["function"]["name"], ""});
      } else {
        EXPECT_FALSE(c["function"].contains("name"));
        got.tool_calls.at(c["index"].get<size_t>()).arguments += c["function"]["arguments"].get<std::string>();
      }
    }
    EXPECT_EQ(got.reasoning, want.reasoning);
    EXPECT_EQ(got.content, want.content);
    ASSERT_EQ(got.tool_calls.size(), want.tool_calls.size());
    for (size_t i = 0; i < got.tool_calls.size(); ++i) {
      EXPECT_EQ(got.tool_calls[i].id, want.tool_calls[i].id);
      EXPECT_EQ(got.tool_calls[i].name, want.tool_calls[i].name);
      EXPECT_EQ(got.tool_calls[i].arguments, want.tool_calls[i].arguments);
    }
  }
}

TEST(ToolCallIds, AreCallPlus24HexAndDistinct) {
  const std::string a = random_tool_call_id(), b = random_tool_call_id();
  EXPECT_NE(a, b);
  ASSERT_EQ(a.size(), 29u);
  EXPECT_TRUE(a.starts_with("call_"));
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef", 5), std::string::npos);
}

TEST(ToolCatalog, StringTypedParameters) {
  const json t = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"properties": {
    "s": {"type": "string"}, "n": {"type": "number"}, "sn": {"type": ["string", "null"]}, "sx": {"type": ["string", "integer"]},
    "e": {"enum": ["a", "b"]}, "en": {"enum": ["a", 1]}, "c": {"const": "x"},
    "any": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "anys": {"oneOf": [{"type": "string"}, {"enum": ["x"]}]}, "anyn": {"anyOf": [{"type": "string"}, {"type": "number"}]},
    "o": {"type": "object"}}}}}])");
  const auto c = std::get<ToolCatalog>(ToolCatalog::from_json(t));
  for (const char* k : {"s", "e", "c", "anys"}) EXPECT_TRUE(c.is_string_param(0, k)) << k;
  for (const char* k : {"n", "sn", "sx", "en", "any", "anyn", "o", "missing"}) EXPECT_FALSE(c.is_string_param(0, k)) << k;
}

TEST(ReasoningStart, PromptOpensReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning("<|assistant|><think>"));
  EXPECT_TRUE(prompt_opens_reasoning("<｜Assistant｜><think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|assistant|><think></think>"));
  EXPECT_FALSE(prompt_opens_reasoning(""));
}

}  // namespace
}  // namespace fp4moe::serve
