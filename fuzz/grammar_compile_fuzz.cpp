// libFuzzer target for the grammar compile path (grammar::Compiler over xgrammar, both built
// with the sanitizers): JSON schemas, regexes and EBNF grammars from a client.
//
// The first byte picks the kind (0 json_schema, 1 regex, 2 ebnf; its bit 2 clears `strict`),
// the rest is the text. Every input must either compile, or be refused with a one-line
// GrammarError; a compiled grammar must then walk: the matcher accepts every token its mask
// allows (checked on a few), and no state it reaches allows no token at all: grammars with dead
// ends (the regex ^\s\S[^\s\S], whose class matches nothing) are refused at compile time
// (grammar/dead_ends.hpp; this vocabulary spells every byte).
// Anything else (a crash, a sanitizer report, another exception, a broken invariant) aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "grammar/grammar.hpp"

namespace {

using namespace fp4moe::grammar;

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "grammar_compile_fuzz: %s\n", what.c_str());
  std::abort();
}

Compiler& compiler() {
  static Compiler* c = [] {
    Vocab v;
    for (int b = 0; b < 256; ++b) v.token_bytes.push_back(std::string(1, char(b)));
    v.token_bytes.push_back("");  // EOS (256)
    for (const char* t : {"\":", "\"k\":", "{\"", "\"}", "true", "false", "null", "12", "\xC3\xA9", "\xE2\x82", "ab"})
      v.token_bytes.push_back(t);
    v.vocab_size = int32_t(v.token_bytes.size()) + 3;
    v.stop_ids = {256};
    Limits lim;
    lim.max_text_bytes = 4096;
    return new Compiler(v, lim, 1);
  }();
  return *c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  GrammarSpec spec;
  spec.kind = data[0] % 3 == 0 ? Kind::kJsonSchema : data[0] % 3 == 1 ? Kind::kRegex : Kind::kEbnf;
  spec.strict = !(data[0] & 4);
  spec.text.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  GrammarPtr g;
  try {
    g = compiler().compile(spec);
  } catch (const GrammarError& e) {
    const std::string what = e.what();
    if (what.empty() || what.find('\n') != std::string::npos || what.size() > 400)
      broken("a refusal that is not one line: " + what);
    return 0;
  } catch (const std::exception& e) {
    broken(std::string("an exception other than GrammarError: ") + e.what());
  }
  Matcher m(g);
  std::vector<uint32_t> mask(size_t(mask_words(m.vocab_size())));
  uint32_t pick = 0;
  for (size_t i = 1; i < size; ++i) pick = pick * 31 + data[i];
  for (int step = 0; step < 48 && !m.terminated(); ++step) {
    m.fill_mask(mask);
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < m.vocab_size(); ++t)
      if ((mask[size_t(t) / 32] >> (t % 32)) & 1u) allowed.push_back(t);
    if (allowed.empty()) broken("a compiled grammar reached a state that allows no token (a dead end)");
    pick = pick * 1103515245u + 12345u;
    const int32_t tok = allowed[(pick >> 8) % allowed.size()];
    if (!m.accept(tok)) broken("the matcher refused token " + std::to_string(tok) + " that its mask allowed");
  }
  return 0;
}
