// fp4moe serve: lifecycle (load, signals, graceful shutdown) and the small endpoints.
#include "serve/server.hpp"

#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/log.hpp"
#include "backend/cpu/cpu_model_backend.hpp"
#include "engine/decode_capacity.hpp"
#include "backend/fake/fake_backend.hpp"
#ifdef FP4MOE_HAVE_GPU_RUNNER
#include "backend/cuda/cuda_model_backend.hpp"
#endif
#include "serve/parser_routes.hpp"
#include "serve/server_impl.hpp"

namespace fp4moe::serve {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() != b.size();
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i)
    diff |= uint8_t(i < a.size() ? a[i] : 0) ^ uint8_t(i < b.size() ? b[i] : 0);
  return diff == 0;
}

const char* status_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// After the engine is idle at SIGTERM, the handlers get this long to hand their last bytes to
// clients; one that does not read them is then cut off.
constexpr int kShutdownFlushMs = 2000;

// --backend cuda without --context-length: the model's positions, at most this many.
constexpr int32_t kCudaDefaultContext = 32768;

std::unique_ptr<engine::Backend> make_backend(const ServeOptions& o, const TextCodec& codec) {
  if (o.backend == "fake") {
    engine::FakeBackendOptions f;
    f.vocab_size = codec.vocab_size();
    f.eos_id = codec.eos_ids().empty() ? -1 : codec.eos_ids()[0];
    f.eos_period = o.fake_eos_period;
    f.step_delay_us = o.fake_step_delay_us;
    f.fail_after_steps = o.fake_fail_after_steps;
    f.uniform_logits = o.fake_uniform_logits;
    if (!o.fake_script.empty()) {
      const std::vector<int32_t> marker = codec.encode("<|assistant|>", false);
      FP4MOE_CHECK(marker.size() == 1, "--fake-script needs a tokenizer with an <|assistant|> token");
      f.script_marker = marker[0];
      f.script = codec.encode(o.fake_script, false);
    }
    f.max_context = 1 << 20;
    if (o.fake_load_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.fake_load_delay_ms));
    return std::make_unique<engine::FakeBackend>(f);
  }
  if (o.backend == "cpu") {
    engine::CpuModelBackendOptions c;
    c.model_dir = o.model;
    c.kv_elem = o.kv_cache_dtype == "f32"        ? KvElem::F32
                : o.kv_cache_dtype == "fp8_e4m3" ? KvElem::FP8_E4M3
                                                 : KvElem::BF16;
    c.speculative_steps = engine::speculative_steps(o.speculative, o.backend, o.num_continuous_decode_steps);
    c.quantize_draft_experts = c.speculative_steps > 0 && engine::quantize_draft_experts(o.speculative, true);
    return std::make_unique<engine::CpuModelBackend>(c);
  }
  if (o.backend == "cuda") {
#ifdef FP4MOE_HAVE_GPU_RUNNER
    engine::gpu::CudaModelBackendOptions c;
    c.model_dir = o.model;
    auto& r = c.runner;
    r.kv_elem = engine::gpu::parse_kv_cache_dtype(o.kv_cache_dtype);  // f32 refused: the CPU reference's
    r.max_requests = o.max_running_requests;
    r.max_tokens = int64_t(o.chunked_prefill_size) + o.max_running_requests;  // the scheduler's largest step
    r.max_logits_rows = o.max_running_requests;  // one sampled row per request
    r.tokens_flag = "--chunked-prefill-size";   // the memory plan's refusal names it
    // The indexer's score rows and the page tables are sized by the context: without
    // --context-length the runner takes the model's, at most kCudaDefaultContext.
    r.max_context = o.context_length > 0 ? o.context_length : kCudaDefaultContext;
    // The KV need: at least one request of that context (the plan's smallest pool, RunnerOptions::
    // kv_needs empty); the tokens per step are --chunked-prefill-size's, never lowered (min_tokens 0).
    r.page_size = o.page_size;
    if (o.mem_fraction_static > 0.0) r.mem_fraction_static = o.mem_fraction_static;
    r.max_total_tokens = o.max_total_tokens;
    r.cuda_graph_max_bs = o.cuda_graph_max_bs > 0 ? o.cuda_graph_max_bs : -1;  // 0: up to --max-running-requests
    r.attention_kernels = engine::gpu::parse_attention_kernels(o.attention_kernels);
    c.speculative_steps = engine::speculative_steps(o.speculative, o.backend, o.num_continuous_decode_steps);
    r.quantize_mtp_experts = c.speculative_steps > 0 && engine::quantize_draft_experts(o.speculative, true);
    // Sized so that every round the scheduler makes runs on the device: K steps per call, and
    // each request's stop ids (the API's most plus the EOS ids) — engine/decode_capacity.hpp.
    const engine::DecodeCapacity cap = engine::serve_decode_capacity(o.num_continuous_decode_steps, codec.eos_ids().size());
    r.max_decode_steps = std::max(cap.max_steps, engine::gpu::RunnerOptions{}.max_decode_steps);  // the plan as before up to 16
    r.max_stop_ids = cap.max_stop_ids;
    return std::make_unique<engine::gpu::CudaModelBackend>(c);
#else
    FP4MOE_FAIL("--backend cuda: this fp4moe was built without CUDA; --backend cpu runs the model on the host");
#endif
  }
  FP4MOE_FAIL("--backend must be cpu, cuda or fake (got '{}')", o.backend);
}

}  // namespace

Server::Server(ServeOptions options)
    : opt_(std::move(options)),
      http_([&] {
        HttpLimits l;
        l.max_body_bytes = size_t(opt_.max_body_bytes);
        l.request_timeout_s = opt_.http_request_timeout;
        l.threads = std::max(64, 2 * opt_.max_running_requests + 32);
        l.max_connections = opt_.http_max_connections;
        // Requests beyond the workers wait for one (as they did for cpp-httplib's pool): the
        // connection limit and the body budget bound them; the engine's queue has its own flag.
        l.max_waiting = opt_.http_max_connections;
        l.max_connections_per_client = opt_.http_max_connections_per_client;
        return l;
      }()) {
  fix_malloc_thresholds();
  served_name_ = opt_.served_model_name;
  if (served_name_.empty()) {
    const auto p = std::filesystem::path(opt_.model).lexically_normal();
    served_name_ = opt_.model.empty() ? opt_.backend : (p.filename().empty() ? p.parent_path() : p).filename().string();
  }
}

void Server::load() {
  const std::string parser_error = parse_parser_flags(opt_.reasoning_parser, opt_.tool_call_parser, parser_flags_);
  FP4MOE_CHECK(parser_error.empty(), "{}", parser_error);
  FP4MOE_CHECK(opt_.kv_cache_dtype == "auto" || opt_.kv_cache_dtype == "bf16" || opt_.kv_cache_dtype == "fp8_e4m3" ||
                   opt_.kv_cache_dtype == "f32",
               "--kv-cache-dtype must be auto, bf16, fp8_e4m3 or f32 (got '{}')", opt_.kv_cache_dtype);
  FP4MOE_CHECK(opt_.cuda_graph_max_bs >= 0, "--cuda-graph-max-bs must be >= 0 (got {})", opt_.cuda_graph_max_bs);
  FP4MOE_CHECK(opt_.max_queued_requests >= -1, "--max-queued-requests must be >= 0 (got {})", opt_.max_queued_requests);
  FP4MOE_CHECK(opt_.context_length >= 0, "--context-length must be positive (got {})", opt_.context_length);
  FP4MOE_CHECK(opt_.backend == "fake" || !opt_.model.empty(), "--model DIR is required (except with --backend fake)");
  speculative_steps_ = engine::speculative_steps(opt_.speculative, opt_.backend, opt_.num_continuous_decode_steps);
  (void)engine::quantize_draft_experts(opt_.speculative, speculative_steps_ > 0);  // its value's and its need's errors
  spec_disable_by_batch_size_ = engine::speculative_disable_by_batch_size(opt_.speculative, speculative_steps_ > 0);
  // The model folder's tokenizer; the fake backend without a folder uses the byte stand-in.
  const std::string tokenizer_dir = opt_.tokenizer_path.empty() ? opt_.model : opt_.tokenizer_path;
  codec_ = tokenizer_dir.empty() ? make_byte_codec() : make_hf_text_codec(tokenizer_dir);
  backend_ = make_backend(opt_, *codec_);
  backend_info_ = backend_->info();
  FP4MOE_CHECK(codec_->vocab_size() <= backend_info_.vocab_size,
               "the tokenizer's vocabulary ({} ids) is larger than the model's ({})", codec_->vocab_size(),
               backend_info_.vocab_size);
  if (backend_info_.applies_token_masks) {
    grammar::Vocab gv;
    gv.vocab_size = backend_info_.vocab_size;
    gv.stop_ids = codec_->eos_ids();
    gv.token_bytes.resize(size_t(codec_->vocab_size()));
    for (int32_t id = 0; id < codec_->vocab_size(); ++id)
      if (!codec_->is_special(id)) gv.token_bytes[size_t(id)] = codec_->token_text(id);
    grammar_ = std::make_unique<grammar::Compiler>(gv);
    grammar_->warm_up();  // the token masks every JSON schema shares, before the first request
  }
  engine::MemoryPlanRequest mr;
  mr.page_size = opt_.page_size;
  mr.max_total_tokens = opt_.max_total_tokens;
  mr.mem_fraction_static = opt_.mem_fraction_static;
  plan_ = engine::plan_memory(backend_info_, mr);
  const int32_t model_context = backend_info_.name == "fake" ? 8192 : backend_info_.max_context;
  FP4MOE_CHECK(opt_.context_length <= backend_info_.max_context,
               "--context-length {} exceeds the model's {} positions", opt_.context_length, backend_info_.max_context);
  context_length_ = opt_.context_length > 0 ? opt_.context_length : model_context;
  max_request_tokens_ = int32_t(std::min<int64_t>(context_length_, plan_.tokens()));
  FP4MOE_CHECK(max_request_tokens_ >= 2, "the KV pool ({} tokens) cannot hold a request", plan_.tokens());

  engine::SchedulerConfig sc;
  sc.page_size = plan_.page_size;
  sc.num_pages = plan_.num_pages;
  sc.max_running = opt_.max_running_requests;
  sc.chunked_prefill_size = opt_.chunked_prefill_size;
  sc.decode_steps = opt_.num_continuous_decode_steps;
  sc.speculative_tokens = speculative_steps_ > 0 ? speculative_steps_ + 1 : 0;
  sc.speculative_disable_by_batch_size = spec_disable_by_batch_size_;
  sc.radix_cache = !opt_.disable_radix_cache;
  sc.context_length = context_length_;
  sc.eos_ids = codec_->eos_ids();
  engine::EngineOptions eo;
  eo.max_queued = opt_.max_queued_requests;
  eo.log_interval_rounds = opt_.decode_log_interval;
  backend_->set_observer(&step_clock_);
  engine_ = std::make_unique<engine::Engine>(sc, *backend_, eo);
  log_info("serving '{}' ({} backend, tokenizer: {}) on http://{}:{}; memory plan: {}; max running {}, decode steps {}, "
           "chunked prefill {}, context {}{}{}{}",
           served_name_, backend_info_.name, codec_->name(), opt_.host, opt_.port, plan_.describe(),
           opt_.max_running_requests, opt_.num_continuous_decode_steps, opt_.chunked_prefill_size, context_length_,
           opt_.disable_radix_cache ? ", radix cache off" : "", opt_.api_key.empty() ? "" : ", API key required",
           speculative_steps_ > 0 ? fmt::format(", speculative NEXTN {} steps (MTP layer KV in the pool)", speculative_steps_)
                                  : "");
  if (plan_.tokens() < context_length_)
    log_warn("the KV pool ({} tokens) is smaller than the context ({}): requests are limited to {} tokens", plan_.tokens(),
             context_length_, max_request_tokens_);
}

bool Server::ready(http::Response& res) {
  switch (state_.load()) {
    case State::kReady:
      if (!engine_->failed()) return true;
      send_error(res, {503, "the engine failed: " + engine_->failure(), "server_error", "", "service_unavailable"});
      return false;
    case State::kLoading:
      send_error(res, {503, "the model is loading", "server_error", "", "service_unavailable"});
      return false;
    case State::kDraining:
      send_error(res, {503, "the server is shutting down", "server_error", "", "service_unavailable"});
      return false;
    case State::kFailed: break;
  }
  send_error(res, {503, "the server failed to start: " + load_error_, "server_error", "", "service_unavailable"});
  return false;
}

void Server::send_error(http::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump(e.to_json()), "application/json");
}

void Server::send_json(http::Response& res, const json& body, int status) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

bool Server::authorized(const http::Request& req) const {
  if (opt_.api_key.empty() || req.path == "/health" || req.path == "/health_generate") return true;
  if (req.path == "/metrics" && opt_.metrics_allow_unauthenticated) return true;
  // "Bearer" is case-insensitive (RFC 9110 auth-scheme); one or more spaces before the token.
  const std::string auth = req.get_header_value("Authorization");
  if (auth.size() < 7 || !http::iequals(std::string_view(auth).substr(0, 6), "bearer") || auth[6] != ' ') return false;
  const size_t token = auth.find_first_not_of(' ', 6);
  return token != std::string::npos && same_secret(auth.substr(token), opt_.api_key);
}

void Server::routes() {
  using http::Request;
  using http::Response;
  // On the I/O thread, before the body is read (the HTTP layer has already refused malformed
  // requests, chunked bodies, a missing Content-Length and bodies over the limit).
  http_.set_head_check([this](const Request& req, Response& res) {
    if (authorized(req)) return false;
    send_error(res, {401, "Incorrect API key provided.", "authentication_error", "", "invalid_api_key"});
    return true;
  });
  // Errors the HTTP layer produces itself get an OpenAI error body too.
  http_.set_error_body([](int status, const std::string& message, Response& res) {
    res.status = status;
    res.set_content(dump(ApiError{status, message, status_type(status), "", ""}.to_json()), "application/json");
  });
  http_.set_logger([this](const Request& req, const Response& res) {
    if (res.status >= 400) metrics_.http_error(res.status);
    if (opt_.log_requests) log_info("{} {} {}", req.method.empty() ? "-" : req.method, req.path, res.status);
  });

  http_.Post("/v1/chat/completions", [this](const Request& q, Response& r) { handle_generation(ApiKind::kChat, q, r); });
  http_.Post("/v1/completions", [this](const Request& q, Response& r) { handle_generation(ApiKind::kCompletion, q, r); });
  http_.Post("/generate", [this](const Request& q, Response& r) { handle_generation(ApiKind::kGenerate, q, r); });
  // SGLang's /parse_function_call and /separate_reasoning need no model: not gated on ready().
  register_parser_routes(
      http_, [this](Response& r, const json& j) { send_json(r, j); }, [this](Response& r, const ApiError& e) { send_error(r, e); });

  // Cheap GETs run on the I/O thread: they answer in milliseconds whatever the workers do.
  constexpr bool kOnIoThread = true;
  http_.Get("/health", [this](const Request&, Response& res) {
    if (ready(res)) res.status = 200;
  }, kOnIoThread);
  http_.Get("/health_generate", [this](const Request&, Response& res) { health_generate(res); });
  http_.Get("/metrics", [this](const Request&, Response& res) {
    const bool loaded = loaded_.load();  // set once engine_ is
    const bool up = loaded && state_ == State::kReady && !engine_->failed();
    const engine::EngineStats st = loaded ? engine_->stats() : engine::EngineStats{};
    res.set_content(metrics_.render(st, up), "text/plain; version=0.0.4");
  }, kOnIoThread);
  http_.Get("/v1/models", [this](const Request&, Response& res) {
    if (!ready(res)) return;
    send_json(res, {{"object", "list"},
                    {"data", json::array({{{"id", served_name_}, {"object", "model"}, {"created", int64_t(std::time(nullptr))},
                                           {"owned_by", "fp4moe"}, {"root", opt_.model}, {"max_model_len", context_length_}}})}});
  }, kOnIoThread);
  http_.Get("/get_model_info", [this](const Request&, Response& res) {
    if (!ready(res)) return;
    send_json(res, {{"model_path", opt_.model},
                    {"tokenizer_path", opt_.tokenizer_path.empty() ? opt_.model : opt_.tokenizer_path},
                    {"is_generation", true},
                    {"served_model_name", served_name_}, {"backend", backend_info_.name},
                    {"tokenizer", codec_->name()}, {"context_length", context_length_},
                    {"vocab_size", codec_->vocab_size()}, {"eos_token_ids", codec_->eos_ids()}});
  }, kOnIoThread);
  http_.Get("/get_server_info", [this](const Request&, Response& res) {
    if (!ready(res)) return;
    const engine::EngineStats st = engine_->stats();
    send_json(res, {{"version", FP4MOE_VERSION},
                    {"model_path", opt_.model},
                    {"tokenizer_path", opt_.tokenizer_path.empty() ? opt_.model : opt_.tokenizer_path},
                    {"served_model_name", served_name_},
                    {"backend", opt_.backend},
                    {"host", opt_.host},
                    {"port", opt_.port},
                    {"max_running_requests", opt_.max_running_requests},
                    {"num_continuous_decode_steps", opt_.num_continuous_decode_steps},
                    {"speculative_algorithm", speculative_steps_ > 0 ? json(opt_.speculative.algorithm) : json(nullptr)},
                    {"speculative_num_steps", speculative_steps_ > 0 ? json(speculative_steps_) : json(nullptr)},
                    {"speculative_eagle_topk", speculative_steps_ > 0 ? json(1) : json(nullptr)},
                    {"speculative_num_draft_tokens", speculative_steps_ > 0 ? json(speculative_steps_ + 1) : json(nullptr)},
                    {"speculative_draft_model_quantization",
                     speculative_steps_ > 0 ? json(opt_.speculative.draft_model_quantization.value_or("nvfp4")) : json(nullptr)},
                    {"speculative_disable_by_batch_size",
                     spec_disable_by_batch_size_ > 0 ? json(spec_disable_by_batch_size_) : json(nullptr)},
                    {"chunked_prefill_size", opt_.chunked_prefill_size},
                    {"max_total_tokens", plan_.tokens()},
                    {"mem_fraction_static", plan_.mem_fraction_static},
                    {"page_size", plan_.page_size},
                    {"cuda_graph_max_bs", opt_.cuda_graph_max_bs > 0 ? opt_.cuda_graph_max_bs : opt_.max_running_requests},
                    {"context_length", context_length_},
                    {"max_queued_requests", opt_.max_queued_requests},
                    {"disable_radix_cache", opt_.disable_radix_cache},
                    {"kv_cache_dtype", opt_.kv_cache_dtype},
                    {"api_key_required", !opt_.api_key.empty()},
                    {"memory_plan",
                     {{"summary", plan_.describe()},
                      {"weight_bytes", plan_.weight_bytes},
                      {"workspace_bytes", plan_.workspace_bytes},
                      {"kv_bytes", plan_.kv_bytes},
                      {"kv_bytes_per_token", plan_.kv_bytes_per_token},
                      {"kv_pages", plan_.num_pages},
                      {"device_bytes", plan_.device_bytes}}},
                    {"internal_states",
                     {{"running", st.running}, {"queued", st.queued}, {"kv_pages_used", st.pages_used},
                      {"kv_pages_cached", st.pages_cached}, {"kv_pages_free", st.pages_free}}}});
  }, kOnIoThread);
  http_.Post("/tokenize", [this](const Request& req, Response& res) {
    if (!ready(res)) return;
    auto parsed = parse_tokenize_request(req.body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
    const TokenizeRequest& t = std::get<TokenizeRequest>(parsed);
    std::vector<int32_t> ids;
    try {
      ids = t.chat.messages.is_null() ? codec_->encode(t.text, true) : codec_->encode(codec_->render_chat(t.chat), false);
    } catch (const Error& e) {
      return send_error(res, {400, e.what(), "invalid_request_error", "messages", ""});
    }
    send_json(res, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", context_length_}});
  });
  http_.Post("/detokenize", [this](const Request& req, Response& res) {
    if (!ready(res)) return;
    auto parsed = parse_detokenize_request(req.body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
    const auto& ids = std::get<std::vector<int32_t>>(parsed);
    for (int32_t t : ids)
      if (t >= codec_->vocab_size())
        return send_error(res, {400, fmt::format("token id {} is outside the vocabulary (size {})", t, codec_->vocab_size()),
                                "invalid_request_error", "tokens", ""});
    const std::string text = codec_->decode(ids, false);
    send_json(res, {{"text", text}, {"prompt", text}});
  });
  http_.Post("/flush_cache", [this](const Request&, Response& res) {
    if (!ready(res)) return;
    send_json(res, {{"message", "Cache flushed."}, {"freed_pages", engine_->flush_cache()}});
  });
}

void Server::graceful_shutdown() {
  // Idle and half-received connections close now; every later response closes its connection.
  http_.drain();
  const State was = state_.exchange(State::kDraining);
  if (loaded_ && was == State::kReady) {
    engine_->stop_accepting();
    const auto st = engine_->stats();
    log_info("shutting down: {} running, {} queued; waiting up to {} s", st.running, st.queued,
             opt_.graceful_shutdown_timeout);
    const auto until = Clock::now() + std::chrono::seconds(opt_.graceful_shutdown_timeout);
    while (engine_->busy() && Clock::now() < until) std::this_thread::sleep_for(10ms);
    if (engine_->busy()) {
      log_info("shutting down: aborting what is left");
      engine_->abort_all("the server is shutting down");
    }
    // Let the handlers send their last bytes; a client that does not read them is cut off
    // after this (stop() fails its blocked write).
    const auto flush_until = Clock::now() + std::chrono::milliseconds(kShutdownFlushMs);
    while (active_calls_ > 0 && Clock::now() < flush_until) std::this_thread::sleep_for(10ms);
  }
  http_.stop();
}

int Server::run() {
  // Signals are taken by one thread with sigwait; every other thread blocks them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGUSR1);  // internal: stop the signal thread
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  routes();
  if (!http_.bind(opt_.host, opt_.port)) {
    const std::string why = std::strerror(errno);
    FP4MOE_FAIL("cannot listen on {}:{} ({})", opt_.host, opt_.port, why);
  }
  std::thread listener([this] { http_.run(); });
  // The first SIGTERM / SIGINT drains (on its own thread, so that a second one is seen); the
  // second exits at once.
  std::thread signals([this, set] {
    std::thread drainer;
    for (;;) {
      int sig = 0;
      sigwait(&set, &sig);
      if (sig == SIGUSR1) break;
      const char* name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
      if (drainer.joinable()) {
        std::fprintf(stderr, "fp4moe: second %s: exiting now without draining\n", name);
        std::_Exit(1);
      }
      log_info("received {}", name);
      drainer = std::thread([this] { graceful_shutdown(); });
    }
    if (drainer.joinable()) drainer.join();
  });
  int rc = 0;
  try {
    load();
    loaded_ = true;
    State loading = State::kLoading;  // a SIGTERM during loading keeps it draining
    state_.compare_exchange_strong(loading, State::kReady);
  } catch (const std::exception& e) {
    load_error_ = e.what();
    state_ = State::kFailed;
    std::fprintf(stderr, "fp4moe: %s\n", e.what());
    rc = 1;
    http_.stop();
  }
  listener.join();
  pthread_kill(signals.native_handle(), SIGUSR1);
  signals.join();
  if (engine_) engine_->shutdown();
  if (rc == 0) log_info("stopped");
  return rc;
}

int run_serve(const ServeOptions& options) {
  Server server(options);
  return server.run();
}

}  // namespace fp4moe::serve
