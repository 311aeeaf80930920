// Structured-output fields of a request body -> one grammar::GrammarSpec (api_request.hpp).
//   OpenAI:  response_format {"type": "text" | "json_object" | "json_schema", "json_schema":
//            {"name", "schema", "strict", "description"}}
//   SGLang:  regex, ebnf, json_schema (a schema as a string, or an object) in sampling_params
//            (/generate) or at the top level of an OpenAI body (extra_body).
// At most one of them per request. Whether the grammar compiles is decided later, against the
// vocabulary (generation_handlers.cpp): a 400 naming the same field.
#include <fmt/format.h>

#include "serve/api_request.hpp"

namespace fp4moe::serve {
namespace {

using json = nlohmann::ordered_json;

struct Refused {
  ApiError error;
};

[[noreturn]] void refuse(const std::string& param, std::string message) {
  ApiError e;
  e.param = param;
  e.message = std::move(message);
  throw Refused{std::move(e)};
}

const json* field(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

const char* json_type(const json& v) {
  return v.is_string() ? "a string" : v.is_object() ? "an object" : v.is_array() ? "an array" : v.is_boolean() ? "a boolean"
         : v.is_number() ? "a number" : "null";
}

std::optional<Constraint> response_format(const json& v) {
  const std::string p = "response_format";
  if (!v.is_object()) refuse(p, fmt::format("'response_format' must be an object, not {}", json_type(v)));
  const json* type = field(v, "type");
  if (!type || !type->is_string()) refuse(p + ".type", "'response_format.type' must be 'text', 'json_object' or 'json_schema'");
  const std::string t = type->get<std::string>();
  auto only = [&](std::initializer_list<const char*> keys) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      bool known = false;
      for (const char* k : keys) known |= it.key() == k;
      if (!known) refuse(p + "." + it.key(), fmt::format("unrecognized argument 'response_format.{}' for type '{}'", it.key(), t));
    }
  };
  if (t == "text") {
    only({"type"});
    return std::nullopt;
  }
  if (t == "json_object") {
    only({"type"});
    Constraint c;
    c.spec.kind = grammar::Kind::kJsonObject;
    c.spec.strict = false;
    c.param = p;
    return c;
  }
  if (t != "json_schema")
    refuse(p + ".type", fmt::format("'response_format.type' must be 'text', 'json_object' or 'json_schema', not '{}'", t));
  only({"type", "json_schema"});
  const json* js = field(v, "json_schema");
  const std::string q = p + ".json_schema";
  if (!js || !js->is_object()) refuse(q, "'response_format.json_schema' (an object with 'name' and 'schema') is required");
  for (auto it = js->begin(); it != js->end(); ++it) {
    const std::string& k = it.key();
    if (k != "name" && k != "schema" && k != "strict" && k != "description")
      refuse(q + "." + k, fmt::format("unrecognized argument 'response_format.json_schema.{}'", k));
  }
  const json* name = field(*js, "name");
  if (!name || !name->is_string() || name->get<std::string>().empty() || name->get<std::string>().size() > 64)
    refuse(q + ".name", "'response_format.json_schema.name' must be a string of 1 to 64 characters");
  const json* desc = field(*js, "description");
  if (desc && !desc->is_string()) refuse(q + ".description", "'response_format.json_schema.description' must be a string");
  const json* strict = field(*js, "strict");
  if (strict && !strict->is_boolean()) refuse(q + ".strict", "'response_format.json_schema.strict' must be a boolean");
  const json* schema = field(*js, "schema");
  Constraint c;
  c.spec.kind = grammar::Kind::kJsonSchema;
  // No schema: any JSON value (OpenAI allows leaving it out).
  if (schema && !schema->is_object() && !schema->is_boolean())
    refuse(q + ".schema", fmt::format("'response_format.json_schema.schema' must be an object, not {}", json_type(*schema)));
  c.spec.text = schema ? schema->dump() : std::string("{}");
  // OpenAI's default is false: properties and items the schema leaves open stay open.
  c.spec.strict = strict && strict->get<bool>();
  c.param = q + ".schema";
  return c;
}

std::optional<Constraint> sglang_field(const json& obj, const std::string& prefix, const char* key) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  const std::string p = prefix + key;
  Constraint c;
  c.param = p;
  const std::string k = key;
  if (k == "json_schema") {
    c.spec.kind = grammar::Kind::kJsonSchema;
    c.spec.strict = true;  // SGLang hands it to xgrammar, whose default is strict
    if (v->is_string())
      c.spec.text = v->get<std::string>();
    else if (v->is_object())
      c.spec.text = v->dump();
    else
      refuse(p, fmt::format("'{}' must be a JSON schema (a string or an object), not {}", p, json_type(*v)));
  } else {
    c.spec.kind = k == "regex" ? grammar::Kind::kRegex : grammar::Kind::kEbnf;
    if (!v->is_string()) refuse(p, fmt::format("'{}' must be a string, not {}", p, json_type(*v)));
    c.spec.text = v->get<std::string>();
  }
  return c;
}

}  // namespace

std::variant<std::optional<Constraint>, ApiError> parse_constraint(const nlohmann::ordered_json& body,
                                                                  const nlohmann::ordered_json* sampling_params) {
  try {
    std::vector<Constraint> found;
    const json& sglang = sampling_params ? *sampling_params : body;
    const std::string prefix = sampling_params ? "sampling_params." : "";
    for (const char* key : {"json_schema", "regex", "ebnf"})
      if (auto c = sglang_field(sglang, prefix, key)) found.push_back(std::move(*c));
    if (!sampling_params)
      if (const json* rf = field(body, "response_format"))
        if (auto c = response_format(*rf)) found.push_back(std::move(*c));
    if (found.size() > 1)
      refuse(found[1].param, fmt::format("give at most one of response_format, regex, ebnf and json_schema ('{}' and '{}' "
                                         "are both set)",
                                         found[0].param, found[1].param));
    if (found.empty()) return std::optional<Constraint>();
    return std::optional<Constraint>(std::move(found[0]));
  } catch (const Refused& r) {
    return r.error;
  }
}

}  // namespace fp4moe::serve
