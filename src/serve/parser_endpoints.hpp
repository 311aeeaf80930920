// SGLang's helper endpoints over the parsers, as pure functions of the request body:
//   POST /parse_function_call  {"text", "tool_call_parser", "tools"}
//                              -> {"normal_text", "calls": [{"tool_index", "name", "parameters"}]}
//                              (parameters: the arguments as a JSON string; tool_index: the
//                              function's position in tools; with no tools the text is
//                              returned whole, as SGLang does)
//   POST /separate_reasoning   {"text", "reasoning_parser"} -> {"text", "reasoning_text"}
//                              (the parser's default start: deepseek-r1 starts in reasoning)
// Malformed bodies, missing or mistyped fields and unknown parser names are ApiErrors (400)
// naming the field. register_parser_routes (parser_routes.hpp) serves them over HTTP.
#pragma once

#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "serve/api_request.hpp"

namespace fp4moe::serve {

std::variant<nlohmann::json, ApiError> parse_function_call_endpoint(std::string_view body);
std::variant<nlohmann::json, ApiError> separate_reasoning_endpoint(std::string_view body);

}  // namespace fp4moe::serve
