#include "serve/tool_call_parser.hpp"

#include <algorithm>
#include <array>
#include <mutex>
#include <random>
#include <utility>

#include "serve/reasoning_parser.hpp"  // incomplete_utf8_tail

namespace fp4moe::serve {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

constexpr std::string_view kGlmOpen = "<tool_call>";
constexpr std::string_view kGlmClose = "</tool_call>";
constexpr std::string_view kGlmKeyOpen = "<arg_key>";
constexpr std::string_view kGlmKeyClose = "</arg_key>";
constexpr std::string_view kGlmValueOpen = "<arg_value>";
constexpr std::string_view kGlmValueClose = "</arg_value>";
constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";

constexpr int kMaxArgumentDepth = 64;   // nesting of a parsed argument value
constexpr size_t kMaxNameBytes = 256;

ToolCallEvent content_event(std::string text) {
  ToolCallEvent e;
  e.text = std::move(text);
  return e;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// GLM separators: whitespace, and the two characters `\n` that some GLM outputs carry
// literally (SGLang accepts both).
std::string_view skip_glm_separators(std::string_view s) {
  for (;;) {
    if (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    else if (s.starts_with("\\n")) s.remove_prefix(2);
    else return s;
  }
}
std::string_view trim_glm(std::string_view s) {
  s = skip_glm_separators(s);
  for (;;) {
    if (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    else if (s.ends_with("\\n")) s.remove_suffix(2);
    else return s;
  }
}

struct Markers {
  std::string_view open, close;
  std::array<std::string_view, 2> dropped;  // removed from content wherever they appear
  size_t longest;
};

Markers markers_of(ToolCallFormat f) {
  if (f == ToolCallFormat::kGlm45 || f == ToolCallFormat::kGlm47) return {kGlmOpen, kGlmClose, {}, kGlmClose.size()};
  return {kDsCallBegin, kDsCallEnd, {kDsCallsBegin, kDsCallsEnd}, kDsCallsBegin.size()};
}

// The longest proper prefix of any marker that s ends with.
size_t partial_marker_suffix(std::string_view s, const Markers& m) {
  size_t best = 0;
  auto check = [&](std::string_view tag) {
    if (tag.empty()) return;
    for (size_t n = std::min(s.size(), tag.size() - 1); n > best; --n)
      if (s.substr(s.size() - n) == tag.substr(0, n)) {
        best = n;
        break;
      }
  };
  check(m.open);
  for (auto d : m.dropped) check(d);
  return best;
}

// A value parsed as JSON, nesting at most kMaxArgumentDepth; nullopt when it does not parse.
std::optional<ordered_json> parse_json_value(std::string_view text) {
  struct TooDeep {};
  try {
    return ordered_json::parse(text, [](int depth, ordered_json::parse_event_t, ordered_json&) {
      if (depth > kMaxArgumentDepth) throw TooDeep{};
      return true;
    });
  } catch (const ordered_json::exception&) {
    return std::nullopt;
  } catch (const TooDeep&) {
    return std::nullopt;
  }
}

bool valid_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  return std::none_of(name.begin(), name.end(), [](char c) {
    return is_space(c) || c == '<' || c == '>' || static_cast<unsigned char>(c) < 0x20;
  });
}

bool schema_is_string(const json& s) {
  if (!s.is_object()) return false;
  if (auto t = s.find("type"); t != s.end()) {
    if (t->is_string()) return *t == "string";
    if (t->is_array()) {
      bool any_string = false;
      for (const auto& x : *t) {
        if (x != "string") return false;
        any_string = true;
      }
      return any_string;
    }
    return false;
  }
  if (auto c = s.find("const"); c != s.end()) return c->is_string();
  if (auto e = s.find("enum"); e != s.end())
    return e->is_array() && !e->empty() && std::all_of(e->begin(), e->end(), [](const json& x) { return x.is_string(); });
  for (const char* key : {"anyOf", "oneOf"}) {
    auto b = s.find(key);
    if (b == s.end() || !b->is_array()) continue;
    return !b->empty() && std::all_of(b->begin(), b->end(), [](const json& x) { return schema_is_string(x); });
  }
  return false;
}

void dumps(const ordered_json& v, std::string& out) {
  if (v.is_object()) {
    out += '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) out += ", ";
      first = false;
      out += ordered_json(it.key()).dump(-1, ' ', false, ordered_json::error_handler_t::replace);
      out += ": ";
      dumps(it.value(), out);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ", ";
      dumps(v[i], out);
    }
    out += ']';
  } else {
    out += v.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  }
}

// A call's text between its tags, parsed.
struct InnerCall {
  enum class Kind { kValid, kUnknown, kMalformed } kind = Kind::kMalformed;
  int32_t tool = -1;
  std::string name;
  std::string arguments;
};

InnerCall finish_call(const ToolCatalog& tools, std::string_view name, const ordered_json& args) {
  InnerCall c;
  if (!valid_name(name)) return c;
  c.name = std::string(name);
  c.tool = tools.index_of(name);
  c.kind = c.tool < 0 ? InnerCall::Kind::kUnknown : InnerCall::Kind::kValid;
  c.arguments = python_json_dumps(args);
  return c;
}

InnerCall parse_glm(const ToolCatalog& tools, std::string_view inner) {
  const size_t first_key = inner.find(kGlmKeyOpen);
  const std::string_view name = trim_glm(inner.substr(0, first_key));
  if (!valid_name(name)) return {};
  const int32_t tool = tools.index_of(name);
  ordered_json args = ordered_json::object();
  std::string_view rest = first_key == std::string_view::npos ? std::string_view() : inner.substr(first_key);
  for (;;) {
    rest = skip_glm_separators(rest);
    if (rest.empty()) break;
    if (!rest.starts_with(kGlmKeyOpen)) return {};
    rest.remove_prefix(kGlmKeyOpen.size());
    const size_t key_end = rest.find(kGlmKeyClose);
    if (key_end == std::string_view::npos) return {};
    const std::string_view key = trim(rest.substr(0, key_end));
    if (key.empty() || key.find('<') != std::string_view::npos) return {};
    rest = skip_glm_separators(rest.substr(key_end + kGlmKeyClose.size()));
    if (!rest.starts_with(kGlmValueOpen)) return {};
    rest.remove_prefix(kGlmValueOpen.size());
    const size_t value_end = rest.find(kGlmValueClose);
    if (value_end == std::string_view::npos) return {};
    const std::string_view value = rest.substr(0, value_end);
    rest.remove_prefix(value_end + kGlmValueClose.size());
    std::optional<ordered_json> parsed;
    if (tool < 0 || !tools.is_string_param(tool, key)) parsed = parse_json_value(value);
    args[std::string(key)] = parsed ? std::move(*parsed) : ordered_json(std::string(value));
  }
  return finish_call(tools, name, args);
}

InnerCall parse_deepseek(const ToolCatalog& tools, std::string_view inner, bool fenced) {
  const size_t sep = inner.find(kDsSep);
  if (sep == std::string_view::npos) return {};
  std::string_view name, body;
  if (fenced) {  // function<｜tool▁sep｜>NAME\n```json\n{...}\n```
    const std::string_view after = inner.substr(sep + kDsSep.size());
    const size_t nl = after.find('\n');
    if (nl == std::string_view::npos) return {};
    name = trim(after.substr(0, nl));
    body = trim(after.substr(nl + 1));
    if (body.starts_with("```json")) body.remove_prefix(7);
    else if (body.starts_with("```")) body.remove_prefix(3);
    else return {};
    if (!body.ends_with("```")) return {};
    body.remove_suffix(3);
  } else {  // NAME<｜tool▁sep｜>{...}
    name = trim(inner.substr(0, sep));
    body = inner.substr(sep + kDsSep.size());
  }
  body = trim(body);
  std::optional<ordered_json> args = body.empty() ? ordered_json::object() : parse_json_value(body);
  if (!args || !args->is_object()) return {};
  return finish_call(tools, name, *args);
}

}  // namespace

// The flag's names, in --help order: the one table the lookup and the list read.
constexpr std::pair<std::string_view, ToolCallFormat> kToolCallFormats[] = {
    {"glm47", ToolCallFormat::kGlm47}, {"glm45", ToolCallFormat::kGlm45},
    {"deepseekv3", ToolCallFormat::kDeepSeekV3}, {"deepseekv31", ToolCallFormat::kDeepSeekV31}};

std::optional<ToolCallFormat> tool_call_format(std::string_view name) {
  for (const auto& [n, f] : kToolCallFormats)
    if (n == name) return f;
  return std::nullopt;
}

std::vector<std::string> tool_call_format_names() {
  std::vector<std::string> names;
  for (const auto& entry : kToolCallFormats) names.emplace_back(entry.first);
  return names;
}

std::variant<ToolCatalog, FieldError> ToolCatalog::from_json(const json& tools, const std::string& param) {
  if (!tools.is_array()) return FieldError{param, "'" + param + "' must be an array of tools"};
  ToolCatalog c;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = param + "[" + std::to_string(i) + "]";
    const json& t = tools[i];
    if (!t.is_object()) return FieldError{at, "'" + at + "' must be an object"};
    if (auto type = t.find("type"); type != t.end() && *type != "function")
      return FieldError{at + ".type", "'" + at + ".type' must be \"function\""};
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) return FieldError{at + ".function", "'" + at + ".function' must be an object"};
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get_ref<const std::string&>().empty())
      return FieldError{at + ".function.name", "'" + at + ".function.name' must be a non-empty string"};
    Tool tool{name->get<std::string>(), json()};
    if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null()) {
      if (!p->is_object()) return FieldError{at + ".function.parameters", "'" + at + ".function.parameters' must be an object"};
      if (auto props = p->find("properties"); props != p->end() && props->is_object()) tool.properties = *props;
    }
    c.tools_.push_back(std::move(tool));
  }
  return c;
}

int32_t ToolCatalog::index_of(std::string_view name) const {
  for (size_t i = 0; i < tools_.size(); ++i)
    if (tools_[i].name == name) return int32_t(i);
  return -1;
}

bool ToolCatalog::is_string_param(int32_t tool, std::string_view key) const {
  const json& props = tools_[size_t(tool)].properties;
  if (!props.is_object()) return false;
  auto it = props.find(std::string(key));
  return it != props.end() && schema_is_string(*it);
}

std::string random_tool_call_id() {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  uint64_t a, b;
  {
    std::lock_guard<std::mutex> lock(mu);
    a = rng();
    b = rng();
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "call_";
  for (int i = 0; i < 16; ++i) id += kHex[(a >> (4 * i)) & 15];
  for (int i = 0; i < 8; ++i) id += kHex[(b >> (4 * i)) & 15];
  return id;
}

std::string python_json_dumps(const ordered_json& value) {
  std::string out;
  dumps(value, out);
  return out;
}

ToolCallStream::ToolCallStream(ToolCallFormat format, std::shared_ptr<const ToolCatalog> tools, ToolCallIdSource ids)
    : format_(format), tools_(std::move(tools)), ids_(std::move(ids)) {
  if (!tools_) tools_ = std::make_shared<ToolCatalog>();
}

std::vector<ToolCallEvent> ToolCallStream::push(std::string_view delta) {
  std::vector<ToolCallEvent> out;
  std::string text = std::move(carry_);
  text.append(delta);
  const size_t tail = incomplete_utf8_tail(text);
  carry_ = text.substr(text.size() - tail);
  text.resize(text.size() - tail);
  buf_ += text;
  run(out, false);
  return out;
}

std::vector<ToolCallEvent> ToolCallStream::finish() {
  std::vector<ToolCallEvent> out;
  buf_ += carry_;
  carry_.clear();
  run(out, true);
  if (!ws_hold_.empty() && !call_seen_) {  // trailing whitespace of a message without calls
    const std::string ws = std::move(ws_hold_);
    if (!out.empty() && out.back().kind == ToolCallEvent::Kind::kContent) out.back().text += ws;
    else out.push_back(content_event(ws));
  }
  return out;
}

void ToolCallStream::emit_content(std::vector<ToolCallEvent>& out, std::string_view text) {
  size_t body = text.size();
  while (body > 0 && is_space(text[body - 1])) --body;
  if (body == 0) {  // whitespace waits: dropped if a call comes before the end
    ws_hold_.append(text);
    return;
  }
  std::string piece;
  if (!emitted_ && call_seen_) {  // the content's start follows a call: no leading whitespace
    while (!text.empty() && is_space(text.front())) text.remove_prefix(1), --body;
  } else {
    piece = std::move(ws_hold_);
  }
  ws_hold_.clear();
  piece.append(text.substr(0, body));
  ws_hold_.assign(text.substr(body));
  emitted_ = true;
  if (!out.empty() && out.back().kind == ToolCallEvent::Kind::kContent) out.back().text += piece;
  else out.push_back(content_event(std::move(piece)));
}

void ToolCallStream::malformed(std::vector<ToolCallEvent>& out, std::string_view raw) { emit_content(out, raw); }

void ToolCallStream::close_call(std::vector<ToolCallEvent>& out, std::string_view raw, std::string_view inner) {
  InnerCall c;
  switch (format_) {
    case ToolCallFormat::kGlm45:
    case ToolCallFormat::kGlm47: c = parse_glm(*tools_, inner); break;
    case ToolCallFormat::kDeepSeekV3: c = parse_deepseek(*tools_, inner, true); break;
    case ToolCallFormat::kDeepSeekV31: c = parse_deepseek(*tools_, inner, false); break;
  }
  if (c.kind == InnerCall::Kind::kMalformed) return malformed(out, raw);
  if (c.kind == InnerCall::Kind::kUnknown) return;  // dropped, as SGLang does
  const int32_t index = calls_++;
  ToolCallEvent start{ToolCallEvent::Kind::kCallStart, "", index, c.tool, ids_(), c.name};
  out.push_back(std::move(start));
  ToolCallEvent args;
  args.kind = ToolCallEvent::Kind::kArguments;
  args.text = std::move(c.arguments);
  args.index = index;
  out.push_back(std::move(args));
}

void ToolCallStream::run(std::vector<ToolCallEvent>& out, bool final) {
  const Markers m = markers_of(format_);
  for (;;) {
    if (state_ == State::kText) {
      size_t at = std::string::npos;
      std::string_view which;
      auto consider = [&](std::string_view tag) {
        if (tag.empty()) return;
        const size_t p = buf_.find(tag);
        if (p < at) at = p, which = tag;
      };
      consider(m.open);
      for (auto d : m.dropped) consider(d);
      if (at != std::string::npos) {
        emit_content(out, std::string_view(buf_).substr(0, at));
        call_seen_ = true;
        if (which == m.open) {
          call_.assign(buf_, at, std::string::npos);
          call_scanned_ = m.open.size();
          buf_.clear();
          state_ = State::kCall;
        } else {  // a section marker: dropped
          buf_.erase(0, at + which.size());
        }
        continue;
      }
      const size_t keep = final ? 0 : partial_marker_suffix(buf_, m);
      emit_content(out, std::string_view(buf_).substr(0, buf_.size() - keep));
      buf_.erase(0, buf_.size() - keep);
      return;
    }
    // kCall: the call's text is in call_ (new text arrives through buf_).
    call_ += buf_;
    buf_.clear();
    const size_t from = std::max(m.open.size(), call_scanned_ >= m.longest ? call_scanned_ - m.longest + 1 : 0);
    const size_t close = call_.find(m.close, from);
    const size_t reopen = call_.find(m.open, from);
    if (reopen != std::string::npos && (close == std::string::npos || reopen < close)) {
      // A new call opens before this one closed: this one is unterminated.
      buf_.assign(call_, reopen, std::string::npos);
      const std::string raw = call_.substr(0, reopen);
      call_.clear();
      state_ = State::kText;
      malformed(out, raw);
      continue;
    }
    if (close != std::string::npos) {
      const std::string whole = std::move(call_);
      call_.clear();
      buf_.assign(whole, close + m.close.size(), std::string::npos);
      state_ = State::kText;
      const std::string_view w(whole);
      close_call(out, w.substr(0, close + m.close.size()), w.substr(m.open.size(), close - m.open.size()));
      continue;
    }
    call_scanned_ = call_.size();
    if (!final) return;
    const std::string raw = std::move(call_);  // cut off by the end of the text
    call_.clear();
    state_ = State::kText;
    malformed(out, raw);
  }
}

void apply_tool_call_events(ParsedToolCalls& into, const std::vector<ToolCallEvent>& events) {
  for (const auto& e : events) {
    switch (e.kind) {
      case ToolCallEvent::Kind::kContent: into.content += e.text; break;
      case ToolCallEvent::Kind::kCallStart:
        into.calls.push_back({e.index, e.tool_index, e.id, e.name, ""});
        break;
      case ToolCallEvent::Kind::kArguments:
        for (auto& c : into.calls)
          if (c.index == e.index) c.arguments += e.text;
        break;
    }
  }
}

ParsedToolCalls parse_tool_calls(ToolCallFormat format, std::shared_ptr<const ToolCatalog> tools, std::string_view text,
                                 ToolCallIdSource ids) {
  ToolCallStream stream(format, std::move(tools), std::move(ids));
  ParsedToolCalls out;
  apply_tool_call_events(out, stream.push(text));
  apply_tool_call_events(out, stream.finish());
  return out;
}

}  // namespace fp4moe::serve
