// Renders a parsed Jinja template, with jinja2's scoping: a for loop body gets a fresh
// scope each iteration (assignments do not leak out of it; namespace() objects carry state
// across), if / elif / else share the enclosing scope, a macro call gets its own scope
// whose parent is the scope the macro was defined in.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/ast.hpp"

namespace fp4moe::text::jinja {

// Bounds that keep a hostile template from running forever or filling memory.
struct RenderLimits {
  size_t max_output_bytes = size_t(64) << 20;
  uint64_t max_steps = 5'000'000;  // statements, loop iterations and calls (~1 us each)
  int max_call_depth = 64;
};

// Throws TemplateError ("line N: ...").
std::string render(const Template& tpl, const std::vector<std::pair<std::string, Value>>& context,
                   const RenderLimits& limits = {});

}  // namespace fp4moe::text::jinja
