#include "text/regex_scanner.hpp"

#include <string>
#include <utility>
#include <vector>

#include "text/regex.hpp"
#include "text/unicode.hpp"

namespace fp4moe::text {

namespace {

constexpr std::string_view kGpt4Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwenPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Character classes of the patterns: letter, number, white space (Oniguruma's \s), CR/LF.
enum : uint8_t { kL = 1, kN = 2, kS = 4, kNL = 8 };

struct AsciiClasses {
  uint8_t c[128];
  constexpr AsciiClasses() : c() {
    for (int i = 0; i < 128; ++i) {
      uint8_t v = 0;
      if ((i >= 'a' && i <= 'z') || (i >= 'A' && i <= 'Z')) v |= kL;
      if (i >= '0' && i <= '9') v |= kN;
      if ((i >= 0x09 && i <= 0x0D) || i == ' ') v |= kS;
      if (i == '\r' || i == '\n') v |= kNL;
      c[i] = v;
    }
  }
};
constexpr AsciiClasses kAscii;

// Classes of every code point as PCRE2 sees them, found once (~1 MiB, tens of ms) by
// matching \p{L}+, \p{N}+ and the translated \s+ with PCRE2 over a text of all code points:
// the scanner then agrees with PCRE2 by construction, whatever Unicode version its tables
// have (Debian 12's PCRE2 10.42 has Unicode 14 -- as tokenizers' Oniguruma 6.9.8 --, while
// utf8proc 2.8, behind is_letter(), has Unicode 15).
const uint8_t* code_point_classes() {
  static const std::vector<uint8_t> table = [] {
    std::string all;
    all.reserve(4 * 0x110000);
    for (char32_t cp = 0; cp < 0x110000; ++cp)
      if (cp < 0xD800 || cp > 0xDFFF) append_utf8(all, cp);
    std::vector<uint8_t> t(0x110000, 0);
    const std::pair<const char*, uint8_t> classes[] = {{R"(\p{L}+)", kL}, {R"(\p{N}+)", kN}, {R"(\s+)", kS}};
    for (const auto& [pattern, bit] : classes) {
      const Regex re(pattern, "scanner character classes");  // no scanner for these: PCRE2
      re.for_each_match(all, [&, bit = bit](size_t b, size_t e) {
        for (size_t i = b; i < e;) t[next_code_point(all, i)] |= bit;
      });
    }
    t['\r'] |= kNL;
    t['\n'] |= kNL;
    return t;
  }();
  return table.data();
}

// Class of the character at s[i]; *next gets the index after it.
inline uint8_t class_at(std::string_view s, size_t i, size_t* next) {
  const unsigned char b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    *next = i + 1;
    return kAscii.c[b0];
  }
  const auto b = [&](size_t k) { return char32_t(static_cast<unsigned char>(s[i + k]) & 0x3F); };
  char32_t cp;
  if (b0 < 0xE0) {
    *next = i + 2;
    cp = ((b0 & 0x1F) << 6) | b(1);
  } else if (b0 < 0xF0) {
    *next = i + 3;
    cp = ((b0 & 0x0F) << 12) | (b(1) << 6) | b(2);
  } else {
    *next = i + 4;
    cp = ((b0 & 0x07) << 18) | (b(1) << 12) | (b(2) << 6) | b(3);
  }
  return code_point_classes()[cp];
}

// End of the run of characters from i whose class has any bit of `want` (i if none).
inline size_t run_of(std::string_view s, size_t i, uint8_t want) {
  while (i < s.size()) {
    size_t j;
    if (!(class_at(s, i, &j) & want)) break;
    i = j;
  }
  return i;
}

// End of the run of characters from i whose class has no bit of `avoid`.
inline size_t run_without(std::string_view s, size_t i, uint8_t avoid) {
  while (i < s.size()) {
    size_t j;
    if (class_at(s, i, &j) & avoid) break;
    i = j;
  }
  return i;
}

// 's 't 're 've 'm 'll 'd after the apostrophe at s[i]; case-insensitive with Unicode
// folding (ſ U+017F folds to s) when `fold`. Returns the match end or 0.
size_t contraction(std::string_view s, size_t i, bool fold) {
  const size_t k = i + 1;
  const auto is = [&](size_t at, char lower) -> size_t {  // length of a match of `lower` at s[at], or 0
    if (at >= s.size()) return 0;
    const char c = s[at];
    if (c == lower || (fold && c == lower - 32)) return 1;
    if (fold && lower == 's' && at + 1 < s.size() && s[at] == '\xC5' && s[at + 1] == '\xBF') return 2;
    return 0;
  };
  if (size_t a = is(k, 's')) return k + a;
  if (size_t a = is(k, 't')) return k + a;
  if (size_t a = is(k, 'r'))
    if (size_t b = is(k + a, 'e')) return k + a + b;
  if (size_t a = is(k, 'v'))
    if (size_t b = is(k + a, 'e')) return k + a + b;
  if (size_t a = is(k, 'm')) return k + a;
  if (size_t a = is(k, 'l'))
    if (size_t b = is(k + a, 'l')) return k + a + b;
  if (size_t a = is(k, 'd')) return k + a;
  return 0;
}

// \s*[\r\n]+ | \s+(?!\S) | \s+ from a white-space character at i.
size_t whitespace_tail(std::string_view s, size_t i, bool newline_alternative) {
  size_t last_nl_end = 0, last_start = i, j = i;
  while (j < s.size()) {
    size_t k;
    const uint8_t c = class_at(s, j, &k);
    if (!(c & kS)) break;
    if (c & kNL) last_nl_end = k;
    last_start = j;
    j = k;
  }
  if (newline_alternative && last_nl_end) return last_nl_end;  // \s*[\r\n]+ ends after the last newline
  if (j == s.size() || last_start == i) return j;              // \s+(?!\S) at the end, or \s+
  return last_start;                                           // \s+(?!\S): all but the last one
}

size_t scan_gpt4(std::string_view s, size_t i, size_t max_digits) {
  size_t j0;
  const uint8_t c0 = class_at(s, i, &j0);
  if (s[i] == '\'')
    if (size_t e = contraction(s, i, true)) return e;
  if (!(c0 & (kL | kN | kNL))) {  // [^\r\n\p{L}\p{N}]\p{L}+
    if (j0 < s.size()) {
      size_t j1;
      if (class_at(s, j0, &j1) & kL) return run_of(s, j1, kL);
    }
  } else if (c0 & kL) {
    return run_of(s, j0, kL);
  }
  if (c0 & kN) {  // \p{N}{1,max}
    size_t e = j0;
    for (size_t k = 1; k < max_digits && e < s.size(); ++k) {
      size_t j;
      if (!(class_at(s, e, &j) & kN)) break;
      e = j;
    }
    return e;
  }
  // ' '?[^\s\p{L}\p{N}]+[\r\n]*
  size_t k = i;
  if (s[i] == ' ' && j0 < s.size()) {
    size_t j1;
    if (!(class_at(s, j0, &j1) & (kS | kL | kN))) k = j0;
  }
  if (k != i || !(c0 & (kS | kL | kN))) {
    size_t e = run_without(s, k, kS | kL | kN);
    while (e < s.size() && (s[e] == '\r' || s[e] == '\n')) ++e;
    return e;
  }
  return whitespace_tail(s, i, true);
}

size_t scan_gpt2(std::string_view s, size_t i) {
  size_t j0;
  const uint8_t c0 = class_at(s, i, &j0);
  if (s[i] == '\'')
    if (size_t e = contraction(s, i, false)) return e;
  // ' '?\p{L}+ | ' '?\p{N}+ | ' '?[^\s\p{L}\p{N}]+ : the class of the character after an
  // optional space decides.
  size_t k = i, jk = j0;
  uint8_t ck = c0;
  if (s[i] == ' ' && j0 < s.size()) {
    size_t j1;
    const uint8_t c1 = class_at(s, j0, &j1);
    if (c1 & kL || c1 & kN || !(c1 & kS)) {
      k = j0;
      jk = j1;
      ck = c1;
    }
  }
  if (ck & kL) return run_of(s, jk, kL);
  if (ck & kN) return run_of(s, jk, kN);
  if (!(ck & kS)) return run_without(s, jk, kS | kL | kN);
  (void)k;
  return whitespace_tail(s, i, false);
}

}  // namespace

ScannerKind scanner_for(std::string_view pattern) {
  for (ScannerKind kind : kScanners)
    if (pattern == scanner_pattern(kind)) return kind;
  return ScannerKind::None;
}

std::string_view scanner_pattern(ScannerKind kind) {
  switch (kind) {
    case ScannerKind::Gpt4: return kGpt4Pattern;
    case ScannerKind::Qwen: return kQwenPattern;
    case ScannerKind::Gpt2: return kGpt2Pattern;
    case ScannerKind::None: break;
  }
  return {};
}

size_t scan_match(ScannerKind kind, std::string_view s, size_t i) {
  switch (kind) {
    case ScannerKind::Gpt4: return scan_gpt4(s, i, 3);
    case ScannerKind::Qwen: return scan_gpt4(s, i, 1);
    case ScannerKind::Gpt2: return scan_gpt2(s, i);
    case ScannerKind::None: break;
  }
  return i;
}

}  // namespace fp4moe::text
