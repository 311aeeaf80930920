// Jinja lexer with the whitespace rules of the environment transformers uses
// (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False):
//   - newlines are normalized to "\n" and one trailing newline of the template is dropped;
//   - "{%-" / "{{-" / "{#-" strip all whitespace before the tag, "-%}" / "-}}" / "-#}" all
//     whitespace after it;
//   - a block or comment tag drops the single newline right after it (trim_blocks) unless
//     written "+%}";
//   - spaces and tabs from the start of a line up to a block or comment tag are dropped
//     (lstrip_blocks) unless the tag is written "{%+".
// Data between tags comes out already stripped; comments produce no tokens; {% raw %}
// bodies come out as data.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace fp4moe::text::jinja {

enum class Tok { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };

struct Token {
  Tok type;
  std::string value;  // data text, name, decoded string literal, number text, operator
  int line;
};

// Throws TemplateError ("line N: ...") on a lexical error.
std::vector<Token> tokenize(std::string_view source);

}  // namespace fp4moe::text::jinja
