// Grammars that could strand a generation are refused when compiled (grammar/dead_ends.hpp): a
// language with no string at all, and a part that text can enter but nothing can complete
// (before this check the request started and was aborted at runtime with "the grammar allows
// no next token"). And the check is not over-strict: dead parts text cannot enter, and every
// grammar the other grammar tests compile, still compile; each accepted grammar is walked to
// its end by a random walk that never meets an empty mask.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "grammar/grammar.hpp"

namespace fp4moe::grammar {
namespace {

constexpr int32_t kEos = 256;

Vocab byte_vocab() {
  Vocab v;
  for (int b = 0; b < 256; ++b) v.token_bytes.push_back(std::string(1, char(b)));
  v.token_bytes.push_back("");  // EOS
  for (const char* t : {"ab", "\"a\":", "12", "{\"", "\"}"}) v.token_bytes.push_back(t);
  v.vocab_size = int32_t(v.token_bytes.size());
  v.stop_ids = {kEos};
  return v;
}

std::string refusal(Compiler& c, const GrammarSpec& spec) {
  try {
    c.compile(spec);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

// Random walks (200, up to 400 steps; EOS chosen one time in four where allowed): every state
// met has some allowed token.
void walk_to_the_end(const GrammarPtr& g, const Vocab& v, const std::string& what) {
  std::mt19937 rng(7);
  std::vector<uint32_t> mask(size_t(mask_words(v.vocab_size)));
  for (int w = 0; w < 200; ++w) {
    Matcher m(g);
    int step = 0;
    for (; step < 400 && !m.terminated(); ++step) {
      m.fill_mask(mask);
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < v.vocab_size; ++t)
        if ((mask[size_t(t) / 32] >> (t % 32)) & 1u) allowed.push_back(t);
      ASSERT_FALSE(allowed.empty()) << what << ": walk " << w << " stranded at step " << step;
      int32_t pick = allowed[rng() % allowed.size()];
      const bool eos_ok = std::find(allowed.begin(), allowed.end(), kEos) != allowed.end();
      if (eos_ok && rng() % 4 == 0) pick = kEos;
      ASSERT_TRUE(m.accept(pick)) << what;
    }
  }
}

TEST(GrammarDeadEnds, EmptyLanguagesAreRefused) {
  const Vocab v = byte_vocab();
  Compiler c(v);
  const GrammarSpec cases[] = {
      {Kind::kRegex, "[^\\s\\S]", true},
      {Kind::kRegex, "[^\\s\\S]+", true},
      {Kind::kEbnf, "root ::= \"a\" root", true},                    // no finite derivation
      {Kind::kEbnf, "root ::= x \"b\"\nx ::= \"a\" x", true},      // through another rule
      {Kind::kJsonSchema, R"({"type":"string","pattern":"[^\\s\\S]"})", true},
  };
  for (const GrammarSpec& s : cases) {
    const std::string why = refusal(c, s);
    EXPECT_NE(why.find("admits no output"), std::string::npos) << s.text << ": '" << why << "'";
  }
}

TEST(GrammarDeadEnds, PartsTextCanEnterButNotCompleteAreRefused) {
  const Vocab v = byte_vocab();
  Compiler c(v);
  const GrammarSpec cases[] = {
      {Kind::kRegex, "a[^\\s\\S]", true},             // the start allows 'a', then nothing
      {Kind::kRegex, "b|a[^\\s\\S]", true},           // the language is {b}, but 'a' is offered
      {Kind::kRegex, "x(y|z[^\\s\\S])", true},
      {Kind::kRegex, "ab{3}[^\\s\\S]", true},
      {Kind::kEbnf, "root ::= \"b\" | \"a\" x\nx ::= \"c\" x", true},
      {Kind::kEbnf, "root ::= \"a\" [^\\x00-\\U0010FFFF]", true},
      {Kind::kJsonSchema, R"({"type":"string","pattern":"a[^\\s\\S]"})", true},
      {Kind::kJsonSchema,
       R"({"type":"object","properties":{"a":{"type":"string","pattern":"x[^\\s\\S]"}},"required":["a"]})", true},
  };
  for (const GrammarSpec& s : cases) {
    const std::string why = refusal(c, s);
    EXPECT_TRUE(why.find("nothing can complete") != std::string::npos || why.find("admits no output") != std::string::npos)
        << s.text << ": '" << why << "'";
    EXPECT_EQ(why.find('\n'), std::string::npos) << why;
  }
  // The compiler is still usable.
  EXPECT_NE(c.compile({Kind::kRegex, "ab", true}), nullptr);
}

TEST(GrammarDeadEnds, DeadPartsTextCannotEnterAndOrdinaryGrammarsCompile) {
  const Vocab v = byte_vocab();
  Compiler c(v);
  const GrammarSpec cases[] = {
      {Kind::kRegex, "[^\\s\\S]|a", true},  // the empty class has no edge: nothing enters it
      {Kind::kRegex, "a|[^\\s\\S]b", true},
      {Kind::kEbnf, "root ::= [^\\x00-\\U0010FFFF] \"x\" | \"a\"", true},
      {Kind::kEbnf, "root ::= \"a\" root | \"b\"", true},
      {Kind::kEbnf, "root ::= x\nx ::= \"(\" x \")\" | \"\"", true},
      {Kind::kRegex, "[a-z]{2,5}(-[0-9]{1,3})*", true},
      {Kind::kRegex, "(ab|a)*c", true},
      {Kind::kRegex, "", true},
      {Kind::kRegex, "[^<]{0,120}", true},
      {Kind::kJsonObject, "", false},
      {Kind::kJsonSchema, R"({"type":"string","minLength":2,"maxLength":5})", true},
      {Kind::kJsonSchema, R"({"type":"integer","minimum":-5,"maximum":300})", true},
      {Kind::kJsonSchema, R"({"type":"number","minimum":0.5})", true},
      {Kind::kJsonSchema, R"({"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":3})", true},
      {Kind::kJsonSchema, R"({"type":"string","format":"date-time"})", true},
      {Kind::kJsonSchema, R"({"type":"string","format":"email"})", true},
      {Kind::kJsonSchema,
       R"({"$defs":{"n":{"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":[{"$ref":"#/$defs/n"},{"type":"null"}]}},"required":["v","next"]}},"$ref":"#/$defs/n"})",
       true},
      {Kind::kJsonSchema, R"({"type":"object","properties":{"a":{"enum":["x","yy",1,null]}},"required":["a"]})", false},
  };
  for (const GrammarSpec& s : cases) {
    const std::string what = std::string(kind_name(s.kind)) + " " + s.text;
    GrammarPtr g;
    try {
      g = c.compile(s);
    } catch (const GrammarError& e) {
      ADD_FAILURE() << what << ": refused: " << e.what();
      continue;
    }
    walk_to_the_end(g, v, what);
  }
}

}  // namespace
}  // namespace fp4moe::grammar
