// The request and response the server's handlers see (shaped like cpp-httplib's, which the
// handlers were written against): a complete request with its body; a response that is either
// a body or a chunked content provider that writes through a DataSink.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "serve/http/http_parser.hpp"

namespace fp4moe::serve::http {

struct Request {
  std::string method, target, path, query;
  int minor_version = 1;
  std::vector<Header> headers;
  std::string body;
  std::string remote_ip;

  bool has_header(std::string_view name) const;
  std::string get_header_value(std::string_view name) const;  // the first one; "" when absent
};

// A streamed response writes through this (on its worker thread).
class DataSink {
 public:
  virtual ~DataSink() = default;
  virtual bool write(const char* data, size_t size) = 0;  // false: the client is gone (or the server stopping)
  virtual void done() = 0;                                // the response is complete
  virtual bool is_writable() = 0;                         // whether the client is still there to write to
};

// Called until it calls sink.done() (or returns false: abort the response and the connection).
using ContentProvider = std::function<bool(size_t offset, DataSink& sink)>;
// Called once at the end with whether the response completed.
using ContentProviderReleaser = std::function<void(bool success)>;

struct Response {
  int status = 200;
  std::vector<Header> headers;
  std::string body;
  std::string content_type;
  ContentProvider provider;  // set: a chunked (streamed) response
  ContentProviderReleaser releaser;

  void set_content(std::string content, std::string type);
  void set_header(std::string name, std::string value);  // replaces one of the same name
  bool has_header(std::string_view name) const;
  void set_chunked_content_provider(std::string type, ContentProvider p, ContentProviderReleaser r = {});
};

const char* reason_phrase(int status);

// The status line and headers (through the blank line). Content-Length when not streamed,
// Transfer-Encoding: chunked when streamed over HTTP/1.1; Connection as `keep_alive` says.
std::string serialize_head(const Response& res, bool chunked, bool keep_alive);

}  // namespace fp4moe::serve::http
