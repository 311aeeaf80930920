// Normalizers and pre-tokenizers of tokenizer.json, as Hugging Face tokenizers applies them.
//
// Pre-tokenizers: Split (regex or literal; behaviors removed / isolated /
// merged_with_previous / merged_with_next / contiguous; invert), Digits (individual or
// contiguous), ByteLevel (add_prefix_space, use_regex: GPT-2's regex), and Sequence of them
// (flattened into steps). ByteLevel maps bytes to characters, so it must be the last step;
// the BPE model then starts from bytes. Normalizers: NFC / NFD / NFKC / NFKD and Sequence.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "text/regex.hpp"
#include "text/unicode.hpp"

namespace fp4moe::text {

// A non-owning callable reference (no allocation on the per-word path).
template <typename Sig>
class FunctionRef;
template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f)  // NOLINT: implicit by design
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, Args... a) -> R { return (*static_cast<std::remove_reference_t<F>*>(o))(a...); }) {}
  R operator()(Args... a) const { return call_(obj_, a...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

class Normalizer {
 public:
  void add(NormalForm form) { forms_.push_back(form); }
  bool empty() const { return forms_.empty(); }
  // The normalized text: a view of s when nothing changes, else a view of *buffer.
  std::string_view apply(std::string_view s, std::string* buffer) const;

 private:
  std::vector<NormalForm> forms_;
};

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct PreTokenizerStep {
  enum class Kind { Split, Digits, ByteLevel } kind = Kind::Split;
  std::shared_ptr<const Regex> regex;  // Split; ByteLevel with use_regex (GPT-2's pattern)
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  bool individual_digits = false;
  bool add_prefix_space = false;
};

class PreTokenizer {
 public:
  // Throws Error when the step cannot follow the previous ones (anything after ByteLevel).
  void add(PreTokenizerStep step);
  // True when the last step is ByteLevel: pre-tokens are then bytes for a byte-level BPE.
  bool byte_level() const { return byte_level_; }
  bool empty() const { return steps_.empty(); }  // no splitting: the whole text is one word
  // emit(piece) for each non-empty pre-token of text, in order.
  void run(std::string_view text, FunctionRef<void(std::string_view)> emit) const;

 private:
  void run_step(size_t k, std::string_view piece, FunctionRef<void(std::string_view)> emit) const;
  std::vector<PreTokenizerStep> steps_;
  bool byte_level_ = false;
};

// GPT-2's pre-tokenizer regex (what ByteLevel with use_regex=true splits on).
std::shared_ptr<const Regex> gpt2_regex();

}  // namespace fp4moe::text
