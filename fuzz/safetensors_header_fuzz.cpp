// libFuzzer target for parse_safetensors_header.
//
// An input is a whole safetensors file: u64 little-endian header length N, N bytes of
// header, then the data section (only its length matters). Inputs whose N does not fit
// are still parsed with the header clipped to the input, so both paths get exercised.
// Every input must give either an fp4moe::Error whose message is one line, or tensors
// that satisfy the format's invariants; anything else (a crash, a sanitizer report,
// another exception, a broken invariant) aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "core/error.hpp"
#include "format/safetensors.hpp"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "safetensors_header_fuzz: invariant broken: %s\n", what);
  std::abort();
}

void check(const std::vector<fp4moe::TensorInfo>& tensors, uint64_t data_size) {
  uint64_t cursor = 0;
  for (const fp4moe::TensorInfo& t : tensors) {
    if (t.begin != cursor || t.end < t.begin) fail("tensors not contiguous and sorted");
    uint64_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 0) fail("negative dim");
      if (__builtin_mul_overflow(n, uint64_t(d), &n)) fail("numel overflow accepted");
    }
    if (n * fp4moe::dtype_size(t.dtype) != t.nbytes()) fail("byte size != numel * dtype size");
    cursor = t.end;
  }
  if (cursor != data_size) fail("data section not fully covered");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  const uint64_t rest = size - 8;
  const uint64_t header_len = n <= rest ? n : rest;
  const std::string_view text(reinterpret_cast<const char*>(data + 8), size_t(header_len));
  const uint64_t data_size = rest - header_len;
  std::map<std::string, std::string> metadata;
  try {
    check(fp4moe::parse_safetensors_header(text, data_size, &metadata, "fuzz.safetensors"), data_size);
  } catch (const fp4moe::Error& e) {
    const std::string_view msg = e.what();
    if (msg.find('\n') != std::string_view::npos) fail("multi-line error message");
    if (msg.substr(0, 18) != "fuzz.safetensors: ") fail("error does not name the file");
  }
  return 0;
}
