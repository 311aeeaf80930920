#include "serve/http_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "serve/http_task_queue.hpp"

namespace fp4moe::serve {
namespace {

using Clock = std::chrono::steady_clock;

int poll_one(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    return r <= 0 ? r : p.revents;
  }
}

void address(const sockaddr_storage& a, std::string& ip, int& port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof(buf));
    port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof(buf));
    port = ntohs(v6->sin6_port);
  }
  ip = buf;
}

// One connection's stream: buffered reads under the request's deadline, writes under the
// write timeout, and a liveness probe.
class ConnectionStream : public httplib::Stream {
 public:
  ConnectionStream(int fd, const HttpLimits& limits) : fd_(fd), limits_(limits) {}

  void start_request() { deadline_ = Clock::now() + std::chrono::seconds(limits_.request_timeout_s); }
  bool close_after = false;

  // Waits for the first byte of the next request (idle keep-alive), giving up when the
  // server stops.
  bool wait_next_request(const std::atomic<socket_t>& server_socket) {
    if (pos_ < len_) return true;
    const auto until = Clock::now() + std::chrono::seconds(limits_.idle_timeout_s);
    while (server_socket != INVALID_SOCKET && Clock::now() < until) {
      const int r = poll_one(fd_, POLLIN, 100);
      if (r < 0) return false;
      if (r > 0) return (r & POLLIN) != 0;
    }
    return false;
  }

  bool peer_alive() const {
    if (pos_ < len_) return true;  // a pipelined request is waiting: the client is there
    const int r = poll_one(fd_, POLLIN, 0);
    if (r == 0) return true;
    if (r < 0 || (r & (POLLERR | POLLNVAL))) return false;
    char c;
    const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
  }

  bool is_readable() const override {
    if (pos_ < len_) return true;
    const int r = poll_one(fd_, POLLIN, remaining_ms());
    return r > 0 && (r & POLLIN);
  }
  bool is_writable() const override {
    const int r = poll_one(fd_, POLLOUT, limits_.write_timeout_s * 1000);
    return r > 0 && (r & POLLOUT) && !(r & (POLLERR | POLLHUP)) && peer_alive();
  }
  ssize_t read(char* ptr, size_t size) override {
    if (pos_ >= len_) {
      const int wait = remaining_ms();
      if (wait <= 0) return -1;  // the request's time is up
      const int r = poll_one(fd_, POLLIN, wait);
      if (r <= 0) return -1;
      const ssize_t n = ::recv(fd_, buf_, sizeof(buf_), 0);
      if (n <= 0) return n;
      pos_ = 0;
      len_ = size_t(n);
    }
    const size_t n = std::min(size, len_ - pos_);
    std::memcpy(ptr, buf_ + pos_, n);
    pos_ += n;
    return ssize_t(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    for (;;) {
      const int r = poll_one(fd_, POLLOUT, limits_.write_timeout_s * 1000);
      if (r <= 0 || !(r & POLLOUT)) return -1;
      const ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      return n;
    }
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) address(a, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) address(a, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  int remaining_ms() const {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
    return int(std::clamp<int64_t>(left, 0, 1 << 30));
  }

  int fd_;
  const HttpLimits& limits_;
  Clock::time_point deadline_ = Clock::now();
  char buf_[16384];
  size_t pos_ = 0, len_ = 0;
};

thread_local ConnectionStream* t_connection = nullptr;

}  // namespace

HttpServer::HttpServer(HttpLimits limits) : limits_(limits) {
  set_payload_max_length(limits_.max_body_bytes);
  set_read_timeout(limits_.request_timeout_s, 0);
  set_write_timeout(limits_.write_timeout_s, 0);
  set_keep_alive_timeout(limits_.idle_timeout_s);
  // Threads start as connections need them (http_task_queue.hpp says why not all at once).
  const size_t threads = size_t(std::max(limits_.threads, 1));
  new_task_queue = [threads] { return new GrowingThreadPool(threads, std::min<size_t>(threads, 8), std::chrono::seconds(30)); };
  // A refused request (its body unread) closes its connection: say so in the headers.
  set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
    if (t_connection && t_connection->close_after) {
      res.headers.erase("Keep-Alive");
      if (!res.has_header("Connection")) res.set_header("Connection", "close");
    }
  });
}

bool HttpServer::bind(const std::string& host, int port) {
  if (!bind_to_port(host, port)) return false;
  return ::listen(svr_sock_, SOMAXCONN) == 0;  // a second listen() resizes the queue
}

bool HttpServer::client_connected() { return !t_connection || t_connection->peer_alive(); }

void HttpServer::close_after_response() {
  if (t_connection) t_connection->close_after = true;
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  const int one = 1;  // headers and body go out in separate writes: no Nagle delay between them
  ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ConnectionStream stream(sock, limits_);
  t_connection = &stream;
  bool ok = false;
  for (int left = limits_.max_requests_per_connection; left > 0 && svr_sock_ != INVALID_SOCKET; --left) {
    if (!stream.wait_next_request(svr_sock_)) break;
    stream.start_request();
    bool closed = false;
    ok = process_request(stream, left == 1 || svr_sock_ == INVALID_SOCKET, closed, nullptr);
    if (!ok || closed || stream.close_after) break;
  }
  t_connection = nullptr;
  if (stream.close_after) {
    // The refused body may still be arriving: stop sending, then read and drop it for a while
    // before closing, so the client sees the response rather than a reset.
    ::shutdown(sock, SHUT_WR);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    char sink[16384];
    size_t drained = 0;
    while (drained < (size_t(64) << 20) && std::chrono::steady_clock::now() < until) {
      if (poll_one(sock, POLLIN, 100) <= 0) continue;
      const ssize_t n = ::recv(sock, sink, sizeof(sink), 0);
      if (n <= 0) break;
      drained += size_t(n);
    }
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

}  // namespace fp4moe::serve
