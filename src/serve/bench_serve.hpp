// `fp4moe bench serve`: a load generator against any OpenAI-compatible server (ours, vLLM,
// SGLang). Requests go to /v1/completions (or /v1/chat/completions) with stream = true and
// stream_options.include_usage, so time to first token and inter-token latency are measured
// on the wire; token counts come from the server's usage.
//
// Datasets: random token ids (SGLang's random dataset: lengths drawn uniformly from
// [len * range_ratio, len]) sent as `prompt` id lists, so input lengths are exact; or a JSONL
// file of prompts. Arrivals: a Poisson process at --request-rate (inf: all at once), at most
// --max-concurrency in flight. The report has SGLang bench_serving's layout and key names.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp4moe::serve::bench {

struct BenchPrompt {
  nlohmann::json prompt;   // a string or a list of token ids
  int32_t input_len = 0;   // tokens when known (id lists); else 0 and the server's usage says
  int32_t output_len = 0;  // max_tokens
};

struct RandomDatasetOptions {
  int64_t num_prompts = 1000;
  int32_t input_len = 1024;
  int32_t output_len = 1024;
  double range_ratio = 0.0;  // lengths uniform in [max(1, len * ratio), len]
  int32_t vocab_size = 0;    // ids uniform in [0, vocab_size)
  uint64_t seed = 1;
};
std::vector<BenchPrompt> make_random_dataset(const RandomDatasetOptions& o);

// One JSON object per line: {"prompt": "text" | [ids], "output_len": n} ("max_tokens" is
// read too; without either, default_output_len). Blank lines are skipped; the file is
// cycled when num_prompts exceeds its lines. Errors name the file and line.
std::vector<BenchPrompt> parse_jsonl_dataset(std::string_view text, const std::string& name, int64_t num_prompts,
                                             int32_t default_output_len);

// Server-sent events: bytes in, the payloads of complete `data:` lines out (in order).
class SseParser {
 public:
  void feed(std::string_view bytes, std::vector<std::string>& payloads);

 private:
  std::string pending_;
};

// What one request measured.
struct RequestResult {
  bool success = false;
  std::string error;
  int32_t prompt_len = 0;
  int32_t output_len = 0;
  double ttft = 0.0;         // seconds, to the first chunk with text
  double latency = 0.0;      // seconds, to the end of the stream
  std::vector<double> itl;   // seconds between consecutive chunks with text
};

// Turns one streamed response's payloads into a RequestResult (completions or chat chunks).
class StreamAccumulator {
 public:
  explicit StreamAccumulator(bool chat) : chat_(chat) {}
  // One `data:` payload received `seconds` after the request was sent. False once [DONE] came.
  bool on_payload(std::string_view payload, double seconds);
  // The result once the response ended (status = the HTTP status; body = a non-SSE body).
  RequestResult finish(int status, std::string_view body, double seconds, const std::string& transport_error) const;

 private:
  bool chat_;
  bool done_ = false;
  bool any_text_ = false;
  double last_ = 0.0;
  int32_t chunks_ = 0;
  RequestResult r_;
};

struct ClientOptions {
  std::string base_url = "http://127.0.0.1:30000";
  std::string model;          // empty: the first of GET /v1/models
  std::string api_key;
  bool chat = false;          // /v1/chat/completions with the prompt as one user message
  bool ignore_eos = true;
  nlohmann::json extra_body = nlohmann::json::object();
  double timeout_s = 3600.0;  // per request
};
nlohmann::json request_body(const ClientOptions& o, const BenchPrompt& p);

// The first model id of GET /v1/models; the vocab size of GET /get_model_info (0: not given).
std::string query_model_name(const ClientOptions& o);
int32_t query_vocab_size(const ClientOptions& o);

// One streaming request, synchronously.
RequestResult send_one(const ClientOptions& o, const BenchPrompt& p);

struct LoadOptions {
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s, Poisson arrivals
  int32_t max_concurrency = 0;                                      // 0: no limit
  uint64_t seed = 1;
  bool progress = true;
};
struct RunResult {
  std::vector<RequestResult> results;  // in prompt order
  double duration = 0.0;               // seconds, first send to last response
};
RunResult run_load(const ClientOptions& o, const std::vector<BenchPrompt>& prompts, const LoadOptions& l);

// Arrival offsets (seconds from the start) of n requests at rate (inf: all zero).
std::vector<double> poisson_arrivals(int64_t n, double rate, uint64_t seed);

// numpy.percentile's default (linear interpolation); 0 for an empty list.
double percentile(std::vector<double> v, double p);

struct Summary {
  std::string backend, dataset;
  double request_rate = 0.0;
  int32_t max_concurrency = 0;
  int64_t completed = 0, failed = 0;
  double duration = 0.0;
  int64_t total_input = 0, total_output = 0;
  double request_throughput = 0, input_throughput = 0, output_throughput = 0, total_throughput = 0;
  double concurrency = 0;  // sum of latencies / duration
  double mean_e2e_ms = 0, median_e2e_ms = 0, p99_e2e_ms = 0;
  double mean_ttft_ms = 0, median_ttft_ms = 0, p99_ttft_ms = 0;
  double mean_tpot_ms = 0, median_tpot_ms = 0, p99_tpot_ms = 0;
  double mean_itl_ms = 0, median_itl_ms = 0, p95_itl_ms = 0, p99_itl_ms = 0, max_itl_ms = 0;
  std::vector<std::string> errors;  // the first few distinct failure messages
};
Summary summarize(const RunResult& run, const std::string& backend, const std::string& dataset, double request_rate,
                  int32_t max_concurrency);
// The text block SGLang's bench_serving prints ("==== Serving Benchmark Result ====" ...).
std::string format_report(const Summary& s);
// SGLang's JSON keys (duration, completed, mean_ttft_ms, ...) plus failed and errors; with
// details, the per-request lists (input_lens, output_lens, ttfts, itls, errors) too.
nlohmann::ordered_json report_json(const Summary& s, const RunResult& run, bool details);

}  // namespace fp4moe::serve::bench
