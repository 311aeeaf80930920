// HTTP bodies -> native requests. Everything a client sends is validated here: wrong types and
// out-of-range values become an ApiError (400 with the parameter's name); unknown fields are
// ignored, as OpenAI does. Limits that need the model (vocabulary, context) are checked later,
// when the prompt is tokenized.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.hpp"

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

struct ApiRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;                  // empty: not given
  std::vector<PromptInput> prompts;   // completions / generate (a batch); empty for chat
  nlohmann::json messages;            // chat: [{"role", "content": string}], validated
  bool add_generation_prompt = true;
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
};

// Limits a request may not pass whatever the model.
inline constexpr int32_t kMaxChoices = 64;     // n, and prompts x n
inline constexpr int32_t kMaxStops = 16;
inline constexpr int32_t kMaxStopBytes = 512;
inline constexpr int32_t kMaxTopLogprobs = 20;
inline constexpr int32_t kMaxJsonDepth = 64;

// Parses a JSON body with a nesting limit; an ApiError on malformed JSON.
std::variant<nlohmann::json, ApiError> parse_json_body(std::string_view body);

std::variant<ApiRequest, ApiError> parse_api_request(ApiKind kind, std::string_view body);

// POST /tokenize: {"prompt" | "text": string} (or "messages" to render the chat template).
struct TokenizeRequest {
  std::string text;
  nlohmann::json messages;  // non-null: render these instead
  bool add_generation_prompt = true;
};
std::variant<TokenizeRequest, ApiError> parse_tokenize_request(std::string_view body);

// POST /detokenize: {"tokens": [int]}.
std::variant<std::vector<int32_t>, ApiError> parse_detokenize_request(std::string_view body);

}  // namespace fp4moe::serve
