// libFuzzer target for the reasoning and tool-call parsers (serve/reasoning_parser,
// serve/tool_call_parser, serve/chat_output_parser) and their endpoints (serve/parser_endpoints).
//
// Byte 0 picks the mode and the parsers, byte 1 seeds the cut points, the rest is the text
// (or, in endpoint mode, the HTTP body). For every input: the text streamed in pieces gives
// exactly the one-shot result (content, reasoning, calls and their arguments), streamed
// events are well formed, every call's arguments are a JSON object, no bytes are invented,
// and an endpoint answers a JSON object or a 400 whose error JSON can be written. Anything
// else (a crash, a sanitizer report, an exception, a broken invariant) aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "serve/chat_output_parser.hpp"
#include "serve/parser_endpoints.hpp"
#include "serve/parser_test_util.hpp"

namespace {

using namespace fp4moe::serve;
using nlohmann::json;

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "tool_call_parser_fuzz: invariant broken: %s\n", what.c_str());
  std::abort();
}

std::shared_ptr<const ToolCatalog> fuzz_tools() {
  static const auto tools = [] {
    const json t = json::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "parameters": {"properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}},
      {"type": "function", "function": {"name": "search", "parameters": {"properties": {
        "query": {"type": "string"}, "filters": {"type": "object"}}}}},
      {"type": "function", "function": {"name": "get_time"}},
      {"type": "function", "function": {"name": "x"}}])");
    return std::make_shared<const ToolCatalog>(std::get<ToolCatalog>(ToolCatalog::from_json(t)));
  }();
  return tools;
}

void check_endpoint(const std::variant<json, ApiError>& r) {
  if (const auto* e = std::get_if<ApiError>(&r)) {
    if (e->status != 400) broken("an endpoint error other than 400: " + e->message);
    (void)e->to_json().dump();
  } else if (!std::get<json>(r).is_object()) {
    broken("an endpoint answer that is not an object");
  } else {
    (void)std::get<json>(r).dump();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t mode = data[0];
  std::mt19937 rng(data[1]);
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);

  if (mode >= 0xF0) {  // endpoint mode: the rest is the body
    check_endpoint(mode & 1 ? separate_reasoning_endpoint(text) : parse_function_call_endpoint(text));
    return 0;
  }
  std::vector<size_t> at;
  for (size_t i = 1; i < text.size(); ++i)
    if (rng() % 6 == 0) at.push_back(i);
  const auto pieces = testing::cut(text, at);

  const auto tool_format = ToolCallFormat(mode % 4);
  const auto once = parse_tool_calls(tool_format, fuzz_tools(), text, testing::counter_ids());
  for (const auto& c : once.calls)
    if (!json::parse(c.arguments).is_object()) broken("arguments that are not a JSON object: " + c.arguments);
  if (once.content.size() > text.size()) broken("content longer than the text");
  const auto streamed = testing::stream_tool_calls(tool_format, fuzz_tools(), pieces);
  if (!streamed.shape_error.empty()) broken(streamed.shape_error);
  if (!(streamed.parsed == once)) broken("streamed tool calls differ from the one-shot parse");

  const auto reasoning_format = ReasoningFormat((mode / 4) % 3);
  const bool open = (mode / 12) % 2;
  const ReasoningSplit split = separate_reasoning(reasoning_format, open, text);
  if (split.reasoning.size() + split.content.size() > text.size()) broken("reasoning + content longer than the text");
  if (!(testing::stream_reasoning(reasoning_format, open, pieces) == split)) broken("streamed reasoning differs");

  // The chat pipeline: reasoning, then tool calls over the content; streamed deltas assemble
  // to the finished message.
  ChatParsing parsing{reasoning_format, open, tool_format, fuzz_tools()};
  const ChatMessageParts want = parse_chat_output(parsing, text, testing::counter_ids());
  ChatStreamParser stream(parsing, testing::counter_ids());
  ChatMessageParts got;
  auto take = [&](const std::vector<json>& deltas) {
    for (const json& d : deltas) {
      if (d.contains("reasoning_content")) got.reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("content")) got.content += d["content"].get<std::string>();
      if (!d.contains("tool_calls")) continue;
      const json& c = d["tool_calls"][0];
      if (c.contains("id")) got.tool_calls.push_back({c["index"], -1, c["id"], c["function"]["name"], ""});
      else got.tool_calls.at(c["index"].get<size_t>()).arguments += c["function"]["arguments"].get<std::string>();
    }
  };
  for (auto p : pieces) take(stream.push(p));
  take(stream.finish());
  if (got.reasoning != want.reasoning || got.content != want.content || got.tool_calls.size() != want.tool_calls.size())
    broken("streamed chat deltas differ from the finished message");
  for (size_t i = 0; i < got.tool_calls.size(); ++i)
    if (got.tool_calls[i].arguments != want.tool_calls[i].arguments || got.tool_calls[i].name != want.tool_calls[i].name)
      broken("streamed chat tool call differs");
  (void)chat_message_json(parsing, want).dump(-1, ' ', false, json::error_handler_t::replace);
  return 0;
}
