// The grammar layer against an independent reference: for sampled states of regexes (and JSON
// schemas whose compact form is a regex), the allowed-token set equals the brute force over the
// whole vocabulary (each token's bytes appended and checked by tests/grammar/byte_regex_nfa.hpp);
// plus the bounds, the one-line errors and the cache.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "cpu/sampling_cpu.hpp"
#include "grammar/byte_regex_nfa.hpp"
#include "grammar/grammar.hpp"

namespace fp4moe::grammar {
namespace {

constexpr int32_t kEos = 256;

// Bytes 0-255, then EOS and two other specials, then multi-byte tokens; the logit width is
// 8 past the last token (ids a tokenizer does not have).
Vocab test_vocab() {
  Vocab v;
  for (int b = 0; b < 256; ++b) v.token_bytes.push_back(std::string(1, char(b)));
  v.token_bytes.push_back("");  // EOS
  v.token_bytes.push_back("");  // a special
  v.token_bytes.push_back("");
  for (const char* t : {"ab", "abc", "12", "123", "true", "false", "null", "\"k\":", "\"b\":", "{\"", "\"}", "  ",
                        "0.5", "-1", "alpha", "beta", " gamma", "alpha\"", "\xC3\xA9", "\xC3", "\xA9x", "\xE2\x82\xAC",
                        "\\u", "\\\"", "e+", "E-", ",\"", "\":", "xyz", "zz", "a", "-", "--", "1e", "\"\"", "ok\"}"})
    v.token_bytes.push_back(t);
  v.vocab_size = int32_t(v.token_bytes.size()) + 8;
  v.stop_ids = {kEos};
  return v;
}

using test::mask_bit;

// Walks `walks` random paths through the grammar; at every state the mask must equal the
// brute force over the vocabulary.
void check_exact(Compiler& c, const Vocab& v, const GrammarSpec& spec, const test::ByteRegexNfa& ref, int walks,
                 int max_steps, uint32_t seed) {
  GrammarPtr g = c.compile(spec);
  std::mt19937 rng(seed);
  std::vector<uint32_t> mask(size_t(mask_words(v.vocab_size)));
  for (int w = 0; w < walks; ++w) {
    Matcher m(g);
    std::string text;
    for (int step = 0; step < max_steps && !m.terminated(); ++step) {
      m.fill_mask(mask);
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < v.vocab_size; ++t) {
        const bool want = test::brute_force_allows(ref, v.token_bytes, kEos, text, t);
        ASSERT_EQ(mask_bit(mask, t), want) << kind_name(spec.kind) << " " << spec.text << " after '" << text << "' token " << t
                                      << " '" << (t < int32_t(v.token_bytes.size()) ? v.token_bytes[size_t(t)] : "")
                                      << "'";
        if (want) allowed.push_back(t);
      }
      ASSERT_FALSE(allowed.empty());
      // Prefer continuing (EOS one time in eight where allowed) so that walks go deep.
      int32_t pick = allowed[rng() % allowed.size()];
      if (pick == kEos && allowed.size() > 1 && rng() % 8 != 0)
        while (pick == kEos) pick = allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.accept(pick));
      if (pick != kEos) text += v.token_bytes[size_t(pick)];
    }
  }
}

TEST(GrammarMask, RegexMasksEqualTheBruteForce) {
  const Vocab v = test_vocab();
  Compiler c(v);
  const char* regexes[] = {
      "abc",
      "(ab|cd)*e",
      "[a-z]{2,5}",
      "-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?",
      "(true|false|null)",
      "\\d{3}-\\d{4}",
      "x*",
      "(alpha|beta|gamma)( (alpha|beta|gamma)){0,3}",
      "\xC3\xA9+\xE2\x82\xAC?",
      "a{0,2}b{1,}c?",
      "\"[a-z\\\\\"]*\"",
      "\\w+@\\w+\\.(com|org)",
      "(1|12|123)+",
      "[0-9a-f]{8}",
  };
  uint32_t seed = 1;
  for (const char* re : regexes) {
    SCOPED_TRACE(re);
    test::ByteRegexNfa ref(re);
    check_exact(c, v, {Kind::kRegex, re, true}, ref, 6, 24, seed++);
  }
}

TEST(GrammarMask, SchemaMasksEqualTheirCompactRegex) {
  const Vocab v = test_vocab();
  Compiler c(v);
  struct Case {
    const char* schema;
    const char* regex;  // the schema's compact (no whitespace) strict form
  };
  const Case cases[] = {
      {R"({"type":"object","properties":{"k":{"enum":["alpha","beta gamma"]},"b":{"type":"boolean"}},"required":["k","b"],"additionalProperties":false})",
       R"(\{"k":("alpha"|"beta gamma"),"b":(true|false)\})"},
      {R"({"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":3})", R"(\[(true|false)(,(true|false)){0,2}\])"},
      {R"({"const":"ok"})", R"("ok")"},
      {R"({"type":"object","properties":{"n":{"type":"null"},"e":{"enum":[1,12,"x"]}},"required":["n","e"],"additionalProperties":false})",
       R"(\{"n":null,"e":(1|12|"x")\})"},
  };
  uint32_t seed = 100;
  for (const Case& k : cases) {
    SCOPED_TRACE(k.schema);
    test::ByteRegexNfa ref(k.regex);
    check_exact(c, v, {Kind::kJsonSchema, k.schema, true}, ref, 6, 40, seed++);
  }
}

TEST(GrammarMask, EbnfMaskEqualsTheSameLanguageAsRegex) {
  const Vocab v = test_vocab();
  Compiler c(v);
  test::ByteRegexNfa ref("(ab|xyz)(,(ab|xyz))*");
  check_exact(c, v, {Kind::kEbnf, "root ::= item (\",\" item)*\nitem ::= \"ab\" | \"xyz\"", true}, ref, 6, 20, 7);
}

TEST(GrammarMask, BitmaskAppliedToLogitsLeavesOnlyAllowedTokens) {
  std::vector<float> logits(70, 1.0f);
  std::vector<uint32_t> allowed(3, 0);
  allowed[0] = 1u << 5;
  allowed[2] = 1u << 1;  // token 65
  EXPECT_EQ(cpu::apply_token_bitmask(logits.data(), 70, allowed.data()), 2);
  for (int t = 0; t < 70; ++t) EXPECT_EQ(std::isinf(logits[size_t(t)]), t != 5 && t != 65) << t;
}

GrammarError compile_error(Compiler& c, const GrammarSpec& spec) {
  try {
    c.compile(spec);
  } catch (const GrammarError& e) {
    return e;
  }
  ADD_FAILURE() << "compiled: " << spec.text;
  return GrammarError("");
}

// Only UTF-8 comes out of a character class (a JSON string's, a negated regex or EBNF class),
// and the mask offers no byte that leads to a dead end: no C0 / C1 (overlong two-byte forms) or
// F5-FF lead byte; after E0 only A0-BF, after F0 only 90-BF (no overlong forms); after ED only
// 80-9F (no surrogates U+D800-U+DFFF); after F4 only 80-8F (nothing past U+10FFFF).
// tools/grammar/patch_xgrammar.py, fix 3.
TEST(GrammarMask, CharacterClassesTakeOnlyUtf8) {
  const Vocab v = test_vocab();
  Compiler c(v);
  auto allowed_bytes = [&](Matcher& m) {
    std::vector<uint32_t> mask(size_t(mask_words(v.vocab_size)));
    m.fill_mask(mask);
    std::vector<int> out;
    for (int b = 0x80; b <= 0xFF; ++b)
      if (mask_bit(mask, b)) out.push_back(b);
    return out;
  };
  auto range = [](int lo, int hi) {
    std::vector<int> r;
    for (int b = lo; b <= hi; ++b) r.push_back(b);
    return r;
  };
  for (const GrammarSpec& spec : {GrammarSpec{Kind::kJsonSchema, R"({"type":"string"})", true},
                                  GrammarSpec{Kind::kRegex, "[^<]*", true}, GrammarSpec{Kind::kEbnf, "root ::= [^a]*", true}}) {
    auto start = [&] {
      Matcher m(c.compile(spec));
      if (spec.kind == Kind::kJsonSchema) {
        EXPECT_TRUE(m.accept('"'));
      }
      return m;
    };
    Matcher m0 = start();
    EXPECT_EQ(allowed_bytes(m0), range(0xC2, 0xF4)) << spec.text;  // lead bytes only
    const std::pair<int, std::vector<int>> after[] = {
        {0xC2, range(0x80, 0xBF)}, {0xE0, range(0xA0, 0xBF)}, {0xE1, range(0x80, 0xBF)}, {0xED, range(0x80, 0x9F)},
        {0xF0, range(0x90, 0xBF)}, {0xF4, range(0x80, 0x8F)}};
    for (const auto& [lead, want] : after) {
      Matcher m = start();
      ASSERT_TRUE(m.accept(lead)) << spec.text;
      const std::vector<int> got = allowed_bytes(m);
      EXPECT_EQ(got, want) << spec.text << " after " << lead << ": " << got.size() << " bytes, last " << (got.empty() ? 0 : got.back());
    }
    Matcher m = start();
    for (int b : {0xED, 0x9F, 0xBF, 0xF4, 0x8F, 0xBF, 0xBF}) ASSERT_TRUE(m.accept(b)) << spec.text;  // U+D7FF U+10FFFF
  }
}

TEST(GrammarErrors, BadInputIsOneLineWithoutXgrammarsPrefix) {
  const Vocab v = test_vocab();
  Compiler c(v);
  const GrammarSpec bad[] = {
      {Kind::kJsonSchema, "{\"type\":", true},                                 // not JSON
      {Kind::kJsonSchema, "{\"type\":\"frobnicate\"}", true},                  // unknown type
      {Kind::kJsonSchema, "[1,2]", true},                                      // not a schema
      {Kind::kRegex, "(ab", true},                                             // unbalanced
      {Kind::kRegex, "[^\\s\\S]", true},                                       // matches nothing
      {Kind::kEbnf, "root ::= \"a\" | ", true},                                // syntax error
      {Kind::kEbnf, "start ::= \"a\"", true},                                  // no root rule
      {Kind::kEbnf, "", true},                                                 // empty
      {Kind::kJsonSchema, std::string(40000, ' ') + "{}", true},               // over the text limit
      {Kind::kJsonSchema, std::string(30, '[') + std::string(30, ']'), true},  // over the depth limit
  };
  for (const GrammarSpec& s : bad) {
    const std::string what = compile_error(c, s).what();
    SCOPED_TRACE(s.text.substr(0, 60));
    EXPECT_FALSE(what.empty());
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_EQ(what.find(".cc:"), std::string::npos) << what;
    EXPECT_LE(what.size(), 400u) << what;
  }
  // The server stays usable: a good grammar still compiles.
  EXPECT_NE(c.compile({Kind::kRegex, "ab", true}), nullptr);
}

TEST(GrammarErrors, DeepArraysAtTheDepthLimitCompileQuickly) {
  // xgrammar's compile time grows ~cubically with nested arrays; the depth limit keeps the worst
  // schema that passes it fast (the bound is on the schema text, two levels per array).
  const Vocab v = test_vocab();
  Compiler c(v);
  std::string schema = "{\"type\":\"integer\"}";
  int depth = 1;
  while (json_nesting_depth("{\"type\":\"array\",\"items\":" + schema + "}") <= c.limits().max_json_depth) {
    schema = "{\"type\":\"array\",\"items\":" + schema + "}";
    ++depth;
  }
  const auto t0 = std::chrono::steady_clock::now();
  c.compile({Kind::kJsonSchema, schema, true});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 5.0) << depth << " levels";
  EXPECT_THROW(c.compile({Kind::kJsonSchema, "{\"type\":\"array\",\"items\":" + schema + "}", true}), GrammarError);
}

TEST(GrammarCache, SameTextHitsDifferentOptionsMiss) {
  const Vocab v = test_vocab();
  Limits lim;
  lim.cache_entries = 2;
  Compiler c(v, lim);
  const std::string s = R"({"type":"object","properties":{"a":{"type":"integer"}}})";
  GrammarPtr a = c.compile({Kind::kJsonSchema, s, true});
  EXPECT_EQ(c.compile({Kind::kJsonSchema, s, true}), a);
  EXPECT_NE(c.compile({Kind::kJsonSchema, s, false}), a);  // strict is part of the key
  c.compile({Kind::kRegex, "a", true});                     // evicts the oldest (strict)
  EXPECT_NE(c.compile({Kind::kJsonSchema, s, true}), a);
  const CacheStats st = c.cache_stats();
  EXPECT_EQ(st.hits, 1);
  EXPECT_EQ(st.entries, 2u);
}

TEST(GrammarMatcher, TerminatesOnStopAndRefusesWhatTheGrammarForbids) {
  const Vocab v = test_vocab();
  Compiler c(v);
  Matcher m(c.compile({Kind::kRegex, "ab", true}));
  EXPECT_FALSE(m.accept('b'));
  EXPECT_FALSE(m.accept(kEos));
  EXPECT_TRUE(m.accept('a'));
  EXPECT_TRUE(m.accept('b'));
  EXPECT_FALSE(m.terminated());
  EXPECT_FALSE(m.accept('a'));
  EXPECT_TRUE(m.accept(kEos));
  EXPECT_TRUE(m.terminated());
  EXPECT_FALSE(m.accept('a'));
  EXPECT_FALSE(m.accept(v.vocab_size + 3));  // out of range: refused, no crash
  m.rollback(1);
  EXPECT_FALSE(m.terminated());
}

TEST(GrammarMatcher, AVocabularyWithoutStopIdsEndsWhereTheTextMayEnd) {
  Vocab v = test_vocab();
  v.stop_ids.clear();  // a tokenizer without EOS (tests/text/data/behaviors has none)
  Compiler c(v);
  Matcher m(c.compile({Kind::kRegex, "ab", true}));
  EXPECT_TRUE(m.accept('a'));
  EXPECT_FALSE(m.terminated());
  EXPECT_TRUE(m.accept('b'));
  EXPECT_TRUE(m.terminated());
}

TEST(GrammarLimits, NestingDepthIgnoresBracketsInStrings) {
  EXPECT_EQ(json_nesting_depth(R"({"a":"[[[{{{","b":[1,{"c":2}]})"), 3);
  EXPECT_EQ(json_nesting_depth(R"("\"[[")"), 0);
  EXPECT_EQ(json_nesting_depth("]]]{"), 1);
}

}  // namespace
}  // namespace fp4moe::grammar
