#include "serve/chat_output_parser.hpp"

namespace fp4moe::serve {
namespace {

using nlohmann::json;

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

void append_events(std::vector<json>& out, const std::vector<ToolCallEvent>& events) {
  for (const auto& e : events) {
    switch (e.kind) {
      case ToolCallEvent::Kind::kContent:
        if (!e.text.empty()) out.push_back({{"content", e.text}});
        break;
      case ToolCallEvent::Kind::kCallStart:
        out.push_back({{"tool_calls", json::array({{{"index", e.index},
                                                    {"id", e.id},
                                                    {"type", "function"},
                                                    {"function", {{"name", e.name}, {"arguments", ""}}}}})}});
        break;
      case ToolCallEvent::Kind::kArguments:
        out.push_back({{"tool_calls", json::array({{{"index", e.index}, {"function", {{"arguments", e.text}}}}})}});
        break;
    }
  }
}

}  // namespace

std::string parse_parser_flags(std::string_view reasoning_parser, std::string_view tool_call_parser, ParserFlags& out) {
  out = {};
  if (!reasoning_parser.empty()) {
    out.reasoning = reasoning_format(reasoning_parser);
    if (!out.reasoning)
      return "--reasoning-parser: unknown parser '" + std::string(reasoning_parser) +
             "' (valid: " + join(reasoning_format_names()) + ")";
  }
  if (!tool_call_parser.empty()) {
    out.tool_calls = tool_call_format(tool_call_parser);
    if (!out.tool_calls)
      return "--tool-call-parser: unknown parser '" + std::string(tool_call_parser) +
             "' (valid: " + join(tool_call_format_names()) + ")";
  }
  return "";
}

ChatParsing chat_parsing(const ParserFlags& flags, bool separate_reasoning, const json& chat_template_kwargs,
                         std::string_view prompt, std::shared_ptr<const ToolCatalog> tools, bool tool_choice_none) {
  ChatParsing p;
  if (flags.reasoning && separate_reasoning) {
    p.reasoning = flags.reasoning;
    p.reasoning_starts_open = reasoning_starts_open(*flags.reasoning, chat_template_kwargs, prompt_opens_reasoning(prompt));
  }
  if (flags.tool_calls && tools && !tools->empty() && !tool_choice_none) {
    p.tool_calls = flags.tool_calls;
    p.tools = std::move(tools);
  }
  return p;
}

ChatMessageParts parse_chat_output(const ChatParsing& parsing, std::string_view text, ToolCallIdSource ids) {
  ChatMessageParts parts;
  std::string content(text);
  if (parsing.reasoning) {
    ReasoningSplit split = separate_reasoning(*parsing.reasoning, parsing.reasoning_starts_open, text);
    parts.reasoning = std::move(split.reasoning);
    content = std::move(split.content);
  }
  if (parsing.tool_calls) {
    ParsedToolCalls parsed = parse_tool_calls(*parsing.tool_calls, parsing.tools, content, std::move(ids));
    parts.content = std::move(parsed.content);
    parts.tool_calls = std::move(parsed.calls);
  } else {
    parts.content = std::move(content);
  }
  return parts;
}

json tool_call_json(const ToolCall& call, bool with_index) {
  json j = {{"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
  if (with_index) j["index"] = call.index;
  return j;
}

json chat_message_json(const ChatParsing& parsing, const ChatMessageParts& parts) {
  json m = {{"role", "assistant"}};
  m["content"] = parts.content.empty() && !parts.tool_calls.empty() ? json(nullptr) : json(parts.content);
  if (parsing.reasoning) m["reasoning_content"] = parts.reasoning.empty() ? json(nullptr) : json(parts.reasoning);
  if (!parts.tool_calls.empty()) {
    json calls = json::array();
    for (const auto& c : parts.tool_calls) calls.push_back(tool_call_json(c, false));
    m["tool_calls"] = std::move(calls);
  }
  return m;
}

std::string chat_finish_reason(std::string_view reason, bool has_tool_calls) {
  return has_tool_calls && reason == "stop" ? "tool_calls" : std::string(reason);
}

ChatStreamParser::ChatStreamParser(ChatParsing parsing, ToolCallIdSource ids) {
  if (parsing.reasoning) reasoning_.emplace(*parsing.reasoning, parsing.reasoning_starts_open);
  if (parsing.tool_calls) tools_.emplace(*parsing.tool_calls, parsing.tools, std::move(ids));
}

void ChatStreamParser::feed(std::vector<json>& out, const ReasoningSplit& split, bool final) {
  if (!split.reasoning.empty()) out.push_back({{"reasoning_content", split.reasoning}});
  if (tools_) {
    if (!split.content.empty()) append_events(out, tools_->push(split.content));
    if (final) append_events(out, tools_->finish());
  } else if (!split.content.empty()) {
    out.push_back({{"content", split.content}});
  }
}

std::vector<json> ChatStreamParser::push(std::string_view text) {
  std::vector<json> out;
  feed(out, reasoning_ ? reasoning_->push(text) : ReasoningSplit{"", std::string(text)}, false);
  return out;
}

std::vector<json> ChatStreamParser::finish() {
  std::vector<json> out;
  feed(out, reasoning_ ? reasoning_->finish() : ReasoningSplit{}, true);
  return out;
}

}  // namespace fp4moe::serve
