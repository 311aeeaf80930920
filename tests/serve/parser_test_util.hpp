// Helpers shared by the parser tests and the parser fuzz target: deterministic call ids, and
// streaming a text through the parsers in given pieces.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "serve/reasoning_parser.hpp"
#include "serve/tool_call_parser.hpp"

namespace fp4moe::serve::testing {

// "call_0", "call_1", ... (one counter per source).
inline ToolCallIdSource counter_ids() {
  auto n = std::make_shared<int>(0);
  return [n] { return "call_" + std::to_string((*n)++); };
}

// The text cut at the given (sorted, in-range) positions.
inline std::vector<std::string_view> cut(std::string_view text, const std::vector<size_t>& at) {
  std::vector<std::string_view> pieces;
  size_t from = 0;
  for (size_t p : at) {
    pieces.push_back(text.substr(from, p - from));
    from = p;
  }
  pieces.push_back(text.substr(from));
  return pieces;
}

// Streams the pieces; returns what a client assembling the deltas gets, and an empty
// `shape_error` when the events were well formed (a call's start before its arguments, call
// indices 0, 1, ... in order, no empty content events).
struct StreamedToolCalls {
  ParsedToolCalls parsed;
  std::string shape_error;
};

inline StreamedToolCalls stream_tool_calls(ToolCallFormat format, std::shared_ptr<const ToolCatalog> tools,
                                           const std::vector<std::string_view>& pieces) {
  ToolCallStream stream(format, std::move(tools), counter_ids());
  StreamedToolCalls out;
  int32_t started = 0;
  auto take = [&](const std::vector<ToolCallEvent>& events) {
    for (const auto& e : events) {
      if (e.kind == ToolCallEvent::Kind::kContent && e.text.empty()) out.shape_error = "an empty content event";
      if (e.kind == ToolCallEvent::Kind::kCallStart &&
          (e.index != started++ || e.id.empty() || e.name.empty()))
        out.shape_error = "a call start out of order or without id / name";
      if (e.kind == ToolCallEvent::Kind::kArguments && (e.index < 0 || e.index >= started))
        out.shape_error = "arguments for a call that has not started";
    }
    apply_tool_call_events(out.parsed, events);
  };
  for (auto p : pieces) take(stream.push(p));
  take(stream.finish());
  return out;
}

inline ReasoningSplit stream_reasoning(ReasoningFormat format, bool starts_open,
                                       const std::vector<std::string_view>& pieces) {
  ReasoningStream stream(format, starts_open);
  ReasoningSplit out;
  auto take = [&](const ReasoningSplit& s) {
    out.reasoning += s.reasoning;
    out.content += s.content;
  };
  for (auto p : pieces) take(stream.push(p));
  take(stream.finish());
  return out;
}

}  // namespace fp4moe::serve::testing
