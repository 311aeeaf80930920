// The hand-written scanners for the GPT-4 / Qwen / GPT-2 pre-tokenizer regexes give exactly
// the matches of PCRE2 on the same (Oniguruma-translated) pattern: every code point in
// contexts that tell its class apart, random text over every general category, and
// adversarial runs (contractions with case folding, whitespace and newline runs, digits,
// combining marks, CJK). fuzz/regex_scanner_fuzz.cpp does the same on arbitrary bytes.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "text/regex.hpp"
#include "text/regex_scanner.hpp"
#include "text/unicode.hpp"

namespace fp4moe::text {
namespace {

// The scanner and PCRE2 for one pattern.
struct Pair {
  explicit Pair(ScannerKind kind) : fast(scanner_pattern(kind), "test"), slow(scanner_pattern(kind), "test") {
    slow.disable_scanner();
  }
  Regex fast;
  Regex slow;
};

// Index of the first match that differs (or of the end of the shorter list), to print the
// place rather than two lists of a million matches.
::testing::AssertionResult same_matches(const Pair& re, const std::string& s) {
  const auto a = re.fast.matches(s), b = re.slow.matches(s);
  if (a == b) return ::testing::AssertionSuccess();
  size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
  const size_t at = k < b.size() ? b[k].first : k < a.size() ? a[k].first : s.size();
  const size_t from = at >= 12 ? at - 12 : 0;
  return ::testing::AssertionFailure() << "pattern " << re.fast.pattern() << ": match " << k << " differs at byte "
                                       << at << " (scanner " << (k < a.size() ? a[k].second : 0) << ", PCRE2 "
                                       << (k < b.size() ? b[k].second : 0) << " end) in ..."
                                       << ::testing::PrintToString(s.substr(from, 40));
}

bool is_surrogate(char32_t cp) { return cp >= 0xD800 && cp <= 0xDFFF; }

TEST(RegexScanner, RecognizesExactlyTheKnownPatterns) {
  EXPECT_EQ(scanner_for(
                R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"),
            ScannerKind::Gpt4);
  EXPECT_EQ(scanner_for(
                R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"),
            ScannerKind::Qwen);
  EXPECT_EQ(scanner_for(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"), ScannerKind::Gpt2);
  EXPECT_EQ(scanner_for(R"(\p{N}{1,3})"), ScannerKind::None);
  EXPECT_EQ(scanner_for(std::string(scanner_pattern(ScannerKind::Gpt4)) + "|x"), ScannerKind::None);
  EXPECT_EQ(scanner_pattern(ScannerKind::None), "");
}

// Each code point after a letter, a digit, a space and punctuation, and before a newline:
// a code point the scanner classes differently from PCRE2 (letter, number, white space or
// other) splits differently in one of these. (The classes are shared by the patterns; the
// GPT-2 one has no newline alternative, so both kinds are run.)
TEST(RegexScanner, EveryCodePointInEveryContextMatchesLikePcre2) {
  for (ScannerKind kind : {ScannerKind::Gpt4, ScannerKind::Gpt2}) {
    const Pair re(kind);
    std::string s;
    for (char32_t cp = 0; cp < 0x110000; ++cp) {
      if (is_surrogate(cp)) continue;
      std::string c;
      append_utf8(c, cp);
      s += "a" + c + "1" + c + " " + c + "!" + c + "\n";
      if (s.size() > (1u << 20) || cp + 1 == 0x110000) {
        ASSERT_TRUE(same_matches(re, s)) << " (code points up to U+" << std::hex << uint32_t(cp) << ")";
        s.clear();
      }
    }
  }
}

// Random text: code points of every general category and plane, the characters the
// patterns single out, and runs of each.
TEST(RegexScanner, RandomUnicodeTextMatchesLikePcre2) {
  const std::vector<std::string> pool = {
      "a", "Z", "s", "S", "t", "T", "r", "R", "e", "E", "v", "V", "m", "M", "l", "L", "d", "D", "'", "'",
      "\xC5\xBF" /* ſ */, "\xE2\x84\xAA" /* Kelvin */, "0", "7", " ", " ", " ", "\t", "\r", "\n", "\r\n", "\x0B", "\x0C",
      "!", ".", "-", "_", "\xC3\xA9", "e\xCC\x81" /* e + combining acute */, "\xCC\x81", "\xE0\xA4\xBF" /* Devanagari sign */,
      "\xE6\x97\xA5", "\xE8\xAA\x9E", "\xE3\x81\x82", "\xEA\xB0\x80" /* Hangul */, "\xE1\x84\x80" /* jamo */,
      "\xD9\xA1" /* Arabic-Indic 1 */, "\xC2\xB2" /* ² */, "\xE2\x85\xAB" /* Ⅻ */, "\xF0\x9D\x9F\x8E" /* math 0 */,
      "\xC2\xA0", "\xE3\x80\x80", "\xC2\x85", "\xE2\x80\xA8", "\xE2\x80\xA9", "\xE1\xA0\x8E" /* U+180E */,
      "\xE2\x80\x8B" /* ZWSP */, "\xE2\x80\x8D" /* ZWJ */, "\xF0\x9F\x91\x8D", "\xF0\x9F\x8F\xBD" /* skin tone */,
      "\xEF\xBF\xBD", "\xF0\xA0\x80\x80" /* CJK ext B */, "\xF3\xA0\x80\x81" /* tag */, "\xF4\x8F\xBF\xBF"};
  std::mt19937 rng(17);
  const auto random_code_point = [&]() {
    // Mostly the low planes, where the categories are dense; sometimes anywhere.
    for (;;) {
      const uint32_t r = rng();
      const char32_t cp = r % 4 == 0 ? char32_t(r % 0x110000) : r % 4 == 1 ? char32_t(r % 0x3000) : char32_t(r % 0x10000);
      if (!is_surrogate(cp)) return cp;
    }
  };
  for (ScannerKind kind : kScanners) {
    const Pair re(kind);
    for (int iter = 0; iter < 20000; ++iter) {
      std::string s;
      const int n = 1 + int(rng() % 24);
      for (int k = 0; k < n; ++k) {
        const uint32_t what = rng() % 8;
        if (what < 5) {
          s += pool[rng() % pool.size()];
        } else if (what < 7) {
          append_utf8(s, random_code_point());
        } else {  // a run of one piece
          const std::string& piece = pool[rng() % pool.size()];
          for (int r = int(rng() % 9); r >= 0; --r) s += piece;
        }
      }
      ASSERT_TRUE(same_matches(re, s));
    }
  }
}

// Hand-picked edges: contractions in every case and with ſ, apostrophes not followed by a
// contraction, white space runs ending in a newline / at the end / before text, digit runs
// longer than three, a space before punctuation, newline runs after punctuation.
TEST(RegexScanner, AdversarialTextMatchesLikePcre2) {
  const std::vector<std::string> cases = {
      "", "'", "''", "'s", "'S", "'\xC5\xBF", "'RE", "'rE", "'Ve", "'LL", "'lL", "'d", "'D", "'x", "'1", "' ", "it's",
      "IT'S", "we'Ll", "'ll'll'", "don't'", "'\xE2\x84\xAA", " 's", "  'd", "'\n", "x\n\n\n", "x \n \n ", " \r\n\r\n  x",
      "\n", "\r", "  ", "   ", "   x", "   !", "\t\tx", "\t!", " \t ", "\xE3\x80\x80x", "\xE3\x80\x80\xE3\x80\x80",
      " \xC2\x85 x", "1234567", "12 345", "\xD9\xA1\xD9\xA2\xD9\xA3\xD9\xA4", "1\xC2\xB2\xC2\xB3", " !!!\n\n", "!!\r\n x",
      " !x", " !\n", "a\xCC\x81\xCC\x81" "b", "\xCC\x81\xCC\x81", " \xCC\x81", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",
      "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7", "x   ", "x\t\t", "\x0B\x0C\x0B"};
  for (ScannerKind kind : kScanners) {
    const Pair re(kind);
    for (const std::string& s : cases) ASSERT_TRUE(same_matches(re, s));
    // Long runs: the scanner must not be quadratic or stop early.
    for (const char* piece : {" ", "\n", " \n", "1", "a", "!", "\xE6\x97\xA5", "\xCC\x81", "'s"}) {
      std::string s;
      for (int r = 0; r < 5000; ++r) s += piece;
      ASSERT_TRUE(same_matches(re, s + "x"));
      ASSERT_TRUE(same_matches(re, s));
    }
  }
}

}  // namespace
}  // namespace fp4moe::text
