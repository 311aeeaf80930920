// The hand-written scanners for the GPT-4 / Qwen / GPT-2 pre-tokenizer regexes give the same
// matches as PCRE2 on the same (Oniguruma-translated) pattern, on random text built from
// every character class the patterns distinguish.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "text/regex.hpp"
#include "text/regex_scanner.hpp"

namespace fp4moe::text {
namespace {

std::vector<std::pair<size_t, size_t>> matches(const Regex& re, const std::string& s) {
  std::vector<std::pair<size_t, size_t>> m;
  re.for_each_match(s, [&](size_t b, size_t e) { m.emplace_back(b, e); });
  return m;
}

TEST(RegexScanner, KnownPatternsMatchLikePcre2) {
  const char* patterns[] = {
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
  };
  const std::vector<std::string> pool = {
      "a", "Z", "s", "S", "t", "T", "r", "e", "v", "m", "l", "L", "d", "'", "'", "\xC5\xBF" /* ſ */, "0", "7",
      " ", " ", " ", "\t", "\r", "\n", "\r\n", "!", ".", "-", "_", "\xC3\xA9", "\xE6\x97\xA5", "\xD9\xA1" /* ١ */,
      "\xC2\xB2" /* ² */, "\xE2\x85\xAB" /* Ⅻ */, "\xC2\xA0", "\xE3\x80\x80", "\xC2\x85", "\xE2\x80\xA8",
      "\xE1\xA0\x8E" /* U+180E */, "\xE2\x80\x8B", "\xF0\x9F\x91\x8D", "\xCC\x81" /* combining acute */, "\x0B", "\x0C"};
  std::mt19937 rng(17);
  for (const char* p : patterns) {
    const Regex fast(p, "test");
    Regex slow(p, "test");
    slow.disable_scanner();
    ASSERT_NE(scanner_for(p), ScannerKind::None) << p;
    for (int iter = 0; iter < 20000; ++iter) {
      std::string s;
      const int n = 1 + int(rng() % 16);
      for (int k = 0; k < n; ++k) s += pool[rng() % pool.size()];
      ASSERT_EQ(matches(fast, s), matches(slow, s)) << p << " on " << testing::PrintToString(s);
    }
  }
  EXPECT_EQ(scanner_for(R"(\p{N}{1,3})"), ScannerKind::None);
}

}  // namespace
}  // namespace fp4moe::text
