// libFuzzer target for tokenizer.json loading and encoding.
//
// An input is: u16 little-endian length N, N bytes of tokenizer.json (clipped to the
// input), then the text to encode (arbitrary bytes). Loading must give a tokenizer or an
// fp4moe::Error with a one-line message naming the file; a loaded tokenizer must encode the
// text into ids of its vocabulary, decode them to valid UTF-8, and stream-detokenize them to
// the same text. Anything else (a crash, a sanitizer report, another exception, a broken
// invariant) aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.hpp"
#include "text/detokenizer.hpp"
#include "text/tokenizer.hpp"
#include "text/unicode.hpp"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "tokenizer_json_fuzz: invariant broken: %s\n", what);
  std::abort();
}

void check_error(const fp4moe::Error& e) {
  const std::string_view msg = e.what();
  if (msg.find('\n') != std::string_view::npos) fail("multi-line error message");
  if (msg.substr(0, 11) != "fuzz.json: ") fail("error does not name the file");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t n = std::min(size - 2, size_t(data[0]) | (size_t(data[1]) << 8));
  const std::string_view json(reinterpret_cast<const char*>(data + 2), n);
  const std::string_view text(reinterpret_cast<const char*>(data + 2 + n), size - 2 - n);
  try {
    const fp4moe::text::Tokenizer tok = fp4moe::text::Tokenizer::from_json(json, "fuzz.json");
    for (bool special : {true, false}) {
      const std::vector<int32_t> ids = tok.encode(text, special);
      for (int32_t id : ids)
        if (id < 0 || id >= tok.vocab_size()) fail("id outside the vocabulary");
      const std::string decoded = tok.decode(ids, false);
      if (!fp4moe::text::is_valid_utf8(decoded)) fail("decode gave invalid UTF-8");
      fp4moe::text::StreamingDetokenizer detok(tok, false);
      std::string streamed;
      for (int32_t id : ids) streamed += detok.push(id);
      streamed += detok.finish();
      if (streamed != decoded) fail("streaming detokenization differs from decode");
    }
  } catch (const fp4moe::Error& e) {
    check_error(e);
  }
  return 0;
}
