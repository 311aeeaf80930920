// fp4moe bench serve: load against an OpenAI-compatible server (see serve/bench_serve.hpp).
// Prints SGLang bench_serving's report; --output-file appends the same numbers as one JSON
// line (SGLang's keys). Exit 0 when the run finished (failed requests are counted in the
// report), 1 when the server cannot be reached, the warm-up fails or no request succeeded.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/text_io.hpp"
#include "core/error.hpp"
#include "serve/bench_serve.hpp"

namespace fp4moe {
namespace {

namespace bench = serve::bench;

struct BenchServeArgs {
  std::string base_url, host = "127.0.0.1", backend = "openai", model, dataset = "random", dataset_path;
  int port = 30000;
  int64_t num_prompts = 1000;
  int32_t input_len = 1024, output_len = 1024, vocab_size = 0, max_concurrency = 0, warmup = 1;
  double range_ratio = 0.0, timeout_s = 3600.0;
  std::string request_rate = "inf", output_file, extra_body, api_key;
  uint64_t seed = 1;
  bool output_details = false, disable_ignore_eos = false, disable_progress = false;
};

double parse_rate(const std::string& s) {
  if (s == "inf" || s == "Inf" || s == "INF") return INFINITY;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  FP4MOE_CHECK(end && *end == '\0' && !s.empty() && std::isfinite(v) && v > 0,
               "--request-rate must be a positive number or inf (got '{}')", s);
  return v;
}

int run_bench_serve(const BenchServeArgs& a) {
  bench::ClientOptions o;
  o.base_url = a.base_url.empty() ? fmt::format("http://{}:{}", a.host, a.port) : a.base_url;
  while (!o.base_url.empty() && o.base_url.back() == '/') o.base_url.pop_back();
  o.api_key = a.api_key;
  if (o.api_key.empty())
    if (const char* k = std::getenv("OPENAI_API_KEY")) o.api_key = k;
  FP4MOE_CHECK(a.backend == "openai" || a.backend == "openai-chat", "--backend must be openai or openai-chat (got '{}')",
               a.backend);
  o.chat = a.backend == "openai-chat";
  o.ignore_eos = !a.disable_ignore_eos;
  o.timeout_s = a.timeout_s;
  if (!a.extra_body.empty()) {
    o.extra_body = nlohmann::json::parse(a.extra_body, nullptr, false);
    FP4MOE_CHECK(!o.extra_body.is_discarded() && o.extra_body.is_object(),
                 "--extra-request-body must be a JSON object (got '{}')", a.extra_body);
  }
  const double rate = parse_rate(a.request_rate);
  o.model = a.model.empty() ? bench::query_model_name(o) : a.model;

  std::vector<bench::BenchPrompt> prompts;
  if (a.dataset == "random") {
    bench::RandomDatasetOptions r;
    r.num_prompts = a.num_prompts;
    r.input_len = a.input_len;
    r.output_len = a.output_len;
    r.range_ratio = a.range_ratio;
    r.seed = a.seed;
    r.vocab_size = a.vocab_size > 0 ? a.vocab_size : bench::query_vocab_size(o);
    FP4MOE_CHECK(r.vocab_size > 0, "{}/get_model_info gave no vocab_size: pass --random-vocab-size", o.base_url);
    prompts = bench::make_random_dataset(r);
  } else {
    FP4MOE_CHECK(a.dataset == "jsonl", "--dataset-name must be random or jsonl (got '{}')", a.dataset);
    FP4MOE_CHECK(!a.dataset_path.empty(), "--dataset-name jsonl needs --dataset-path FILE");
    prompts = bench::parse_jsonl_dataset(cli::read_input(a.dataset_path), a.dataset_path, a.num_prompts, a.output_len);
  }
  if (o.chat)
    for (const auto& p : prompts)
      FP4MOE_CHECK(p.prompt.is_string(), "--backend openai-chat needs text prompts (a JSONL dataset of strings)");

  std::cerr << fmt::format("bench serve: {} {} prompts ({}) to {} model '{}', request rate {}, max concurrency {}\n",
                           prompts.size(), a.dataset, o.chat ? "chat" : "completions", o.base_url, o.model,
                           a.request_rate, a.max_concurrency > 0 ? std::to_string(a.max_concurrency) : "not set");
  for (int32_t w = 0; w < a.warmup; ++w) {
    const bench::RequestResult r = bench::send_one(o, prompts[size_t(w) % prompts.size()]);
    FP4MOE_CHECK(r.success, "warm-up request failed: {}", r.error);
  }

  bench::LoadOptions l;
  l.request_rate = rate;
  l.max_concurrency = a.max_concurrency;
  l.seed = a.seed;
  l.progress = !a.disable_progress;
  const bench::RunResult run = bench::run_load(o, prompts, l);
  const bench::Summary s = bench::summarize(run, a.backend, a.dataset, rate, a.max_concurrency);
  std::cout << '\n' << bench::format_report(s) << std::flush;
  for (const std::string& e : s.errors) std::cerr << "bench serve: failed request: " << e << '\n';
  if (!a.output_file.empty()) {
    std::ofstream f(a.output_file, std::ios::app);
    FP4MOE_CHECK(f, "--output-file {}: cannot open for appending", a.output_file);
    f << bench::report_json(s, run, a.output_details).dump() << '\n';
    FP4MOE_CHECK(f.good(), "--output-file {}: write failed", a.output_file);
  }
  FP4MOE_CHECK(s.completed > 0, "no request succeeded (first error: {})", s.errors.empty() ? "none" : s.errors[0]);
  return 0;
}

void setup(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<BenchServeArgs>();
  app.add_option("--base-url", a->base_url, "server address, e.g. http://127.0.0.1:30000 (default: --host and --port)");
  app.add_option("--host", a->host, "server host when --base-url is not given (default 127.0.0.1)");
  app.add_option("--port", a->port, "server port when --base-url is not given (default 30000)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--backend", a->backend,
                 "openai: POST /v1/completions (default); openai-chat: POST /v1/chat/completions, the prompt as one user "
                 "message");
  app.add_option("--model", a->model, "model name in the requests (default: the first of GET /v1/models)");
  app.add_option("--api-key", a->api_key, "bearer token (default: $OPENAI_API_KEY)");
  app.add_option("--dataset-name", a->dataset, "random (token ids of random lengths, default) or jsonl");
  app.add_option("--dataset-path", a->dataset_path,
                 "jsonl: one {\"prompt\": \"text\" | [ids], \"output_len\": n} per line (cycled to --num-prompts)");
  app.add_option("--num-prompts", a->num_prompts, "requests to send (default 1000)")->check(CLI::PositiveNumber);
  app.add_option("--random-input-len", a->input_len, "random: prompt tokens (default 1024)")->check(CLI::PositiveNumber);
  app.add_option("--random-output-len", a->output_len,
                 "random: max_tokens (default 1024); jsonl: for lines without output_len")
      ->check(CLI::PositiveNumber);
  app.add_option("--random-range-ratio", a->range_ratio,
                 "random: lengths uniform in [len * ratio, len] (default 0.0; 1.0 = exactly len)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--random-vocab-size", a->vocab_size, "random: ids in [0, N) (default: vocab_size of GET /get_model_info)")
      ->check(CLI::PositiveNumber);
  app.add_option("--request-rate", a->request_rate, "requests per second, Poisson arrivals; inf (default): all at once");
  app.add_option("--max-concurrency", a->max_concurrency, "most requests in flight (default: no limit)")
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup-requests", a->warmup, "requests sent one by one before the measured run (default 1)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", a->seed, "seed of the random dataset and the arrival times (default 1)");
  app.add_option("--output-file", a->output_file, "append the report as one JSON line (SGLang's keys) to FILE");
  app.add_flag("--output-details", a->output_details, "with --output-file: per-request lengths, TTFTs, ITLs, errors");
  app.add_flag("--disable-ignore-eos", a->disable_ignore_eos, "let requests stop at EOS (default: ignore_eos = true)");
  app.add_option("--extra-request-body", a->extra_body, "JSON object merged into every request body");
  app.add_option("--timeout", a->timeout_s, "per-request read timeout in seconds (default 3600)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--disable-progress", a->disable_progress, "no progress bar (it is drawn only on a terminal anyway)");
  run = [a] { return run_bench_serve(*a); };
}

const cli::Registrar kRegistrar{"bench serve", "Load an OpenAI-compatible server; report throughput, TTFT, TPOT, ITL",
                                setup};

}  // namespace
}  // namespace fp4moe
