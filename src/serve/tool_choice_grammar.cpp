#include "serve/tool_choice_grammar.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

namespace fp4moe::serve {
namespace {

using nlohmann::json;

struct Refused {
  FieldError error;
};
[[noreturn]] void refuse(std::string param, std::string message) { throw Refused{{std::move(param), std::move(message)}}; }

constexpr std::string_view kValueClose = "</arg_value>";

// Keywords that say nothing about the value (JSON Schema's annotations).
bool is_annotation(const std::string& k) {
  static constexpr std::array<std::string_view, 9> kNames = {"title",    "description", "default", "examples", "$schema",
                                                             "$id",      "$comment",    "deprecated", "readOnly"};
  return std::find(kNames.begin(), kNames.end(), k) != kNames.end() || k == "writeOnly";
}

// A schema every value satisfies (true, or only annotations): a raw string read back as JSON
// still validates.
bool accepts_anything(const json& s) {
  if (s.is_boolean()) return s.get<bool>();
  if (!s.is_object()) return false;
  return std::all_of(s.items().begin(), s.items().end(), [](const auto& kv) { return is_annotation(kv.key()); });
}

bool is_string_value(const json& v) { return v.is_string(); }

// Whether a value of this top-level parameter may be written as a raw string (glm_xml writes a
// string raw wherever the schema allows one).
bool may_be_string(const json& s) {
  if (!s.is_object()) return true;
  if (auto t = s.find("type"); t != s.end()) {
    if (t->is_string()) return *t == "string";
    if (t->is_array()) return std::any_of(t->begin(), t->end(), [](const json& x) { return x == "string"; });
    return true;
  }
  if (auto c = s.find("const"); c != s.end()) return c->is_string();
  if (auto e = s.find("enum"); e != s.end())
    return !e->is_array() || std::any_of(e->begin(), e->end(), is_string_value);
  if (auto a = s.find("anyOf"); a != s.end())
    return !a->is_array() || std::any_of(a->begin(), a->end(), [](const json& b) { return may_be_string(b); });
  for (const char* k : {"properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
                        "maxItems", "minProperties", "maxProperties"})
    if (s.contains(k)) return false;
  return true;
}

json const_string(std::string value) { return {{"type", "const_string"}, {"value", std::move(value)}}; }
json sequence(json elements) { return {{"type", "sequence"}, {"elements", std::move(elements)}}; }
json one_of(json elements) {
  if (elements.size() == 1) return std::move(elements[0]);
  return {{"type", "or"}, {"elements", std::move(elements)}};
}

// A raw string value, then </arg_value> (the first one ends the value, so the value never holds
// it): free text up to the tag; a length bound as [^<]{min,max} (a length-bounded raw string
// holds no '<'); enum / const as literals; anyOf of such as alternatives. A client's pattern or
// format is refused: it could write the closing tag, or (format) xgrammar's regex for it is not
// reachable from here.
json raw_value_then_close(const json& s, const std::string& at) {
  auto literal = [&](const json& v, const std::string& where) {
    if (!v.is_string()) refuse(where, fmt::format("'{}' must be a string here", where));
    const std::string& text = v.get_ref<const std::string&>();
    if (text.find(kValueClose) != std::string::npos)
      refuse(where, fmt::format("'{}' holds '</arg_value>', which ends a glm argument value", where));
    return const_string(text + std::string(kValueClose));
  };
  if (auto c = s.find("const"); c != s.end()) return literal(*c, at + ".const");
  if (auto e = s.find("enum"); e != s.end()) {
    json alts = json::array();
    for (const json& v : *e) alts.push_back(literal(v, at + ".enum"));
    return one_of(std::move(alts));
  }
  if (auto a = s.find("anyOf"); a != s.end()) {
    json alts = json::array();
    for (size_t i = 0; i < a->size(); ++i) alts.push_back(raw_value_then_close((*a)[i], fmt::format("{}.anyOf[{}]", at, i)));
    return one_of(std::move(alts));
  }
  for (const char* k : {"pattern", "format"})
    if (s.contains(k))
      refuse(at + "." + k, fmt::format("'{}.{}': a string parameter is written raw inside <arg_value> in the glm "
                                       "tool-call format, where '{}' is not supported (it could write the closing "
                                       "tag); nest the parameter in an object (JSON strings keep it)",
                                       at, k, k));
  if (s.contains("minLength") || s.contains("maxLength")) {
    auto bound_of = [&](const char* k, int64_t fallback) {
      auto b = s.find(k);
      if (b == s.end()) return fallback;
      if (!b->is_number_integer() || b->get<int64_t>() < 0 || b->get<int64_t>() > 100000)
        refuse(at + "." + k, fmt::format("'{}.{}' must be an integer from 0 to 100000", at, k));
      return b->get<int64_t>();
    };
    const int64_t lo = bound_of("minLength", 0), hi = bound_of("maxLength", -1);
    if (hi >= 0 && hi < lo) refuse(at + ".maxLength", fmt::format("'{}.maxLength' is below its minLength", at));
    const std::string bound = hi < 0 ? fmt::format("{{{},}}", lo) : fmt::format("{{{},{}}}", lo, hi);
    // The closing tag inside the same regex: xgrammar then keeps the bounded repetition as one
    // counted edge followed by '<' (which the class excludes) and decides tokens inside it from
    // the bounds, instead of a mask per position (the repetition as its own rule, then the tag
    // as a separate element, took 1.5-3 s per cold compile at maxLength 120 against a
    // 154,880-token vocabulary; this form ~40 ms: bench grammar prints it).
    return json{{"type", "regex"}, {"pattern", "[^<]" + bound + std::string(kValueClose)}};
  }
  return {{"type", "tag"}, {"begin", ""}, {"content", {{"type", "any_text"}}}, {"end", std::string(kValueClose)}};
}

bool safe_key(const std::string& k) {
  if (k.empty() || k.size() > 256) return false;
  return std::none_of(k.begin(), k.end(), [](char c) {
    return c == '<' || c == '>' || c == '&' || c == '"' || c == '\'' || c == ' ' || c == '\t' || c == '\n' ||
           c == '\r' || static_cast<unsigned char>(c) < 0x20;
  });
}

// One call of a tool in the glm layout: <tool_call>NAME, then each property of the parameters
// schema in its order (the required ones always, the others optionally) as
// <arg_key>K</arg_key><arg_value>V</arg_value>, then </tool_call>; glm45 puts a newline after
// NAME, after </arg_key> and after </arg_value>. A value the schema types as a string is raw
// text (raw_value_then_close), any other JSON from its schema (whitespace between JSON tokens
// bounded at one character: xgrammar's structural tags allow no less).
json glm_call(const std::string& name, const json& params, const ToolCatalog& catalog, int32_t tool, bool glm45,
              const std::string& at) {
  const std::string nl = glm45 ? "\n" : "";
  for (auto it = params.begin(); it != params.end(); ++it) {
    const std::string& k = it.key();
    if (k == "type" || k == "properties" || k == "required" || k == "additionalProperties" || k == "$defs" ||
        k == "definitions" || is_annotation(k))
      continue;
    refuse(at + "." + k, fmt::format("'{}.{}' is not supported at the top of a tool's parameters in the glm tool-call "
                                     "format (they are a list of named arguments)",
                                     at, k));
  }
  json defs = json::object();
  for (const char* k : {"$defs", "definitions"})
    if (auto d = params.find(k); d != params.end()) defs[k] = *d;
  static const json kNoProperties = json::object();
  const auto p = params.find("properties");
  const json& props = p != params.end() && p->is_object() ? *p : kNoProperties;
  std::vector<std::string> required;
  if (auto r = params.find("required"); r != params.end() && r->is_array())
    for (const json& x : *r) {
      if (!x.is_string() || !props.contains(x.get<std::string>()))
        refuse(at + ".required", fmt::format("'{}.required' names {}, which is not in its properties", at, x.dump()));
      required.push_back(x.get<std::string>());
    }
  json elements = json::array({const_string("<tool_call>" + name + nl)});
  for (auto it = props.begin(); it != props.end(); ++it) {
    const std::string& key = it.key();
    const std::string pa = at + ".properties." + key;
    if (!safe_key(key))
      refuse(at + ".properties", fmt::format("'{}.properties': the name '{}' cannot be written as a glm <arg_key> "
                                             "(no whitespace, quotes, '<', '>' or '&')",
                                             at, key.size() > 64 ? key.substr(0, 64) + "..." : key));
    const json& s = it.value();
    if (s.is_object())
      for (const char* k : {"$ref", "allOf"})
        if (s.contains(k))
          refuse(pa + "." + k, fmt::format("'{}.{}': write a top-level parameter's schema inline in the glm tool-call "
                                           "format (the parser decides raw string or JSON from it)",
                                           pa, k));
    json value;
    if (catalog.is_string_param(tool, key)) {
      value = raw_value_then_close(s, pa);
    } else {
      if (may_be_string(s) && !accepts_anything(s))
        refuse(pa, fmt::format("'{}' may be a string or another type: the glm tool-call format writes strings raw, so "
                               "the parser cannot tell \"12\" from 12; give the parameter one kind of type",
                               pa));
      json schema = s;
      if (schema.is_object())
        for (auto d = defs.begin(); d != defs.end(); ++d)
          if (!schema.contains(d.key())) schema[d.key()] = d.value();
      value = sequence(json::array({json{{"type", "json_schema"}, {"json_schema", std::move(schema)}, {"style", "json"},
                                         {"max_whitespace_cnt", 1}},
                                    const_string(std::string(kValueClose))}));
    }
    json arg = sequence(json::array({const_string("<arg_key>" + key + "</arg_key>" + nl + "<arg_value>"), std::move(value),
                                     const_string(nl)}));
    const bool is_required = std::find(required.begin(), required.end(), key) != required.end();
    elements.push_back(is_required ? std::move(arg) : json{{"type", "optional"}, {"content", std::move(arg)}});
  }
  elements.push_back(const_string("</tool_call>"));
  return sequence(std::move(elements));
}

}  // namespace

std::variant<grammar::GrammarSpec, FieldError> tool_choice_grammar(const ToolChoiceGrammarRequest& r) {
  const std::string choice = r.named.empty() ? "'tool_choice': 'required'" : "'tool_choice' naming a function";
  try {
    if (r.format != ToolCallFormat::kGlm47 && r.format != ToolCallFormat::kGlm45)
      refuse("tool_choice", fmt::format("{} is not supported with this --tool-call-parser: its tool-call markers are "
                                        "special tokens, which constrained decoding does not produce (glm47 and glm45 "
                                        "are supported)",
                                        choice));
    if (!r.tools || !r.tools->is_array() || r.tools->empty())
      refuse("tools", fmt::format("{} needs a non-empty 'tools' list", choice));
    const json tools = json::parse(r.tools->dump());
    auto parsed = ToolCatalog::from_json(tools);
    if (auto* e = std::get_if<FieldError>(&parsed)) return *e;
    const ToolCatalog& catalog = std::get<ToolCatalog>(parsed);
    json tags = json::array();  // one call of each tool the choice allows
    for (size_t i = 0; i < tools.size(); ++i) {
      const json& fn = tools[i]["function"];
      const std::string name = fn["name"].get<std::string>();
      if (!r.named.empty() && name != r.named) continue;
      const std::string at = fmt::format("tools[{}].function", i);
      if (!safe_key(name))
        refuse(at + ".name", fmt::format("'{}.name' cannot be written in a glm <tool_call> (no whitespace, quotes, '<', "
                                         "'>' or '&')",
                                         at));
      json params = fn.contains("parameters") && !fn["parameters"].is_null()
                        ? fn["parameters"]
                        : json{{"type", "object"}, {"properties", json::object()}};
      const std::string p = at + ".parameters";
      if (auto t = params.find("type"); t == params.end() || *t != "object")
        refuse(p + ".type", fmt::format("'{}.type' must be \"object\"", p));
      try {
        grammar::check_schema_keywords(params.dump());
      } catch (const grammar::GrammarError& e) {
        refuse(p, fmt::format("'{}': {}", p, e.what()));
      }
      tags.push_back(glm_call(name, params, catalog, int32_t(i), r.format == ToolCallFormat::kGlm45, p));
    }
    if (tags.empty()) refuse("tool_choice", fmt::format("'tool_choice' names the function '{}', which is not in 'tools'", r.named));
    // "required": one or more calls (one without parallel_tool_calls); a named function: one.
    json call = one_of(std::move(tags));
    json calls = call;
    if (r.named.empty() && r.parallel_tool_calls) {
      json more = r.format == ToolCallFormat::kGlm45 ? sequence(json::array({const_string("\n"), call})) : call;
      calls = sequence(json::array({std::move(call), json{{"type", "star"}, {"content", std::move(more)}}}));
    }
    json format = std::move(calls);
    if (r.reasoning_open)
      format = sequence(json::array(
          {json{{"type", "tag"}, {"begin", ""}, {"content", {{"type", "any_text"}}}, {"end", "</think>"}}, std::move(format)}));
    grammar::GrammarSpec spec;
    spec.kind = grammar::Kind::kStructuralTag;
    spec.strict = true;
    spec.text = json{{"type", "structural_tag"}, {"format", std::move(format)}}.dump();
    return spec;
  } catch (const Refused& e) {
    return e.error;
  }
}

}  // namespace fp4moe::serve
