// Reasoning parsers (`--reasoning-parser`): split generated text into the model's reasoning
// (`<think>…</think>`) and its answer, once over a finished text or incrementally over
// streamed deltas. The streaming parser holds back what could still become a tag ("</thi"),
// so for every way of cutting a text into deltas the concatenated outputs equal the one-shot
// split. Formats follow SGLang's detectors of the same names:
//   glm45        <think>R</think>C; `<tool_call>` inside the reasoning also ends it (the tag stays
//                in the content for the tool-call parser). Starts open unless the request sets
//                chat_template_kwargs.enable_thinking = false.
//   deepseek-r1  R</think>C: the text always starts inside the reasoning (a leading <think> the
//                model repeats is dropped).
//   deepseek-v3  like glm45, but starts open only when chat_template_kwargs.thinking = true.
// Any of them also starts open when the rendered prompt already ends with `<think>`. Text
// that starts closed is content unless it begins (after whitespace) with `<think>`. A reasoning
// block with no `</think>` by the end (finish_reason "length") is all reasoning.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp4moe::serve {

enum class ReasoningFormat { kGlm45, kDeepSeekR1, kDeepSeekV3 };

std::optional<ReasoningFormat> reasoning_format(std::string_view name);
std::vector<std::string> reasoning_format_names();  // in --help order

struct ReasoningSplit {
  std::string reasoning;
  std::string content;
  bool operator==(const ReasoningSplit&) const = default;
};

// Whether the generated text starts inside the reasoning block, as SGLang decides it for a
// chat request: the format's default, the request's chat_template_kwargs (null: none given)
// and whether the rendered prompt already opened `<think>` (prompt_opens_reasoning).
bool reasoning_starts_open(ReasoningFormat format, const nlohmann::json& chat_template_kwargs,
                           bool prompt_opened_think);
// What /separate_reasoning assumes without a request: the format's default.
bool reasoning_starts_open(ReasoningFormat format);
// The prompt ends (ignoring trailing whitespace) with `<think>`: the template opened it.
bool prompt_opens_reasoning(std::string_view prompt);

class ReasoningStream {
 public:
  // deepseek-r1 always starts open (SGLang's detector ignores the request).
  ReasoningStream(ReasoningFormat format, bool starts_open);

  // The reasoning and content released by this delta (either may be empty).
  ReasoningSplit push(std::string_view delta);
  // Releases what was held back; the stream is done after it.
  ReasoningSplit finish();

  bool in_reasoning() const { return state_ != State::kContent; }

 private:
  enum class State { kLead, kReasoning, kContent };
  void run(ReasoningSplit& out, bool final);

  bool tool_call_ends_reasoning_;
  bool starts_open_;
  State state_ = State::kLead;
  std::string buf_;    // unreleased text (whole UTF-8 characters)
  std::string carry_;  // an incomplete UTF-8 character at the end of the last delta
};

// The one-shot split: equal to one push of the whole text and finish().
ReasoningSplit separate_reasoning(ReasoningFormat format, bool starts_open, std::string_view text);

// Length of the incomplete UTF-8 sequence at the end of s (0 when s ends on a boundary).
size_t incomplete_utf8_tail(std::string_view s);

}  // namespace fp4moe::serve
