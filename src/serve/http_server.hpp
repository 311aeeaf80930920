// fp4moe's HTTP/1.1 server (see README.md, "The HTTP server"): one I/O thread owns every
// connection while its request arrives — accepts, reads heads and bodies non-blocking under
// deadlines, parses them strictly (http/http_parser.hpp), checks the API key before a body is
// read, answers cheap GETs (/health) itself — and hands complete requests to a bounded pool of
// worker threads that run the handlers and write the responses (a stream holds its worker).
// A slow or idle connection therefore costs a few bytes of state, never a thread, and the
// cheap endpoints answer in milliseconds whatever the workers are doing.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "serve/http/message.hpp"

namespace fp4moe::serve {

struct HttpLimits {
  size_t max_body_bytes = size_t(32) << 20;
  int request_timeout_s = 30;  // a request's head and body must arrive within this from its first byte
  int idle_timeout_s = 5;      // a kept-alive connection waits this long for the next request
  int write_timeout_s = 30;    // a client that takes no bytes for this long is dropped
  int max_requests_per_connection = 1000;
  int threads = 128;           // workers: requests handled at once (a stream holds one); started as needed
  int max_waiting = 64;        // complete requests waiting for a worker; beyond, 503
  int max_connections = 4096;  // open at once (lowered to fit RLIMIT_NOFILE); beyond, the oldest unserved one goes
  int max_connections_per_client = 512;  // per IP, not counting those whose request a worker runs
  size_t body_budget_bytes = 0;          // request bodies buffered at once over all connections (0: 8 x max body)
  int drain_close_ms = 2000;   // after a refusal the unread body is read and dropped this long before close
  http::ParserLimits parser;
};

class HttpServer {
 public:
  using Handler = std::function<void(const http::Request&, http::Response&)>;
  // On the I/O thread, after the head and before the body: true refuses the request with `res`
  // (its body is never read and the connection closes).
  using HeadCheck = std::function<bool(const http::Request& head, http::Response& res)>;
  // Fills the body of an error the server produces itself (malformed HTTP, no route, limits).
  using ErrorBody = std::function<void(int status, const std::string& message, http::Response& res)>;
  using Logger = std::function<void(const http::Request&, const http::Response&)>;

  explicit HttpServer(HttpLimits limits);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // on_io_thread: a cheap handler (no blocking, no streaming) that the I/O thread runs itself.
  void Get(const std::string& path, Handler h, bool on_io_thread = false);
  void Post(const std::string& path, Handler h);
  void set_head_check(HeadCheck f);
  void set_error_body(ErrorBody f);
  void set_logger(Logger f);

  bool bind(const std::string& host, int port);  // false with errno set
  int port() const;                              // the bound port (for port 0)
  const HttpLimits& limits() const;

  void run();    // the I/O loop; returns after stop(), every worker joined and every socket closed
  void drain();  // any thread: close idle and half-received connections now; every later response closes its connection
  void stop();   // any thread: abort every connection (blocked writes fail at once) and end run()

  // For handlers on their worker thread: whether the client is still there. A client that
  // half-closed after its request (shutdown(SHUT_WR)) is: HTTP allows it. A non-streamed
  // HTTP/1.1 request whose client sent EOF gets one interim "100 Continue" as a probe; a
  // closed client answers it with a reset, which the next call sees.
  static bool client_connected();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4moe::serve
