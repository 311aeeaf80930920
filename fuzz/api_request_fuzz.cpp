// libFuzzer target for the server's request parsers (parse_api_request for chat, completions
// and /generate, parse_tokenize_request, parse_detokenize_request).
//
// The first byte picks the parser, the rest is the HTTP body. Every input must give a
// request within the limits the server relies on, or a one-line 400 whose error JSON can be
// written; anything else (a crash, a sanitizer report, an exception, a broken invariant) aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "serve/api_request_invariants.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int kind = data[0] % 5;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string broken = fp4moe::serve::testing::parse_violation(kind, body);
  if (!broken.empty()) {
    std::fprintf(stderr, "api_request_fuzz: invariant broken: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
