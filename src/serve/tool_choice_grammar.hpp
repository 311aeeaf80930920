// tool_choice "required" and a named function (issue 42): the grammar that holds a chat
// completion to the model's tool-call format (--tool-call-parser) with each tool's `parameters`
// JSON schema, so that the tool-call parser always reads the output back as valid calls.
//
// Built as an xgrammar structural tag (grammar::Kind::kStructuralTag) of our own composition:
//   glm47  <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>, calls back
//          to back; glm45 the same with a newline after NAME, after </arg_key> and after
//          </arg_value>, and between calls (SGLang's glm45 layout).
//   The properties of the tool's `parameters` come in the schema's order, the required ones
//   always, the others optionally; properties it does not name are never written. A value the
//   schema types as a string (ToolCatalog::is_string_param, as the parser decides) is raw text
//   up to </arg_value>; any other is JSON from its schema (at most one whitespace character
//   between JSON tokens: structural tags allow no less). What that encoding cannot keep exact is
//   refused: a top-level parameter that may be a string or another type, a raw string's pattern
//   or format, a property name with markup or whitespace, top-level keywords other than
//   properties / required / additionalProperties / $defs.
//   "required": one or more calls of any of the tools (exactly one with parallel_tool_calls
//   false); a named function: exactly one call, of that function (SGLang and vLLM both ask for
//   one call of the named function).
//   With the reasoning parser starting inside a reasoning block, free text up to `</think>`
//   comes first (SGLang constrains only after the reasoning ends).
// deepseekv3 / deepseekv31 are not built: their markers are special tokens, which grammars do
// not produce; such requests get a 400.
#pragma once

#include <optional>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "grammar/grammar.hpp"
#include "serve/tool_call_parser.hpp"

namespace fp4moe::serve {

struct ToolChoiceGrammarRequest {
  ToolCallFormat format = ToolCallFormat::kGlm47;
  const nlohmann::ordered_json* tools = nullptr;  // the request's validated tools (an array)
  std::string named;                              // empty: "required"
  bool parallel_tool_calls = true;
  bool reasoning_open = false;  // the output starts inside a reasoning block ended by </think>
};

// The grammar, or the refusal (param + one-line message) for a 400.
std::variant<grammar::GrammarSpec, FieldError> tool_choice_grammar(const ToolChoiceGrammarRequest& request);

}  // namespace fp4moe::serve
