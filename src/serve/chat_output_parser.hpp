// What the chat handler needs from the reasoning and tool-call parsers: per request, which
// parsers run (server flags + request fields, as SGLang decides); for a finished choice, the
// assistant message {content, reasoning_content, tool_calls} and its finish_reason; for a
// streamed choice, a parser state that turns text deltas into OpenAI delta objects. The text
// goes through the reasoning parser first; its content part then goes through the tool-call
// parser (reasoning is never searched for tool calls).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/reasoning_parser.hpp"
#include "serve/tool_call_parser.hpp"

namespace fp4moe::serve {

// The server's --reasoning-parser / --tool-call-parser. An empty name is "not set".
struct ParserFlags {
  std::optional<ReasoningFormat> reasoning;
  std::optional<ToolCallFormat> tool_calls;
};
// Validates the two flags' values: an error line naming the flag and the valid names, or "".
std::string parse_parser_flags(std::string_view reasoning_parser, std::string_view tool_call_parser, ParserFlags& out);

// What runs over one chat request's output.
struct ChatParsing {
  std::optional<ReasoningFormat> reasoning;  // unset: no reasoning split
  bool reasoning_starts_open = false;
  std::optional<ToolCallFormat> tool_calls;  // unset: no tool-call parsing
  std::shared_ptr<const ToolCatalog> tools;
};

// SGLang's rules: reasoning is split when the server has a reasoning parser and the request
// does not set separate_reasoning = false; tool calls are parsed when the server has a
// tool-call parser, the request has tools and tool_choice is not "none".
// chat_template_kwargs: the request's (null if absent); prompt: the rendered prompt.
ChatParsing chat_parsing(const ParserFlags& flags, bool separate_reasoning, const nlohmann::json& chat_template_kwargs,
                         std::string_view prompt, std::shared_ptr<const ToolCatalog> tools, bool tool_choice_none);

struct ChatMessageParts {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  bool operator==(const ChatMessageParts&) const = default;
};

ChatMessageParts parse_chat_output(const ChatParsing& parsing, std::string_view text,
                                   ToolCallIdSource ids = random_tool_call_id);

// {"role": "assistant", "content", "reasoning_content"?, "tool_calls"?}: content is null when
// it is empty and there are tool calls; reasoning_content is present (null when empty) when a
// reasoning parser ran; tool_calls is present when there are any.
nlohmann::json chat_message_json(const ChatParsing& parsing, const ChatMessageParts& parts);
// OpenAI's tool_calls entry {id, type "function", function {name, arguments}} (+ "index"
// when streaming).
nlohmann::json tool_call_json(const ToolCall& call, bool with_index);
// "tool_calls" when the choice made tool calls and stopped normally; else the reason.
std::string chat_finish_reason(std::string_view reason, bool has_tool_calls);

// One streamed choice's parser state.
class ChatStreamParser {
 public:
  explicit ChatStreamParser(ChatParsing parsing, ToolCallIdSource ids = random_tool_call_id);

  // OpenAI delta objects, in order: {"reasoning_content": s}, {"content": s},
  // {"tool_calls": [{"index", "id", "type": "function", "function": {"name", "arguments": ""}}]}
  // when a call starts, {"tool_calls": [{"index", "function": {"arguments": s}}]} for its
  // arguments. Empty when nothing is released.
  std::vector<nlohmann::json> push(std::string_view text);
  std::vector<nlohmann::json> finish();  // after the last push
  bool has_tool_calls() const { return tools_ && tools_->calls() > 0; }

 private:
  void feed(std::vector<nlohmann::json>& out, const ReasoningSplit& split, bool final);

  std::optional<ReasoningStream> reasoning_;
  std::optional<ToolCallStream> tools_;
};

}  // namespace fp4moe::serve
