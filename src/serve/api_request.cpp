#include "serve/api_request.hpp"

#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace fp4moe::serve {
namespace {

using nlohmann::json;

// Thrown inside the parsers, returned as a value at their edge.
struct Invalid {
  ApiError error;
};

[[noreturn]] void invalid(std::string param, std::string message) {
  ApiError e;
  e.message = std::move(message);
  e.param = std::move(param);
  throw Invalid{std::move(e)};
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a float";
    default: return "an integer";
  }
}

// Field readers: a missing or null field is "not given".
class Fields {
 public:
  Fields(const json& obj, std::string prefix) : obj_(obj), prefix_(std::move(prefix)) {}

  const json* get(const char* key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  std::string name(const char* key) const { return prefix_ + key; }

  std::optional<double> number(const char* key, double lo, double hi, bool lo_open = false) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) invalid(name(key), fmt::format("'{}' must be a number, not {}", name(key), type_name(*v)));
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
      invalid(name(key), fmt::format("'{}' must be in {}{}, {}], got {}", name(key), lo_open ? "(" : "[", lo, hi, x));
    return x;
  }
  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    return as_integer(*v, name(key), lo, hi);
  }
  std::optional<bool> boolean(const char* key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) invalid(name(key), fmt::format("'{}' must be a boolean, not {}", name(key), type_name(*v)));
    return v->get<bool>();
  }
  std::optional<std::string> string(const char* key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) invalid(name(key), fmt::format("'{}' must be a string, not {}", name(key), type_name(*v)));
    return v->get<std::string>();
  }

  static int64_t as_integer(const json& v, const std::string& name, int64_t lo, int64_t hi) {
    int64_t x = 0;
    if (v.is_number_integer() && !v.is_number_unsigned()) {
      x = v.get<int64_t>();
    } else if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > uint64_t(std::numeric_limits<int64_t>::max()))
        invalid(name, fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, u));
      x = int64_t(u);
    } else {
      invalid(name, fmt::format("'{}' must be an integer, not {}", name, type_name(v)));
    }
    if (x < lo || x > hi) invalid(name, fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, x));
    return x;
  }

 private:
  const json& obj_;
  std::string prefix_;
};

std::vector<int32_t> token_ids(const json& v, const std::string& name) {
  if (!v.is_array()) invalid(name, fmt::format("'{}' must be an array of token ids, not {}", name, type_name(v)));
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const json& t : v)
    ids.push_back(int32_t(Fields::as_integer(t, name, 0, std::numeric_limits<int32_t>::max())));
  return ids;
}

// A prompt: string | [string] | [int] | [[int]] (OpenAI's four forms).
std::vector<PromptInput> prompts(const json& v, const std::string& name) {
  std::vector<PromptInput> out;
  auto text = [&](const json& s) {
    PromptInput p;
    p.text = s.get<std::string>();
    if (p.text.empty()) invalid(name, fmt::format("'{}' is empty", name));
    out.push_back(std::move(p));
  };
  auto ids = [&](const json& a) {
    PromptInput p;
    p.is_ids = true;
    p.ids = token_ids(a, name);
    if (p.ids.empty()) invalid(name, fmt::format("'{}' has an empty list of token ids", name));
    out.push_back(std::move(p));
  };
  if (v.is_string()) {
    text(v);
  } else if (v.is_array()) {
    if (v.empty()) invalid(name, fmt::format("'{}' is an empty array", name));
    if (v[0].is_number()) {
      ids(v);
    } else {
      for (const json& e : v) {
        if (e.is_string())
          text(e);
        else if (e.is_array())
          ids(e);
        else
          invalid(name, fmt::format("'{}' must hold strings or arrays of token ids, not {}", name, type_name(e)));
      }
    }
  } else {
    invalid(name, fmt::format("'{}' must be a string, an array of strings or of token ids, not {}", name, type_name(v)));
  }
  if (int32_t(out.size()) > kMaxChoices) invalid(name, fmt::format("at most {} prompts per request", kMaxChoices));
  return out;
}

std::vector<std::string> stops(const Fields& f, const char* key) {
  const json* v = f.get(key);
  std::vector<std::string> out;
  if (!v) return out;
  auto add = [&](const json& s) {
    if (!s.is_string()) invalid(f.name(key), fmt::format("'{}' must hold strings, not {}", f.name(key), type_name(s)));
    std::string x = s.get<std::string>();
    if (x.empty()) invalid(f.name(key), fmt::format("'{}' holds an empty string", f.name(key)));
    if (int32_t(x.size()) > kMaxStopBytes)
      invalid(f.name(key), fmt::format("'{}' strings are limited to {} bytes", f.name(key), kMaxStopBytes));
    out.push_back(std::move(x));
  };
  if (v->is_string()) {
    add(*v);
  } else if (v->is_array()) {
    if (int32_t(v->size()) > kMaxStops) invalid(f.name(key), fmt::format("at most {} stop sequences", kMaxStops));
    for (const json& s : *v) add(s);
  } else {
    invalid(f.name(key), fmt::format("'{}' must be a string or an array of strings, not {}", f.name(key), type_name(*v)));
  }
  return out;
}

// The sampling fields shared by every endpoint (OpenAI names; /generate reads them from sampling_params).
void sampling_fields(const Fields& f, ApiRequest& r) {
  engine::SamplingParams& s = r.sampling;
  if (auto x = f.number("temperature", 0.0, 2.0)) s.temperature = float(*x);
  if (auto x = f.number("top_p", 0.0, 1.0, true)) s.top_p = float(*x);
  if (auto x = f.integer("top_k", -1, std::numeric_limits<int32_t>::max())) s.top_k = *x <= 0 ? -1 : int32_t(*x);
  if (auto x = f.number("min_p", 0.0, 1.0)) s.min_p = float(*x);
  if (auto x = f.number("presence_penalty", -2.0, 2.0)) s.presence_penalty = float(*x);
  if (auto x = f.number("frequency_penalty", -2.0, 2.0)) s.frequency_penalty = float(*x);
  if (auto x = f.number("repetition_penalty", 0.0, 2.0, true)) s.repetition_penalty = float(*x);
  for (const char* key : {"seed", "sampling_seed"})
    if (auto x = f.integer(key, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
      s.seed = uint64_t(*x);
      s.has_seed = true;
    }
  r.stop = stops(f, "stop");
  if (const json* v = f.get("stop_token_ids")) {
    r.stop_ids = token_ids(*v, f.name("stop_token_ids"));
    if (int32_t(r.stop_ids.size()) > 64) invalid(f.name("stop_token_ids"), "at most 64 stop token ids");
  }
  if (auto x = f.boolean("ignore_eos")) r.ignore_eos = *x;
  if (auto x = f.boolean("skip_special_tokens")) r.skip_special_tokens = *x;
  if (auto x = f.integer("n", 1, kMaxChoices)) r.n = int32_t(*x);
}

json chat_messages(const json* v) {
  if (!v) invalid("messages", "'messages' is required");
  if (!v->is_array()) invalid("messages", fmt::format("'messages' must be an array, not {}", type_name(*v)));
  if (v->empty()) invalid("messages", "'messages' is empty");
  json out = json::array();
  for (size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) invalid(where, fmt::format("'{}' must be an object, not {}", where, type_name(m)));
    Fields f(m, where + ".");
    const auto role = f.string("role");
    if (!role) invalid(where + ".role", fmt::format("'{}.role' is required", where));
    if (*role != "system" && *role != "user" && *role != "assistant" && *role != "tool" && *role != "developer")
      invalid(where + ".role", fmt::format("'{}.role' must be system, user, assistant, tool or developer, not '{}'", where,
                                           *role));
    std::string content;
    const json* c = f.get("content");
    if (!c) {
      if (*role != "assistant") invalid(where + ".content", fmt::format("'{}.content' is required", where));
    } else if (c->is_string()) {
      content = c->get<std::string>();
    } else if (c->is_array()) {
      for (size_t k = 0; k < c->size(); ++k) {
        const json& part = (*c)[k];
        const std::string pw = fmt::format("{}.content[{}]", where, k);
        if (!part.is_object()) invalid(pw, fmt::format("'{}' must be an object, not {}", pw, type_name(part)));
        Fields pf(part, pw + ".");
        const auto type = pf.string("type");
        if (type != "text") invalid(pw + ".type", fmt::format("'{}.type' must be 'text' (only text is supported)", pw));
        const auto text = pf.string("text");
        if (!text) invalid(pw + ".text", fmt::format("'{}.text' is required", pw));
        content += *text;
      }
    } else {
      invalid(where + ".content", fmt::format("'{}.content' must be a string or an array of parts, not {}", where,
                                              type_name(*c)));
    }
    out.push_back({{"role", *role}, {"content", std::move(content)}});
  }
  return out;
}

ApiRequest parse(ApiKind kind, const json& body) {
  if (!body.is_object()) invalid("", fmt::format("the request body must be a JSON object, not {}", type_name(body)));
  ApiRequest r;
  r.kind = kind;
  Fields f(body, "");
  if (kind == ApiKind::kGenerate) {
    const json* text = f.get("text");
    const json* ids = f.get("input_ids");
    if ((text != nullptr) == (ids != nullptr)) invalid("text", "give exactly one of 'text' and 'input_ids'");
    if (text && !text->is_string() && !text->is_array())
      invalid("text", fmt::format("'text' must be a string or an array of strings, not {}", type_name(*text)));
    if (text && text->is_array())
      for (const json& t : *text)
        if (!t.is_string()) invalid("text", fmt::format("'text' must hold strings, not {}", type_name(t)));
    if (ids && (!ids->is_array() || ids->empty() || ids->at(0).is_string()))
      invalid("input_ids", "'input_ids' must be a non-empty array of token ids (or of arrays of them)");
    r.prompts = prompts(text ? *text : *ids, text ? "text" : "input_ids");
    const json* sp = f.get("sampling_params");
    if (sp && !sp->is_object())
      invalid("sampling_params", fmt::format("'sampling_params' must be an object, not {}", type_name(*sp)));
    static const json kEmpty = json::object();
    Fields s(sp ? *sp : kEmpty, "sampling_params.");
    sampling_fields(s, r);
    r.max_tokens = s.integer("max_new_tokens", 1, std::numeric_limits<int32_t>::max());
    if (!r.max_tokens) r.max_tokens = 128;  // SGLang's default
    if (auto x = f.boolean("stream")) r.stream = *x;
    if (f.boolean("return_logprob").value_or(false))
      r.logprobs = int32_t(f.integer("top_logprobs_num", 0, kMaxTopLogprobs).value_or(0));
  } else {
    if (auto m = f.string("model")) r.model = *m;
    sampling_fields(f, r);
    if (auto x = f.integer("max_tokens", 1, std::numeric_limits<int32_t>::max())) r.max_tokens = *x;
    if (auto x = f.boolean("stream")) r.stream = *x;
    if (const json* so = f.get("stream_options")) {
      if (!so->is_object()) invalid("stream_options", fmt::format("'stream_options' must be an object, not {}", type_name(*so)));
      if (auto x = Fields(*so, "stream_options.").boolean("include_usage")) r.include_usage = *x;
    }
    if (const json* lb = f.get("logit_bias"); lb && !(lb->is_object() && lb->empty()))
      invalid("logit_bias", "'logit_bias' is not supported");
    if (kind == ApiKind::kCompletion) {
      const json* p = f.get("prompt");
      if (!p) invalid("prompt", "'prompt' is required");
      r.prompts = prompts(*p, "prompt");
      if (f.boolean("echo").value_or(false)) invalid("echo", "'echo' is not supported");
      if (auto x = f.integer("logprobs", 0, kMaxTopLogprobs)) r.logprobs = int32_t(*x);
    } else {
      r.messages = chat_messages(f.get("messages"));
      if (auto x = f.integer("max_completion_tokens", 1, std::numeric_limits<int32_t>::max())) r.max_tokens = *x;
      if (auto x = f.boolean("add_generation_prompt")) r.add_generation_prompt = *x;
      const bool lp = f.boolean("logprobs").value_or(false);
      const auto top = f.integer("top_logprobs", 0, kMaxTopLogprobs);
      if (top && !lp) invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true");
      if (lp) r.logprobs = int32_t(top.value_or(0));
    }
  }
  const int64_t choices = int64_t(std::max<size_t>(1, r.prompts.size())) * r.n;
  if (choices > kMaxChoices)
    invalid("n", fmt::format("{} prompts x n = {} choices; at most {} per request", r.prompts.size(), r.n, kMaxChoices));
  return r;
}

// Error messages quote the client's bytes: keep them valid UTF-8 (invalid bytes become '?').
std::string valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const uint8_t c = uint8_t(s[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (uint8_t(s[i + k]) & 0xC0) == 0x80;
    if (ok && len > 1) {  // no overlong forms, surrogates or code points past U+10FFFF
      uint32_t cp = c & (0xFF >> (len + 1));
      for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
      ok = cp >= (len == 2 ? 0x80u : len == 3 ? 0x800u : 0x10000u) && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
    }
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += '?';
      ++i;
    }
  }
  return out;
}

}  // namespace

json ApiError::to_json() const {
  return {{"error",
           {{"message", valid_utf8(message)},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

std::variant<json, ApiError> parse_json_body(std::string_view body) {
  struct TooDeep {};
  try {
    return json::parse(body, [](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth) throw TooDeep{};
      return true;
    });
  } catch (const json::exception& e) {  // parse_error, out_of_range (1e400)
    ApiError err;
    err.message = fmt::format("the body is not valid JSON: {}", e.what());
    return err;
  } catch (const TooDeep&) {
    ApiError err;
    err.message = fmt::format("the body nests deeper than {} levels", kMaxJsonDepth);
    return err;
  }
}

std::variant<ApiRequest, ApiError> parse_api_request(ApiKind kind, std::string_view body) {
  auto parsed = parse_json_body(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  try {
    return parse(kind, std::get<json>(parsed));
  } catch (const Invalid& e) {
    return e.error;
  }
}

std::variant<TokenizeRequest, ApiError> parse_tokenize_request(std::string_view body) {
  auto parsed = parse_json_body(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  try {
    const json& b = std::get<json>(parsed);
    if (!b.is_object()) invalid("", "the request body must be a JSON object");
    Fields f(b, "");
    TokenizeRequest r;
    if (f.get("messages")) {
      r.messages = chat_messages(f.get("messages"));
      if (auto x = f.boolean("add_generation_prompt")) r.add_generation_prompt = *x;
      return r;
    }
    auto text = f.string("prompt");
    if (!text) text = f.string("text");
    if (!text) invalid("prompt", "'prompt' (a string) or 'messages' is required");
    r.text = *text;
    return r;
  } catch (const Invalid& e) {
    return e.error;
  }
}

std::variant<std::vector<int32_t>, ApiError> parse_detokenize_request(std::string_view body) {
  auto parsed = parse_json_body(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  try {
    const json& b = std::get<json>(parsed);
    if (!b.is_object()) invalid("", "the request body must be a JSON object");
    const json* t = Fields(b, "").get("tokens");
    if (!t) invalid("tokens", "'tokens' is required");
    return token_ids(*t, "tokens");
  } catch (const Invalid& e) {
    return e.error;
  }
}

}  // namespace fp4moe::serve
