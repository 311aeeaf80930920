// Jinja parser: tokens → Template, following jinja2's grammar and operator precedence.
// Unknown filters and tests, unsupported tags ({% include %}, {% call %}, {% filter %},
// recursive loops ...) are errors here, before anything renders.
#pragma once

#include <string_view>

#include "text/jinja/ast.hpp"

namespace fp4moe::text::jinja {

// Throws TemplateError ("line N: ...").
Template parse_template(std::string_view source);

// The filter and test names the interpreter implements (builtins.cpp).
bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);

}  // namespace fp4moe::text::jinja
