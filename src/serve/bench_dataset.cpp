// bench serve: datasets, arrivals, and the parsing of streamed responses (no I/O here).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <random>

#include "core/error.hpp"
#include "serve/bench_serve.hpp"

namespace fp4moe::serve::bench {

using json = nlohmann::json;

std::vector<BenchPrompt> make_random_dataset(const RandomDatasetOptions& o) {
  FP4MOE_CHECK(o.num_prompts > 0, "--num-prompts must be positive (got {})", o.num_prompts);
  FP4MOE_CHECK(o.input_len > 0 && o.output_len > 0, "--random-input-len and --random-output-len must be positive");
  FP4MOE_CHECK(o.range_ratio >= 0.0 && o.range_ratio <= 1.0, "--random-range-ratio must be in [0, 1] (got {})",
               o.range_ratio);
  FP4MOE_CHECK(o.vocab_size > 0, "the random dataset needs a vocabulary size (--random-vocab-size)");
  std::mt19937_64 rng(o.seed);
  auto length = [&](int32_t len) {
    const int32_t lo = std::max<int32_t>(1, int32_t(double(len) * o.range_ratio));
    return std::uniform_int_distribution<int32_t>(std::min(lo, len), len)(rng);
  };
  std::uniform_int_distribution<int32_t> id(0, o.vocab_size - 1);
  std::vector<BenchPrompt> out(size_t(o.num_prompts));
  for (BenchPrompt& p : out) {
    p.input_len = length(o.input_len);
    p.output_len = length(o.output_len);
    std::vector<int32_t> ids(size_t(p.input_len));
    for (int32_t& t : ids) t = id(rng);
    p.prompt = std::move(ids);
  }
  return out;
}

std::vector<BenchPrompt> parse_jsonl_dataset(std::string_view text, const std::string& name, int64_t num_prompts,
                                             int32_t default_output_len) {
  FP4MOE_CHECK(num_prompts > 0, "--num-prompts must be positive (got {})", num_prompts);
  std::vector<BenchPrompt> lines;
  size_t pos = 0;
  for (int64_t line_no = 1; pos < text.size(); ++line_no) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const json j = json::parse(line, nullptr, false);
    FP4MOE_CHECK(!j.is_discarded() && j.is_object(), "{}:{}: not a JSON object", name, line_no);
    FP4MOE_CHECK(j.contains("prompt"), "{}:{}: no \"prompt\"", name, line_no);
    BenchPrompt p;
    p.prompt = j["prompt"];
    if (p.prompt.is_array()) {
      FP4MOE_CHECK(!p.prompt.empty(), "{}:{}: an empty prompt", name, line_no);
      for (const json& t : p.prompt)
        FP4MOE_CHECK(t.is_number_integer() && t.get<int64_t>() >= 0 && t.get<int64_t>() <= INT32_MAX,
                     "{}:{}: \"prompt\" lists must hold token ids (non-negative integers)", name, line_no);
      p.input_len = int32_t(p.prompt.size());
    } else {
      FP4MOE_CHECK(p.prompt.is_string() && !p.prompt.get<std::string>().empty(),
                   "{}:{}: \"prompt\" must be a non-empty string or a list of token ids", name, line_no);
    }
    p.output_len = default_output_len;
    for (const char* key : {"output_len", "max_tokens"})
      if (j.contains(key)) {
        const json& v = j[key];
        FP4MOE_CHECK(v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() <= INT32_MAX,
                     "{}:{}: \"{}\" must be a positive integer", name, line_no, key);
        p.output_len = int32_t(v.get<int64_t>());
      }
    lines.push_back(std::move(p));
  }
  FP4MOE_CHECK(!lines.empty(), "{}: no prompts", name);
  std::vector<BenchPrompt> out;
  out.reserve(size_t(num_prompts));
  for (int64_t i = 0; i < num_prompts; ++i) out.push_back(lines[size_t(i) % lines.size()]);
  return out;
}

std::vector<double> poisson_arrivals(int64_t n, double rate, uint64_t seed) {
  FP4MOE_CHECK(rate > 0.0, "--request-rate must be positive or inf (got {})", rate);
  std::vector<double> t(size_t(std::max<int64_t>(n, 0)), 0.0);
  if (std::isinf(rate)) return t;
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::exponential_distribution<double> gap(rate);
  double now = 0.0;
  for (double& x : t) {
    x = now;
    now += gap(rng);
  }
  return t;
}

void SseParser::feed(std::string_view bytes, std::vector<std::string>& payloads) {
  pending_.append(bytes);
  size_t start = 0;
  for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string_view line(pending_.data() + start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.substr(0, 5) != "data:") continue;  // blank separators, comments, other fields
    line.remove_prefix(5);
    if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    payloads.emplace_back(line);
  }
  pending_.erase(0, start);
}

bool StreamAccumulator::on_payload(std::string_view payload, double seconds) {
  if (done_) return false;
  if (payload == "[DONE]") {
    done_ = true;
    return false;
  }
  const json j = json::parse(payload, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    if (r_.error.empty()) r_.error = "a stream event that is not a JSON object";
    return true;
  }
  if (j.contains("error")) {
    const json& e = j["error"];
    if (r_.error.empty())
      r_.error = e.is_object() && e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>()
                                                                                     : e.dump();
    return true;
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    const json& u = j["usage"];
    // A count is an int32 in [0, 2^31): anything else is the server's error, not a number to wrap.
    auto count = [&](const char* key, int32_t& out) {
      if (!u.contains(key) || !u[key].is_number_integer()) return;
      const json& v = u[key];
      const bool ok = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(INT32_MAX)
                                             : v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX;
      if (ok)
        out = int32_t(v.get<int64_t>());
      else if (r_.error.empty())
        r_.error = std::string("usage.") + key + " out of range: " + v.dump();
    };
    count("prompt_tokens", r_.prompt_len);
    count("completion_tokens", r_.output_len);
  }
  if (!j.contains("choices") || !j["choices"].is_array()) return true;
  bool text = false;
  for (const json& c : j["choices"]) {
    if (!c.is_object()) continue;
    const json* t = nullptr;
    if (chat_) {
      if (c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content")) t = &c["delta"]["content"];
    } else if (c.contains("text")) {
      t = &c["text"];
    }
    if (t && t->is_string() && !t->get<std::string>().empty()) text = true;
    if (c.contains("finish_reason") && c["finish_reason"] == "abort" && r_.error.empty())
      r_.error = "the server aborted the request (finish_reason abort)";
  }
  if (text) {
    if (!any_text_) {
      r_.ttft = seconds;
      any_text_ = true;
    } else {
      r_.itl.push_back(seconds - last_);
    }
    last_ = seconds;
    ++chunks_;
  }
  return true;
}

RequestResult StreamAccumulator::finish(int status, std::string_view body, double seconds,
                                        const std::string& transport_error) const {
  RequestResult r = r_;
  r.latency = seconds;
  if (!transport_error.empty()) {
    r.error = transport_error;
  } else if (status != 200) {
    const json j = json::parse(body, nullptr, false);
    std::string msg(body.substr(0, 200));
    if (!j.is_discarded() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
        j["error"]["message"].is_string())
      msg = j["error"]["message"];
    r.error = "HTTP " + std::to_string(status) + (msg.empty() ? "" : ": " + msg);
  } else if (r.error.empty() && !done_) {
    r.error = "the stream ended without data: [DONE]";
  }
  if (r.output_len == 0) r.output_len = chunks_;  // no usage: one token per chunk with text
  if (!any_text_) r.ttft = seconds;               // no text came: the first token came by the end at the latest
  r.success = r.error.empty();
  return r;
}

}  // namespace fp4moe::serve::bench
