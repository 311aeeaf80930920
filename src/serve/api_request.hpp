// HTTP bodies -> native requests. Everything a client sends is validated here: wrong types and
// out-of-range values become an ApiError (400 with the parameter's name). Every field is either
// honoured, ignored because ignoring it changes nothing the client can observe (`user`, ...), or
// refused with a 400 naming it: a field we do not implement (`response_format` json, `regex`,
// `logit_bias`, `tool_choice: "required"`, ...) or do not know. README.md lists each field's fate.
// Limits that need the model (vocabulary, context) are checked later, when the prompt is tokenized.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.hpp"
#include "grammar/grammar.hpp"
#include "serve/text_codec.hpp"

namespace fp4moe::serve {

// An OpenAI error: {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
  nlohmann::json to_json() const;
};

enum class ApiKind { kChat, kCompletion, kGenerate };

struct PromptInput {
  bool is_ids = false;
  std::string text;
  std::vector<int32_t> ids;
};

// "required" and a named function hold the output to the tool-call format (tool_choice_grammar.hpp).
enum class ToolChoice { kAuto, kNone, kRequired, kNamed };

// Structured output: the grammar a request asks for and the field that asked (for its 400s).
struct Constraint {
  grammar::GrammarSpec spec;
  std::string param;
};

struct ApiRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;                  // empty: not given
  std::vector<PromptInput> prompts;   // completions / generate (a batch); empty for chat
  ChatInput chat;                     // chat: the messages, tools and template variables
  // chat: the validated tools, also when tool_choice is "none" (chat.tools is then null: they are
  // not rendered, as SGLang does).
  nlohmann::ordered_json tools;
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;     // kNamed: the function
  bool parallel_tool_calls = true;  // recorded for the tool-call parser
  bool separate_reasoning = true;   // SGLang's per-request switch, recorded for the reasoning parser
  std::optional<int64_t> max_tokens;  // absent: the endpoint's default
  engine::SamplingParams sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;
  int32_t logprobs = -1;  // -1: none; k >= 0: the sampled token's and the top k
  std::optional<Constraint> constraint;  // response_format / regex / ebnf / json_schema
};

// The structured-output fields (constraint_request.cpp): response_format (OpenAI bodies) and
// SGLang's regex / ebnf / json_schema, from sampling_params when given (/generate) or else the
// body's top level. At most one; an ApiError for a malformed or duplicate one.
std::variant<std::optional<Constraint>, ApiError> parse_constraint(const nlohmann::ordered_json& body,
                                                                  const nlohmann::ordered_json* sampling_params);

// Limits a request may not pass whatever the model.
inline constexpr int32_t kMaxChoices = 64;     // n, and prompts x n
inline constexpr int32_t kMaxStops = 16;
inline constexpr int32_t kMaxStopBytes = 512;
inline constexpr int32_t kMaxTopLogprobs = 20;
inline constexpr int32_t kMaxJsonDepth = 64;
inline constexpr int32_t kMaxTools = 128;
// The logprob entries a response may hold: choices x max_tokens x (top_logprobs + 1). A
// non-streamed response builds them as one JSON document (~1 KB of memory each), so 2^18
// entries keep a request near 256 MB.
inline constexpr int64_t kMaxLogprobEntries = int64_t(1) << 18;

// Parses a JSON body with a nesting limit (objects keep their key order); an ApiError on
// malformed JSON.
std::variant<nlohmann::ordered_json, ApiError> parse_json_body(std::string_view body);

std::variant<ApiRequest, ApiError> parse_api_request(ApiKind kind, std::string_view body);

// POST /tokenize: {"prompt" | "text": string}, or "messages" (with "tools",
// "chat_template_kwargs", "add_generation_prompt", as in a chat request) to render the chat
// template exactly as /v1/chat/completions would.
struct TokenizeRequest {
  std::string text;
  ChatInput chat;  // chat.messages non-null: render these instead
};
std::variant<TokenizeRequest, ApiError> parse_tokenize_request(std::string_view body);

// POST /detokenize: {"tokens": [int]}.
std::variant<std::vector<int32_t>, ApiError> parse_detokenize_request(std::string_view body);

}  // namespace fp4moe::serve
