// libFuzzer target for the server's HTTP request-head parser (serve/http/http_parser.cpp).
//
// The input is the bytes a client sends. The parser must give the same answer whether they
// arrive at once or split (at points the input picks), never ask for more once the limits are
// passed, and on success hand back a head within the grammar and the limits; an error carries
// one of the statuses the server answers with. Anything else aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "serve/http/http_parser.hpp"

namespace {

using fp4moe::serve::http::HeadParser;
using fp4moe::serve::http::ParserLimits;
using R = HeadParser::Result;

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "http_request_fuzz: invariant broken: %s\n", what);
  std::abort();
}

bool has_ctl(const std::string& s) {
  for (unsigned char c : s)
    if ((c < 0x20 && c != '\t') || c == 0x7f) return true;
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Small limits so that the fuzzer reaches them.
  ParserLimits limits;
  limits.max_request_line = 256;
  limits.max_header_bytes = 1024;
  limits.max_headers = 8;
  const std::string_view all(reinterpret_cast<const char*>(data), size);

  HeadParser whole(limits);
  const R r = whole.parse(all);

  // The same bytes in pieces: the piece lengths come from the bytes themselves.
  HeadParser split(limits);
  R rs = R::kNeedMore;
  for (size_t at = 0; at < size && rs == R::kNeedMore;) {
    at = std::min(size, at + 1 + size_t(data[at] % 17));
    rs = split.parse(all.substr(0, at));
  }
  if (size == 0) rs = split.parse(all);
  if (rs != r) broken("split input gives another result");
  if (r == R::kError && split.error().status != whole.error().status) broken("split input gives another status");
  if (r == R::kDone && split.head_bytes() != whole.head_bytes()) broken("split input gives another head length");

  if (r == R::kNeedMore && size > limits.max_request_line + limits.max_header_bytes) broken("buffers past the limits");
  if (r == R::kError) {
    const int s = whole.error().status;
    if (s != 400 && s != 411 && s != 414 && s != 417 && s != 431 && s != 501 && s != 505) broken("unexpected status");
    if (whole.error().message.empty()) broken("an error without a message");
  }
  if (r == R::kDone) {
    const auto& h = whole.head();
    const size_t n = whole.head_bytes();
    if (n > size || n < 4 || all.substr(n - 4, 4) != "\r\n\r\n") broken("the head does not end in CRLF CRLF");
    if (all.substr(0, n - 2).find("\r\n\r\n") != std::string_view::npos) broken("the head ends late");
    if (h.method.empty() || has_ctl(h.method) || h.path.empty() || h.path[0] != '/') broken("bad request line");
    if (h.target != h.path + (h.target.size() > h.path.size() ? "?" + h.query : "")) broken("target != path?query");
    if (h.minor_version != 0 && h.minor_version != 1) broken("bad version");
    if (h.headers.size() > limits.max_headers) broken("too many headers");
    for (const auto& x : h.headers)
      if (x.name.empty() || has_ctl(x.name) || has_ctl(x.value) || x.name.find(':') != std::string::npos)
        broken("bad header");
    if (h.minor_version == 1 && !h.find("host")) broken("HTTP/1.1 without Host");
    if (h.find("transfer-encoding")) broken("Transfer-Encoding accepted");
    if (h.has_content_length != (h.find("content-length") != nullptr)) broken("Content-Length flag");
  }
  return 0;
}
