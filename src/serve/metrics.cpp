#include "serve/metrics.hpp"

#include <fmt/format.h>

namespace fp4moe::serve {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), buckets_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value, uint64_t count) {
  size_t b = 0;
  while (b < bounds_.size() && value > bounds_[b]) ++b;
  std::lock_guard<std::mutex> lock(mu_);
  buckets_[b] += count;
  sum_ += value * double(count);
  count_ += count;
}

void Histogram::observe_all(std::span<const int32_t> values) {
  std::vector<uint64_t> local(buckets_.size(), 0);
  double sum = 0;
  for (int32_t v : values) {
    size_t b = 0;
    while (b < bounds_.size() && double(v) > bounds_[b]) ++b;
    ++local[b];
    sum += double(v);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t b = 0; b < local.size(); ++b) buckets_[b] += local[b];
  sum_ += sum;
  count_ += values.size();
}

uint64_t Histogram::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  std::lock_guard<std::mutex> lock(mu_);
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t b = 0; b < bounds_.size(); ++b) {
    cum += buckets_[b];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[b], cum);
  }
  cum += buckets_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, sum_, name, count_);
}

Metrics::Metrics() = default;

void Metrics::on_step(int32_t requests, int32_t tokens) {
  step_requests.observe(double(requests));
  step_tokens.observe(double(tokens));
}

void Metrics::on_moe_gemm(int32_t, std::span<const int32_t> tokens_per_expert) {
  ++moe_gemms_;
  uint64_t routed = 0, active = 0;
  for (int32_t t : tokens_per_expert) routed += uint64_t(t), active += t > 0;
  moe_routed_ += routed;
  moe_experts_ += tokens_per_expert.size();
  moe_active_experts_ += active;
  expert_tokens.observe_all(tokens_per_expert);
}

void Metrics::on_speculative(int32_t drafted, int32_t accepted, int32_t emitted) {
  spec_drafted_ += uint64_t(drafted);
  spec_accepted_ += uint64_t(accepted);
  ++spec_rounds_;
  spec_accept_length.observe(double(emitted));
}

void Metrics::request_finished(engine::FinishReason reason, int32_t prompt_tokens, int32_t cached_tokens,
                               int32_t completion_tokens) {
  ++finished_[size_t(reason)];
  prompt_tokens_ += uint64_t(prompt_tokens);
  cached_tokens_ += uint64_t(cached_tokens);
  generation_tokens_ += uint64_t(completion_tokens);
}

void Metrics::http_error(int status) {
  std::lock_guard<std::mutex> lock(errors_mu_);
  ++http_errors_[status];
}

std::string Metrics::render(const engine::EngineStats& s, bool healthy) const {
  std::string out;
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
  };
  auto seconds = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {:.6f}\n", name, help, name, name, v);
  };
  auto gauge = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
  };
  counter("fp4moe_requests_total", "Generation requests received (choices count once per HTTP request).", requests_);
  out += "# HELP fp4moe_request_finished_total Choices finished, by finish reason.\n"
         "# TYPE fp4moe_request_finished_total counter\n";
  for (auto r : {engine::FinishReason::kStop, engine::FinishReason::kLength, engine::FinishReason::kAbort})
    out += fmt::format("fp4moe_request_finished_total{{finished_reason=\"{}\"}} {}\n", engine::finish_reason_name(r),
                       finished_[size_t(r)].load());
  counter("fp4moe_prompt_tokens_total", "Prompt tokens of finished choices.", prompt_tokens_);
  counter("fp4moe_cached_prompt_tokens_total", "Prompt tokens served from the prefix cache.", cached_tokens_);
  counter("fp4moe_generation_tokens_total", "Tokens generated for finished choices.", generation_tokens_);
  counter("fp4moe_prefill_computed_tokens_total", "Tokens the engine computed in prefill chunks (recomputation included).",
          uint64_t(s.prefill_tokens));
  counter("fp4moe_engine_cached_tokens_total", "Prompt tokens the scheduler took from the prefix cache (every admission).",
          uint64_t(s.cached_tokens));
  counter("fp4moe_retractions_total", "Requests retracted for lack of KV pages and requeued.", uint64_t(s.retractions));
  counter("fp4moe_engine_rounds_total", "Scheduling rounds.", uint64_t(s.rounds));
  counter("fp4moe_engine_steps_total", "Model steps (a K-step decode round counts K).", uint64_t(s.steps));
  seconds("fp4moe_engine_busy_seconds_total",
          "Wall time of the engine thread's busy iterations (admission, the round, handing events to HTTP threads).",
          s.busy_seconds);
  seconds("fp4moe_engine_backend_seconds_total",
          "Wall time inside the backend's step / decode calls; busy minus this is the engine's host work.",
          s.backend_seconds);
  counter("fp4moe_spec_verify_steps_total", "Speculative decoding: draft/verify rounds, per request.", spec_rounds_);
  counter("fp4moe_spec_draft_tokens_total", "Speculative decoding: draft tokens proposed by the MTP layer.", spec_drafted_);
  counter("fp4moe_spec_accepted_tokens_total", "Speculative decoding: draft tokens the target accepted.", spec_accepted_);
  counter("fp4moe_spec_disabled_rounds_total",
          "Speculative decoding: decode rounds run as one plain step because the batch held more than "
          "--speculative-disable-by-batch-size requests.",
          uint64_t(s.spec_disabled_rounds));
  counter("fp4moe_moe_gemms_total", "Grouped MoE GEMMs the backend reported.", moe_gemms_);
  {
    std::lock_guard<std::mutex> lock(errors_mu_);
    out += "# HELP fp4moe_http_errors_total HTTP error responses, by status.\n# TYPE fp4moe_http_errors_total counter\n";
    for (auto& [status, n] : http_errors_) out += fmt::format("fp4moe_http_errors_total{{status=\"{}\"}} {}\n", status, n);
  }
  gauge("fp4moe_num_running_requests", "Requests in the running batch.", s.running);
  gauge("fp4moe_num_queued_requests", "Requests waiting for admission.", s.queued);
  gauge("fp4moe_kv_pages_total", "KV cache pages in the pool.", s.pages_total);
  gauge("fp4moe_kv_pages_used", "KV pages referenced by requests.", s.pages_used);
  gauge("fp4moe_kv_pages_cached", "KV pages held only by the prefix cache (evictable).", s.pages_cached);
  gauge("fp4moe_kv_pages_free", "KV pages on the free list.", s.pages_free);
  gauge("fp4moe_kv_usage_ratio", "Share of KV pages referenced by requests.",
        s.pages_total ? double(s.pages_used) / s.pages_total : 0.0);
  gauge("fp4moe_healthy", "1 when the engine can serve.", healthy ? 1 : 0);
  const double routed = double(moe_routed_.load()), experts = double(moe_experts_.load()),
               active = double(moe_active_experts_.load());
  gauge("fp4moe_moe_tokens_per_expert_mean", "Mean tokens per expert per grouped MoE GEMM since start (all experts).",
        experts > 0 ? routed / experts : 0.0);
  gauge("fp4moe_moe_tokens_per_active_expert_mean",
        "Mean tokens per expert per grouped MoE GEMM since start, over experts with at least one token.",
        active > 0 ? routed / active : 0.0);
  ttft.render(out, "fp4moe_time_to_first_token_seconds", "Time from request arrival to its first token.");
  itl.render(out, "fp4moe_inter_token_latency_seconds", "Time between consecutive tokens of a choice.");
  e2e.render(out, "fp4moe_e2e_request_latency_seconds", "Time from request arrival to its last token.");
  expert_tokens.render(out, "fp4moe_moe_expert_tokens", "Tokens routed to one expert in one grouped MoE GEMM.");
  spec_accept_length.render(out, "fp4moe_spec_accept_length",
                            "Speculative decoding: tokens one request's draft/verify round emitted.");
  step_requests.render(out, "fp4moe_step_batch_requests", "Requests in one model step (the running batch).");
  step_tokens.render(out, "fp4moe_step_batch_tokens", "Tokens computed in one model step.");
  return out;
}

}  // namespace fp4moe::serve
