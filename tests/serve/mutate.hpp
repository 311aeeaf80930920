// The byte mutations of the parsers' mutation tests (the cheap in-build stand-in for the
// libFuzzer targets): 1-4 edits, each a random byte overwritten, a dictionary token inserted
// or a short run erased.
#pragma once

#include <random>
#include <span>
#include <string>

namespace fp4moe::serve::testing {

inline std::string mutate(std::string s, std::span<const char* const> tokens, std::mt19937_64& rng) {
  for (int k = 1 + int(rng() % 4); k > 0; --k) {
    const size_t pos = rng() % (s.size() + 1);
    switch (rng() % 3) {
      case 0: if (pos < s.size()) s[pos] = char(rng()); break;
      case 1: s.insert(pos, tokens[rng() % tokens.size()]); break;
      default: if (pos < s.size()) s.erase(pos, 1 + rng() % 6); break;
    }
  }
  return s;
}

}  // namespace fp4moe::serve::testing
