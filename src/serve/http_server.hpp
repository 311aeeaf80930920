// cpp-httplib's Server with fp4moe's connection handling: each connection runs on a stream
// that gives the whole request (headers and body) one deadline, so a client that trickles
// bytes (slowloris) is dropped after --http-read-timeout however slowly it sends, and never
// reaches the engine; handlers can ask whether their client is still connected; a response
// can close its connection (when the body was refused unread).
#pragma once

#include <cstddef>

#include <httplib.h>

namespace fp4moe::serve {

struct HttpLimits {
  size_t max_body_bytes = size_t(32) << 20;
  int request_timeout_s = 30;  // the whole request (headers + body) must arrive within this
  int idle_timeout_s = 5;      // wait for the next request on a kept-alive connection
  int write_timeout_s = 30;    // a client that takes no bytes for this long is dropped
  int max_requests_per_connection = 1000;
  int threads = 128;           // connections served at once (streams hold one each); started as needed
};

class HttpServer : public httplib::Server {
 public:
  explicit HttpServer(HttpLimits limits);
  const HttpLimits& limits() const { return limits_; }
  // bind_to_port with a deep accept queue (the library's is 5: a burst of connections beyond
  // it waits for the client's 1 s SYN retry).
  bool bind(const std::string& host, int port);

  // For handlers, on their own thread: whether the client is still connected.
  static bool client_connected();
  // For handlers: close the connection after this response.
  static void close_after_response();

 private:
  bool process_and_close_socket(socket_t sock) override;
  HttpLimits limits_;
};

}  // namespace fp4moe::serve
