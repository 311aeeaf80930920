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
// The defaults: a 200K-token prompt is about 1 MB of text, so 4 MiB of output is ~4x the
// longest context served; 64 MiB of live values (16x the output: a template holds a few
// copies of the messages it reshapes; the caller's messages themselves are not counted);
// 5M steps is a few seconds of CPU, 30-100x what the test templates take on 50 messages.
struct RenderLimits {
  size_t max_output_bytes = size_t(4) << 20;  // the rendered text, and any text a macro / set block builds
  size_t max_memory_bytes = size_t(64) << 20;  // live values, loop item lists and text buffers
  uint64_t max_steps = 5'000'000;  // statements, loop iterations, calls, items walked, 256 B copied (~1 us each)
  int max_call_depth = 64;
};

// Throws TemplateError ("line N: ...").
std::string render(const Template& tpl, const std::vector<std::pair<std::string, Value>>& context,
                   const RenderLimits& limits = {});

}  // namespace fp4moe::text::jinja
