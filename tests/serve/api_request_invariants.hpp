// What every parse of a request body must satisfy (shared by api_request_test's random
// inputs and fuzz/api_request_fuzz.cpp). Returns "" or what is broken.
#pragma once

#include <string>
#include <string_view>
#include <variant>

#include "serve/api_request.hpp"
#include "serve/tool_choice_grammar.hpp"

namespace fp4moe::serve::testing {

inline std::string error_violation(const ApiError& e) {
  if (e.status != 400) return "a parse error that is not 400";
  if (e.message.empty()) return "an empty error message";
  if (e.message.find('\n') != std::string::npos) return "a multi-line error message";
  try {
    const auto j = e.to_json();
    (void)j.dump();  // strict: throws on invalid UTF-8
    if (!j["error"]["message"].is_string() || !j["error"]["type"].is_string()) return "error JSON without message/type";
  } catch (const std::exception&) {
    return "error JSON that cannot be written";
  }
  return "";
}

inline std::string request_violation(const ApiRequest& r) {
  const auto& s = r.sampling;
  if (r.n < 1 || r.n > kMaxChoices) return "n out of range";
  if (int64_t(std::max<size_t>(1, r.prompts.size())) * r.n > kMaxChoices) return "too many choices";
  if (r.kind == ApiKind::kChat) {
    if (!r.chat.messages.is_array() || r.chat.messages.empty()) return "chat without messages";
    if (!r.chat.tools.is_null() && (!r.chat.tools.is_array() || r.chat.tools.empty())) return "tools not a list";
    if (!r.chat.kwargs.is_null() && !r.chat.kwargs.is_object()) return "chat_template_kwargs not an object";
    for (const auto& m : r.chat.messages)
    {
      if (!m.is_object() || !m["role"].is_string() || !m["content"].is_string()) return "a message without role/content";
      if (m["role"] == "tool" && !(m.contains("tool_call_id") && m["tool_call_id"].is_string()))
        return "a tool message without tool_call_id";
      if (m.contains("tool_calls"))
        for (const auto& c : m["tool_calls"])
          if (!c["function"]["name"].is_string() || !c["function"]["arguments"].is_object())
            return "a tool call without a name or object arguments";
    }
  } else {
    if (r.prompts.empty()) return "no prompt";
    for (const auto& p : r.prompts) {
      if (p.is_ids ? p.ids.empty() : p.text.empty()) return "an empty prompt";
      for (int32_t t : p.ids)
        if (t < 0) return "a negative token id";
    }
  }
  if (!(s.temperature >= 0 && s.temperature <= 2)) return "temperature out of range";
  if (!(s.top_p > 0 && s.top_p <= 1)) return "top_p out of range";
  if (!(s.min_p >= 0 && s.min_p <= 1)) return "min_p out of range";
  if (s.top_k == 0 || s.top_k < -1) return "top_k out of range";
  if (!(s.presence_penalty >= -2 && s.presence_penalty <= 2)) return "presence_penalty out of range";
  if (!(s.frequency_penalty >= -2 && s.frequency_penalty <= 2)) return "frequency_penalty out of range";
  if (!(s.repetition_penalty > 0 && s.repetition_penalty <= 2)) return "repetition_penalty out of range";
  if (r.max_tokens && *r.max_tokens < 1) return "max_tokens < 1";
  if (r.logprobs < -1 || r.logprobs > kMaxTopLogprobs) return "logprobs out of range";
  if (int32_t(r.stop.size()) > kMaxStops) return "too many stops";
  for (const auto& x : r.stop)
    if (x.empty() || int32_t(x.size()) > kMaxStopBytes) return "a bad stop string";
  for (int32_t t : r.stop_ids)
    if (t < 0) return "a negative stop id";
  if (r.constraint && (r.constraint->param.empty() ||
                       (r.constraint->spec.kind == grammar::Kind::kJsonObject && !r.constraint->spec.text.empty())))
    return "a constraint without its field, or json_object with a text";
  return "";
}

// Parses body as kind (0 chat, 1 completion, 2 generate, 3 tokenize, 4 detokenize).
// tool_choice "required" / a named function: the grammar built from the request's tools, for
// both glm formats (without compiling it), is either a structural tag that is JSON or a
// one-line refusal naming a parameter.
inline std::string tool_choice_violation(const ApiRequest& r) {
  if (r.tool_choice != ToolChoice::kRequired && r.tool_choice != ToolChoice::kNamed) return "";
  for (ToolCallFormat f : {ToolCallFormat::kGlm47, ToolCallFormat::kGlm45}) {
    ToolChoiceGrammarRequest q;
    q.format = f;
    q.tools = &r.tools;
    q.named = r.tool_choice == ToolChoice::kNamed ? r.tool_choice_name : std::string();
    q.reasoning_open = f == ToolCallFormat::kGlm45;
    auto spec = tool_choice_grammar(q);
    if (auto* e = std::get_if<FieldError>(&spec)) {
      if (e->param.empty() || e->message.empty() || e->message.find('\n') != std::string::npos)
        return "a tool_choice refusal without a parameter or on several lines";
      continue;
    }
    const auto& g = std::get<grammar::GrammarSpec>(spec);
    if (g.kind != grammar::Kind::kStructuralTag || !nlohmann::json::accept(g.text))
      return "a tool_choice grammar that is not a structural tag in JSON";
  }
  return "";
}

inline std::string parse_violation(int kind, std::string_view body) {
  if (kind <= 2) {
    auto r = parse_api_request(ApiKind(kind), body);
    if (auto* e = std::get_if<ApiError>(&r)) return error_violation(*e);
    const std::string broken = request_violation(std::get<ApiRequest>(r));
    return broken.empty() ? tool_choice_violation(std::get<ApiRequest>(r)) : broken;
  }
  if (kind == 3) {
    auto r = parse_tokenize_request(body);
    if (auto* e = std::get_if<ApiError>(&r)) return error_violation(*e);
    return "";
  }
  auto r = parse_detokenize_request(body);
  if (auto* e = std::get_if<ApiError>(&r)) return error_violation(*e);
  for (int32_t t : std::get<std::vector<int32_t>>(r))
    if (t < 0) return "a negative token id";
  return "";
}

}  // namespace fp4moe::serve::testing
