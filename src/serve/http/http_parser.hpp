// A strict, incremental HTTP/1.1 request-head parser (RFC 9112) with hard limits.
//
// The caller keeps every byte of the request received so far in one buffer and calls parse()
// after each read; the parser validates each line as soon as its CRLF arrives, so garbage is
// refused after its first line, never buffered. Anything outside the grammar is an error with
// the status to answer (the caller then closes the connection: there is no resynchronisation).
// Refused: bare LF or CR, obs-fold, whitespace before a header's colon, control bytes, a request
// line over 8 KiB (414), a header block over 64 KiB or over 100 headers (431), a target that is
// not origin-form, a version other than HTTP/1.0 / 1.1 (505), a missing or repeated Host
// (HTTP/1.1), a repeated or malformed Content-Length, any Transfer-Encoding (411 for chunked,
// 501 otherwise; 400 beside a Content-Length), an Expect other than 100-continue (417).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fp4moe::serve::http {

struct ParserLimits {
  size_t max_request_line = 8192;   // bytes, CRLF included
  size_t max_header_bytes = 65536;  // the header lines after the request line, CRLFs included
  size_t max_headers = 100;
};

struct Header {
  std::string name, value;
};

// Case-insensitive ASCII comparison (header names, tokens).
bool iequals(std::string_view a, std::string_view b);

struct RequestHead {
  std::string method, target, path, query;  // path + ("?" query) = target
  int minor_version = 1;                    // HTTP/1.<minor>
  std::vector<Header> headers;              // in arrival order, values without surrounding whitespace
  bool keep_alive = true;
  bool has_content_length = false;
  uint64_t content_length = 0;
  bool expect_continue = false;
  const std::string* find(std::string_view name) const;  // the first header of that name
};

struct ParseError {
  int status = 0;  // 400, 411, 414, 417, 431, 501, 505
  std::string message;
};

class HeadParser {
 public:
  enum class Result { kNeedMore, kDone, kError };
  explicit HeadParser(ParserLimits limits = {}) : limits_(limits) {}

  // buf: the bytes of this request received so far (buf[0] is its first byte; the caller only
  // appends between calls). kDone: head() is complete and head_bytes() bytes of buf were the head.
  Result parse(std::string_view buf);
  const RequestHead& head() const { return head_; }
  RequestHead& head() { return head_; }
  size_t head_bytes() const { return pos_; }
  const ParseError& error() const { return error_; }
  void reset() { *this = HeadParser(limits_); }

 private:
  Result fail(int status, std::string message);
  bool request_line(std::string_view line);
  bool header_line(std::string_view line);
  bool finish();

  ParserLimits limits_;
  RequestHead head_;
  ParseError error_;
  size_t pos_ = 0;             // start of the first line not yet taken
  size_t scanned_ = 0;         // bytes already searched for LF
  size_t headers_start_ = 0;   // end of the request line
  bool have_request_line_ = false;
  Result result_ = Result::kNeedMore;
};

}  // namespace fp4moe::serve::http
