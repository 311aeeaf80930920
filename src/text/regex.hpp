// Pre-tokenizer regexes: PCRE2 (UTF, Unicode properties, JIT) behaving like the Oniguruma
// regexes that Hugging Face tokenizers compiles.
//
// Oniguruma (Ruby syntax) and PCRE2 differ in a few escapes; the pattern is rewritten so
// that the PCRE2 match is Oniguruma's: \s is Unicode White_Space (PCRE2's adds U+180E and
// drops U+0085), \w is Letter|Mark|Decimal_Number|Connector_Punctuation, \h / \H are hex
// digits, \uHHHH is a code point, and ^ / $ match at line breaks. \S, \W and \H inside a
// bracket class cannot be rewritten and are a load error.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/regex_scanner.hpp"

namespace fp4moe::text {

// The PCRE2 pattern equivalent to an Oniguruma pattern (throws Error naming `what`).
std::string oniguruma_to_pcre2(std::string_view pattern, std::string_view what);

class Regex {
 public:
  // Compiles an Oniguruma-syntax pattern; a bad pattern throws Error naming `what`.
  Regex(std::string_view pattern, std::string_view what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // fn(begin, end) for each match in s (valid UTF-8), left to right, non-overlapping, with
  // Oniguruma's find_iter rule for empty matches: one right after the previous match is
  // skipped and the search moves on by one character.
  template <typename Fn>
  void for_each_match(std::string_view s, Fn&& fn) const {
    if (scanner_ != ScannerKind::None) {  // a known pattern: its matches tile the text
      for (size_t i = 0; i < s.size();) {
        const size_t e = scan_match(scanner_, s, i);
        fn(i, e);
        i = e;
      }
      return;
    }
    size_t pos = 0, last_end = size_t(-1);
    while (pos <= s.size()) {
      size_t b, e;
      if (!search(s, pos, &b, &e)) return;
      if (b == e && e == last_end) {
        if (pos >= s.size()) return;
        pos += char_len(s, pos);
        continue;
      }
      pos = e;
      last_end = e;
      fn(b, e);
    }
  }

  // Every [begin, end) for_each_match gives, in order.
  std::vector<std::pair<size_t, size_t>> matches(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> m;
    for_each_match(s, [&](size_t b, size_t e) { m.emplace_back(b, e); });
    return m;
  }

  const std::string& pattern() const { return pattern_; }
  // Tests compare the scanner with PCRE2: this forces PCRE2.
  void disable_scanner() { scanner_ = ScannerKind::None; }

 private:
  bool search(std::string_view s, size_t from, size_t* begin, size_t* end) const;
  static size_t char_len(std::string_view s, size_t i);

  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
  ScannerKind scanner_ = ScannerKind::None;
};

}  // namespace fp4moe::text
