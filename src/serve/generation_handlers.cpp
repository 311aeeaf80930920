// POST /v1/chat/completions, /v1/completions and /generate: validate, tokenize, hand the
// choices to the engine, and answer in one JSON body or as server-sent events.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <malloc.h>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/log.hpp"
#include "serve/server_impl.hpp"
#include "serve/tool_choice_grammar.hpp"

namespace fp4moe::serve {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

std::string random_id(const char* prefix) {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), uint32_t(rng()));
}

// JSON numbers cannot be -inf: clamp like vLLM does.
double finite_logprob(float lp) { return std::isfinite(lp) ? double(lp) : -9999.0; }

json byte_list(const std::string& s) {
  json b = json::array();
  for (char c : s) b.push_back(int(uint8_t(c)));
  return b;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

// Memory back to the system after large requests: glibc keeps freed heap pages (a 30 MB
// body's copies, a prompt's ids, a response's JSON document) resident, and its mmap threshold
// grows to the largest block freed, so even big buffers land on the heap after the first.
// malloc_trim(0) returns the free pages. A large request asks for it when it ends; the trim
// runs 1 s after the last such request (once the response is written and the stream closed),
// on its own thread — never after every request, since trimming walks the whole heap.
constexpr size_t kLargeBodyBytes = size_t(8) << 20;
constexpr int64_t kLargeLogprobEntries = 1 << 16;  // ~64 MB of response document

void trim_heap_soon() {
  struct Trimmer {
    std::mutex mu;
    std::condition_variable cv;
    bool pending = false;
    Trimmer() {
      std::thread([this] {
        std::unique_lock<std::mutex> lock(mu);
        for (;;) {
          cv.wait(lock, [this] { return pending; });
          do {  // until 1 s passes with no new request for a trim
            pending = false;
            lock.unlock();
            std::this_thread::sleep_for(1s);
            lock.lock();
          } while (pending);
          lock.unlock();
          malloc_trim(0);
          lock.lock();
        }
      }).detach();
    }
  };
  static Trimmer* trimmer = new Trimmer;  // never destroyed: its thread runs until the process exits
  {
    std::lock_guard<std::mutex> lock(trimmer->mu);
    trimmer->pending = true;
  }
  trimmer->cv.notify_one();
}

// Calls trim_heap_soon() when it goes out of scope, if armed.
struct TrimOnExit {
  bool armed = false;
  ~TrimOnExit() {
    if (armed) trim_heap_soon();
  }
};

uint64_t mix_seed(uint64_t seed, uint64_t choice) {
  uint64_t x = seed + 0x9E3779B97F4A7C15ull * (choice + 1);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 27);
}

}  // namespace

// glibc raises its mmap threshold to the largest block freed (up to 32 MiB) and its trim
// threshold with it, so after one large request every later buffer under 32 MiB lands on an
// arena heap whose free top (up to 64 MiB per thread arena) malloc_trim leaves resident.
// Fixed thresholds keep blocks of 4 MiB and more on mmap (returned on free) and trim heap tops
// past 4 MiB (with 16 MiB, 4 threads kept ~40 MB after four 30 MB prompts; bench serve on the
// CPU backend measured the same tokens/s either way). Set once, by Server's constructor: at
// start-up, before the model's and any request's allocations.
void fix_malloc_thresholds() {
  mallopt(M_MMAP_THRESHOLD, 4 << 20);
  mallopt(M_TRIM_THRESHOLD, 4 << 20);
}

// tool_choice "required" / a named function: the tool-call format's grammar, compiled; or the
// 400 that says why this server cannot hold the output to it.
std::optional<ApiError> Server::tool_choice_grammar_for(const ApiRequest& r, const ChatParsing& parsing,
                                                        grammar::GrammarPtr& out) {
  const std::string choice =
      r.tool_choice == ToolChoice::kRequired ? "'tool_choice': 'required'" : "'tool_choice' naming a function";
  auto refused = [&](std::string param, std::string message) {
    return ApiError{400, std::move(message), "invalid_request_error", std::move(param), ""};
  };
  if (r.constraint)
    return refused(r.constraint->param, fmt::format("{} and '{}' both constrain the output: give one of them", choice,
                                                    r.constraint->param));
  if (!parser_flags_.tool_calls)
    return refused("tool_choice", fmt::format("{} needs the server to run with --tool-call-parser (the output is held "
                                              "to that parser's tool-call format)",
                                              choice));
  if (!grammar_)
    return refused("tool_choice", fmt::format("{} is not supported by the {} backend: its sampler does not apply "
                                              "grammar masks yet",
                                              choice, backend_info_.name));
  ToolChoiceGrammarRequest q;
  q.format = *parser_flags_.tool_calls;
  q.tools = &r.tools;
  q.named = r.tool_choice == ToolChoice::kNamed ? r.tool_choice_name : std::string();
  q.parallel_tool_calls = r.parallel_tool_calls;
  q.reasoning_open = parsing.reasoning && parsing.reasoning_starts_open;
  auto spec = tool_choice_grammar(q);
  if (auto* e = std::get_if<FieldError>(&spec)) return refused(e->param, e->message);
  try {
    out = grammar_->compile(std::get<grammar::GrammarSpec>(spec));
  } catch (const grammar::GrammarError& e) {
    return refused("tools", fmt::format("{}: the tools' grammar: {}", choice, e.what()));
  }
  return std::nullopt;
}

void Server::handle_generation(ApiKind kind, const http::Request& req, http::Response& res) {
  if (!ready(res)) return;
  TrimOnExit trim{req.body.size() >= kLargeBodyBytes};  // refused or not, a large body leaves garbage
  auto parsed = parse_api_request(kind, req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
  auto call = std::make_shared<GenerationCall>();
  ApiRequest& r = call->request;
  r = std::move(std::get<ApiRequest>(parsed));
  if (!r.model.empty() && r.model != served_name_) {
    ApiError e{404, fmt::format("The model '{}' does not exist (this server serves '{}')", r.model, served_name_),
               "invalid_request_error", "model", "model_not_found"};
    return send_error(res, e);
  }
  // Structured output: the grammar compiled (or found in the cache) for this vocabulary.
  grammar::GrammarPtr grammar;
  if (r.constraint) {
    const std::string& param = r.constraint->param;
    if (!grammar_)
      return send_error(res, {400,
                              fmt::format("'{}' is not supported by the {} backend: its sampler does not apply grammar "
                                          "masks yet",
                                          param, backend_info_.name),
                              "invalid_request_error", param, ""});
    try {
      grammar = grammar_->compile(r.constraint->spec);
    } catch (const grammar::GrammarError& e) {
      return send_error(res, {400, fmt::format("'{}': {}", param, e.what()), "invalid_request_error", param, ""});
    }
  }

  // Prompts -> token ids, checked against the vocabulary and the context. A text that cannot
  // fit is refused on its byte length before it is encoded (text_codec.hpp, max_bytes_per_token).
  const char* prompt_param = kind == ApiKind::kChat ? "messages" : kind == ApiKind::kGenerate ? "input_ids" : "prompt";
  const char* max_param = kind == ApiKind::kGenerate ? "max_new_tokens" : "max_tokens";
  auto context_error = [&](int64_t len, int64_t want, size_t bytes) {  // bytes > 0: len is a lower bound from them
    const std::string prompt =
        bytes ? fmt::format("the prompt's {} bytes are at least {} tokens, as a token stands for at most {} bytes", bytes,
                            len, codec_->max_bytes_per_token())
              : fmt::format("{} in the prompt", len);
    return ApiError{400,
                    fmt::format("This model's maximum context length is {} tokens. However, you requested {}{} tokens "
                                "({}, {} for the completion). Please reduce the length of the prompt or the completion.",
                                max_request_tokens_, bytes ? "at least " : "", len + want, prompt, want),
                    "invalid_request_error", r.max_tokens ? max_param : prompt_param, "context_length_exceeded"};
  };
  const int64_t min_want = std::max<int64_t>(r.max_tokens.value_or(1), 1);
  auto fits_by_bytes = [&](size_t bytes) -> std::optional<ApiError> {
    const size_t per = codec_->max_bytes_per_token();
    if (per == 0) return std::nullopt;
    const int64_t least = int64_t((bytes + per - 1) / per);
    if (least + min_want > max_request_tokens_) return context_error(least, min_want, bytes);
    return std::nullopt;
  };
  std::vector<std::vector<int32_t>> prompts;
  if (kind == ApiKind::kChat) {
    std::string text;
    try {
      text = codec_->render_chat(r.chat);
    } catch (const Error& e) {  // the template refused the conversation (raise_exception), or there is none
      return send_error(res, {400, e.what(), "invalid_request_error", "messages", ""});
    }
    if (auto e = fits_by_bytes(text.size())) return send_error(res, *e);
    prompts.push_back(codec_->encode(text, false));
    std::shared_ptr<const ToolCatalog> catalog;
    if (parser_flags_.tool_calls && r.tools.is_array() && !r.tools.empty()) {
      auto tools = ToolCatalog::from_json(r.tools);
      if (auto* e = std::get_if<FieldError>(&tools)) return send_error(res, {400, e->message, "invalid_request_error", e->param, ""});
      catalog = std::make_shared<const ToolCatalog>(std::move(std::get<ToolCatalog>(tools)));
    }
    call->parsing = chat_parsing(parser_flags_, r.separate_reasoning, r.chat.kwargs, text, std::move(catalog),
                                 r.tool_choice == ToolChoice::kNone);
    if (r.tool_choice == ToolChoice::kRequired || r.tool_choice == ToolChoice::kNamed) {
      if (auto e = tool_choice_grammar_for(r, call->parsing, grammar)) return send_error(res, *e);
    }
  } else {
    for (const PromptInput& p : r.prompts)
      if (!p.is_ids)
        if (auto e = fits_by_bytes(p.text.size())) return send_error(res, *e);
    for (const PromptInput& p : r.prompts) prompts.push_back(p.is_ids ? p.ids : codec_->encode(p.text, true));
  }
  const int32_t vocab = codec_->vocab_size();
  for (const auto& ids : prompts) {
    if (ids.empty()) return send_error(res, {400, "the prompt is empty", "invalid_request_error", prompt_param, ""});
    for (int32_t t : ids)
      if (t >= vocab)
        return send_error(res, {400, fmt::format("token id {} is outside the vocabulary (size {})", t, vocab),
                                "invalid_request_error", prompt_param, ""});
  }
  for (int32_t t : r.stop_ids)
    if (t >= vocab)
      return send_error(res, {400, fmt::format("stop token id {} is outside the vocabulary (size {})", t, vocab),
                              "invalid_request_error", "stop_token_ids", ""});
  std::vector<int32_t> max_new(prompts.size());
  int64_t logprob_entries = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const int64_t len = int64_t(prompts[p].size());
    const int64_t want = r.max_tokens ? *r.max_tokens : kind == ApiKind::kCompletion ? 16 : max_request_tokens_ - len;
    if (len + std::max<int64_t>(want, 1) > max_request_tokens_)
      return send_error(res, context_error(len, std::max<int64_t>(want, 1), 0));
    max_new[p] = int32_t(want);
    logprob_entries += int64_t(want) * r.n * (r.logprobs + 1);
  }
  // The response's size: every logprob entry is built into the answer (api_request.hpp).
  if (r.logprobs >= 0 && logprob_entries > kMaxLogprobEntries) {
    const char* lp_param = kind == ApiKind::kGenerate ? "top_logprobs_num"
                           : kind == ApiKind::kChat   ? (r.logprobs > 0 ? "top_logprobs" : "logprobs")
                                                      : "logprobs";
    return send_error(res, {400,
                            fmt::format("n x {} x ({} + 1) = {} logprob entries; at most {} per request: lower n, {} "
                                        "or {}",
                                        max_param, lp_param, logprob_entries, kMaxLogprobEntries, max_param, lp_param),
                            "invalid_request_error", lp_param, ""});
  }
  const bool large = trim.armed || (r.logprobs >= 0 && logprob_entries >= kLargeLogprobEntries);
  trim.armed = large;  // a non-streamed answer trims after its handler; a stream when it closes (below)

  // One engine request per (prompt, choice).
  std::vector<engine::RequestSpec> specs;
  for (size_t p = 0; p < prompts.size(); ++p) {
    call->prompt_tokens.push_back(int32_t(prompts[p].size()));
    for (int32_t j = 0; j < r.n; ++j) {
      engine::RequestSpec s;
      s.prompt = prompts[p];
      s.sampling = r.sampling;
      if (s.sampling.has_seed && specs.size() > 0) s.sampling.seed = mix_seed(r.sampling.seed, specs.size());
      s.max_new_tokens = max_new[p];
      s.stop_ids = r.stop_ids;
      s.ignore_eos = r.ignore_eos;
      s.sampling.logprobs_top_n = r.logprobs;
      s.grammar = grammar;
      specs.push_back(std::move(s));
      call->prompt_of.push_back(int32_t(p));
      call->choices.emplace_back(*codec_, r.stop, r.skip_special_tokens);
      if (r.stream && call->parsed()) call->stream_parsers.emplace_back(call->parsing);
    }
  }
  const size_t n = specs.size();
  call->cancel_sent.assign(n, 0);
  call->started.assign(n, 0);
  call->text_offset.assign(n, 0);
  call->last_token.assign(n, call->start);
  call->id = random_id(kind == ApiKind::kChat ? "chatcmpl-" : kind == ApiKind::kCompletion ? "cmpl-" : "");
  call->created = int64_t(std::time(nullptr));
  switch (engine_->submit(std::move(specs), call->channel, call->engine_ids)) {
    case engine::Engine::Submit::kOk: break;
    case engine::Engine::Submit::kQueueFull:
      return send_error(res, {429, fmt::format("the queue is full ({} requests wait); retry later", opt_.max_queued_requests),
                              "rate_limit_error", "", "queue_full"});
    case engine::Engine::Submit::kStopped:
      return send_error(res, {503, "the server is not accepting requests (shutting down or failed)", "server_error", "",
                              "service_unavailable"});
  }
  metrics_.request_started();
  ++active_calls_;
  call->active = &active_calls_;

  if (!r.stream) {
    while (!call->done()) {
      pump(*call, 100ms, nullptr);
      if (!call->done() && !HttpServer::client_connected()) return abandon(*call);
    }
    if (opt_.log_requests)
      log_info("request {}: {} choices, {} prompt tokens, {} completion tokens, {:.1f} ms", call->id, n,
               usage_json(*call)["prompt_tokens"].get<int64_t>(), usage_json(*call)["completion_tokens"].get<int64_t>(),
               std::chrono::duration<double, std::milli>(Clock::now() - call->start).count());
    return send_json(res, full_response(*call));
  }

  trim.armed = false;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, call](size_t, http::DataSink& sink) {
        std::string out;
        if (call->request.kind == ApiKind::kChat && !call->role_sent) {
          call->role_sent = true;
          for (int32_t i = 0; i < int32_t(call->choices.size()); ++i) {
            json chunk = {{"id", call->id}, {"object", "chat.completion.chunk"}, {"created", call->created},
                          {"model", served_name_},
                          {"choices", json::array({{{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                                                    {"logprobs", nullptr}, {"finish_reason", nullptr}}})}};
            if (call->request.include_usage) chunk["usage"] = nullptr;
            out += sse(chunk);
          }
        }
        pump(*call, 50ms, [&](int32_t i, ChoiceDelta& d) { out += stream_chunks(*call, i, d); });
        if (call->done()) out += stream_end(*call);
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          abandon(*call);
          return false;
        }
        if (call->done()) {
          sink.done();
          return true;
        }
        if (!sink.is_writable()) {
          abandon(*call);
          return false;
        }
        return true;
      },
      [this, call, large](bool) {
        if (!call->done()) abandon(*call);
        if (large) trim_heap_soon();
      });
}

void Server::pump(GenerationCall& call, std::chrono::milliseconds wait,
                  const std::function<void(int32_t, ChoiceDelta&)>& on_delta) {
  std::vector<engine::OutputChannel::Item> items;
  call.channel->wait(items, wait);
  const auto now = Clock::now();
  for (auto& item : items) {
    const int32_t i = item.index;
    ChoiceOutput& choice = call.choices[size_t(i)];
    const size_t n_tokens = item.event.tokens.size();
    ChoiceDelta d = choice.consume(item.event);
    if (n_tokens > 0) {
      const double dt = std::chrono::duration<double>(now - call.last_token[size_t(i)]).count();
      size_t rest = n_tokens;
      if (!call.started[size_t(i)]) {
        call.started[size_t(i)] = 1;
        metrics_.ttft.observe(std::chrono::duration<double>(now - call.start).count());
        --rest;
      }
      if (rest > 0) metrics_.itl.observe(dt / double(n_tokens), rest);
      call.last_token[size_t(i)] = now;
    }
    if (choice.stop_matched() && !call.cancel_sent[size_t(i)] && !d.finished) {
      call.cancel_sent[size_t(i)] = 1;
      engine_->cancel({&call.engine_ids[size_t(i)], 1});
    }
    if (d.finished) {
      ++call.finished;
      const engine::Usage& u = choice.usage();
      metrics_.request_finished(choice.stop_matched() ? engine::FinishReason::kStop : item.event.reason,
                                u.prompt_tokens, u.cached_tokens, u.completion_tokens);
      metrics_.e2e.observe(std::chrono::duration<double>(now - call.start).count());
    }
    if (on_delta && (d.finished || !d.text.empty() || !d.tokens.empty())) on_delta(i, d);
  }
}

void Server::abandon(GenerationCall& call) {
  engine_->cancel(call.engine_ids);
  const auto until = Clock::now() + 5s;  // the engine aborts within a round; count the finishes
  while (!call.done() && Clock::now() < until) pump(call, 50ms, nullptr);
  if (opt_.log_requests) log_info("request {}: client disconnected, cancelled", call.id);
}

json Server::logprobs_json(const GenerationCall& call, int32_t, const std::vector<engine::GeneratedToken>& toks,
                           int64_t& offset) const {
  if (call.request.kind == ApiKind::kChat) {
    json content = json::array();
    for (const auto& t : toks) {
      const std::string s = codec_->token_text(t.id);
      json top = json::array();
      for (const auto& c : t.top) {
        const std::string cs = codec_->token_text(c.id);
        top.push_back({{"token", cs}, {"logprob", finite_logprob(c.logprob)}, {"bytes", byte_list(cs)}});
      }
      content.push_back({{"token", s}, {"logprob", finite_logprob(t.logprob)}, {"bytes", byte_list(s)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const auto& t : toks) {
    const std::string s = codec_->token_text(t.id);
    tokens.push_back(s);
    lps.push_back(finite_logprob(t.logprob));
    json top = json::object();
    for (const auto& c : t.top) top[codec_->token_text(c.id)] = finite_logprob(c.logprob);
    tops.push_back(top);
    offsets.push_back(offset);
    offset += int64_t(s.size());
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json Server::usage_json(const GenerationCall& call) const {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (int32_t p : call.prompt_tokens) prompt += p;
  std::vector<int32_t> cached_per_prompt(call.prompt_tokens.size(), 0);
  for (size_t i = 0; i < call.choices.size(); ++i) {
    completion += call.choices[i].usage().completion_tokens;
    auto& c = cached_per_prompt[size_t(call.prompt_of[i])];
    c = std::max(c, call.choices[i].usage().cached_tokens);
  }
  for (int32_t c : cached_per_prompt) cached += c;
  json u = {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  if (speculative_steps_ > 0) {  // the draft/verify rounds of every choice (SGLang's meta_info spec_verify_ct)
    int64_t verify = 0;
    for (const auto& c : call.choices) verify += c.usage().spec_verify_steps;
    u["spec_verify_ct"] = verify;
  }
  return u;
}

json Server::generate_object(const GenerationCall& call, int32_t i) const {
  const ChoiceOutput& c = call.choices[size_t(i)];
  json ids = json::array();
  json lps = json::array(), tops = json::array();
  for (const auto& t : c.tokens()) {
    ids.push_back(t.id);
    if (call.request.logprobs >= 0) {
      lps.push_back(json::array({finite_logprob(t.logprob), t.id, nullptr}));
      json top = json::array();
      for (const auto& x : t.top) top.push_back(json::array({finite_logprob(x.logprob), x.id, nullptr}));
      tops.push_back(top);
    }
  }
  json meta = {{"id", fmt::format("{}-{}", call.id, i)},
               {"prompt_tokens", call.prompt_tokens[size_t(call.prompt_of[size_t(i)])]},
               {"completion_tokens", int64_t(c.tokens().size())},
               {"cached_tokens", c.usage().cached_tokens},
               {"e2e_latency", std::chrono::duration<double>(Clock::now() - call.start).count()}};
  if (speculative_steps_ > 0) meta["spec_verify_ct"] = c.usage().spec_verify_steps;
  meta["finish_reason"] = c.finished() ? json{{"type", c.finish_reason()}, {"matched", c.matched()}} : json(nullptr);
  if (c.finished() && !c.abort_message().empty()) meta["finish_reason"]["message"] = c.abort_message();
  if (call.request.logprobs >= 0) {
    meta["output_token_logprobs"] = lps;
    meta["output_top_logprobs"] = tops;
  }
  return {{"text", c.text()}, {"output_ids", ids}, {"meta_info", meta}, {"index", i}};
}

json Server::full_response(const GenerationCall& call) const {
  const ApiRequest& r = call.request;
  if (r.kind == ApiKind::kGenerate) {
    if (call.choices.size() == 1 && r.prompts.size() == 1) return generate_object(call, 0);
    json all = json::array();
    for (int32_t i = 0; i < int32_t(call.choices.size()); ++i) all.push_back(generate_object(call, i));
    return all;
  }
  json choices = json::array();
  for (int32_t i = 0; i < int32_t(call.choices.size()); ++i) {
    const ChoiceOutput& c = call.choices[size_t(i)];
    int64_t offset = 0;
    json lp = r.logprobs >= 0 ? logprobs_json(call, i, c.tokens(), offset) : json(nullptr);
    if (r.kind == ApiKind::kChat && call.parsed()) {
      ChatMessageParts parts = parse_chat_output(call.parsing, c.text());
      if (!r.parallel_tool_calls && parts.tool_calls.size() > 1) parts.tool_calls.resize(1);  // the first call only
      choices.push_back({{"index", i},
                         {"message", chat_message_json(call.parsing, parts)},
                         {"logprobs", lp},
                         {"finish_reason", chat_finish_reason(c.finish_reason(), !parts.tool_calls.empty())},
                         {"matched_stop", c.matched()}});
    } else if (r.kind == ApiKind::kChat) {
      choices.push_back({{"index", i},
                         {"message", {{"role", "assistant"}, {"content", c.text()}}},
                         {"logprobs", lp},
                         {"finish_reason", c.finish_reason()},
                         {"matched_stop", c.matched()}});
    } else
      choices.push_back({{"index", i}, {"text", c.text()}, {"logprobs", lp}, {"finish_reason", c.finish_reason()},
                         {"matched_stop", c.matched()}});
  }
  return {{"id", call.id},
          {"object", r.kind == ApiKind::kChat ? "chat.completion" : "text_completion"},
          {"created", call.created},
          {"model", served_name_},
          {"choices", choices},
          {"usage", usage_json(call)}};
}

std::string Server::stream_chunks(GenerationCall& call, int32_t i, const ChoiceDelta& d) {
  const ApiRequest& r = call.request;
  const ChoiceOutput& c = call.choices[size_t(i)];
  if (r.kind == ApiKind::kGenerate) return sse(generate_object(call, i));
  std::string out;
  const json lp = r.logprobs >= 0 && !d.tokens.empty() ? logprobs_json(call, i, d.tokens, call.text_offset[size_t(i)])
                                                       : json(nullptr);
  auto chunk = [&](json choice) {
    json j = {{"id", call.id},
              {"object", r.kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion"},
              {"created", call.created},
              {"model", served_name_},
              {"choices", json::array({std::move(choice)})}};
    if (r.include_usage) j["usage"] = nullptr;
    out += sse(j);
  };
  if (r.kind == ApiKind::kChat && call.parsed()) {
    // The parsers turn the text into reasoning / content / tool-call deltas (chat_output_parser.hpp);
    // the tokens' logprobs ride on the first chunk of the step (or on an empty content delta).
    ChatStreamParser& parser = call.stream_parsers[size_t(i)];
    std::vector<json> deltas = parser.push(d.text);
    if (d.finished)
      for (json& f : parser.finish()) deltas.push_back(std::move(f));
    json pending_lp = lp;
    for (json& delta : deltas) {
      if (!r.parallel_tool_calls && delta.contains("tool_calls") && delta["tool_calls"][0].value("index", 0) > 0)
        continue;  // parallel_tool_calls false: the first call only
      chunk({{"index", i}, {"delta", std::move(delta)}, {"logprobs", pending_lp}, {"finish_reason", nullptr}});
      pending_lp = nullptr;
    }
    if (!pending_lp.is_null())
      chunk({{"index", i}, {"delta", {{"content", ""}}}, {"logprobs", pending_lp}, {"finish_reason", nullptr}});
  } else if (!d.text.empty() || !lp.is_null()) {
    if (r.kind == ApiKind::kChat)
      chunk({{"index", i}, {"delta", {{"content", d.text}}}, {"logprobs", lp}, {"finish_reason", nullptr}});
    else
      chunk({{"index", i}, {"text", d.text}, {"logprobs", lp}, {"finish_reason", nullptr}});
  }
  if (d.finished) {
    if (r.kind == ApiKind::kChat)
      chunk({{"index", i}, {"delta", json::object()}, {"logprobs", nullptr},
             {"finish_reason",
              call.parsed() ? chat_finish_reason(c.finish_reason(), call.stream_parsers[size_t(i)].has_tool_calls())
                            : c.finish_reason()},
             {"matched_stop", c.matched()}});
    else
      chunk({{"index", i}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", c.finish_reason()},
             {"matched_stop", c.matched()}});
  }
  return out;
}

std::string Server::stream_end(GenerationCall& call) {
  std::string out;
  const ApiRequest& r = call.request;
  if (r.kind != ApiKind::kGenerate && r.include_usage)
    out += sse({{"id", call.id},
                {"object", r.kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion"},
                {"created", call.created},
                {"model", served_name_},
                {"choices", json::array()},
                {"usage", usage_json(call)}});
  if (opt_.log_requests)
    log_info("request {}: {} choices streamed, {} completion tokens, {:.1f} ms", call.id, call.choices.size(),
             usage_json(call)["completion_tokens"].get<int64_t>(),
             std::chrono::duration<double, std::milli>(Clock::now() - call.start).count());
  return out + "data: [DONE]\n\n";
}

// A step within this long means the engine generates: no probe of our own.
constexpr auto kHealthRecentStep = std::chrono::seconds(2);
// A probe's result answers every /health_generate for this long after it.
constexpr auto kHealthProbeReuse = std::chrono::seconds(1);

void Server::health_generate(http::Response& res) {
  if (!ready(res)) return;
  // The engine finished a step moments ago and has not failed: it generates (SGLang answers
  // from its last received output the same way). Otherwise one probe runs at a time and its
  // result is reused, so unauthenticated callers cannot make the engine work.
  if (step_clock_.since_last_step() < kHealthRecentStep) return send_json(res, {{"status", "ok"}});
  HealthProbe& p = health_probe_;
  std::unique_lock<std::mutex> lock(p.mu);
  while (p.status == 0 || Clock::now() - p.finished_at >= kHealthProbeReuse) {
    if (p.running) {
      p.cv.wait(lock);
      continue;
    }
    p.running = true;
    lock.unlock();
    std::string message;
    const int status = run_health_probe(message);
    lock.lock();
    p.running = false;
    p.status = status;
    p.message = std::move(message);
    p.finished_at = Clock::now();
    p.cv.notify_all();
  }
  if (p.status == 200) return send_json(res, {{"status", "ok"}});
  send_error(res, {503, p.message, "server_error", "", "service_unavailable"});
}

int Server::run_health_probe(std::string& message) {
  engine::RequestSpec s;
  s.prompt = {0};
  s.max_new_tokens = 1;
  s.sampling.temperature = 0.0f;
  s.ignore_eos = true;
  auto channel = std::make_shared<engine::OutputChannel>();
  std::vector<uint64_t> ids;
  if (engine_->submit({s}, channel, ids) != engine::Engine::Submit::kOk) {
    message = "the engine does not accept requests";
    return 503;
  }
  const auto until = Clock::now() + 30s;
  std::vector<engine::OutputChannel::Item> items;
  int32_t tokens = 0;
  while (Clock::now() < until) {
    items.clear();
    channel->wait(items, 100ms);
    for (auto& it : items) {
      tokens += int32_t(it.event.tokens.size());
      if (it.event.finished) {
        if (tokens == 1 && it.event.reason != engine::FinishReason::kAbort) return 200;
        message = "the engine could not generate: " + it.event.abort_message;
        return 503;
      }
    }
  }
  engine_->cancel(ids);
  message = "the engine did not generate a token within 30 s";
  return 503;
}

}  // namespace fp4moe::serve
