// Tool-call parsers (`--tool-call-parser`): find the model's tool calls in its generated text
// and turn them into OpenAI tool calls {id, type "function", function {name, arguments}},
// the rest staying content. Formats follow SGLang's detectors of the same names:
//   glm47, glm45  <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>
//                 (glm45 puts newlines between the parts; both parsers accept either). A value
//                 whose parameter the tool's JSON schema types as string is taken verbatim; any
//                 other is parsed as JSON, falling back to the verbatim string.
//   deepseekv3    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   deepseekv31   the same with <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
// arguments is the JSON object re-serialized as Python's json.dumps(ensure_ascii=False) writes
// it ({"k": 1, "l": [1, 2]}), as SGLang returns it. A call is committed only once its closing
// tag arrives, so the stream never has to take anything back: a call that is malformed or cut
// off by the end of the text is returned as plain content, byte for byte; a well-formed call
// naming a function that is not in the tools list is dropped (SGLang logs and drops it).
// Content is the text outside the calls (DeepSeek's section markers are dropped); when the
// text has a call, the content's leading and trailing whitespace is stripped, as SGLang does
// (leading whitespace only where a call comes before the first content: the stream cannot wait). The streaming parser emits, for every split of the text into deltas, events whose
// concatenated content and arguments equal the one-shot parse.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp4moe::serve {

enum class ToolCallFormat { kGlm45, kGlm47, kDeepSeekV3, kDeepSeekV31 };

std::optional<ToolCallFormat> tool_call_format(std::string_view name);
std::vector<std::string> tool_call_format_names();  // in --help order

// A refusal of a request field: the parameter's name and a message.
struct FieldError {
  std::string param;
  std::string message;
};

// The request's tools, as the parsers need them: names and parameter schemas.
class ToolCatalog {
 public:
  // OpenAI's tools: [{"type": "function", "function": {"name", "description"?, "parameters"?}}].
  static std::variant<ToolCatalog, FieldError> from_json(const nlohmann::json& tools, const std::string& param = "tools");

  size_t size() const { return tools_.size(); }
  bool empty() const { return tools_.empty(); }
  int32_t index_of(std::string_view name) const;  // -1: not in the list
  const std::string& name(int32_t tool) const { return tools_[size_t(tool)].name; }
  // The tool's schema types the parameter as a string and nothing else (type "string" or
  // ["string"], a string enum / const, or anyOf / oneOf of those; a nullable string is not,
  // as in SGLang's glm47 detector): its value is taken verbatim.
  bool is_string_param(int32_t tool, std::string_view key) const;

 private:
  struct Tool {
    std::string name;
    nlohmann::json properties;  // the parameters schema's "properties" (an object, or null)
  };
  std::vector<Tool> tools_;
};

struct ToolCall {
  int32_t index = 0;        // position among this message's calls
  int32_t tool_index = -1;  // position in the tools list
  std::string id;
  std::string name;
  std::string arguments;    // a JSON object, as text
  bool operator==(const ToolCall&) const = default;
};

struct ToolCallEvent {
  enum class Kind { kContent, kCallStart, kArguments };
  Kind kind = Kind::kContent;
  std::string text;         // kContent: content; kArguments: an arguments fragment
  int32_t index = -1;       // kCallStart / kArguments
  int32_t tool_index = -1;  // kCallStart
  std::string id;           // kCallStart
  std::string name;         // kCallStart
};

using ToolCallIdSource = std::function<std::string()>;
// "call_" + 24 random hex digits.
std::string random_tool_call_id();

class ToolCallStream {
 public:
  ToolCallStream(ToolCallFormat format, std::shared_ptr<const ToolCatalog> tools,
                 ToolCallIdSource ids = random_tool_call_id);

  std::vector<ToolCallEvent> push(std::string_view delta);
  // Releases what was held back (a partial tag, an unfinished call as content).
  std::vector<ToolCallEvent> finish();
  int32_t calls() const { return calls_; }

 private:
  enum class State { kText, kCall };
  void run(std::vector<ToolCallEvent>& out, bool final);
  void emit_content(std::vector<ToolCallEvent>& out, std::string_view text);
  void close_call(std::vector<ToolCallEvent>& out, std::string_view raw, std::string_view inner);
  void malformed(std::vector<ToolCallEvent>& out, std::string_view raw);

  ToolCallFormat format_;
  std::shared_ptr<const ToolCatalog> tools_;
  ToolCallIdSource ids_;
  State state_ = State::kText;
  std::string buf_;       // unprocessed text (whole UTF-8 characters)
  std::string carry_;     // an incomplete UTF-8 character at the end of the last delta
  std::string call_;      // the open call's text so far, from its opening tag
  size_t call_scanned_ = 0;
  std::string ws_hold_;     // trailing whitespace of the content, released with the next content
  bool emitted_ = false;    // some content went out
  bool call_seen_ = false;  // a call (or section marker) opened
  int32_t calls_ = 0;
};

struct ParsedToolCalls {
  std::string content;
  std::vector<ToolCall> calls;
  bool operator==(const ParsedToolCalls&) const = default;
};

// Folds events into content and calls (what a client assembling the stream sees).
void apply_tool_call_events(ParsedToolCalls& into, const std::vector<ToolCallEvent>& events);
// The one-shot parse: equal to one push of the whole text and finish().
ParsedToolCalls parse_tool_calls(ToolCallFormat format, std::shared_ptr<const ToolCatalog> tools,
                                 std::string_view text, ToolCallIdSource ids = random_tool_call_id);

// Python's json.dumps(value, ensure_ascii=False): ", " and ": " separators, keys in order;
// invalid UTF-8 in strings becomes U+FFFD.
std::string python_json_dumps(const nlohmann::ordered_json& value);

}  // namespace fp4moe::serve
