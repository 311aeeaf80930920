#include "serve/http/message.hpp"

namespace fp4moe::serve::http {

bool Request::has_header(std::string_view name) const {
  for (const Header& h : headers)
    if (iequals(h.name, name)) return true;
  return false;
}

std::string Request::get_header_value(std::string_view name) const {
  for (const Header& h : headers)
    if (iequals(h.name, name)) return h.value;
  return {};
}

void Response::set_content(std::string content, std::string type) {
  body = std::move(content);
  content_type = std::move(type);
}

void Response::set_header(std::string name, std::string value) {
  for (Header& h : headers)
    if (iequals(h.name, name)) {
      h.value = std::move(value);
      return;
    }
  headers.push_back({std::move(name), std::move(value)});
}

bool Response::has_header(std::string_view name) const {
  for (const Header& h : headers)
    if (iequals(h.name, name)) return true;
  return false;
}

void Response::set_chunked_content_provider(std::string type, ContentProvider p, ContentProviderReleaser r) {
  content_type = std::move(type);
  provider = std::move(p);
  releaser = std::move(r);
}

const char* reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

std::string serialize_head(const Response& res, bool chunked, bool keep_alive) {
  std::string out = "HTTP/1.1 " + std::to_string(res.status) + " " + reason_phrase(res.status) + "\r\n";
  for (const Header& h : res.headers) {
    if (iequals(h.name, "content-length") || iequals(h.name, "transfer-encoding") || iequals(h.name, "connection"))
      continue;  // the server's to set
    out += h.name + ": " + h.value + "\r\n";
  }
  if (!res.content_type.empty() && !res.has_header("content-type")) out += "Content-Type: " + res.content_type + "\r\n";
  if (chunked) out += "Transfer-Encoding: chunked\r\n";
  else if (!res.provider) out += "Content-Length: " + std::to_string(res.body.size()) + "\r\n";
  out += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return out;
}

}  // namespace fp4moe::serve::http
