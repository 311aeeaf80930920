#include "serve/http/http_parser.hpp"

#include <cstring>

namespace fp4moe::serve::http {
namespace {

char lower(char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; }

// RFC 9110 tchar.
bool is_tchar(unsigned char c) {
  if (c >= '0' && c <= '9') return true;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
  return c != 0 && std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s)
    if (!is_tchar(c)) return false;
  return true;
}

// field-vchar / SP / HTAB (obs-text allowed, no other control byte and no DEL).
bool is_field_char(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Calls f(token) for each comma-separated element (trimmed, empty ones skipped).
template <class F>
void for_each_element(std::string_view list, F&& f) {
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view item = trim_ows(list.substr(0, comma));
    if (!item.empty()) f(item);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
}

}  // namespace

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

const std::string* RequestHead::find(std::string_view name) const {
  for (const Header& h : headers)
    if (iequals(h.name, name)) return &h.value;
  return nullptr;
}

HeadParser::Result HeadParser::fail(int status, std::string message) {
  error_ = {status, std::move(message)};
  return result_ = Result::kError;
}

HeadParser::Result HeadParser::parse(std::string_view buf) {
  if (result_ != Result::kNeedMore) return result_;
  for (;;) {
    const size_t from = std::max(pos_, scanned_);
    const void* lf = from < buf.size() ? std::memchr(buf.data() + from, '\n', buf.size() - from) : nullptr;
    if (!lf) {
      scanned_ = buf.size();
      const size_t pending = buf.size() - pos_;
      if (!have_request_line_ && pending >= limits_.max_request_line)
        return fail(414, "the request line is longer than " + std::to_string(limits_.max_request_line) + " bytes");
      if (have_request_line_ && buf.size() - headers_start_ > limits_.max_header_bytes)
        return fail(431, "the request headers are larger than " + std::to_string(limits_.max_header_bytes) + " bytes");
      return result_;
    }
    const size_t end = size_t(static_cast<const char*>(lf) - buf.data());  // the LF
    scanned_ = end + 1;
    if (!have_request_line_ && end + 1 > limits_.max_request_line)
      return fail(414, "the request line is longer than " + std::to_string(limits_.max_request_line) + " bytes");
    if (have_request_line_ && end + 1 - headers_start_ > limits_.max_header_bytes)
      return fail(431, "the request headers are larger than " + std::to_string(limits_.max_header_bytes) + " bytes");
    if (end == pos_ || buf[end - 1] != '\r') return fail(400, "a line does not end in CRLF");
    const std::string_view line = buf.substr(pos_, end - 1 - pos_);
    if (line.find('\r') != std::string_view::npos) return fail(400, "a bare CR in the request head");
    pos_ = end + 1;
    if (!have_request_line_) {
      if (!request_line(line)) return result_;
      have_request_line_ = true;
      headers_start_ = pos_;
      continue;
    }
    if (line.empty()) return finish() ? result_ = Result::kDone : result_;
    if (!header_line(line)) return result_;
  }
}

bool HeadParser::request_line(std::string_view line) {
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    fail(400, "malformed request line");
    return false;
  }
  const std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1),
                         version = line.substr(sp2 + 1);
  if (!is_token(method)) {
    fail(400, "malformed request method");
    return false;
  }
  if (target.empty() || target[0] != '/') {
    fail(400, "the request target must be a path (origin-form)");
    return false;
  }
  for (unsigned char c : target)
    if (c <= 0x20 || c >= 0x7f || c == '#') {
      fail(400, "the request target holds a byte outside the URI grammar");
      return false;
    }
  if (version.size() == 8 && version.substr(0, 5) == "HTTP/" && version[6] == '.' && version[5] >= '0' &&
      version[5] <= '9' && version[7] >= '0' && version[7] <= '9') {
    if (version[5] != '1' || (version[7] != '0' && version[7] != '1')) {
      fail(505, "only HTTP/1.0 and HTTP/1.1 are served");
      return false;
    }
  } else {
    fail(400, "malformed HTTP version");
    return false;
  }
  head_.method = method;
  head_.target = target;
  const size_t q = target.find('?');
  head_.path = target.substr(0, q);
  head_.query = q == std::string_view::npos ? std::string_view() : target.substr(q + 1);
  head_.minor_version = version[7] - '0';
  head_.keep_alive = head_.minor_version == 1;
  return true;
}

bool HeadParser::header_line(std::string_view line) {
  if (line[0] == ' ' || line[0] == '\t') {
    fail(400, "folded header lines (obs-fold) are not accepted");
    return false;
  }
  if (head_.headers.size() >= limits_.max_headers) {
    fail(431, "more than " + std::to_string(limits_.max_headers) + " request headers");
    return false;
  }
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos || !is_token(line.substr(0, colon))) {
    fail(400, "malformed header line");
    return false;
  }
  const std::string_view value = trim_ows(line.substr(colon + 1));
  for (unsigned char c : value)
    if (!is_field_char(c)) {
      fail(400, "a control byte in a header value");
      return false;
    }
  head_.headers.push_back({std::string(line.substr(0, colon)), std::string(value)});
  return true;
}

bool HeadParser::finish() {
  int hosts = 0, lengths = 0;
  bool transfer_encoding = false, chunked_last = false;
  for (const Header& h : head_.headers) {
    if (iequals(h.name, "host")) {
      ++hosts;
    } else if (iequals(h.name, "content-length")) {
      if (++lengths > 1) {
        fail(400, "more than one Content-Length header");
        return false;
      }
      if (h.value.empty() || h.value.size() > 18 || h.value.find_first_not_of("0123456789") != std::string::npos) {
        fail(400, "malformed Content-Length");
        return false;
      }
      head_.content_length = std::stoull(h.value);
      head_.has_content_length = true;
    } else if (iequals(h.name, "transfer-encoding")) {
      transfer_encoding = true;
      for_each_element(h.value, [&](std::string_view c) { chunked_last = iequals(c, "chunked"); });
    } else if (iequals(h.name, "connection")) {
      for_each_element(h.value, [&](std::string_view c) {
        if (iequals(c, "close")) head_.keep_alive = false;
        else if (iequals(c, "keep-alive") && head_.minor_version == 0) head_.keep_alive = true;
      });
    } else if (iequals(h.name, "expect")) {
      if (!iequals(h.value, "100-continue")) {
        fail(417, "only 'Expect: 100-continue' is understood");
        return false;
      }
      head_.expect_continue = head_.minor_version == 1;
    }
  }
  if (hosts > 1 || (hosts == 0 && head_.minor_version == 1)) {
    fail(400, hosts ? "more than one Host header" : "an HTTP/1.1 request needs a Host header");
    return false;
  }
  if (transfer_encoding) {
    if (lengths) fail(400, "both Transfer-Encoding and Content-Length");
    else if (chunked_last) fail(411, "send the body with a Content-Length (chunked bodies are not accepted)");
    else fail(501, "unsupported Transfer-Encoding");
    return false;
  }
  // A 1.0 keep-alive connection needs the response's length: every non-streamed one has it.
  return true;
}

}  // namespace fp4moe::serve::http
