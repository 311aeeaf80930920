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

}  // namespace

std::variant<json, ApiError> parse_function_call_endpoint(std::string_view body) {
  auto parsed = object_body(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& b = std::get<json>(parsed);
  std::optional<ApiError> error;
  const json* text = string_field(b, "text", error);
  if (!text) return *error;
  const json* parser = string_field(b, "tool_call_parser", error);
  if (!parser) return *error;
  const auto format = tool_call_format(parser->get_ref<const std::string&>());
  if (!format)
    return bad("tool_call_parser", "unknown tool_call_parser " + quoted(*parser) +
                                       " (valid: " + joined(tool_call_format_names()) + ")");
  json tools_json = b.value("tools", json::array());
  if (tools_json.is_null()) tools_json = json::array();
  auto catalog = ToolCatalog::from_json(tools_json);
  if (auto* fe = std::get_if<FieldError>(&catalog)) return bad(fe->param, fe->message);
  auto tools = std::make_shared<const ToolCatalog>(std::move(std::get<ToolCatalog>(catalog)));

  json calls = json::array();
  if (tools->empty()) return json{{"normal_text", *text}, {"calls", calls}};
  const ParsedToolCalls result = parse_tool_calls(*format, tools, text->get_ref<const std::string&>());
  for (const auto& c : result.calls)
    calls.push_back({{"tool_index", c.tool_index}, {"name", c.name}, {"parameters", c.arguments}});
  return json{{"normal_text", result.content}, {"calls", std::move(calls)}};
}

std::variant<json, ApiError> separate_reasoning_endpoint(std::string_view body) {
  auto parsed = object_body(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& b = std::get<json>(parsed);
  std::optional<ApiError> error;
  const json* text = string_field(b, "text", error);
  if (!text) return *error;
  const json* parser = string_field(b, "reasoning_parser", error);
  if (!parser) return *error;
  const auto format = reasoning_format(parser->get_ref<const std::string&>());
  if (!format)
    return bad("reasoning_parser", "unknown reasoning_parser " + quoted(*parser) +
                                       " (valid: " + joined(reasoning_format_names()) + ")");
  const ReasoningSplit split =
      separate_reasoning(*format, reasoning_starts_open(*format), text->get_ref<const std::string&>());
  return json{{"text", split.content}, {"reasoning_text", split.reasoning}};
}

}  // namespace fp4moe::serve
