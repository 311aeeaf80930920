// libFuzzer target for bench serve's parsers of bytes that come from a server or a file: the
// SSE stream -> per-request result (completions and chat chunks), and the JSONL dataset.
// The first byte picks the parser (0 completions stream, 1 chat stream, 2 JSONL); the rest is
// the input. Any broken invariant (serve/bench_stream_invariants.hpp) or stray exception aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "serve/bench_stream_invariants.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string broken = fp4moe::serve::testing::bench_stream_violation(data[0] % 3, bytes);
  if (!broken.empty()) {
    std::fprintf(stderr, "bench_stream_fuzz: invariant broken: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
