// The JSON-schema keywords the compiled grammar honours, checked before xgrammar sees a schema:
// xgrammar skips what it does not implement (`not`, `if`, `contains`, several `allOf` schemas,
// `multipleOf` on numbers, length bounds next to a pattern ...) with a log line, which would make
// an output that does not validate a 200. Here such a schema is refused, naming the keyword and
// where it is. Annotations (title, description, examples ...) are accepted and change nothing.
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "grammar/grammar.hpp"

namespace fp4moe::grammar {
namespace {

using json = nlohmann::json;

// A refusal is one printable line: control bytes of client-chosen keys are escaped (a property
// named "e\nf" put a newline in the message: grammar_compile fuzz finding) and a long path keeps
// its last 160 bytes.
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += char(c);
  }
  return out;
}

[[noreturn]] void refuse(const std::string& where, const std::string& what) {
  std::string path = printable(where);
  if (path.size() > 160) path = "..." + path.substr(path.size() - 160);
  throw GrammarError(fmt::format("{} at {}", printable(what), path.empty() ? "#" : "#" + path));
}

bool is_annotation(const std::string& k) {
  static const char* kNames[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                 "deprecated", "readOnly", "writeOnly", "$anchor", "contentMediaType",
                                 "contentEncoding"};
  for (const char* n : kNames)
    if (k == n) return true;
  return false;
}

std::string key_path(const std::string& at, const std::string& key) {
  std::string k;
  for (char c : key) k += c == '/' ? std::string("~1") : c == '~' ? std::string("~0") : std::string(1, c);
  return at + "/" + k;
}

void check(const json& s, const std::string& at, int depth);

void check_map(const json& m, const std::string& at, int depth) {
  if (!m.is_object()) refuse(at, "expected an object of schemas");
  for (auto it = m.begin(); it != m.end(); ++it) check(*it, key_path(at, it.key()), depth + 1);
}

void check_list(const json& l, const std::string& at, int depth) {
  if (!l.is_array() || l.empty()) refuse(at, "expected a non-empty array of schemas");
  for (size_t i = 0; i < l.size(); ++i) check(l[i], at + "/" + std::to_string(i), depth + 1);
}

void check(const json& s, const std::string& at, int depth) {
  if (depth > 64) refuse(at, "the schema nests too deep");
  if (s.is_boolean()) return;
  if (!s.is_object()) refuse(at, fmt::format("a schema must be an object or a boolean, not {}", s.type_name()));
  const bool bounded_length = s.contains("minLength") || s.contains("maxLength");
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    const json& v = *it;
    const std::string here = key_path(at, k);
    if (is_annotation(k)) continue;
    if (k == "properties" || k == "patternProperties" || k == "$defs" || k == "definitions") {
      check_map(v, here, depth);
    } else if (k == "additionalProperties" || k == "unevaluatedProperties" || k == "items" || k == "unevaluatedItems" ||
               k == "propertyNames") {
      check(v, here, depth + 1);
    } else if (k == "prefixItems" || k == "anyOf") {
      check_list(v, here, depth);
    } else if (k == "allOf") {
      if (!v.is_array() || v.size() != 1)
        refuse(here, "'allOf' with other than one schema is not supported (merge them, or use anyOf)");
      check_list(v, here, depth);
    } else if (k == "oneOf") {
      refuse(here, "'oneOf' is not supported (its branches would not be checked for exclusivity): use anyOf");
    } else if (k == "$ref") {
      if (!v.is_string() || !v.get<std::string>().starts_with("#"))
        refuse(here, "'$ref' must point inside the schema ('#', '#/$defs/...')");
    } else if (k == "uniqueItems") {
      if (v != json(false)) refuse(here, "'uniqueItems': true is not supported");
    } else if (k == "multipleOf") {
      if (s.value("type", json()) != "integer") refuse(here, "'multipleOf' is supported on integers only");
    } else if (k == "pattern" || k == "format") {
      if (bounded_length) refuse(here, fmt::format("'{}' together with minLength / maxLength is not supported", k));
    } else if (k == "type" || k == "required" || k == "enum" || k == "const" || k == "minItems" || k == "maxItems" ||
               k == "minLength" || k == "maxLength" || k == "minimum" || k == "maximum" || k == "exclusiveMinimum" ||
               k == "exclusiveMaximum" || k == "minProperties" || k == "maxProperties") {
      continue;  // values: xgrammar checks their types
    } else {
      refuse(here, fmt::format("unsupported JSON schema keyword '{}'", k.size() > 40 ? k.substr(0, 40) + "..." : k));
    }
  }
}

}  // namespace

void check_schema_keywords(std::string_view text) {
  json schema;
  try {
    schema = json::parse(text);
  } catch (const json::exception& e) {
    std::string what = e.what();
    const size_t p = what.find("] ");  // "[json.exception.parse_error.101] parse error at ..."
    // nlohmann quotes the text it last read ("last read: '...'"): cut to one bounded line.
    std::string why = printable(p == std::string::npos ? what : what.substr(p + 2));
    if (why.size() > 200) why = why.substr(0, 197) + "...";
    throw GrammarError("the json_schema is not valid JSON: " + why);
  }
  check(schema, "", 0);
}

}  // namespace fp4moe::grammar
