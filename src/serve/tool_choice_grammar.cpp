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

// A raw string value ends at the first </arg_value>: its schema must keep that text out.
// xgrammar's raw string does so unbounded; a length bound becomes the pattern [^<]{min,max}
// (a length-bounded raw string holds no '<'); a client's own pattern is refused (it may admit
// the closing tag). Returns the schema handed to xgrammar.
json raw_string_schema(json s, const std::string& at) {
  if (!s.is_object()) return s;
  if (s.contains("pattern"))
    refuse(at + ".pattern", fmt::format("'{}.pattern': a string parameter is written raw inside <arg_value> in the glm "
                                        "tool-call format, where a pattern cannot be kept from writing the closing "
                                        "tag; nest the parameter in an object (JSON strings keep their pattern)",
                                        at));
  if (auto f = s.find("format"); f != s.end() && f->is_string()) {
    static constexpr std::array<std::string_view, 8> kSafe = {"date", "time",  "date-time", "duration",
                                                              "ipv4", "ipv6",  "uuid",      "hostname"};
    const std::string fmt_name = f->get<std::string>();
    if (std::find(kSafe.begin(), kSafe.end(), fmt_name) == kSafe.end())
      refuse(at + ".format", fmt::format("'{}.format': '{}' is not kept exact in a raw glm <arg_value> string (formats "
                                         "kept: date, time, date-time, duration, ipv4, ipv6, uuid, hostname)",
                                         at, fmt_name));
  }
  auto no_close = [&](const json& v, const std::string& where) {
    if (v.is_string() && v.get_ref<const std::string&>().find(kValueClose) != std::string::npos)
      refuse(where, fmt::format("'{}' holds '</arg_value>', which ends a glm argument value", where));
  };
  if (auto c = s.find("const"); c != s.end()) no_close(*c, at + ".const");
  if (auto e = s.find("enum"); e != s.end() && e->is_array())
    for (const json& v : *e) no_close(v, at + ".enum");
  const bool enumerated = s.contains("const") || s.contains("enum");
  if (!enumerated && (s.contains("minLength") || s.contains("maxLength"))) {
    auto bound_of = [&](const char* k, int64_t fallback) {
      auto b = s.find(k);
      if (b == s.end()) return fallback;
      if (!b->is_number_integer() || b->get<int64_t>() < 0 || b->get<int64_t>() > 1000000)
        refuse(at + "." + k, fmt::format("'{}.{}' must be an integer from 0 to 1000000", at, k));
      return b->get<int64_t>();
    };
    const int64_t lo = bound_of("minLength", 0), hi = bound_of("maxLength", -1);
    if (hi >= 0 && hi < lo) refuse(at + ".maxLength", fmt::format("'{}.maxLength' is below its minLength", at));
    const std::string bound = hi < 0 ? fmt::format("{{{},}}", lo) : fmt::format("{{{},{}}}", lo, hi);
    s.erase("minLength");
    s.erase("maxLength");
    s["pattern"] = "[^<]" + bound;
  }
  if (auto a = s.find("anyOf"); a != s.end() && a->is_array())
    for (size_t i = 0; i < a->size(); ++i) (*a)[i] = raw_string_schema((*a)[i], fmt::format("{}.anyOf[{}]", at, i));
  return s;
}

bool safe_key(const std::string& k) {
  if (k.empty() || k.size() > 256) return false;
  return std::none_of(k.begin(), k.end(), [](char c) {
    return c == '<' || c == '>' || c == '&' || c == '"' || c == '\'' || c == ' ' || c == '\t' || c == '\n' ||
           c == '\r' || static_cast<unsigned char>(c) < 0x20;
  });
}

// The glm formats' encoding of one tool's top-level parameters, as tool_call_parser.cpp reads it.
void check_glm_parameters(json& params, const ToolCatalog& catalog, int32_t tool, const std::string& at) {
  for (const char* k : {"patternProperties", "propertyNames", "$ref", "allOf", "anyOf", "enum", "const"})
    if (params.contains(k))
      refuse(at + "." + k, fmt::format("'{}.{}' is not supported at the top of a tool's parameters in the glm "
                                       "tool-call format (its parameters are a list of named arguments)",
                                       at, k));
  if (auto ap = params.find("additionalProperties"); ap != params.end() && !ap->is_boolean() && !accepts_anything(*ap))
    refuse(at + ".additionalProperties",
           fmt::format("'{}.additionalProperties' must be true or false in the glm tool-call format: the parser reads "
                       "an unnamed argument as JSON, so a schema for it cannot be kept exact",
                       at));
  const auto props = params.find("properties");
  if (props == params.end() || !props->is_object()) return;
  // (the rewritten schema: raw strings' length bounds as patterns)
  for (auto it = props->begin(); it != props->end(); ++it) {
    const std::string& key = it.key();
    const std::string p = at + ".properties." + key;
    if (!safe_key(key))
      refuse(at + ".properties", fmt::format("'{}.properties': the name '{}' cannot be written as a glm <arg_key> "
                                             "(no whitespace, quotes, '<', '>' or '&')",
                                             at, key.size() > 64 ? key.substr(0, 64) + "..." : key));
    json& s = it.value();
    if (s.is_object())
      for (const char* k : {"$ref", "allOf"})
        if (s.contains(k))
          refuse(p + "." + k, fmt::format("'{}.{}': write a top-level parameter's schema inline in the glm tool-call "
                                          "format (the parser decides raw string or JSON from it)",
                                          p, k));
    if (catalog.is_string_param(tool, key)) {
      s = raw_string_schema(s, p);
    } else if (may_be_string(s) && !accepts_anything(s)) {
      refuse(p, fmt::format("'{}' may be a string or another type: the glm tool-call format writes strings raw, so "
                            "the parser cannot tell \"12\" from 12; give the parameter one kind of type",
                            p));
    }
  }
}

json tool_tag(const ToolChoiceGrammarRequest& r, const std::string& name, const json& params) {
  const bool glm45 = r.format == ToolCallFormat::kGlm45;
  json content = {{"type", "json_schema"},
                  {"json_schema", params},
                  {"style", "glm_xml"},
                  // Bounded whitespace between the parts (issue 42: constrained output always
                  // ends); glm45's layout has a newline between them.
                  {"max_whitespace_cnt", glm45 ? 1 : 0}};
  return {{"type", "tag"},
          {"begin", "<tool_call>" + name + (glm45 ? "\n" : "")},
          {"content", std::move(content)},
          {"end", "</tool_call>"}};
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
    json tags = json::array();
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
      check_glm_parameters(params, catalog, int32_t(i), p);
      tags.push_back(tool_tag(r, name, params));
    }
    json calls;
    if (!r.named.empty()) {
      if (tags.empty()) refuse("tool_choice", fmt::format("'tool_choice' names the function '{}', which is not in 'tools'", r.named));
      calls = tags[0];
    } else {
      calls = {{"type", "tags_with_separator"},
               {"tags", std::move(tags)},
               {"separator", r.format == ToolCallFormat::kGlm45 ? "\n" : ""},
               {"at_least_one", true},
               {"stop_after_first", !r.parallel_tool_calls}};
    }
    json format = std::move(calls);
    if (r.reasoning_open)
      format = {{"type", "sequence"},
                {"elements",
                 {{{"type", "tag"}, {"begin", ""}, {"content", {{"type", "any_text"}}}, {"end", "</think>"}},
                  std::move(format)}}};
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
