// Prometheus text-format metrics: request/token counters, the engine's gauges, and histograms
// of time to first token, inter-token latency, end-to-end latency, the running batch per model
// step and tokens per expert per MoE GEMM (fed through engine::StepObserver).
//
// Tokens per expert per MoE GEMM: every grouped GEMM reports its per-expert token counts;
// fp4moe_moe_expert_tokens is their histogram over (GEMM, expert) pairs, zeros included, and
// the two gauges are running means since start: over all experts (= tokens x top_k / experts)
// and over the experts that got at least one token (the M of the GEMMs that ran).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/backend.hpp"
#include "engine/engine.hpp"

namespace fp4moe::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value, uint64_t count = 1);
  // Many values under one lock.
  void observe_all(std::span<const int32_t> values);
  // Appends the _bucket / _sum / _count lines.
  void render(std::string& out, const std::string& name, const std::string& help) const;
  uint64_t count() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> buckets_;  // per bound, not cumulative; the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics : public engine::StepObserver {
 public:
  Metrics();
  void on_step(int32_t requests, int32_t tokens) override;
  void on_moe_gemm(int32_t layer, std::span<const int32_t> tokens_per_expert) override;
  void on_speculative(int32_t drafted, int32_t accepted, int32_t emitted) override;

  void request_started() { ++requests_; }
  void request_finished(engine::FinishReason reason, int32_t prompt_tokens, int32_t cached_tokens,
                        int32_t completion_tokens);
  void http_error(int status);

  Histogram ttft{{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}};
  Histogram itl{{0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                 1, 2.5}};
  Histogram e2e{{0.01, 0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480}};
  Histogram expert_tokens{{0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192}};
  Histogram step_requests{{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096}};
  // Tokens one request's draft/verify round emitted (accepted drafts + 1, unless a stop or max_tokens cut it).
  Histogram spec_accept_length{{1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 17}};
  Histogram step_tokens{{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}};

  std::string render(const engine::EngineStats& engine, bool healthy) const;

 private:
  std::atomic<uint64_t> requests_{0};
  std::array<std::atomic<uint64_t>, kFinishReasons> finished_{};  // by FinishReason
  std::atomic<uint64_t> prompt_tokens_{0}, cached_tokens_{0}, generation_tokens_{0}, moe_gemms_{0};
  std::atomic<uint64_t> spec_drafted_{0}, spec_accepted_{0}, spec_rounds_{0};
  std::atomic<uint64_t> moe_routed_{0}, moe_experts_{0}, moe_active_experts_{0};
  mutable std::mutex errors_mu_;
  std::map<int, uint64_t> http_errors_;
};

}  // namespace fp4moe::serve
