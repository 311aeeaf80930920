#include "serve/parser_endpoints.hpp"

#include <memory>

#include "serve/reasoning_parser.hpp"
#include "serve/tool_call_parser.hpp"

namespace fp4moe::serve {
namespace {

using nlohmann::json;

ApiError bad(std::string param, std::string message) {
  ApiError e;
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

// A client's name in a message: at most 64 bytes of it.
std::string quoted(const json& name) {
  const std::string& s = name.get_ref<const std::string&>();
  return "'" + (s.size() > 64 ? s.substr(0, 64) + "..." : s) + "'";
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// The body as an object, or the error.
std::variant<json, ApiError> object_body(std::string_view body) {
  auto parsed = parse_json_body(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  json b(std::get<nlohmann::ordered_json>(parsed));
  if (!b.is_object()) return bad("", "the request body must be a JSON object");
  return b;
}

const json* string_field(const json& b, const char* key, std::optional<ApiError>& error) {
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) {
    error = bad(key, std::string("'") + key + "' is required");
    return nullptr;
  }
  if (!it->is_string()) {
    error = bad(key, std::string("'") + key + "' must be a string");
    return nullptr;
  }
  return &*it;
}

// The body's "text" and its parser's name (field parser_key, one of `names`), as the endpoints
// take them; an ApiError naming the field otherwise.
template <class Format>
struct TextAndParser {
  json body;
  std::string text;
  Format format;
};
template <class Format, class Lookup>
std::variant<TextAndParser<Format>, ApiError> text_and_parser(std::string_view body, const char* parser_key,
                                                              Lookup lookup, const std::vector<std::string>& names) {
  auto parsed = object_body(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  json b = std::move(std::get<json>(parsed));
  std::optional<ApiError> error;
  const json* text = string_field(b, "text", error);
  if (!text) return *error;
  const json* parser = string_field(b, parser_key, error);
  if (!parser) return *error;
  const std::optional<Format> format = lookup(parser->get_ref<const std::string&>());
  if (!format)
    return bad(parser_key, std::string("unknown ") + parser_key + " " + quoted(*parser) + " (valid: " + joined(names) + ")");
  std::string t = text->get<std::string>();
  return TextAndParser<Format>{std::move(b), std::move(t), *format};
}

}  // namespace

std::variant<json, ApiError> parse_function_call_endpoint(std::string_view body) {
  auto got = text_and_parser<ToolCallFormat>(body, "tool_call_parser", tool_call_format, tool_call_format_names());
  if (auto* e = std::get_if<ApiError>(&got)) return *e;
  const auto& [b, text, format] = std::get<TextAndParser<ToolCallFormat>>(got);
  json tools_json = b.value("tools", json::array());
  if (tools_json.is_null()) tools_json = json::array();
  auto catalog = ToolCatalog::from_json(tools_json);
  if (auto* fe = std::get_if<FieldError>(&catalog)) return bad(fe->param, fe->message);
  auto tools = std::make_shared<const ToolCatalog>(std::move(std::get<ToolCatalog>(catalog)));

  json calls = json::array();
  if (tools->empty()) return json{{"normal_text", text}, {"calls", calls}};
  const ParsedToolCalls result = parse_tool_calls(format, tools, text);
  for (const auto& c : result.calls)
    calls.push_back({{"tool_index", c.tool_index}, {"name", c.name}, {"parameters", c.arguments}});
  return json{{"normal_text", result.content}, {"calls", std::move(calls)}};
}

std::variant<json, ApiError> separate_reasoning_endpoint(std::string_view body) {
  auto got = text_and_parser<ReasoningFormat>(body, "reasoning_parser", reasoning_format, reasoning_format_names());
  if (auto* e = std::get_if<ApiError>(&got)) return *e;
  const auto& [b, text, format] = std::get<TextAndParser<ReasoningFormat>>(got);
  const ReasoningSplit split = separate_reasoning(format, reasoning_starts_open(format), text);
  return json{{"text", split.content}, {"reasoning_text", split.reasoning}};
}

}  // namespace fp4moe::serve
