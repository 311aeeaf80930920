// bench serve: the summary of a run, printed in SGLang bench_serving's layout and as JSON.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "serve/bench_serve.hpp"

namespace fp4moe::serve::bench {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = std::clamp(p, 0.0, 100.0) / 100.0 * double(v.size() - 1);
  const size_t lo = size_t(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

namespace {

double mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
}

std::vector<double> ms(std::vector<double> v) {
  for (double& x : v) x *= 1000.0;
  return v;
}

}  // namespace

Summary summarize(const RunResult& run, const std::string& backend, const std::string& dataset, double request_rate,
                  int32_t max_concurrency) {
  Summary s;
  s.backend = backend;
  s.dataset = dataset;
  s.request_rate = request_rate;
  s.max_concurrency = max_concurrency;
  s.duration = run.duration;
  std::vector<double> e2e, ttft, tpot, itl;
  for (const RequestResult& r : run.results) {
    if (!r.success) {
      ++s.failed;
      if (s.errors.size() < 5 && std::find(s.errors.begin(), s.errors.end(), r.error) == s.errors.end())
        s.errors.push_back(r.error);
      continue;
    }
    ++s.completed;
    s.total_input += r.prompt_len;
    s.total_output += r.output_len;
    e2e.push_back(r.latency);
    ttft.push_back(r.ttft);
    if (r.output_len > 1) tpot.push_back((r.latency - r.ttft) / double(r.output_len - 1));
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
  }
  const double d = run.duration > 0 ? run.duration : 1e-9;
  s.request_throughput = double(s.completed) / d;
  s.input_throughput = double(s.total_input) / d;
  s.output_throughput = double(s.total_output) / d;
  s.total_throughput = double(s.total_input + s.total_output) / d;
  s.concurrency = std::accumulate(e2e.begin(), e2e.end(), 0.0) / d;
  e2e = ms(e2e), ttft = ms(ttft), tpot = ms(tpot), itl = ms(itl);
  s.mean_e2e_ms = mean(e2e), s.median_e2e_ms = percentile(e2e, 50), s.p99_e2e_ms = percentile(e2e, 99);
  s.mean_ttft_ms = mean(ttft), s.median_ttft_ms = percentile(ttft, 50), s.p99_ttft_ms = percentile(ttft, 99);
  s.mean_tpot_ms = mean(tpot), s.median_tpot_ms = percentile(tpot, 50), s.p99_tpot_ms = percentile(tpot, 99);
  s.mean_itl_ms = mean(itl), s.median_itl_ms = percentile(itl, 50), s.p95_itl_ms = percentile(itl, 95);
  s.p99_itl_ms = percentile(itl, 99), s.max_itl_ms = itl.empty() ? 0.0 : *std::max_element(itl.begin(), itl.end());
  return s;
}

std::string format_report(const Summary& s) {
  std::string out;
  auto title = [&](const std::string& t, char fill) {  // centred in 50 columns, the odd one on the right
    const size_t pad = t.size() < 50 ? 50 - t.size() : 0;
    out += std::string(pad / 2, fill) + t + std::string(pad - pad / 2, fill) + "\n";
  };
  auto row = [&](const char* k, const std::string& v) { out += fmt::format("{:<40} {:<10}\n", k, v); };
  auto num = [&](const char* k, double v) { row(k, fmt::format("{:.2f}", v)); };
  title(" Serving Benchmark Result ", '=');
  row("Backend:", s.backend);
  row("Traffic request rate:", std::isinf(s.request_rate) ? "inf" : fmt::format("{}", s.request_rate));
  row("Max request concurrency:", s.max_concurrency > 0 ? std::to_string(s.max_concurrency) : "not set");
  row("Successful requests:", std::to_string(s.completed));
  row("Failed requests:", std::to_string(s.failed));
  num("Benchmark duration (s):", s.duration);
  row("Total input tokens:", std::to_string(s.total_input));
  row("Total generated tokens:", std::to_string(s.total_output));
  num("Request throughput (req/s):", s.request_throughput);
  num("Input token throughput (tok/s):", s.input_throughput);
  num("Output token throughput (tok/s):", s.output_throughput);
  num("Total token throughput (tok/s):", s.total_throughput);
  num("Concurrency:", s.concurrency);
  title("End-to-End Latency", '-');
  num("Mean E2E Latency (ms):", s.mean_e2e_ms);
  num("Median E2E Latency (ms):", s.median_e2e_ms);
  num("P99 E2E Latency (ms):", s.p99_e2e_ms);
  title("Time to First Token", '-');
  num("Mean TTFT (ms):", s.mean_ttft_ms);
  num("Median TTFT (ms):", s.median_ttft_ms);
  num("P99 TTFT (ms):", s.p99_ttft_ms);
  title("Time per Output Token (excl. 1st token)", '-');
  num("Mean TPOT (ms):", s.mean_tpot_ms);
  num("Median TPOT (ms):", s.median_tpot_ms);
  num("P99 TPOT (ms):", s.p99_tpot_ms);
  title("Inter-Token Latency", '-');
  num("Mean ITL (ms):", s.mean_itl_ms);
  num("Median ITL (ms):", s.median_itl_ms);
  num("P95 ITL (ms):", s.p95_itl_ms);
  num("P99 ITL (ms):", s.p99_itl_ms);
  num("Max ITL (ms):", s.max_itl_ms);
  title("", '=');
  return out;
}

nlohmann::ordered_json report_json(const Summary& s, const RunResult& run, bool details) {
  nlohmann::ordered_json j;
  j["backend"] = s.backend;
  j["dataset_name"] = s.dataset;
  j["request_rate"] = std::isinf(s.request_rate) ? nlohmann::ordered_json("inf") : nlohmann::ordered_json(s.request_rate);
  j["max_concurrency"] = s.max_concurrency > 0 ? nlohmann::ordered_json(s.max_concurrency) : nlohmann::ordered_json();
  j["duration"] = s.duration;
  j["completed"] = s.completed;
  j["failed"] = s.failed;
  j["total_input_tokens"] = s.total_input;
  j["total_output_tokens"] = s.total_output;
  j["request_throughput"] = s.request_throughput;
  j["input_throughput"] = s.input_throughput;
  j["output_throughput"] = s.output_throughput;
  j["total_throughput"] = s.total_throughput;
  j["concurrency"] = s.concurrency;
  j["mean_e2e_latency_ms"] = s.mean_e2e_ms;
  j["median_e2e_latency_ms"] = s.median_e2e_ms;
  j["p99_e2e_latency_ms"] = s.p99_e2e_ms;
  j["mean_ttft_ms"] = s.mean_ttft_ms;
  j["median_ttft_ms"] = s.median_ttft_ms;
  j["p99_ttft_ms"] = s.p99_ttft_ms;
  j["mean_tpot_ms"] = s.mean_tpot_ms;
  j["median_tpot_ms"] = s.median_tpot_ms;
  j["p99_tpot_ms"] = s.p99_tpot_ms;
  j["mean_itl_ms"] = s.mean_itl_ms;
  j["median_itl_ms"] = s.median_itl_ms;
  j["p95_itl_ms"] = s.p95_itl_ms;
  j["p99_itl_ms"] = s.p99_itl_ms;
  j["max_itl_ms"] = s.max_itl_ms;
  j["error_messages"] = s.errors;
  if (details) {  // built apart: ordered_json's members live in a vector, references into it move
    nlohmann::ordered_json in = nlohmann::ordered_json::array(), out = in, ttfts = in, itls = in, errs = in;
    for (const RequestResult& r : run.results) {
      in.push_back(r.prompt_len);
      out.push_back(r.output_len);
      ttfts.push_back(r.ttft);
      itls.push_back(r.itl);
      errs.push_back(r.error);
    }
    j["input_lens"] = std::move(in);
    j["output_lens"] = std::move(out);
    j["ttfts"] = std::move(ttfts);
    j["itls"] = std::move(itls);
    j["errors"] = std::move(errs);
  }
  return j;
}

}  // namespace fp4moe::serve::bench
