#include "serve/api_request.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include <fmt/format.h>

#include "engine/decode_capacity.hpp"

namespace fp4moe::serve {
namespace {

using json = nlohmann::ordered_json;

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

// A float that holds an integer too large for int64 / uint64 (nlohmann reads 2^64 as a float):
// its message says "out of range", not "not an integer".
bool huge_integral(const json& v) {
  if (!v.is_number_float()) return false;
  const double x = v.get<double>();
  return std::isfinite(x) && x == std::floor(x) && std::fabs(x) >= 9.2233720368547758e18;
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
  const json& object() const { return obj_; }
  const std::string& prefix() const { return prefix_; }

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
  const json* object(const char* key) const {
    const json* v = get(key);
    if (v && !v->is_object()) invalid(name(key), fmt::format("'{}' must be an object, not {}", name(key), type_name(*v)));
    return v;
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
    } else if (huge_integral(v)) {
      invalid(name, fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, v.get<double>()));
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

// ---- What each field of a body does (README.md, "what each request field does") ----
//
// kUse: the parser reads it. kIgnore: accepted (type-checked by `accepts`) and ignored, because
// ignoring it changes nothing the client can observe. kDefaultOnly: refused unless its value
// is what leaving it out means (`accepts`), because nothing else is implemented. A null value
// is "not given". A key that no table names is refused ("unrecognized"), as OpenAI does.
enum class Fate { kUse, kIgnore, kDefaultOnly };
using Accepts = bool (*)(const json&);
struct FieldRule {
  const char* name;
  Fate fate;
  Accepts accepts = nullptr;
  const char* why = "";  // kDefaultOnly: why other values are refused; kIgnore: the expected type
};

bool never(const json&) { return false; }
bool is_false(const json& v) { return v.is_boolean() && !v.get<bool>(); }
bool is_true(const json& v) { return v.is_boolean() && v.get<bool>(); }
bool is_bool(const json& v) { return v.is_boolean(); }
bool is_string(const json& v) { return v.is_string(); }
bool is_object(const json& v) { return v.is_object(); }
bool is_zero(const json& v) { return v.is_number() && v.get<double>() == 0; }
bool is_one(const json& v) { return v.is_number_integer() && v.get<int64_t>() == 1; }
bool is_minus_one(const json& v) { return v.is_number_integer() && v.get<int64_t>() == -1; }
bool is_positive_int(const json& v) { return v.is_number_integer() && v.get<int64_t>() >= 1; }
bool is_index(const json& v) { return v.is_number_integer() && v.get<int64_t>() >= 0; }  // a streamed call's index
bool is_empty_object(const json& v) { return v.is_object() && v.empty(); }
bool is_empty_string(const json& v) { return v.is_string() && v.get<std::string>().empty(); }
bool is_text_modality(const json& v) { return v == json::array({"text"}); }
bool is_standard_tier(const json& v) { return v == "auto" || v == "default"; }

constexpr const char* kConstrained = "it needs constrained decoding, which is not supported yet";
constexpr const char* kGuided = "vLLM's guided_* fields are not read: use response_format or SGLang's json_schema, regex or ebnf";

// Sampling fields every endpoint reads (OpenAI names; /generate reads them from sampling_params).
const FieldRule kSamplingRules[] = {
    {"temperature", Fate::kUse}, {"top_p", Fate::kUse}, {"top_k", Fate::kUse}, {"min_p", Fate::kUse},
    {"presence_penalty", Fate::kUse}, {"frequency_penalty", Fate::kUse}, {"repetition_penalty", Fate::kUse},
    {"seed", Fate::kUse}, {"sampling_seed", Fate::kUse}, {"stop", Fate::kUse}, {"stop_token_ids", Fate::kUse},
    {"ignore_eos", Fate::kUse}, {"skip_special_tokens", Fate::kUse}, {"n", Fate::kUse},
    {"logit_bias", Fate::kDefaultOnly, is_empty_object, "logit biases are not implemented"},
    {"regex", Fate::kUse}, {"ebnf", Fate::kUse}, {"json_schema", Fate::kUse},  // constraint_request.cpp
    {"structural_tag", Fate::kDefaultOnly, never, kConstrained},
    {"no_stop_trim", Fate::kDefaultOnly, is_false, "the stop string is always left out of the text"},
};

// /v1/chat/completions and /v1/completions.
const FieldRule kOpenAIRules[] = {
    {"model", Fate::kUse}, {"max_tokens", Fate::kUse}, {"stream", Fate::kUse}, {"stream_options", Fate::kUse},
    {"logprobs", Fate::kUse},
    {"user", Fate::kIgnore, is_string, "a string"},
    {"metadata", Fate::kIgnore, is_object, "an object"},
    {"prompt_cache_key", Fate::kIgnore, is_string, "a string"},
    {"safety_identifier", Fate::kIgnore, is_string, "a string"},
    {"service_tier", Fate::kDefaultOnly, is_standard_tier, "only 'auto' or 'default' is served"},
    {"store", Fate::kDefaultOnly, is_false, "completions are not stored"},
    {"response_format", Fate::kUse},  // constraint_request.cpp
    {"guided_json", Fate::kDefaultOnly, never, kGuided},
    {"guided_regex", Fate::kDefaultOnly, never, kGuided},
    {"guided_choice", Fate::kDefaultOnly, never, kGuided},
    {"guided_grammar", Fate::kDefaultOnly, never, kGuided},
    {"echo", Fate::kDefaultOnly, is_false, "the prompt is not echoed"},
    {"best_of", Fate::kDefaultOnly, is_one, "best-of sampling is not implemented (use n)"},
    {"min_tokens", Fate::kDefaultOnly, is_zero, "a minimum length is not implemented"},
    {"top_a", Fate::kDefaultOnly, is_zero, "top-a sampling is not implemented"},
    {"return_hidden_states", Fate::kDefaultOnly, is_false, "hidden states are not returned"},
    {"lora_path", Fate::kDefaultOnly, never, "LoRA adapters are not supported"},
    {"session_params", Fate::kDefaultOnly, never, "sessions are not supported"},
    {"rid", Fate::kDefaultOnly, never, "the server assigns request ids"},
};

const FieldRule kChatRules[] = {
    {"messages", Fate::kUse}, {"max_completion_tokens", Fate::kUse}, {"top_logprobs", Fate::kUse},
    {"add_generation_prompt", Fate::kUse}, {"tools", Fate::kUse}, {"tool_choice", Fate::kUse},
    {"parallel_tool_calls", Fate::kUse}, {"chat_template_kwargs", Fate::kUse}, {"separate_reasoning", Fate::kUse},
    {"stream_reasoning", Fate::kDefaultOnly, is_true, "reasoning is not separated from the answer yet"},
    {"continue_final_message", Fate::kDefaultOnly, is_false, "continuing the last message is not implemented"},
    {"reasoning_effort", Fate::kDefaultOnly, never,
     "the chat template decides how the model reasons: use chat_template_kwargs (e.g. enable_thinking)"},
    {"functions", Fate::kDefaultOnly, never, "it is deprecated: use tools"},
    {"function_call", Fate::kDefaultOnly, never, "it is deprecated: use tool_choice"},
    {"audio", Fate::kDefaultOnly, never, "the model gives text only"},
    {"modalities", Fate::kDefaultOnly, is_text_modality, "the model gives text only"},
    {"prediction", Fate::kDefaultOnly, never, "predicted outputs are not implemented"},
    {"web_search_options", Fate::kDefaultOnly, never, "web search is not available"},
    {"verbosity", Fate::kDefaultOnly, never, "verbosity is not implemented"},
    {"chat_template", Fate::kDefaultOnly, never, "the model folder's chat template is used"},
    {"documents", Fate::kDefaultOnly, never, "documents are not passed to the template"},
};

const FieldRule kCompletionRules[] = {
    {"prompt", Fate::kUse},
    {"suffix", Fate::kDefaultOnly, is_empty_string, "insertion after a suffix is not implemented"},
};

// SGLang's /generate (top level; sampling_params take kSamplingRules and kSamplingParamsRules).
const FieldRule kGenerateRules[] = {
    {"text", Fate::kUse}, {"input_ids", Fate::kUse}, {"sampling_params", Fate::kUse}, {"stream", Fate::kUse},
    {"return_logprob", Fate::kUse}, {"top_logprobs_num", Fate::kUse},
    {"log_metrics", Fate::kIgnore, is_bool, "a boolean"},
    {"logprob_start_len", Fate::kDefaultOnly, is_minus_one, "prompt logprobs are not returned"},
    {"return_text_in_logprobs", Fate::kDefaultOnly, is_false, "logprobs carry token ids only"},
    {"token_ids_logprob", Fate::kDefaultOnly, never, "logprobs of chosen ids are not implemented"},
    {"return_hidden_states", Fate::kDefaultOnly, is_false, "hidden states are not returned"},
    {"image_data", Fate::kDefaultOnly, never, "the model takes text only"},
    {"video_data", Fate::kDefaultOnly, never, "the model takes text only"},
    {"audio_data", Fate::kDefaultOnly, never, "the model takes text only"},
    {"input_embeds", Fate::kDefaultOnly, never, "the model takes token ids only"},
    {"modalities", Fate::kDefaultOnly, never, "the model takes text only"},
    {"lora_path", Fate::kDefaultOnly, never, "LoRA adapters are not supported"},
    {"session_params", Fate::kDefaultOnly, never, "sessions are not supported"},
    {"custom_logit_processor", Fate::kDefaultOnly, never, "custom logit processors are not supported"},
    {"rid", Fate::kDefaultOnly, never, "the server assigns request ids"},
    {"bootstrap_host", Fate::kDefaultOnly, never, "disaggregated serving is not supported"},
    {"bootstrap_port", Fate::kDefaultOnly, never, "disaggregated serving is not supported"},
    {"bootstrap_room", Fate::kDefaultOnly, never, "disaggregated serving is not supported"},
    {"data_parallel_rank", Fate::kDefaultOnly, never, "there is one engine"},
};

const FieldRule kSamplingParamsRules[] = {
    {"max_new_tokens", Fate::kUse},
    {"spaces_between_special_tokens", Fate::kIgnore, is_bool, "a boolean"},  // a slow-tokenizer option
    {"stream_interval", Fate::kIgnore, is_positive_int, "a positive integer"},  // events go out as tokens come
    {"min_new_tokens", Fate::kDefaultOnly, is_zero, "a minimum length is not implemented"},
    {"custom_params", Fate::kDefaultOnly, never, "custom logit processors are not supported"},
};

const FieldRule kStreamOptionsRules[] = {
    {"include_usage", Fate::kUse},
    {"include_obfuscation", Fate::kIgnore, is_bool, "a boolean"},  // padding against side channels; none is added
    {"continuous_usage_stats", Fate::kDefaultOnly, is_false, "usage comes in the last chunk only"},
};

const FieldRule kTokenizeRules[] = {
    {"prompt", Fate::kUse}, {"text", Fate::kUse}, {"messages", Fate::kUse}, {"tools", Fate::kUse},
    {"tool_choice", Fate::kUse}, {"chat_template_kwargs", Fate::kUse}, {"add_generation_prompt", Fate::kUse},
    {"model", Fate::kIgnore, is_string, "a string"},
};

// A client's key as it may appear in a one-line message: control characters escaped, at most
// 64 bytes (then "...").
std::string printable_key(const std::string& key) {
  std::string out;
  for (char c : key.substr(0, 64)) {
    if (uint8_t(c) < 0x20 || c == 0x7F)
      out += fmt::format("\\x{:02x}", uint8_t(c));
    else
      out += c;
  }
  return key.size() > 64 ? out + "..." : out;
}

// Checks every key of f's object against the tables: unknown keys and unsupported values are refused.
void check_fields(const Fields& f, std::initializer_list<std::span<const FieldRule>> tables) {
  for (auto it = f.object().begin(); it != f.object().end(); ++it) {
    if (it->is_null()) continue;
    const std::string name = f.prefix() + printable_key(it.key());
    const FieldRule* rule = nullptr;
    for (const auto& table : tables)
      for (const FieldRule& r : table)
        if (it.key() == r.name) rule = &r;
    if (!rule) invalid(name, fmt::format("unrecognized request argument '{}'", name));
    if (rule->fate == Fate::kIgnore && !rule->accepts(*it))
      invalid(name, fmt::format("'{}' must be {}, not {}", name, rule->why, type_name(*it)));
    if (rule->fate == Fate::kDefaultOnly && !rule->accepts(*it))
      invalid(name, fmt::format("'{}' is not supported: {}", name, rule->why));
  }
}

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

// A seed: any integer in [-2^63, 2^64 - 1]; a negative one is taken modulo 2^64.
uint64_t seed_value(const json& v, const std::string& name) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) return uint64_t(v.get<int64_t>());
  if (huge_integral(v))
    invalid(name, fmt::format("'{}' must be in [-9223372036854775808, 18446744073709551615], got {}", name,
                              v.get<double>()));
  invalid(name, fmt::format("'{}' must be an integer, not {}", name, type_name(v)));
}

void sampling_fields(const Fields& f, ApiRequest& r) {
  engine::SamplingParams& s = r.sampling;
  if (auto x = f.number("temperature", 0.0, 2.0)) s.temperature = float(*x);
  if (auto x = f.number("top_p", 0.0, 1.0, true)) s.top_p = float(*x);
  if (auto x = f.integer("top_k", -1, std::numeric_limits<int32_t>::max())) {  // SGLang's rule: -1 off, 0 refused
    if (*x == 0) invalid(f.name("top_k"), fmt::format("'{}' must be -1 (off) or at least 1, got 0", f.name("top_k")));
    s.top_k = int32_t(*x);
  }
  if (auto x = f.number("min_p", 0.0, 1.0)) s.min_p = float(*x);
  if (auto x = f.number("presence_penalty", -2.0, 2.0)) s.presence_penalty = float(*x);
  if (auto x = f.number("frequency_penalty", -2.0, 2.0)) s.frequency_penalty = float(*x);
  if (auto x = f.number("repetition_penalty", 0.0, 2.0, true)) s.repetition_penalty = float(*x);
  for (const char* key : {"seed", "sampling_seed"})
    if (const json* v = f.get(key)) {
      s.seed = seed_value(*v, f.name(key));
      s.has_seed = true;
    }
  r.stop = stops(f, "stop");
  if (const json* v = f.get("stop_token_ids")) {
    r.stop_ids = token_ids(*v, f.name("stop_token_ids"));
    if (int32_t(r.stop_ids.size()) > engine::kMaxStopTokenIds)
      invalid(f.name("stop_token_ids"), fmt::format("at most {} stop token ids", engine::kMaxStopTokenIds));
  }
  if (auto x = f.boolean("ignore_eos")) r.ignore_eos = *x;
  if (auto x = f.boolean("skip_special_tokens")) r.skip_special_tokens = *x;
  if (auto x = f.integer("n", 1, kMaxChoices)) r.n = int32_t(*x);
}

// A message's content: a string, or a list of text parts (joined with " ", as SGLang does for
// templates that take string content). Other part types are refused.
std::string message_content(const json& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array())
    invalid(where, fmt::format("'{}' must be a string or an array of parts, not {}", where, type_name(c)));
  std::string content;
  for (size_t k = 0; k < c.size(); ++k) {
    const json& part = c[k];
    const std::string pw = fmt::format("{}[{}]", where, k);
    if (!part.is_object()) invalid(pw, fmt::format("'{}' must be an object, not {}", pw, type_name(part)));
    Fields pf(part, pw + ".");
    const auto type = pf.string("type");
    if (type != "text")
      invalid(pw + ".type", fmt::format("'{}.type' must be 'text' (the model takes text only)", pw));
    static const FieldRule kPart[] = {{"type", Fate::kUse}, {"text", Fate::kUse}};
    check_fields(pf, {kPart});
    const auto text = pf.string("text");
    if (!text) invalid(pw + ".text", fmt::format("'{}.text' is required", pw));
    if (k > 0) content += ' ';
    content += *text;
  }
  return content;
}

// JSON text that must hold an object (a tool call's arguments), parsed with the nesting limit.
json json_object_text(const std::string& text, const std::string& name) {
  struct TooDeep {};
  json v;
  try {
    v = json::parse(text, [](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth) throw TooDeep{};
      return true;
    });
  } catch (const json::exception&) {
    invalid(name, fmt::format("'{}' is not valid JSON", name));
  } catch (const TooDeep&) {
    invalid(name, fmt::format("'{}' nests deeper than {} levels", name, kMaxJsonDepth));
  }
  if (!v.is_object()) invalid(name, fmt::format("'{}' must hold a JSON object, not {}", name, type_name(v)));
  return v;
}

// An assistant message's tool_calls -> [{"id"?, "type": "function", "function": {"name",
// "arguments": object}}]: arguments given as a JSON string are parsed, as SGLang and vLLM do
// before rendering, so templates can iterate them.
json tool_calls(const json& v, const std::string& where) {
  if (!v.is_array()) invalid(where, fmt::format("'{}' must be an array, not {}", where, type_name(v)));
  static const FieldRule kCall[] = {{"id", Fate::kUse}, {"type", Fate::kUse}, {"function", Fate::kUse},
                                    {"index", Fate::kIgnore, is_index, "a non-negative integer"}};
  static const FieldRule kFunction[] = {{"name", Fate::kUse}, {"arguments", Fate::kUse}};
  json out = json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string w = fmt::format("{}[{}]", where, i);
    if (!v[i].is_object()) invalid(w, fmt::format("'{}' must be an object, not {}", w, type_name(v[i])));
    Fields f(v[i], w + ".");
    check_fields(f, {kCall});
    json call = json::object();
    if (auto id = f.string("id")) call["id"] = *id;
    if (auto type = f.string("type"); type && *type != "function")
      invalid(w + ".type", fmt::format("'{}.type' must be 'function'", w));
    call["type"] = "function";
    const json* fn = f.object("function");
    if (!fn) invalid(w + ".function", fmt::format("'{}.function' is required", w));
    Fields ff(*fn, w + ".function.");
    check_fields(ff, {kFunction});
    const auto name = ff.string("name");
    if (!name || name->empty()) invalid(ff.name("name"), fmt::format("'{}' is required", ff.name("name")));
    json args = json::object();
    if (const json* a = ff.get("arguments")) {
      if (a->is_string())
        args = json_object_text(a->get<std::string>(), ff.name("arguments"));
      else if (a->is_object())
        args = *a;
      else
        invalid(ff.name("arguments"), fmt::format("'{}' must be a JSON string or an object, not {}", ff.name("arguments"),
                                                  type_name(*a)));
    }
    call["function"] = {{"name", *name}, {"arguments", std::move(args)}};
    out.push_back(std::move(call));
  }
  return out;
}

json chat_messages(const json* v) {
  if (!v) invalid("messages", "'messages' is required");
  if (!v->is_array()) invalid("messages", fmt::format("'messages' must be an array, not {}", type_name(*v)));
  if (v->empty()) invalid("messages", "'messages' is empty");
  static const FieldRule kMessage[] = {{"role", Fate::kUse},       {"content", Fate::kUse},
                                       {"name", Fate::kUse},       {"tool_calls", Fate::kUse},
                                       {"tool_call_id", Fate::kUse}, {"reasoning_content", Fate::kUse}};
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
                                           printable_key(*role)));
    check_fields(f, {kMessage});
    const bool assistant = *role == "assistant";
    json msg = {{"role", *role}};
    const json* c = f.get("content");
    if (!c && !assistant) invalid(where + ".content", fmt::format("'{}.content' is required", where));
    msg["content"] = c ? message_content(*c, where + ".content") : std::string();
    if (auto name = f.string("name")) msg["name"] = *name;
    if (const json* tc = f.get("tool_calls")) {
      if (!assistant) invalid(where + ".tool_calls", fmt::format("'{}.tool_calls' is for assistant messages", where));
      msg["tool_calls"] = tool_calls(*tc, where + ".tool_calls");
    }
    if (auto rc = f.string("reasoning_content")) {
      if (!assistant)
        invalid(where + ".reasoning_content", fmt::format("'{}.reasoning_content' is for assistant messages", where));
      msg["reasoning_content"] = *rc;
    }
    const auto call_id = f.string("tool_call_id");
    if (*role == "tool" && !call_id)
      invalid(where + ".tool_call_id", fmt::format("'{}.tool_call_id' is required in a tool message", where));
    if (call_id && *role != "tool")
      invalid(where + ".tool_call_id", fmt::format("'{}.tool_call_id' is for tool messages", where));
    if (call_id) msg["tool_call_id"] = *call_id;
    out.push_back(std::move(msg));
  }
  return out;
}

// tools: [{"type": "function", "function": {"name", "description"?, "parameters"? (object)}}],
// kept as the client wrote them (the template sees them so).
json chat_tools(const Fields& f) {
  const json* v = f.get("tools");
  if (!v) return json();
  if (!v->is_array()) invalid("tools", fmt::format("'tools' must be an array, not {}", type_name(*v)));
  if (int32_t(v->size()) > kMaxTools) invalid("tools", fmt::format("at most {} tools", kMaxTools));
  static const FieldRule kTool[] = {{"type", Fate::kUse}, {"function", Fate::kUse}};
  static const FieldRule kFunction[] = {
      {"name", Fate::kUse}, {"description", Fate::kUse}, {"parameters", Fate::kUse},
      {"strict", Fate::kDefaultOnly, is_false, kConstrained}};
  std::vector<std::string> names;
  for (size_t i = 0; i < v->size(); ++i) {
    const std::string w = fmt::format("tools[{}]", i);
    if (!(*v)[i].is_object()) invalid(w, fmt::format("'{}' must be an object, not {}", w, type_name((*v)[i])));
    Fields t((*v)[i], w + ".");
    check_fields(t, {kTool});
    if (t.string("type") != "function") invalid(w + ".type", fmt::format("'{}.type' must be 'function'", w));
    const json* fn = t.object("function");
    if (!fn) invalid(w + ".function", fmt::format("'{}.function' is required", w));
    Fields ff(*fn, w + ".function.");
    check_fields(ff, {kFunction});
    const auto name = ff.string("name");
    if (!name || name->empty()) invalid(ff.name("name"), fmt::format("'{}' is required", ff.name("name")));
    if (std::find(names.begin(), names.end(), *name) != names.end())
      invalid(ff.name("name"), fmt::format("two tools are named '{}'", printable_key(*name)));
    names.push_back(*name);
    (void)ff.string("description");
    (void)ff.object("parameters");
  }
  return *v;
}

// tool_choice: "auto" | "none" | "required" | {"type": "function", "function": {"name"}}; the last
// two are held to the tool-call format by a grammar (generation_handlers.cpp decides whether
// this server can build it).
ToolChoice tool_choice(const Fields& f, const json& tools, std::string& named) {
  const json* v = f.get("tool_choice");
  if (!v) return ToolChoice::kAuto;
  if (v->is_string()) {
    const std::string s = v->get<std::string>();
    if (s == "auto") return ToolChoice::kAuto;
    if (s == "none") return ToolChoice::kNone;
    if (s == "required") {
      if (!tools.is_array() || tools.empty()) invalid("tool_choice", "'tool_choice': 'required' needs a non-empty 'tools' list");
      return ToolChoice::kRequired;
    }
    invalid("tool_choice", fmt::format("'tool_choice' must be 'auto', 'none', 'required' or a function, not '{}'",
                                         printable_key(s)));
  }
  if (!v->is_object())
    invalid("tool_choice", fmt::format("'tool_choice' must be a string or an object, not {}", type_name(*v)));
  Fields c(*v, "tool_choice.");
  if (c.string("type") != "function") invalid("tool_choice.type", "'tool_choice.type' must be 'function'");
  const json* fn = c.object("function");
  const auto name = fn ? Fields(*fn, "tool_choice.function.").string("name") : std::nullopt;
  if (!name) invalid("tool_choice.function.name", "'tool_choice.function.name' is required");
  bool known = false;
  if (tools.is_array())
    for (const json& t : tools) known = known || t["function"]["name"] == *name;
  if (!known)
    invalid("tool_choice",
            fmt::format("'tool_choice' names the function '{}', which is not in 'tools'", printable_key(*name)));
  named = *name;
  return ToolChoice::kNamed;
}

// chat_template_kwargs: an object of extra template variables; the ones the server sets are refused.
json template_kwargs(const Fields& f) {
  const json* v = f.object("chat_template_kwargs");
  if (!v) return json();
  for (const char* reserved : {"messages", "tools", "documents", "add_generation_prompt"})
    if (v->contains(reserved))
      invalid("chat_template_kwargs",
              fmt::format("'chat_template_kwargs' may not set '{}': the request's own field does", reserved));
  return *v;
}

// The chat fields shared by chat requests and /tokenize.
void chat_input(const Fields& f, ChatInput& chat, json& tools, ToolChoice& choice, std::string& named) {
  chat.messages = chat_messages(f.get("messages"));
  if (auto x = f.boolean("add_generation_prompt")) chat.add_generation_prompt = *x;
  tools = chat_tools(f);
  choice = tool_choice(f, tools, named);
  // Rendered unless tool_choice is "none" or the list is empty (SGLang's rule).
  if (choice != ToolChoice::kNone && tools.is_array() && !tools.empty()) chat.tools = tools;
  chat.kwargs = template_kwargs(f);
}

void constraint_fields(const json& body, const json* sampling_params, ApiRequest& r) {
  auto c = parse_constraint(body, sampling_params);
  if (auto* e = std::get_if<ApiError>(&c)) throw Invalid{std::move(*e)};
  r.constraint = std::move(std::get<std::optional<Constraint>>(c));
}

ApiRequest parse(ApiKind kind, const json& body) {
  if (!body.is_object()) invalid("", fmt::format("the request body must be a JSON object, not {}", type_name(body)));
  ApiRequest r;
  r.kind = kind;
  Fields f(body, "");
  if (kind == ApiKind::kGenerate) {
    check_fields(f, {kGenerateRules});
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
    const json* sp = f.object("sampling_params");
    static const json kEmpty = json::object();
    Fields s(sp ? *sp : kEmpty, "sampling_params.");
    check_fields(s, {kSamplingRules, kSamplingParamsRules});
    sampling_fields(s, r);
    constraint_fields(body, sp ? sp : &kEmpty, r);
    r.max_tokens = s.integer("max_new_tokens", 1, std::numeric_limits<int32_t>::max());
    if (!r.max_tokens) r.max_tokens = 128;  // SGLang's default
    if (auto x = f.boolean("stream")) r.stream = *x;
    const bool lp = f.boolean("return_logprob").value_or(false);
    const auto top = f.integer("top_logprobs_num", 0, kMaxTopLogprobs);
    if (lp) r.logprobs = int32_t(top.value_or(0));
  } else {
    if (kind == ApiKind::kChat)
      check_fields(f, {kSamplingRules, kOpenAIRules, kChatRules});
    else
      check_fields(f, {kSamplingRules, kOpenAIRules, kCompletionRules});
    if (auto m = f.string("model")) r.model = *m;
    sampling_fields(f, r);
    constraint_fields(body, nullptr, r);
    if (auto x = f.integer("max_tokens", 1, std::numeric_limits<int32_t>::max())) r.max_tokens = *x;
    if (auto x = f.boolean("stream")) r.stream = *x;
    if (const json* so = f.object("stream_options")) {
      Fields o(*so, "stream_options.");
      check_fields(o, {kStreamOptionsRules});
      if (auto x = o.boolean("include_usage")) r.include_usage = *x;
      (void)o.boolean("include_obfuscation");
    }
    if (kind == ApiKind::kCompletion) {
      const json* p = f.get("prompt");
      if (!p) invalid("prompt", "'prompt' is required");
      r.prompts = prompts(*p, "prompt");
      if (auto x = f.integer("logprobs", 0, kMaxTopLogprobs)) r.logprobs = int32_t(*x);
    } else {
      chat_input(f, r.chat, r.tools, r.tool_choice, r.tool_choice_name);
      if (auto x = f.integer("max_completion_tokens", 1, std::numeric_limits<int32_t>::max())) r.max_tokens = *x;
      const bool lp = f.boolean("logprobs").value_or(false);
      const auto top = f.integer("top_logprobs", 0, kMaxTopLogprobs);
      if (top && !lp) invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true");
      if (lp) r.logprobs = int32_t(top.value_or(0));
      if (auto x = f.boolean("parallel_tool_calls")) r.parallel_tool_calls = *x;
      if (auto x = f.boolean("separate_reasoning")) r.separate_reasoning = *x;
      // With tools rendered, special tokens stay in the text (the tool-call markers are special
      // tokens in GLM's and DeepSeek's vocabularies), as SGLang does, unless the client says otherwise.
      if (!r.chat.tools.is_null() && !f.get("skip_special_tokens")) r.skip_special_tokens = false;
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

nlohmann::json ApiError::to_json() const {
  using J = nlohmann::json;
  return {{"error",
           {{"message", valid_utf8(message)},
            {"type", type},
            {"param", param.empty() ? J(nullptr) : J(param)},
            {"code", code.empty() ? J(nullptr) : J(code)}}}};
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
    check_fields(f, {kTokenizeRules});
    TokenizeRequest r;
    if (f.get("messages")) {
      json tools;
      ToolChoice choice;
      std::string named;
      chat_input(f, r.chat, tools, choice, named);
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
