// serve/http/http_parser: the request-head grammar and its limits. Every malformed head is an
// error with its status (the server closes the connection on it: no resynchronisation).
#include <string>

#include <gtest/gtest.h>

#include "serve/http/http_parser.hpp"

namespace fp4moe::serve::http {
namespace {

using R = HeadParser::Result;

struct Parsed {
  R result = R::kNeedMore;
  int status = 0;
  RequestHead head;
  size_t head_bytes = 0;
};

Parsed parse(const std::string& s, ParserLimits limits = {}) {
  HeadParser p(limits);
  Parsed out;
  out.result = p.parse(s);
  out.status = p.error().status;
  out.head = p.head();
  out.head_bytes = p.head_bytes();
  return out;
}

int status_of(const std::string& s) {
  const Parsed p = parse(s);
  EXPECT_EQ(p.result, R::kError) << s;
  return p.status;
}

TEST(HttpParser, ParsesAGetWithHeadersAndQuery) {
  const std::string s = "GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\nX-Y:  v w \t\r\nAuthorization: Bearer k\r\n\r\nrest";
  const Parsed p = parse(s);
  ASSERT_EQ(p.result, R::kDone);
  EXPECT_EQ(p.head.method, "GET");
  EXPECT_EQ(p.head.path, "/v1/models");
  EXPECT_EQ(p.head.query, "x=1");
  EXPECT_EQ(p.head.minor_version, 1);
  EXPECT_TRUE(p.head.keep_alive);
  ASSERT_NE(p.head.find("x-y"), nullptr);
  EXPECT_EQ(*p.head.find("X-Y"), "v w");
  EXPECT_EQ(p.head_bytes, s.size() - 4);
  EXPECT_FALSE(p.head.has_content_length);
}

TEST(HttpParser, IncrementalFeedGivesTheSameHead) {
  const std::string s = "POST /generate HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\nConnection: close\r\n\r\n";
  HeadParser p;
  for (size_t n = 1; n < s.size(); ++n) ASSERT_EQ(p.parse(std::string_view(s).substr(0, n)), R::kNeedMore) << n;
  ASSERT_EQ(p.parse(s), R::kDone);
  EXPECT_EQ(p.head().content_length, 12u);
  EXPECT_TRUE(p.head().has_content_length);
  EXPECT_FALSE(p.head().keep_alive);
}

TEST(HttpParser, Http10KeepsAliveOnlyWhenAsked) {
  EXPECT_FALSE(parse("GET / HTTP/1.0\r\n\r\n").head.keep_alive);
  EXPECT_TRUE(parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").head.keep_alive);
  EXPECT_EQ(parse("GET / HTTP/1.0\r\n\r\n").result, R::kDone);  // no Host needed
}

TEST(HttpParser, AMalformedRequestLineFailsAtOnce) {
  // The probe's desync: after "BAD" every later line used to be a request. Now the first line fails.
  const Parsed p = parse("BAD\r\nx\r\nx\r\n");
  EXPECT_EQ(p.result, R::kError);
  EXPECT_EQ(p.status, 400);
  EXPECT_EQ(status_of("XX\r\nGET /get_server_info HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET  / HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1 \r\nHost: a\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET /\r\n\r\n"), 400);
  EXPECT_EQ(status_of("G(T / HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET http://x/ HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET * HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET /a#b HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET /\x01 HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1x\r\nHost: a\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / http/1.1\r\nHost: a\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/2.0\r\nHost: a\r\n\r\n"), 505);
  EXPECT_EQ(status_of("GET / HTTP/1.2\r\nHost: a\r\n\r\n"), 505);
  EXPECT_EQ(status_of("\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
}

TEST(HttpParser, LineEndingsAreCrlfOnly) {
  EXPECT_EQ(status_of("GET / HTTP/1.1\nHost: a\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: a\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: a\r\n\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: a\rX: b\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HT\rTP/1.1\r\nHost: a\r\n\r\n"), 400);
}

TEST(HttpParser, HeaderGrammar) {
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost : a\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: a\r\nnocolon\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: a\r\n: v\r\n\r\n"), 400);
  EXPECT_EQ(status_of(std::string("GET / HTTP/1.1\r\nHost: a\r\nX: a\0b\r\n\r\n", 34)), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: a\r\nX: a\x7f\r\n\r\n"), 400);
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nHost: a\r\nX: caf\xc3\xa9\r\n\r\n").result, R::kDone);  // obs-text
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\n\r\n"), 400);                     // HTTP/1.1 without Host
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\n\r\n"), 417);
  EXPECT_TRUE(parse("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n").head.expect_continue);
}

TEST(HttpParser, ContentLengthIsOneDecimalNumber) {
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"), 400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n"), 400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n"), 400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n"), 400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n"), 400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x10\r\n\r\n"), 400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: \r\n\r\n"), 400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1234567890123456789\r\n\r\n"), 400);
  const Parsed p = parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 123456789012345678\r\n\r\n");
  ASSERT_EQ(p.result, R::kDone);
  EXPECT_EQ(p.head.content_length, 123456789012345678ull);
}

TEST(HttpParser, TransferEncodingIsRefused) {
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"), 411);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n"), 501);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"), 400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
}

TEST(HttpParser, Limits) {
  // The request line: at most 8 KiB, refused as soon as it is longer, without its end.
  const std::string long_line = "GET /" + std::string(8200, 'a');
  EXPECT_EQ(parse(long_line).status, 414);
  EXPECT_EQ(parse(std::string("GET /") + std::string(8176, 'a') + " HTTP/1.1\r\nHost: a\r\n\r\n").result, R::kDone);
  // The header block: 64 KiB and 100 headers.
  std::string flood = "GET / HTTP/1.1\r\nHost: a\r\n";
  while (flood.size() < 70000) flood += "X-Pad: " + std::string(100, 'p') + "\r\n";
  ParserLimits many;
  many.max_headers = 100000;
  EXPECT_EQ(parse(flood, many).status, 431);  // no final CRLF needed to refuse it
  std::string hundred = "GET / HTTP/1.1\r\nHost: a\r\n";
  for (int i = 0; i < 99; ++i) hundred += "X: y\r\n";
  EXPECT_EQ(parse(hundred + "\r\n").result, R::kDone);
  EXPECT_EQ(parse(hundred + "X: y\r\n\r\n").status, 431);
  // A single header line longer than the block, without a CRLF yet.
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nHost: a\r\nX: " + std::string(70000, 'x')).status, 431);
}

TEST(HttpParser, ResetStartsOver) {
  HeadParser p;
  ASSERT_EQ(p.parse("BAD\r\n"), R::kError);
  p.reset();
  EXPECT_EQ(p.parse("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), R::kDone);
}

}  // namespace
}  // namespace fp4moe::serve::http
