// The JSON schema `format: email` (xgrammar's email regex; since tools/grammar/patch_xgrammar.py
// fix 5 its domain is built as an automaton, ~20x cheaper masks) has the same masks as before at
// every step: the same regex compiled as one rule expansion (the old form: CompileRegex expands
// a regex into grammar rules, as the JSON converter did) gives word-for-word the same mask, and
// both equal the brute force over the vocabulary (tests/grammar/byte_regex_nfa.hpp). The walks
// follow valid addresses (dot form, quoted form, hyphens, several labels) and random paths
// biased towards multi-byte tokens that cross the local part / `@` / domain / closing-quote
// boundaries, where the automaton and the old rules differ in how they decide a token.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "grammar/byte_regex_nfa.hpp"
#include "grammar/grammar.hpp"

namespace fp4moe::grammar {
namespace {

constexpr int32_t kEos = 256;

// xgrammar's email regex (json_schema_converter.cc, JSONFormatToRegexPattern, the JSON string
// form: a quote inside the quoted local part is written \" in the JSON text) between the JSON
// string's quotes, in xgrammar's regex syntax.
std::string old_form_regex() {
  const std::string atext = R"([\w!#$%&'*+/=?^`{|}~-])";
  const std::string dot = "(" + atext + "+(\\." + atext + "+)*)";
  const std::string quote = R"(\\\")";
  const std::string pair = R"(\\\\([\x20-\x21\x23-\x5B\x5D-\x7E]|\\\"|\\\\))";
  const std::string quoted = quote + "(" + pair + R"(|[\x20\x21\x23-\x5B\x5D-\x7E])*)" + quote;
  const std::string domain = R"(([A-Za-z0-9]([\-A-Za-z0-9]*[A-Za-z0-9])?)((\.[A-Za-z0-9][\-A-Za-z0-9]*[A-Za-z0-9])*))";
  return "\"(" + dot + "|" + quoted + ")@" + domain + "\"";
}

// The same language in byte_regex_nfa's subset (no \x escapes: the printable class without
// '"' and '\\' is written with its bytes).
std::string nfa_regex() {
  const std::string atext = R"([\w!#$%&'*+/=?^`{|}~-])";
  const std::string dot = "(" + atext + "+(\\." + atext + "+)*)";
  const std::string printable = R"([ !#-Z\[\]^-~])";
  const std::string quoted = R"(\\"(\\\\()" + printable + R"(|\\"|\\\\)|)" + printable + R"()*\\")";
  const std::string domain = R"(([A-Za-z0-9]([\-A-Za-z0-9]*[A-Za-z0-9])?)((\.[A-Za-z0-9][\-A-Za-z0-9]*[A-Za-z0-9])*))";
  return "\"(" + dot + "|" + quoted + ")@" + domain + "\"";
}

// Bytes 0-255, EOS and two specials, then tokens that cross the email's boundaries.
const std::vector<std::string>& boundary_tokens() {
  static const std::vector<std::string> t = {
      "alice", "bob", "@", "@example", "example", ".com", ".com\"", "com\"", "\"", "le.", "ple.org", "x-y", "a-",
      "-b", "9\"", ".c", "..", "\\\"", "\\\\", "\\\\\"", "a.b", "ab@c", "ing\"", "ing ", "o\"}", "\",", "le\"]",
      "e.", "-.", "@-", "x@y.z\"", "org\"", "-\"", ".-", "a@b", "\\\\\\\\", "\\\" ", " \\\"@", "\"@", "\\\"@x",
      "mail-", "1-2.", "z\"\"", "\xC3\xA9", "_+", "{|}"};
  return t;
}

Vocab email_vocab() {
  Vocab v;
  for (int b = 0; b < 256; ++b) v.token_bytes.push_back(std::string(1, char(b)));
  for (int k = 0; k < 3; ++k) v.token_bytes.push_back("");  // EOS, two specials
  for (const std::string& s : boundary_tokens()) v.token_bytes.push_back(s);
  v.vocab_size = int32_t(v.token_bytes.size()) + 5;
  v.stop_ids = {kEos};
  return v;
}

using test::mask_bit;

struct Walker {
  const Vocab& v;
  GrammarPtr now, old;
  const test::ByteRegexNfa& ref;
  int64_t steps = 0;
  int64_t domain_steps = 0;  // steps after the '@' (the part built as an automaton)

  // One walk: `next` picks the token from the allowed set (or -1 to stop); at every step the
  // two masks are equal word for word and equal the brute force.
  template <class Next>
  void walk(Next next, int max_steps) {
    Matcher a(now), b(old);
    std::vector<uint32_t> ma(size_t(mask_words(v.vocab_size))), mb(ma.size());
    std::string text;
    for (int step = 0; step < max_steps && !a.terminated(); ++step, ++steps) {
      a.fill_mask(ma);
      b.fill_mask(mb);
      ASSERT_EQ(ma, mb) << "after '" << text << "'";
      if (text.find('@') != std::string::npos) ++domain_steps;
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < v.vocab_size; ++t) {
        const bool want = test::brute_force_allows(ref, v.token_bytes, kEos, text, t);
        ASSERT_EQ(mask_bit(ma, t), want) << "after '" << text << "' token " << t << " '"
                                    << (t < int32_t(v.token_bytes.size()) ? v.token_bytes[size_t(t)] : "") << "'";
        if (want) allowed.push_back(t);
      }
      ASSERT_FALSE(allowed.empty()) << "after '" << text << "'";
      const int32_t pick = next(text, allowed);
      if (pick < 0) return;
      ASSERT_TRUE(a.accept(pick));
      ASSERT_TRUE(b.accept(pick));
      if (pick != kEos) text += v.token_bytes[size_t(pick)];
    }
  }
};

TEST(GrammarEmailFormat, MasksEqualTheOldRuleExpansionAndTheBruteForce) {
  const Vocab v = email_vocab();
  Compiler c(v);
  const test::ByteRegexNfa ref(nfa_regex());
  Walker w{v, c.compile({Kind::kJsonSchema, R"({"type":"string","format":"email"})", true}),
           c.compile({Kind::kRegex, old_form_regex(), true}), ref};

  // Valid addresses, spelled by the longest allowed token that continues the text.
  const char* addresses[] = {
      "\"alice@example.com\"", "\"bob@example.org\"", "\"a.b-c@x-y.example.org\"", "\"x@y.zz\"",
      "\"first.last+tag@mail-1.co\"", "\"_+{|}@a1\"", "\"\\\"quoted pair\\\\\\\\x\\\\\\\"\\\"@host\"",
      "\"\\\"\\\"@1-2.example\"", "\"o'neil@ab\"", "\"ab@c9\""};
  for (const char* addr : addresses) {
    SCOPED_TRACE(addr);
    const std::string target = addr;
    ASSERT_TRUE(ref.full_match(target));
    w.walk(
        [&](const std::string& text, const std::vector<int32_t>& allowed) -> int32_t {
          if (text == target) return kEos;
          int32_t best = -1;
          for (int32_t t : allowed)
            if (t != kEos && target.compare(text.size(), v.token_bytes[size_t(t)].size(), v.token_bytes[size_t(t)]) == 0 &&
                (best < 0 || v.token_bytes[size_t(t)].size() > v.token_bytes[size_t(best)].size()))
              best = t;
          return best;  // the address is valid: some token always continues it
        },
        200);
    if (HasFatalFailure()) return;
  }

  // Random paths: half the steps take a boundary token where one is allowed, '@' often.
  std::mt19937 rng(42);
  const int32_t first_boundary = 259;
  const int32_t at = '@';
  for (int walk = 0; walk < 120; ++walk) {
    w.walk(
        [&](const std::string&, const std::vector<int32_t>& allowed) -> int32_t {
          std::vector<int32_t> multi;
          for (int32_t t : allowed)
            if (t >= first_boundary) multi.push_back(t);
          const uint32_t r = rng() % 8;
          if (r == 0 && std::find(allowed.begin(), allowed.end(), at) != allowed.end()) return at;
          if (r < 5 && !multi.empty()) return multi[rng() % multi.size()];
          int32_t pick = allowed[rng() % allowed.size()];
          if (pick == kEos && allowed.size() > 1 && rng() % 4 != 0)
            while (pick == kEos) pick = allowed[rng() % allowed.size()];
          return pick;
        },
        40);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(w.steps, 1200);
  EXPECT_GT(w.domain_steps, 500);
}

}  // namespace
}  // namespace fp4moe::grammar
