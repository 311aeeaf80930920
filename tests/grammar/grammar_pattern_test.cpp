// JSON schema `pattern`s (xgrammar builds them as automata) against two independent references:
// for each pattern, each test string is accepted as a whole JSON string exactly when std::regex
// matches it, and at every prefix of a random walk the mask equals the brute force over the
// vocabulary (tests/grammar/byte_regex_nfa.hpp). The patterns put optional groups, stars and
// alternatives next to each other: `(b*c)?` once accepted `b` (tools/grammar/patch_xgrammar.py
// fix 6).
#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <string>
#include <vector>

#include "grammar/byte_regex_nfa.hpp"
#include "grammar/grammar.hpp"

namespace fp4moe::grammar {
namespace {

constexpr int32_t kEos = 256;

// Bytes 0-255, EOS, then a few multi-byte tokens that cross the patterns' parts.
Vocab pattern_vocab() {
  Vocab v;
  for (int b = 0; b < 256; ++b) v.token_bytes.push_back(std::string(1, char(b)));
  v.token_bytes.push_back("");  // EOS
  for (const char* t : {"ab", "b\"", "bc", "bb", "c\"", "-\"", "a-", "--", "-a\"", "ax", "xb", "cb"})
    v.token_bytes.push_back(t);
  v.vocab_size = int32_t(v.token_bytes.size());
  v.stop_ids = {kEos};
  return v;
}

std::string schema_of(const std::string& pattern) {
  std::string escaped;
  for (char c : pattern) {
    if (c == '\\' || c == '"') escaped += '\\';
    escaped += c;
  }
  return R"({"type":"string","pattern":"^)" + escaped + R"($"})";
}

const char* const kPatterns[] = {
    "a(b*c)?", "(b*c)?", "ax?(b*c)?", "a(b*c)", "ab*c", "a(b|c)*c", "a(c|b*c)?", "(a|ab*c)", "(ab*)?c?",
    "[a-c]([\\-a-c]*[a-c])?", "a(b+c)?b?", "(a?b*)?c",
};

TEST(GrammarPattern, WholeStringsMatchStdRegex) {
  const Vocab v = pattern_vocab();
  Compiler c(v);
  const char* inputs[] = {"", "a", "b", "c", "ab", "ac", "bc", "abb", "abc", "abbc", "abcb", "axb", "axc",
                          "a-", "a-c", "a--c", "ca", "cc", "abcc", "bbc", "aab"};
  for (const char* p : kPatterns) {
    SCOPED_TRACE(p);
    GrammarPtr g = c.compile({Kind::kJsonSchema, schema_of(p), true});
    const std::regex re(p);
    for (const char* in : inputs) {
      Matcher m(g);
      bool ok = true;
      std::string quoted = "\"";
      quoted += in;
      quoted += '"';
      for (char ch : quoted) ok = ok && m.accept(uint8_t(ch));
      ok = ok && m.accept(kEos);
      EXPECT_EQ(ok, std::regex_match(std::string(in), re)) << "'" << in << "'";
    }
  }
}

using test::mask_bit;

TEST(GrammarPattern, MasksEqualTheBruteForce) {
  const Vocab v = pattern_vocab();
  Compiler c(v);
  std::mt19937 rng(7);
  std::vector<uint32_t> mask(size_t(mask_words(v.vocab_size)));
  for (const char* p : kPatterns) {
    SCOPED_TRACE(p);
    const test::ByteRegexNfa ref("\"(" + std::string(p) + ")\"");
    GrammarPtr g = c.compile({Kind::kJsonSchema, schema_of(p), true});
    for (int walk = 0; walk < 12; ++walk) {
      Matcher m(g);
      std::string text;
      for (int step = 0; step < 12 && !m.terminated(); ++step) {
        m.fill_mask(mask);
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < v.vocab_size; ++t) {
          const bool want = test::brute_force_allows(ref, v.token_bytes, kEos, text, t);
          ASSERT_EQ(mask_bit(mask, t), want) << "after '" << text << "' token '" << v.token_bytes[size_t(t)] << "'";
          if (want) allowed.push_back(t);
        }
        ASSERT_FALSE(allowed.empty());
        const int32_t pick = allowed[rng() % allowed.size()];
        ASSERT_TRUE(m.accept(pick));
        if (pick != kEos) text += v.token_bytes[size_t(pick)];
      }
    }
  }
}

}  // namespace
}  // namespace fp4moe::grammar
