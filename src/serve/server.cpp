// fp4moe serve: lifecycle (load, signals, graceful shutdown) and the small endpoints.
#include "serve/server.hpp"

#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/log.hpp"
#include "engine/cpu_model_backend.hpp"
#include "engine/fake_backend.hpp"
#ifdef FP4MOE_HAVE_GPU_RUNNER
#include "engine/gpu/cuda_model_backend.hpp"
#endif
#include "serve/server_impl.hpp"

namespace fp4moe::serve {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

bool needs_key(const std::string& path) { return path != "/health" && path != "/health_generate" && path != "/metrics"; }

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
    return std::make_unique<engine::CpuModelBackend>(c);
  }
  if (o.backend == "cuda") {
#ifdef FP4MOE_HAVE_GPU_RUNNER
    FP4MOE_CHECK(o.kv_cache_dtype == "auto" || o.kv_cache_dtype == "bf16",
                 "--backend cuda keeps its KV cache in bf16 (got --kv-cache-dtype {})", o.kv_cache_dtype);
    engine::gpu::CudaModelBackendOptions c;
    c.model_dir = o.model;
    auto& r = c.runner;
    r.max_requests = o.max_running_requests;
    r.max_tokens = int64_t(o.chunked_prefill_size) + o.max_running_requests;  // the scheduler's largest step
    r.max_logits_rows = o.max_running_requests;  // one sampled row per request
    r.tokens_flag = "--chunked-prefill-size";   // the memory plan's refusal names it
    // The indexer's score rows and the page tables are sized by the context: without
    // --context-length the runner takes the model's, at most kCudaDefaultContext.
    r.max_context = o.context_length > 0 ? o.context_length : kCudaDefaultContext;
    r.page_size = o.page_size;
    if (o.mem_fraction_static > 0.0) r.mem_fraction_static = o.mem_fraction_static;
    r.max_total_tokens = o.max_total_tokens;
    r.cuda_graph_max_bs = o.cuda_graph_max_bs > 0 ? o.cuda_graph_max_bs : -1;  // 0: up to --max-running-requests
    r.attention_kernels = engine::gpu::parse_attention_kernels(o.attention_kernels);
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
      http_(HttpLimits{size_t(opt_.max_body_bytes), opt_.http_request_timeout, 5, 30, 1000,
                       std::max(64, 2 * opt_.max_running_requests + 32)}) {
  served_name_ = opt_.served_model_name;
  if (served_name_.empty()) {
    const auto p = std::filesystem::path(opt_.model).lexically_normal();
    served_name_ = opt_.model.empty() ? opt_.backend : (p.filename().empty() ? p.parent_path() : p).filename().string();
  }
}

void Server::load() {
  FP4MOE_CHECK(opt_.kv_cache_dtype == "auto" || opt_.kv_cache_dtype == "bf16" || opt_.kv_cache_dtype == "fp8_e4m3" ||
                   opt_.kv_cache_dtype == "f32",
               "--kv-cache-dtype must be auto, bf16, fp8_e4m3 or f32 (got '{}')", opt_.kv_cache_dtype);
  FP4MOE_CHECK(opt_.cuda_graph_max_bs >= 0, "--cuda-graph-max-bs must be >= 0 (got {})", opt_.cuda_graph_max_bs);
  FP4MOE_CHECK(opt_.max_queued_requests >= -1, "--max-queued-requests must be >= 0 (got {})", opt_.max_queued_requests);
  FP4MOE_CHECK(opt_.context_length >= 0, "--context-length must be positive (got {})", opt_.context_length);
  FP4MOE_CHECK(opt_.backend == "fake" || !opt_.model.empty(), "--model DIR is required (except with --backend fake)");
  // The model folder's tokenizer; the fake backend without a folder uses the byte stand-in.
  const std::string tokenizer_dir = opt_.tokenizer_path.empty() ? opt_.model : opt_.tokenizer_path;
  codec_ = tokenizer_dir.empty() ? make_byte_codec() : make_hf_text_codec(tokenizer_dir);
  backend_ = make_backend(opt_, *codec_);
  backend_info_ = backend_->info();
  FP4MOE_CHECK(codec_->vocab_size() <= backend_info_.vocab_size,
               "the tokenizer's vocabulary ({} ids) is larger than the model's ({})", codec_->vocab_size(),
               backend_info_.vocab_size);
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
  sc.radix_cache = !opt_.disable_radix_cache;
  sc.context_length = context_length_;
  sc.eos_ids = codec_->eos_ids();
  engine::EngineOptions eo;
  eo.max_queued = opt_.max_queued_requests;
  eo.log_interval_rounds = opt_.decode_log_interval;
  backend_->set_observer(&metrics_);
  engine_ = std::make_unique<engine::Engine>(sc, *backend_, eo);
  log_info("serving '{}' ({} backend, tokenizer: {}) on http://{}:{}; memory plan: {}; max running {}, decode steps {}, "
           "chunked prefill {}, context {}{}{}",
           served_name_, backend_info_.name, codec_->name(), opt_.host, opt_.port, plan_.describe(),
           opt_.max_running_requests, opt_.num_continuous_decode_steps, opt_.chunked_prefill_size, context_length_,
           opt_.disable_radix_cache ? ", radix cache off" : "", opt_.api_key.empty() ? "" : ", API key required");
  if (plan_.tokens() < context_length_)
    log_warn("the KV pool ({} tokens) is smaller than the context ({}): requests are limited to {} tokens", plan_.tokens(),
             context_length_, max_request_tokens_);
}

bool Server::ready(httplib::Response& res) {
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

void Server::send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump(e.to_json()), "application/json");
}

void Server::send_json(httplib::Response& res, const json& body, int status) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void Server::routes() {
  using httplib::Request;
  using httplib::Response;
  // Before the body is read: size, chunked bodies, the API key. A refused body is left unread
  // and its connection closed.
  http_.set_pre_routing_handler([this](const Request& req, Response& res) {
    auto refuse = [&](const ApiError& e) {
      send_error(res, e);
      HttpServer::close_after_response();
      return httplib::Server::HandlerResponse::Handled;
    };
    if (req.method == "POST" || req.method == "PUT" || req.method == "PATCH") {
      if (req.has_header("Transfer-Encoding") || !req.has_header("Content-Length"))
        return refuse({411, "send the body with a Content-Length (chunked bodies are not accepted)",
                       "invalid_request_error", "", "length_required"});
      const std::string len = req.get_header_value("Content-Length");
      const bool digits = !len.empty() && len.size() <= 18 && len.find_first_not_of("0123456789") == std::string::npos;
      if (!digits) return refuse({400, "bad Content-Length", "invalid_request_error", "", ""});
      if (std::stoll(len) > opt_.max_body_bytes)
        return refuse({413, fmt::format("the request body ({} bytes) exceeds the limit of {} bytes", len, opt_.max_body_bytes),
                       "invalid_request_error", "", "request_too_large"});
    }
    if (!opt_.api_key.empty() && needs_key(req.path)) {
      const std::string auth = req.get_header_value("Authorization");
      const std::string bearer = "Bearer ";
      if (!auth.starts_with(bearer) || !same_secret(auth.substr(bearer.size()), opt_.api_key))
        return refuse({401, "Incorrect API key provided.", "authentication_error", "", "invalid_api_key"});
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Errors httplib produced itself (no route, malformed HTTP, body too large) get a JSON body too.
  http_.set_error_handler(httplib::Server::HandlerWithResponse([this](const Request& req, Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg = res.status == 404 ? fmt::format("Invalid URL ({} {})", req.method, req.path)
                      : res.status == 413 ? "the request body is too large"
                                          : fmt::format("HTTP error {}", res.status);
    res.set_content(dump(ApiError{res.status, msg, status_type(res.status), "", ""}.to_json()), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  http_.set_exception_handler([](const Request&, Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    res.status = 500;
    res.set_content(dump(ApiError{500, what, "server_error", "", ""}.to_json()), "application/json");
  });
  http_.set_logger([this](const Request& req, const Response& res) {
    if (res.status >= 400) metrics_.http_error(res.status);
    if (opt_.log_requests) log_info("{} {} {}", req.method, req.path, res.status);
  });

  http_.Post("/v1/chat/completions", [this](const Request& q, Response& r) { handle_generation(ApiKind::kChat, q, r); });
  http_.Post("/v1/completions", [this](const Request& q, Response& r) { handle_generation(ApiKind::kCompletion, q, r); });
  http_.Post("/generate", [this](const Request& q, Response& r) { handle_generation(ApiKind::kGenerate, q, r); });

  http_.Get("/health", [this](const Request&, Response& res) {
    if (ready(res)) res.status = 200;
  });
  http_.Get("/health_generate", [this](const Request&, Response& res) { health_generate(res); });
  http_.Get("/metrics", [this](const Request&, Response& res) {
    const bool loaded = loaded_.load();  // set once engine_ is
    const bool up = loaded && state_ == State::kReady && !engine_->failed();
    const engine::EngineStats st = loaded ? engine_->stats() : engine::EngineStats{};
    res.set_content(metrics_.render(st, up), "text/plain; version=0.0.4");
  });
  http_.Get("/v1/models", [this](const Request&, Response& res) {
    if (!ready(res)) return;
    send_json(res, {{"object", "list"},
                    {"data", json::array({{{"id", served_name_}, {"object", "model"}, {"created", int64_t(std::time(nullptr))},
                                           {"owned_by", "fp4moe"}, {"root", opt_.model}, {"max_model_len", context_length_}}})}});
  });
  http_.Get("/get_model_info", [this](const Request&, Response& res) {
    if (!ready(res)) return;
    send_json(res, {{"model_path", opt_.model},
                    {"tokenizer_path", opt_.tokenizer_path.empty() ? opt_.model : opt_.tokenizer_path},
                    {"is_generation", true},
                    {"served_model_name", served_name_}, {"backend", backend_info_.name},
                    {"tokenizer", codec_->name()}, {"context_length", context_length_},
                    {"vocab_size", codec_->vocab_size()}, {"eos_token_ids", codec_->eos_ids()}});
  });
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
  });
  http_.Post("/tokenize", [this](const Request& req, Response& res) {
    if (!ready(res)) return;
    auto parsed = parse_tokenize_request(req.body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
    const TokenizeRequest& t = std::get<TokenizeRequest>(parsed);
    std::vector<int32_t> ids;
    try {
      ids = t.messages.is_null() ? codec_->encode(t.text, true)
                                 : codec_->encode(codec_->render_chat(t.messages, t.add_generation_prompt), false);
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
    const auto flush_until = Clock::now() + 5s;  // let the handlers send their last bytes
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
    log_warn("cannot listen on {}:{} ({})", opt_.host, opt_.port, std::strerror(errno));
    FP4MOE_FAIL("cannot listen on {}:{}", opt_.host, opt_.port);
  }
  std::atomic<bool> listen_ended{false};
  std::thread listener([this, &listen_ended] {
    http_.listen_after_bind();
    listen_ended = true;
  });
  std::thread signals([this, set] {
    int sig = 0;
    sigwait(&set, &sig);
    if (sig == SIGUSR1) return;
    log_info("received {}", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    graceful_shutdown();
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
    // stop() does nothing until the listener runs, and a quick load failure can come first.
    while (!listen_ended) {
      http_.stop();
      std::this_thread::sleep_for(5ms);
    }
    pthread_kill(signals.native_handle(), SIGUSR1);
  }
  listener.join();
  if (rc == 0) pthread_kill(signals.native_handle(), SIGUSR1);  // listen ended on its own
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
