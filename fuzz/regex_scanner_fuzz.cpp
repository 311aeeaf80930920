// libFuzzer target: the hand-written pre-tokenizer scanners against PCRE2.
//
// An input is arbitrary bytes, made valid UTF-8 the way encoding does (each ill-formed
// subpart becomes U+FFFD). For each known pattern (GPT-4 / GLM, Qwen, GPT-2) the scanner's
// matches must equal PCRE2's on the same translated pattern, match for match; a difference
// prints the pattern and the place and aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "text/regex.hpp"
#include "text/unicode.hpp"

namespace {

struct Pair {
  explicit Pair(fp4moe::text::ScannerKind kind)
      : fast(fp4moe::text::scanner_pattern(kind), "fuzz"), slow(fp4moe::text::scanner_pattern(kind), "fuzz") {
    slow.disable_scanner();
  }
  fp4moe::text::Regex fast;
  fp4moe::text::Regex slow;
};

const std::vector<std::unique_ptr<Pair>>& pairs() {
  static const auto all = [] {
    std::vector<std::unique_ptr<Pair>> v;
    for (fp4moe::text::ScannerKind kind : fp4moe::text::kScanners) v.push_back(std::make_unique<Pair>(kind));
    return v;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = fp4moe::text::to_valid_utf8(std::string_view(reinterpret_cast<const char*>(data), size));
  for (const auto& re : pairs()) {
    const auto a = re->fast.matches(text), b = re->slow.matches(text);
    if (a == b) continue;
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    std::fprintf(stderr, "regex_scanner_fuzz: scanner and PCRE2 differ at match %zu (byte %zu; ends %zu vs %zu) for %s\n",
                 k, k < b.size() ? b[k].first : size_t(0), k < a.size() ? a[k].second : size_t(0),
                 k < b.size() ? b[k].second : size_t(0), re->fast.pattern().c_str());
    std::abort();
  }
  return 0;
}
