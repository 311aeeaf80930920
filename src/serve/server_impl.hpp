// The server's parts shared by server.cpp (lifecycle, small endpoints) and
// generation_handlers.cpp (chat / completions / generate).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/backend.hpp"
#include "engine/engine.hpp"
#include "engine/memory_plan.hpp"
#include "grammar/grammar.hpp"
#include "serve/api_request.hpp"
#include "serve/chat_output_parser.hpp"
#include "serve/choice_output.hpp"
#include "serve/http_server.hpp"
#include "serve/metrics.hpp"
#include "serve/server.hpp"
#include "serve/text_codec.hpp"

namespace fp4moe::serve {

using Clock = std::chrono::steady_clock;

// The backend's step observer, passed through, noting when the last model step finished:
// /health_generate answers from it while the engine is working (as SGLang does).
class StepClock : public engine::StepObserver {
 public:
  explicit StepClock(engine::StepObserver& inner) : inner_(inner) {}
  void on_step(int32_t requests, int32_t tokens) override {
    last_ns_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    inner_.on_step(requests, tokens);
  }
  void on_speculative(int32_t drafted, int32_t accepted, int32_t emitted) override {
    inner_.on_speculative(drafted, accepted, emitted);
  }
  void on_moe_gemm(int32_t layer, std::span<const int32_t> tokens_per_expert) override {
    inner_.on_moe_gemm(layer, tokens_per_expert);
  }
  // Time since the last step (a large value before the first).
  Clock::duration since_last_step() const {
    const int64_t t = last_ns_.load(std::memory_order_relaxed);
    return t == 0 ? Clock::duration::max() : Clock::now() - Clock::time_point(Clock::duration(t));
  }

 private:
  engine::StepObserver& inner_;
  std::atomic<int64_t> last_ns_{0};
};

// /health_generate's own generation: one at a time, its result reused for a while, so that
// unauthenticated callers cannot drive the engine.
struct HealthProbe {
  std::mutex mu;
  std::condition_variable cv;
  bool running = false;
  Clock::time_point finished_at{};  // of the last probe
  int status = 0;                   // its result: 200, or the 503 it gave
  std::string message;
};

// One generation request in flight (all its choices).
struct GenerationCall {
  ApiRequest request;
  std::string id;
  int64_t created = 0;
  std::shared_ptr<engine::OutputChannel> channel = std::make_shared<engine::OutputChannel>();
  std::vector<uint64_t> engine_ids;      // per choice
  std::vector<ChoiceOutput> choices;
  std::vector<int32_t> prompt_of;        // choice -> prompt index
  std::vector<int32_t> prompt_tokens;    // per prompt
  std::vector<uint8_t> cancel_sent, started;
  std::vector<int64_t> text_offset;      // completions logprobs: per choice
  std::vector<Clock::time_point> last_token;
  Clock::time_point start = Clock::now();
  int32_t finished = 0;
  bool role_sent = false;
  // chat: what runs over each choice's text (--reasoning-parser / --tool-call-parser and the
  // request's fields), and each streamed choice's parser state.
  ChatParsing parsing;
  std::vector<ChatStreamParser> stream_parsers;
  bool parsed() const { return parsing.reasoning || parsing.tool_calls; }
  std::atomic<int>* active = nullptr;    // the server's count of calls in flight
  ~GenerationCall() {
    if (active) --*active;
  }
  bool done() const { return finished == int32_t(choices.size()); }
};

// glibc's mmap and trim thresholds fixed at 4 MiB (generation_handlers.cpp says why); Server's
// constructor calls it, once per process at start-up.
void fix_malloc_thresholds();

class Server {
 public:
  explicit Server(ServeOptions options);
  int run();

 private:
  enum class State { kLoading, kReady, kDraining, kFailed };

  void load();
  void routes();
  void graceful_shutdown();
  bool ready(http::Response& res);  // else sends 503
  void send_error(http::Response& res, const ApiError& e);
  void send_json(http::Response& res, const nlohmann::json& body, int status = 200);
  bool authorized(const http::Request& req) const;

  // generation_handlers.cpp
  void handle_generation(ApiKind kind, const http::Request& req, http::Response& res);
  std::optional<ApiError> tool_choice_grammar_for(const ApiRequest& r, const ChatParsing& parsing, grammar::GrammarPtr& out);
  void pump(GenerationCall& call, std::chrono::milliseconds wait,
            const std::function<void(int32_t, ChoiceDelta&)>& on_delta);
  void abandon(GenerationCall& call);  // the client left: cancel and drain
  nlohmann::json full_response(const GenerationCall& call) const;
  std::string stream_chunks(GenerationCall& call, int32_t index, const ChoiceDelta& delta);
  std::string stream_end(GenerationCall& call);
  nlohmann::json logprobs_json(const GenerationCall& call, int32_t index, const std::vector<engine::GeneratedToken>& t,
                               int64_t& text_offset) const;
  nlohmann::json usage_json(const GenerationCall& call) const;
  nlohmann::json generate_object(const GenerationCall& call, int32_t index) const;
  void health_generate(http::Response& res);
  int run_health_probe(std::string& message);  // one real generation: 200 or 503

  ServeOptions opt_;
  ParserFlags parser_flags_;  // --reasoning-parser, --tool-call-parser
  std::string served_name_;
  HttpServer http_;
  Metrics metrics_;
  StepClock step_clock_{metrics_};
  HealthProbe health_probe_;
  std::unique_ptr<TextCodec> codec_;
  std::unique_ptr<engine::Backend> backend_;
  std::unique_ptr<engine::Engine> engine_;
  engine::MemoryPlan plan_;
  engine::BackendInfo backend_info_;
  // Structured output: compiles (and caches) request grammars for this vocabulary; null when the
  // backend's sampler applies no token masks (constrained requests are then a 400).
  std::unique_ptr<grammar::Compiler> grammar_;
  int32_t context_length_ = 0;
  int32_t speculative_steps_ = 0;  // --speculative-num-steps when --speculative-algorithm is on, else 0
  int32_t spec_disable_by_batch_size_ = 0;  // --speculative-disable-by-batch-size (0: speculate at every batch size)
  int32_t max_request_tokens_ = 0;  // min(context, KV pool)
  std::atomic<State> state_{State::kLoading};
  std::atomic<bool> loaded_{false};
  std::atomic<int> active_calls_{0};
  std::string load_error_;
};

}  // namespace fp4moe::serve
