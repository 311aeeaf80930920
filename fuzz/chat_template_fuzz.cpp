// libFuzzer target for the chat template parser and interpreter.
//
// An input is a template source. It is parsed and rendered on a fixed conversation with
// tools, under small step, memory and output limits (the interpreter's own bounds, so a
// template that would allocate or loop without bound ends in a TemplateError, not an OOM). The outcome must be output or a
// jinja::TemplateError whose message is one line starting "line N: "; anything else (a
// crash, a sanitizer report, another exception, a hang past the limits) aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "text/jinja/interpreter.hpp"
#include "text/jinja/parser.hpp"

namespace {

using fp4moe::text::jinja::Json;
using fp4moe::text::jinja::Value;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "chat_template_fuzz: invariant broken: %s\n", what);
  std::abort();
}

const std::vector<std::pair<std::string, Value>>& context() {
  static const auto ctx = [] {
    std::vector<std::pair<std::string, Value>> c;
    c.emplace_back("messages", Value::data(Json::parse(R"([
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "What's the weather in Paris? 日本 👍"},
      {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "{\"temp\": 21}"},
      {"role": "assistant", "content": "<think>ok</think>It is 21 C.", "reasoning_content": "r"}])")));
    c.emplace_back("tools", Value::data(Json::parse(
        R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])")));
    c.emplace_back("add_generation_prompt", Value::boolean(true));
    c.emplace_back("enable_thinking", Value::boolean(false));
    c.emplace_back("bos_token", Value::string("<s>"));
    c.emplace_back("eos_token", Value::string("</s>"));
    return c;
  }();
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  fp4moe::text::jinja::RenderLimits limits;
  limits.max_steps = 20000;
  limits.max_output_bytes = 1 << 20;
  limits.max_memory_bytes = 16 << 20;
  limits.max_call_depth = 16;
  try {
    const auto tpl = fp4moe::text::jinja::parse_template(source);
    (void)fp4moe::text::jinja::render(tpl, context(), limits);
  } catch (const fp4moe::text::jinja::TemplateError& e) {
    if (e.message.find('\n') != std::string::npos) fail("multi-line error message");
    if (e.message.rfind("line ", 0) != 0) fail("error does not give the line");
  }
  return 0;
}
