// bench serve: the HTTP side (cpp-httplib clients, one per worker thread) and the load loop.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include <httplib.h>

#include "core/error.hpp"
#include "core/progress.hpp"
#include "serve/bench_serve.hpp"

namespace fp4moe::serve::bench {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::unique_ptr<httplib::Client> make_client(const ClientOptions& o) {
  auto c = std::make_unique<httplib::Client>(o.base_url);
  FP4MOE_CHECK(c->is_valid(), "--base-url {}: not a valid http(s)://host[:port] address", o.base_url);
  const auto seconds = time_t(std::max(1.0, o.timeout_s));
  c->set_connection_timeout(10, 0);
  c->set_read_timeout(seconds, 0);
  c->set_write_timeout(seconds, 0);
  c->set_keep_alive(true);
  if (!o.api_key.empty()) c->set_bearer_token_auth(o.api_key);
  return c;
}

json get_json(const ClientOptions& o, const std::string& path) {
  auto c = make_client(o);
  const auto res = c->Get(path);
  FP4MOE_CHECK(res, "{}{}: {}", o.base_url, path, httplib::to_string(res.error()));
  if (res->status != 200) return json();
  json j = json::parse(res->body, nullptr, false);
  return j.is_discarded() ? json() : j;
}

RequestResult send_with(httplib::Client& c, const ClientOptions& o, const BenchPrompt& p) {
  const std::string body = request_body(o, p).dump();
  StreamAccumulator acc(o.chat);
  SseParser sse;
  std::vector<std::string> payloads;
  std::string raw;  // the first bytes, for an error body
  int status = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = o.chat ? "/v1/chat/completions" : "/v1/completions";
  req.headers = {{"Accept", "text/event-stream"}};
  req.body = body;
  req.set_header("Content-Type", "application/json");
  const auto t0 = Clock::now();
  auto since = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (raw.size() < 4096) raw.append(data, std::min(n, 4096 - raw.size()));
    if (status != 200) return true;
    const double now = since();
    payloads.clear();
    sse.feed(std::string_view(data, n), payloads);
    for (const std::string& pl : payloads) acc.on_payload(pl, now);
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool ok = c.send(req, res, err);
  if (status == 0) status = res.status;
  return acc.finish(status, raw, since(), ok ? std::string() : "connection: " + httplib::to_string(err));
}

}  // namespace

json request_body(const ClientOptions& o, const BenchPrompt& p) {
  json b = {{"model", o.model}, {"max_tokens", p.output_len}, {"temperature", 0.0}, {"stream", true},
            {"stream_options", {{"include_usage", true}}}, {"ignore_eos", o.ignore_eos}};
  if (o.chat) {
    FP4MOE_CHECK(p.prompt.is_string(), "--backend openai-chat needs text prompts (a JSONL dataset of strings)");
    b["messages"] = json::array({{{"role", "user"}, {"content", p.prompt}}});
  } else {
    b["prompt"] = p.prompt;
  }
  for (const auto& [k, v] : o.extra_body.items()) b[k] = v;
  return b;
}

std::string query_model_name(const ClientOptions& o) {
  const json j = get_json(o, "/v1/models");
  FP4MOE_CHECK(j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
                   j["data"][0].is_object() && j["data"][0].contains("id") && j["data"][0]["id"].is_string(),
               "{}/v1/models gave no model id: pass --model", o.base_url);
  return j["data"][0]["id"];
}

int32_t query_vocab_size(const ClientOptions& o) {
  const json j = get_json(o, "/get_model_info");
  if (j.is_object() && j.contains("vocab_size") && j["vocab_size"].is_number_integer()) return j["vocab_size"];
  return 0;
}

RequestResult send_one(const ClientOptions& o, const BenchPrompt& p) {
  auto c = make_client(o);
  return send_with(*c, o, p);
}

RunResult run_load(const ClientOptions& o, const std::vector<BenchPrompt>& prompts, const LoadOptions& l) {
  const int64_t n = int64_t(prompts.size());
  const std::vector<double> arrivals = poisson_arrivals(n, l.request_rate, l.seed);
  // One worker per request in flight: max_concurrency of them, or one per request (at most 4096).
  const int64_t workers = std::min<int64_t>({n, l.max_concurrency > 0 ? l.max_concurrency : n, 4096});
  RunResult run;
  run.results.resize(size_t(n));
  std::atomic<int64_t> next{0};
  ProgressBar bar("requests", n, l.progress);
  const auto t0 = Clock::now();
  auto work = [&] {
    auto c = make_client(o);
    for (int64_t i; (i = next.fetch_add(1)) < n;) {
      std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(arrivals[size_t(i)])));
      RequestResult r = send_with(*c, o, prompts[size_t(i)]);
      if (r.prompt_len == 0) r.prompt_len = prompts[size_t(i)].input_len;
      run.results[size_t(i)] = std::move(r);
      bar.advance();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(size_t(workers));
  for (int64_t w = 0; w < workers; ++w) threads.emplace_back(work);
  for (auto& t : threads) t.join();
  run.duration = std::chrono::duration<double>(Clock::now() - t0).count();
  bar.finish();
  return run;
}

}  // namespace fp4moe::serve::bench
