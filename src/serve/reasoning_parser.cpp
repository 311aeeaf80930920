#include "serve/reasoning_parser.hpp"

#include <algorithm>
#include <utility>

namespace fp4moe::serve {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolCallOpen = "<tool_call>";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The longest proper prefix of tag that s ends with.
size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

}  // namespace

size_t incomplete_utf8_tail(std::string_view s) {
  // Walk back over at most 3 continuation bytes to a lead byte and compare the length it
  // announces with the bytes present.
  const size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(4, n); ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    size_t need = 1;
    if ((c & 0xE0) == 0xC0) need = 2;
    else if ((c & 0xF0) == 0xE0) need = 3;
    else if ((c & 0xF8) == 0xF0) need = 4;
    return need > back ? back : 0;
  }
  return 0;
}

// The flag's names, in --help order: the one table the lookup and the list read.
constexpr std::pair<std::string_view, ReasoningFormat> kReasoningFormats[] = {
    {"glm45", ReasoningFormat::kGlm45}, {"deepseek-r1", ReasoningFormat::kDeepSeekR1},
    {"deepseek-v3", ReasoningFormat::kDeepSeekV3}};

std::optional<ReasoningFormat> reasoning_format(std::string_view name) {
  for (const auto& [n, f] : kReasoningFormats)
    if (n == name) return f;
  return std::nullopt;
}

std::vector<std::string> reasoning_format_names() {
  std::vector<std::string> names;
  for (const auto& entry : kReasoningFormats) names.emplace_back(entry.first);
  return names;
}

bool reasoning_starts_open(ReasoningFormat format) { return format == ReasoningFormat::kDeepSeekR1; }

bool reasoning_starts_open(ReasoningFormat format, const nlohmann::json& kwargs, bool prompt_opened_think) {
  if (prompt_opened_think || format == ReasoningFormat::kDeepSeekR1) return true;
  auto flag = [&](const char* key) -> const nlohmann::json* {
    if (!kwargs.is_object()) return nullptr;
    auto it = kwargs.find(key);
    return it == kwargs.end() ? nullptr : &*it;
  };
  if (format == ReasoningFormat::kGlm45) {  // on unless enable_thinking is exactly false
    const auto* v = flag("enable_thinking");
    return !(v && v->is_boolean() && !v->get<bool>());
  }
  const auto* v = flag("thinking");  // deepseek-v3: off unless thinking is exactly true
  return v && v->is_boolean() && v->get<bool>();
}

bool prompt_opens_reasoning(std::string_view prompt) {
  while (!prompt.empty() && is_space(prompt.back())) prompt.remove_suffix(1);
  return prompt.ends_with(kThinkOpen);
}

ReasoningStream::ReasoningStream(ReasoningFormat format, bool starts_open)
    : tool_call_ends_reasoning_(format != ReasoningFormat::kDeepSeekR1),
      starts_open_(starts_open || format == ReasoningFormat::kDeepSeekR1) {}

ReasoningSplit ReasoningStream::push(std::string_view delta) {
  ReasoningSplit out;
  std::string text = std::move(carry_);
  text.append(delta);
  const size_t tail = incomplete_utf8_tail(text);
  carry_ = text.substr(text.size() - tail);
  text.resize(text.size() - tail);
  buf_ += text;
  run(out, false);
  return out;
}

ReasoningSplit ReasoningStream::finish() {
  ReasoningSplit out;
  buf_ += carry_;
  carry_.clear();
  run(out, true);
  return out;
}

void ReasoningStream::run(ReasoningSplit& out, bool final) {
  for (;;) {
    switch (state_) {
      case State::kLead: {
        // Leading whitespace and a `<think>` the model writes itself are dropped; anything
        // else decides the text's start: reasoning if it starts open, else content.
        size_t ws = 0;
        while (ws < buf_.size() && is_space(buf_[ws])) ++ws;
        const std::string_view rest = std::string_view(buf_).substr(ws);
        if (rest.starts_with(kThinkOpen)) {
          buf_.erase(0, ws + kThinkOpen.size());
          state_ = State::kReasoning;
          continue;
        }
        if (!final && kThinkOpen.starts_with(rest)) return;  // "", "<", "<th", ...: wait
        state_ = starts_open_ ? State::kReasoning : State::kContent;
        continue;
      }
      case State::kReasoning: {
        const size_t close = buf_.find(kThinkClose);
        const size_t tool = tool_call_ends_reasoning_ ? buf_.find(kToolCallOpen) : std::string::npos;
        if (close != std::string::npos && (tool == std::string::npos || close < tool)) {
          out.reasoning.append(buf_, 0, close);
          buf_.erase(0, close + kThinkClose.size());
          state_ = State::kContent;
          continue;
        }
        if (tool != std::string::npos) {  // the tag stays, as content
          out.reasoning.append(buf_, 0, tool);
          buf_.erase(0, tool);
          state_ = State::kContent;
          continue;
        }
        size_t keep = 0;
        if (!final) {
          keep = partial_tag_suffix(buf_, kThinkClose);
          if (tool_call_ends_reasoning_) keep = std::max(keep, partial_tag_suffix(buf_, kToolCallOpen));
        }
        out.reasoning.append(buf_, 0, buf_.size() - keep);
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      case State::kContent:
        out.content += buf_;
        buf_.clear();
        return;
    }
  }
}

ReasoningSplit separate_reasoning(ReasoningFormat format, bool starts_open, std::string_view text) {
  ReasoningStream stream(format, starts_open);
  ReasoningSplit out = stream.push(text);
  ReasoningSplit last = stream.finish();
  out.reasoning += last.reasoning;
  out.content += last.content;
  return out;
}

}  // namespace fp4moe::serve
