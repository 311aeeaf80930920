// Streaming detokenization: token ids in, text out as soon as it is complete UTF-8.
//
// A byte-level token can end inside a UTF-8 character (one emoji spread over several
// tokens). push() returns the text that became complete and holds back the bytes of a
// character still being spelled; a sequence that turns out ill-formed becomes U+FFFD at
// once. The concatenation of every push() and finish() equals Tokenizer::decode of all the
// ids, so no broken UTF-8 ever leaves it.
#pragma once

#include <cstdint>
#include <string>

#include "text/tokenizer.hpp"

namespace fp4moe::text {

class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = true)
      : tok_(&tokenizer), skip_special_(skip_special_tokens) {}

  // The text completed by this token (often the whole token, sometimes empty).
  std::string push(int32_t id);
  // Flushes what is held: an unfinished character becomes U+FFFD. The detokenizer can be
  // reused for a new stream afterwards.
  std::string finish();
  // Bytes currently held back (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  bool first_ = true;
  std::string pending_;
};

}  // namespace fp4moe::text
