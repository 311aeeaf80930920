#include "serve/http_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "serve/http_task_queue.hpp"

namespace fp4moe::serve {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr size_t kReadChunk = 65536;
constexpr auto kEvictAfter = std::chrono::seconds(1);
constexpr size_t kDrainMaxBytes = size_t(64) << 20;
constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";

std::string peer_ip(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&a)->sin_addr, buf, sizeof(buf));
  else if (a.ss_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr, buf, sizeof(buf));
  return buf;
}

int poll_one(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    return r <= 0 ? r : p.revents;
  }
}

struct Conn {
  enum class Phase { kHead, kBody, kWorker, kWrite, kDrain };
  int fd = -1;
  std::string ip;
  Phase phase = Phase::kHead;
  bool idle = true;      // kHead with no byte of the request yet
  bool counted = false;  // in the per-IP count (every phase but kWorker)
  bool close_after = false;
  bool write_failed = false;
  bool dead = false;     // closed; reaped at the end of the loop's iteration
  bool keep_alive = true;
  int served = 0;
  std::string in;        // this request's bytes so far (and any pipelined after them)
  http::HeadParser parser;
  http::Request req;
  size_t head_len = 0, body_len = 0, reserved = 0;
  Clock::time_point deadline, since;
  std::string out;
  size_t out_pos = 0;
  size_t drained = 0;
  // The worker's view (only the worker touches these while phase is kWorker).
  bool probe_sent = false;
  const std::atomic<bool>* stopping = nullptr;
};

thread_local Conn* t_conn = nullptr;

}  // namespace

struct Route {
  HttpServer::Handler handler;
  bool on_io_thread = false;
};

struct HttpServer::Impl {
  explicit Impl(HttpLimits l)
      : limits(l),
        pool(size_t(std::max(l.threads, 1)), std::min<size_t>(size_t(std::max(l.threads, 1)), 8), 30s) {
    if (limits.body_budget_bytes == 0) limits.body_budget_bytes = 8 * limits.max_body_bytes;
    limits.body_budget_bytes = std::max(limits.body_budget_bytes, limits.max_body_bytes);
  }

  HttpLimits limits;
  std::map<std::pair<std::string, std::string>, Route> routes;  // (method, path)
  HeadCheck head_check;
  ErrorBody error_body;
  Logger logger;

  int listen_fd = -1, epoll_fd = -1, wake_fd = -1;
  std::atomic<bool> stop_requested{false}, drain_requested{false}, stopping{false};
  bool drained = false;  // the I/O thread has closed the idle connections
  std::unordered_map<int, std::unique_ptr<Conn>> conns;
  std::vector<int> dead;  // closed this iteration: their fds close (and may be reused) only in reap()
  std::unordered_map<std::string, int> per_ip;
  size_t reserved_total = 0;
  std::mutex returned_mu;
  std::vector<Conn*> returned;
  GrowingThreadPool pool;

  // --- the I/O thread ---
  void loop();
  void accept_all();
  void on_event(Conn& c, uint32_t ev);
  void read_some(Conn& c);
  void process(Conn& c);
  void start_body(Conn& c);
  void dispatch(Conn& c);
  void respond(Conn& c, http::Response& res, bool close);
  void respond_error(Conn& c, int status, const std::string& message, bool close);
  void flush(Conn& c);
  void after_response(Conn& c);
  void close_conn(Conn& c);
  void reap();
  void set_counted(Conn& c, bool on);
  void watch(Conn& c, uint32_t events, int op = EPOLL_CTL_MOD);
  bool evict_oldest(const std::string* ip, Clock::duration min_age);
  void take_returned();
  void sweep(Clock::time_point now);
  void drain_now();
  void wake() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd, &one, sizeof(one));
  }

  // --- workers ---
  void serve(Conn* c, const Route* route);
  // The route's handler; an exception becomes a 500 with the error body.
  http::Response run_handler(const Route& route, const http::Request& req);
};

// ---------------------------------------------------------------------------------------------
// Worker side: blocking writes on a non-blocking socket, under the write timeout.

namespace {

bool write_all(Conn& c, const char* data, size_t n, int timeout_s) {
  size_t off = 0;
  auto last = Clock::now();
  while (off < n) {
    if (c.stopping->load()) return false;
    const ssize_t k = ::send(c.fd, data + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      off += size_t(k);
      last = Clock::now();
      continue;
    }
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (Clock::now() - last > std::chrono::seconds(timeout_s)) return false;
      const int r = poll_one(c.fd, POLLOUT, 100);
      if (r > 0 && (r & (POLLERR | POLLHUP | POLLNVAL))) return false;
      continue;
    }
    return false;
  }
  return true;
}

bool write_all(Conn& c, const std::string& s, int timeout_s) { return write_all(c, s.data(), s.size(), timeout_s); }

class WorkerSink final : public http::DataSink {
 public:
  WorkerSink(Conn& c, bool chunked, int timeout_s) : c_(c), chunked_(chunked), timeout_s_(timeout_s) {}
  bool write(const char* data, size_t size) override {
    if (failed_) return false;
    if (size == 0) return true;  // an empty chunk would end the body
    if (chunked_) {
      std::string frame = fmt::format("{:x}\r\n", size);
      frame.append(data, size);
      frame += "\r\n";
      failed_ = !write_all(c_, frame, timeout_s_);
    } else {
      failed_ = !write_all(c_, data, size, timeout_s_);
    }
    if (!failed_) written += size;
    return !failed_;
  }
  void done() override { finished = true; }
  bool is_writable() override {
    // Writable within the write timeout, no reset, and no EOF: a streaming client that closed
    // its side has left (a stream has no interim response to probe with).
    const auto until = Clock::now() + std::chrono::seconds(timeout_s_);
    for (;;) {
      if (failed_ || c_.stopping->load()) return false;
      const int r = poll_one(c_.fd, POLLOUT | POLLRDHUP, 100);
      if (r < 0 || (r > 0 && (r & (POLLERR | POLLHUP | POLLNVAL)))) return false;
      if (r > 0 && (r & POLLRDHUP)) {
        char ch;
        const ssize_t n = ::recv(c_.fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0) return false;
      }
      if (r > 0 && (r & POLLOUT)) return true;
      if (Clock::now() >= until) return false;
    }
  }
  bool failed() const { return failed_; }
  bool finished = false;
  size_t written = 0;

 private:
  Conn& c_;
  bool chunked_;
  int timeout_s_;
  bool failed_ = false;
};

}  // namespace

http::Response HttpServer::Impl::run_handler(const Route& route, const http::Request& req) {
  http::Response res;
  try {
    route.handler(req, res);
  } catch (const std::exception& e) {
    res = {};
    res.status = 500;
    if (error_body) error_body(500, e.what(), res);
  } catch (...) {
    res = {};
    res.status = 500;
    if (error_body) error_body(500, "internal error", res);
  }
  return res;
}

void HttpServer::Impl::serve(Conn* c, const Route* route) {
  t_conn = c;
  http::Response res = run_handler(*route, c->req);
  bool keep = c->keep_alive && !drain_requested.load();
  bool ok;
  if (!res.provider) {
    std::string out = http::serialize_head(res, false, keep);
    out += res.body;
    ok = write_all(*c, out, limits.write_timeout_s);
  } else {
    const bool chunked = c->req.minor_version == 1;  // HTTP/1.0: the body runs to the close
    if (!chunked) keep = false;
    ok = write_all(*c, http::serialize_head(res, chunked, keep), limits.write_timeout_s);
    WorkerSink sink(*c, chunked, limits.write_timeout_s);
    try {
      while (ok && !sink.finished) {
        if (!res.provider(sink.written, sink) || sink.failed()) ok = false;
      }
    } catch (...) {  // the headers are out: all that is left is to cut the stream short
      ok = false;
    }
    if (ok && chunked) ok = write_all(*c, "0\r\n\r\n", limits.write_timeout_s);
    try {
      if (res.releaser) res.releaser(ok);
    } catch (...) {
      ok = false;
    }
  }
  t_conn = nullptr;
  if (logger) logger(c->req, res);
  c->close_after = !keep;
  c->write_failed = !ok;
  {
    std::lock_guard<std::mutex> lock(returned_mu);
    returned.push_back(c);
  }
  wake();
}

bool HttpServer::client_connected() {
  Conn* c = t_conn;
  if (!c) return true;
  const int r = poll_one(c->fd, POLLIN | POLLRDHUP, 0);
  if (r == 0) return true;
  if (r < 0 || (r & (POLLERR | POLLHUP | POLLNVAL))) return false;
  char ch;
  const ssize_t n = ::recv(c->fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return true;  // a pipelined request: the client is there
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  // EOF: half-closed (still reading) or gone. Probe once with an interim response (HTTP/1.1
  // clients skip 1xx); a closed socket answers it with a reset, seen above next time.
  if (c->req.minor_version == 0 || c->probe_sent) return true;
  c->probe_sent = true;
  return ::send(c->fd, kContinue, sizeof(kContinue) - 1, MSG_NOSIGNAL | MSG_DONTWAIT) > 0;
}

// ---------------------------------------------------------------------------------------------
// The I/O thread.

void HttpServer::Impl::watch(Conn& c, uint32_t events, int op) {
  epoll_event e{};
  e.events = events;
  e.data.fd = c.fd;
  ::epoll_ctl(epoll_fd, op, c.fd, &e);
}

void HttpServer::Impl::set_counted(Conn& c, bool on) {
  if (c.counted == on) return;
  c.counted = on;
  if (on) {
    ++per_ip[c.ip];
  } else if (--per_ip[c.ip] <= 0) {
    per_ip.erase(c.ip);
  }
}

void HttpServer::Impl::close_conn(Conn& c) {
  if (c.dead) return;
  c.dead = true;
  set_counted(c, false);
  reserved_total -= c.reserved;
  c.reserved = 0;
  ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);
  dead.push_back(c.fd);
}

void HttpServer::Impl::reap() {
  for (int fd : dead) {
    ::close(fd);
    conns.erase(fd);
  }
  dead.clear();
}

// Closes the connection (of `ip`, or any) that has waited longest without a worker, if it has
// waited at least min_age: a burst of fresh connections evicts nothing, a slow one goes first.
bool HttpServer::Impl::evict_oldest(const std::string* ip, Clock::duration min_age) {
  Conn* oldest = nullptr;
  for (auto& [fd, p] : conns) {
    Conn& c = *p;
    if (c.dead || c.phase == Conn::Phase::kWorker || (ip && c.ip != *ip)) continue;
    if (!oldest || c.since < oldest->since) oldest = &c;
  }
  if (!oldest || Clock::now() - oldest->since < min_age) return false;
  close_conn(*oldest);
  return true;
}

void HttpServer::Impl::accept_all() {
  for (int i = 0; i < 256; ++i) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or out of descriptors / memory: try again on the next event
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::string ip = peer_ip(addr);
    if (int(conns.size()) >= limits.max_connections && !evict_oldest(nullptr, Clock::duration::zero())) {
      ::close(fd);  // every connection runs a request
      continue;
    }
    // Over the per-client bound, its oldest connection goes if it has waited a second: one
    // client's burst of fresh connections (a benchmark) is not cut, a slow flood evicts itself.
    auto it = per_ip.find(ip);
    if (it != per_ip.end() && it->second >= limits.max_connections_per_client) evict_oldest(&ip, kEvictAfter);
    auto conn = std::make_unique<Conn>();
    Conn& c = *conn;
    c.fd = fd;
    c.ip = std::move(ip);
    c.stopping = &stopping;
    c.parser = http::HeadParser(limits.parser);
    c.since = Clock::now();
    const auto timeout = drain_requested ? std::min(std::chrono::seconds(limits.request_timeout_s), std::chrono::seconds(2))
                                         : std::chrono::seconds(limits.request_timeout_s);
    c.deadline = c.since + timeout;
    conns.emplace(fd, std::move(conn));
    set_counted(c, true);
    watch(c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
  }
}

void HttpServer::Impl::on_event(Conn& c, uint32_t ev) {
  if (c.dead) return;
  switch (c.phase) {
    case Conn::Phase::kWrite:
      if (ev & (EPOLLERR | EPOLLHUP)) return close_conn(c);
      if (ev & EPOLLOUT) flush(c);
      return;
    case Conn::Phase::kDrain: {
      char buf[16384];
      for (int i = 0; i < 8; ++i) {
        const ssize_t n = ::recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) {
          c.drained += size_t(n);
          if (c.drained < kDrainMaxBytes) continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        return close_conn(c);
      }
      return;
    }
    case Conn::Phase::kHead:
    case Conn::Phase::kBody: return read_some(c);
    case Conn::Phase::kWorker: return;
  }
}

void HttpServer::Impl::read_some(Conn& c) {
  for (int i = 0; i < 4; ++i) {
    size_t want = kReadChunk;
    if (c.phase == Conn::Phase::kBody)
      want = c.in.size() >= c.head_len + c.body_len ? 0 : std::min(want, c.head_len + c.body_len - c.in.size());
    if (want == 0) return;
    const size_t old = c.in.size();
    c.in.resize(old + want);
    const ssize_t n = ::recv(c.fd, c.in.data() + old, want, MSG_DONTWAIT);
    c.in.resize(old + size_t(std::max<ssize_t>(n, 0)));
    if (n == 0) return close_conn(c);  // EOF before a whole request: nothing to answer
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      return close_conn(c);
    }
    if (c.idle) {  // the next request's first byte: its whole-request deadline starts
      c.idle = false;
      c.deadline = Clock::now() + std::chrono::seconds(limits.request_timeout_s);
    }
    process(c);
    if (c.dead || (c.phase != Conn::Phase::kHead && c.phase != Conn::Phase::kBody)) return;
    if (size_t(n) < want) return;
  }
}

void HttpServer::Impl::respond_error(Conn& c, int status, const std::string& message, bool close) {
  http::Response res;
  res.status = status;
  if (error_body) error_body(status, message, res);
  else res.set_content(message + "\n", "text/plain");
  respond(c, res, close);
}

void HttpServer::Impl::process(Conn& c) {
  while (!c.dead && (c.phase == Conn::Phase::kHead || c.phase == Conn::Phase::kBody)) {
    if (c.phase == Conn::Phase::kHead) {
      if (c.in.empty()) return;
      const auto r = c.parser.parse(c.in);
      if (r == http::HeadParser::Result::kNeedMore) return;
      if (r == http::HeadParser::Result::kError) {
        c.req = {};  // the logger sees what was parsed: nothing to trust
        return respond_error(c, c.parser.error().status, c.parser.error().message, true);
      }
      start_body(c);
      continue;
    }
    if (c.in.size() < c.head_len + c.body_len) return;
    c.req.body.assign(c.in, c.head_len, c.body_len);
    c.in.erase(0, c.head_len + c.body_len);
    c.head_len = c.body_len = 0;  // consumed
    dispatch(c);
    return;  // dispatch answered (inline) or handed the connection to a worker
  }
}

void HttpServer::Impl::start_body(Conn& c) {
  http::RequestHead& h = c.parser.head();
  c.head_len = c.parser.head_bytes();
  c.req = {};
  c.req.method = std::move(h.method);
  c.req.target = std::move(h.target);
  c.req.path = std::move(h.path);
  c.req.query = std::move(h.query);
  c.req.minor_version = h.minor_version;
  c.req.headers = std::move(h.headers);
  c.req.remote_ip = c.ip;
  c.keep_alive = h.keep_alive && c.served + 1 < limits.max_requests_per_connection;
  c.body_len = h.has_content_length ? size_t(h.content_length) : 0;
  const bool wants_body = c.req.method == "POST" || c.req.method == "PUT" || c.req.method == "PATCH";
  c.phase = Conn::Phase::kBody;
  if (wants_body && !h.has_content_length)
    return respond_error(c, 411, "send the body with a Content-Length (chunked bodies are not accepted)", true);
  if (h.content_length > limits.max_body_bytes)
    return respond_error(c, 413, fmt::format("the request body ({} bytes) exceeds the limit of {} bytes", h.content_length,
                                             limits.max_body_bytes), true);
  if (head_check) {
    http::Response res;
    if (head_check(c.req, res)) return respond(c, res, true);
  }
  if (!routes.count({c.req.method, c.req.path}))
    return respond_error(c, 404, fmt::format("Invalid URL ({} {})", c.req.method, c.req.path), c.body_len > 0);
  if (reserved_total + c.body_len > limits.body_budget_bytes)
    return respond_error(c, 503, "the server is receiving too many request bodies at once; retry later", true);
  c.reserved = c.body_len;
  reserved_total += c.body_len;
  if (h.expect_continue && c.in.size() < c.head_len + c.body_len)
    [[maybe_unused]] ssize_t n = ::send(c.fd, kContinue, sizeof(kContinue) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void HttpServer::Impl::dispatch(Conn& c) {
  const Route& route = routes.at({c.req.method, c.req.path});
  if (route.on_io_thread) {
    http::Response res = run_handler(route, c.req);
    return respond(c, res, !c.keep_alive);
  }
  c.phase = Conn::Phase::kWorker;
  c.probe_sent = false;
  set_counted(c, false);
  ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);
  Conn* p = &c;
  const Route* r = &route;
  if (pool.try_enqueue([this, p, r] { serve(p, r); }, size_t(std::max(limits.max_waiting, 0)))) return;
  c.phase = Conn::Phase::kBody;
  set_counted(c, true);
  watch(c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
  respond_error(c, 503, "the server is busy (every worker is taken and the wait queue is full); retry later", true);
}

void HttpServer::Impl::respond(Conn& c, http::Response& res, bool close) {
  // Responses the I/O thread writes are whole (no streaming): routes on it must not stream.
  close = close || !c.keep_alive || drain_requested.load();
  if (c.phase == Conn::Phase::kBody) {  // answered from the head: the request's bytes are still in `in`
    if (c.body_len == 0) c.in.erase(0, c.head_len);
    else close = true;  // its body is unread
  }
  if (res.provider) {
    res = {};
    res.status = 500;
    if (error_body) error_body(500, "a streamed response on the I/O thread", res);
  }
  if (logger) logger(c.req, res);
  c.out = http::serialize_head(res, false, !close);
  c.out += res.body;
  c.out_pos = 0;
  c.close_after = close;
  c.phase = Conn::Phase::kWrite;
  c.deadline = Clock::now() + std::chrono::seconds(limits.write_timeout_s);
  c.since = Clock::now();
  flush(c);
}

void HttpServer::Impl::flush(Conn& c) {
  while (c.out_pos < c.out.size()) {
    const ssize_t n = ::send(c.fd, c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out_pos += size_t(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      watch(c, EPOLLOUT);
      return;
    }
    return close_conn(c);
  }
  c.out.clear();
  c.out.shrink_to_fit();
  after_response(c);
}

// A response is out (from the I/O thread, or a worker's returned connection).
void HttpServer::Impl::after_response(Conn& c) {
  ++c.served;
  reserved_total -= c.reserved;
  c.reserved = 0;
  c.req = {};
  c.since = Clock::now();
  if (c.close_after || drain_requested.load()) {
    // Stop sending, then read and drop what the client still sends (a refused body) for a
    // while, so that it sees the response rather than a reset.
    ::shutdown(c.fd, SHUT_WR);
    c.in.clear();
    c.in.shrink_to_fit();
    c.phase = Conn::Phase::kDrain;
    c.deadline = Clock::now() + std::chrono::milliseconds(limits.drain_close_ms);
    watch(c, EPOLLIN | EPOLLRDHUP);
    return;
  }
  c.phase = Conn::Phase::kHead;
  c.parser.reset();
  c.idle = c.in.empty();
  c.deadline = Clock::now() + std::chrono::seconds(c.idle ? limits.idle_timeout_s : limits.request_timeout_s);
  watch(c, EPOLLIN | EPOLLRDHUP);
  if (!c.in.empty()) process(c);  // a pipelined request
}

void HttpServer::Impl::take_returned() {
  std::vector<Conn*> back;
  {
    std::lock_guard<std::mutex> lock(returned_mu);
    back.swap(returned);
  }
  for (Conn* c : back) {
    c->phase = Conn::Phase::kWrite;  // its response is written
    set_counted(*c, true);
    if (c->write_failed) {
      close_conn(*c);  // the client is gone (or the server stopping): nothing to linger for
      continue;
    }
    watch(*c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
    after_response(*c);
  }
}

void HttpServer::Impl::sweep(Clock::time_point now) {
  std::vector<Conn*> late;
  for (auto& [fd, c] : conns)
    if (!c->dead && c->phase != Conn::Phase::kWorker && now >= c->deadline) late.push_back(c.get());
  for (Conn* c : late) close_conn(*c);
}

void HttpServer::Impl::drain_now() {
  drained = true;
  std::vector<Conn*> waiting;
  for (auto& [fd, c] : conns)
    if (!c->dead && (c->phase == Conn::Phase::kHead || c->phase == Conn::Phase::kBody)) waiting.push_back(c.get());
  for (Conn* c : waiting) close_conn(*c);
}

void HttpServer::Impl::loop() {
  std::vector<epoll_event> events(256);
  auto last_sweep = Clock::now();
  while (!stop_requested.load()) {
    const int n = ::epoll_wait(epoll_fd, events.data(), int(events.size()), 50);
    for (int i = 0; i < n; ++i) {
      const int fd = events[size_t(i)].data.fd;
      if (fd == listen_fd) {
        accept_all();
      } else if (fd == wake_fd) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(wake_fd, &v, sizeof(v));
      } else if (auto it = conns.find(fd); it != conns.end()) {
        on_event(*it->second, events[size_t(i)].events);
      }
    }
    take_returned();
    if (drain_requested.load() && !drained) drain_now();
    const auto now = Clock::now();
    if (now - last_sweep >= 50ms) {
      sweep(now);
      last_sweep = now;
    }
    reap();
  }
  // Stop: no new connections; every socket shut down so that workers blocked on one return.
  stopping = true;
  ::close(listen_fd);
  listen_fd = -1;
  for (auto& [fd, c] : conns) ::shutdown(fd, SHUT_RDWR);
  pool.shutdown();  // handlers end: their writes fail, and the engine aborts what they wait for
  {
    std::lock_guard<std::mutex> lock(returned_mu);
    returned.clear();
  }
  for (auto& [fd, c] : conns) close_conn(*c);
  reap();
}

// ---------------------------------------------------------------------------------------------

HttpServer::HttpServer(HttpLimits limits) : impl_(std::make_unique<Impl>(limits)) {}

HttpServer::~HttpServer() {
  if (impl_->listen_fd >= 0) ::close(impl_->listen_fd);
  if (impl_->epoll_fd >= 0) ::close(impl_->epoll_fd);
  if (impl_->wake_fd >= 0) ::close(impl_->wake_fd);
}

void HttpServer::Get(const std::string& path, Handler h, bool on_io_thread) {
  impl_->routes[{"GET", path}] = Route{std::move(h), on_io_thread};
}
void HttpServer::Post(const std::string& path, Handler h) { impl_->routes[{"POST", path}] = Route{std::move(h), false}; }
void HttpServer::set_head_check(HeadCheck f) { impl_->head_check = std::move(f); }
void HttpServer::set_error_body(ErrorBody f) { impl_->error_body = std::move(f); }
void HttpServer::set_logger(Logger f) { impl_->logger = std::move(f); }
const HttpLimits& HttpServer::limits() const { return impl_->limits; }

bool HttpServer::bind(const std::string& host, int port) {
  // Connections are descriptors: fit the limit to what the process may open.
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    if (rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &rl);
      ::getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur != RLIM_INFINITY)
      impl_->limits.max_connections = int(std::clamp<int64_t>(int64_t(rl.rlim_cur) - 256, 16, impl_->limits.max_connections));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) {
    errno = EADDRNOTAVAIL;
    return false;
  }
  int fd = -1;
  for (addrinfo* a = res; a; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) break;
    const int saved = errno;
    ::close(fd);
    fd = -1;
    errno = saved;
  }
  ::freeaddrinfo(res);
  if (fd < 0) return false;
  impl_->listen_fd = fd;
  impl_->epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  impl_->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  for (int w : {fd, impl_->wake_fd}) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.fd = w;
    ::epoll_ctl(impl_->epoll_fd, EPOLL_CTL_ADD, w, &e);
  }
  return true;
}

int HttpServer::port() const {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (impl_->listen_fd < 0 || ::getsockname(impl_->listen_fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return -1;
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
  return -1;
}

void HttpServer::run() {
  if (impl_->listen_fd < 0) return;
  impl_->loop();
}

void HttpServer::drain() {
  impl_->drain_requested = true;
  if (impl_->wake_fd >= 0) impl_->wake();
}

void HttpServer::stop() {
  impl_->stop_requested = true;
  if (impl_->wake_fd >= 0) impl_->wake();
}

}  // namespace fp4moe::serve
