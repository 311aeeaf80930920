// One request through an Engine, waited for to its end: `fp4moe generate` is this client of the
// same Engine, scheduler and backends as `serve` (tests use it the same way). The rows a request
// asks back (RequestSpec::dump) come in its events by position and are assembled here into
// generate's dump layouts.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/backend.hpp"
#include "engine/engine.hpp"
#include "engine/request.hpp"

namespace fp4moe::engine {

struct OneRequestResult {
  std::vector<int32_t> tokens;              // prompt + generated
  int64_t prompt_tokens = 0;
  std::vector<GeneratedToken> generated;    // with logprobs when asked
  FinishReason reason = FinishReason::kLength;
  Usage usage;
  // Wall seconds: submit -> the end of the first model step (the prefill and the first sample),
  // and from there to the end of the last step (the decode steps), on the engine thread's clock
  // when the backend's observer is a OneRequestObserver given to run_one_request (else when the
  // events reach this thread, which a loaded machine delays).
  double prefill_seconds = 0.0, decode_seconds = 0.0;
  // kDumpLogits: [tokens - 1, vocab]: row i = the next-token logits after the first i + 1 tokens.
  std::vector<float> logits;
  // kDumpHidden: hidden_states 0 .. L, each [prompt, hidden] (0: embeddings, L: after the final norm).
  std::vector<std::vector<float>> hidden;
  // kDumpMtpLogits: [prompt - 1, vocab]: row i = the MTP layer's logits given the target's hidden
  // state at prompt position i and prompt token i + 1.
  std::vector<float> mtp_logits;
};

class OneRequestObserver;

// Submits spec and waits for its finish. A refusal (queue full, engine stopped) or an aborted
// request throws fp4moe::Error with the engine's reason (one line); so does a dump asked for and
// not delivered whole. observer: the engine's backend's observer (set before the engine started),
// for the step times; null: timed on this thread.
OneRequestResult run_one_request(Engine& engine, RequestSpec spec, const OneRequestObserver* observer = nullptr);

// The scheduler configuration of an engine that runs one request of `prompt_tokens` +
// `max_new_tokens` (pages for exactly that, the whole prompt in one prefill step, one running
// request, no prefix cache, one decode step per round, or N + 1 tokens per speculative round).
SchedulerConfig one_request_config(int64_t prompt_tokens, int64_t max_new_tokens, int32_t page_size,
                                   int32_t speculative_steps);

// The backend's observer for a one-request run (engine thread): when the first and the last model
// step ended, and the speculative rounds (StepObserver::on_speculative): drafts proposed and
// accepted, rounds by tokens emitted (accept_length[i]: rounds that emitted i + 1).
class OneRequestObserver : public StepObserver {
 public:
  explicit OneRequestObserver(int32_t speculative_steps = 0) : accept_length(size_t(speculative_steps) + 1, 0) {}
  void on_step(int32_t, int32_t) override {
    last_step = std::chrono::steady_clock::now();
    if (!first_step) first_step = last_step;
  }
  void on_moe_gemm(int32_t, std::span<const int32_t>) override {}
  void on_speculative(int32_t d, int32_t a, int32_t emitted) override {
    drafted += d;
    accepted += a;
    if (emitted >= 1 && size_t(emitted) <= accept_length.size()) ++accept_length[size_t(emitted) - 1];
  }
  int64_t drafted = 0, accepted = 0;
  std::vector<int64_t> accept_length;
  std::optional<std::chrono::steady_clock::time_point> first_step, last_step;
};

}  // namespace fp4moe::engine
