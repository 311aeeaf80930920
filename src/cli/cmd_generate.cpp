// fp4moe generate --model DIR (--prompt-ids 1,2,3 | --prompt TEXT) --max-new-tokens N [sampling options]
//                 [--backend cpu|cuda] [--dump-logits OUT.safetensors] [--dump-hidden OUT.safetensors]
//                 [--dump-mtp-logits OUT.safetensors]
//
// A one-request client of engine::Engine (engine/one_request.hpp): the same scheduler and backends
// as `serve` (cpu: model::Model on the host; cuda: the GPU runner), with pages for exactly this
// request, the whole prompt in one prefill step, then one decode step per new token (or one
// draft/verify round with --speculative-algorithm NEXTN); the EOS ids do not stop it
// (max_new_tokens tokens always). Prints the generated ids (with --prompt: the generated text,
// through the model folder's tokenizer.json, or --tokenizer-path) and the prefill / decode tokens
// per second. The dumps are rows the backend hands back with the tokens (RequestSpec::dump):
// --dump-logits writes `tokens` I32 [P+N] and `logits` F32 [P+N-1, vocab] (row i: next-token
// logits after the first i+1 tokens; prompt rows from the prefill step, the others from the
// decode steps). --dump-hidden writes `hidden_states.{i}` F32 [P, hidden] for i = 0..L of the
// prefill step (0: embeddings, L: after the final norm). --dump-mtp-logits writes `tokens` I32 [P]
// and `mtp_logits` F32 [P-1, vocab]: row i is the MTP layer's next-next-token logits given the
// target's hidden state at prompt position i and prompt token i+1 (cpu and cuda backends).
#include <charconv>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/threads.hpp"
#include "cpu/sampling_cpu.hpp"
#include "backend/cpu/cpu_model_backend.hpp"
#include "engine/dist/parallel_options.hpp"
#include "engine/engine.hpp"
#include "engine/one_request.hpp"
#include "engine/speculative_options.hpp"
#include "format/safetensors.hpp"
#include "text/tokenizer.hpp"
#if defined(FP4MOE_HAVE_GPU_RUNNER)
#include "backend/cuda/cuda_model_backend.hpp"
#endif

namespace fp4moe::cli {
namespace {

struct GenerateArgs {
  std::string model, prompt_ids, prompt_text, tokenizer_path, backend = "cpu", dump_logits, dump_hidden, dump_mtp_logits, kv_dtype = "f32";
  int64_t max_new_tokens = 16, page_size = 16, tp = 1, ep = 1;
  int64_t indexer_score_rows = 0;  // cuda: the DSA indexer's score rows per chunk at most (0: the plan's)
  int threads = 0, logprobs = -1;
  double mem_fraction_static = 0.88;
  cpu::SamplingParams sampling{.temperature = 0.0f};  // greedy unless --temperature
  engine::SpeculativeFlags speculative;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t j = std::min(s.find(',', i), s.size());
    const std::string tok = s.substr(i, j - i);
    int64_t v = 0;
    const auto [p, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
    FP4MOE_CHECK(!tok.empty() && ec == std::errc() && p == tok.data() + tok.size() && v >= 0 && v <= INT32_MAX,
                 "--prompt-ids: '{}' is not a token id (a non-negative integer)", tok.substr(0, 40));
    ids.push_back(int32_t(v));
    i = j + 1;
  }
  return ids;
}

// The backend of `--backend`, loaded (cuda prints its start-up and memory plan lines; the cpu
// backend's one line comes once the request is checked).
std::unique_ptr<engine::Backend> make_backend(const GenerateArgs& a, int64_t prompt_tokens, int32_t speculative_steps,
                                              std::string& threads_note) {
  const bool fp8_kv = a.kv_dtype == "fp8" || a.kv_dtype == "fp8_e4m3";
  if (a.backend == "cuda") {
#if defined(FP4MOE_HAVE_GPU_RUNNER)
    engine::gpu::CudaModelBackendOptions c;
    c.model_dir = a.model;
    engine::gpu::RunnerOptions& ro = c.runner;
    const int64_t P = prompt_tokens;
    ro.max_tokens = std::max<int64_t>(P + 1, 8);  // the scheduler's largest step: the prompt + one running request
    ro.max_requests = 1;
    ro.max_context = P + a.max_new_tokens;
    ro.page_size = a.page_size;
    ro.mem_fraction_static = a.mem_fraction_static;
    ro.max_total_tokens = P + a.max_new_tokens + a.page_size;
    ro.cuda_graph_max_bs = 1;
    // One prefill step over the whole prompt (the memory plan refuses it, naming the prompt, when
    // its workspace does not fit); one logits row per step unless --dump-logits keeps every row.
    ro.max_logits_rows = a.dump_logits.empty() && a.dump_mtp_logits.empty() ? 1 : 0;
    ro.tokens_flag = "the prompt length";
    // Its KV need: one request of the prompt + the new tokens (max_context: the plan's smallest pool).
    ro.kv_flag = "--max-new-tokens or the prompt";
    ro.max_score_rows = a.indexer_score_rows;
    ro.kv_elem = fp8_kv ? KvElem::FP8_E4M3 : KvElem::BF16;
    c.speculative_steps = speculative_steps;  // the MTP layer loaded, verify rows allowed (cuda_model_backend.hpp)
    c.mtp_layer = !a.dump_mtp_logits.empty();
    ro.quantize_mtp_experts = speculative_steps > 0 && engine::quantize_draft_experts(a.speculative, true);
    if (a.kv_dtype == "f32") log_info("--backend cuda: the KV cache is BF16 (--kv-dtype f32 is the CPU's)");
    threads_note = "cuda";
    return std::make_unique<engine::gpu::CudaModelBackend>(c);  // prints its start-up and memory plan lines
#else
    FP4MOE_FAIL("--backend cuda: this fp4moe was built without CUDA");
#endif
  }
  engine::CpuModelBackendOptions c;
  c.model_dir = a.model;
  c.threads = a.threads > 0 ? a.threads : default_num_threads();
  c.kv_elem = a.kv_dtype == "f32" ? KvElem::F32 : fp8_kv ? KvElem::FP8_E4M3 : KvElem::BF16;
  c.speculative_steps = speculative_steps;
  c.mtp_layer = !a.dump_mtp_logits.empty();
  c.quantize_draft_experts = speculative_steps > 0 && engine::quantize_draft_experts(a.speculative, true);
  auto b = std::make_unique<engine::CpuModelBackend>(c);
  threads_note = fmt::format("{} threads", c.threads);
  return b;
}

int run_generate(const GenerateArgs& a) {
  FP4MOE_CHECK(a.backend == "cpu" || a.backend == "cuda", "--backend {}: cpu or cuda", a.backend);
  FP4MOE_CHECK(a.indexer_score_rows == 0 || a.backend == "cuda", "--indexer-score-rows is the cuda backend's");
  dist::require_single_gpu(a.model, {a.tp, a.ep});  // --tp 1 --ep 1: the single-GPU path, unchanged
  std::optional<text::Tokenizer> tokenizer;
  if (!a.prompt_text.empty()) tokenizer = text::Tokenizer::from_dir(a.tokenizer_path.empty() ? a.model : a.tokenizer_path);
  const std::vector<int32_t> prompt = tokenizer ? tokenizer->encode(a.prompt_text) : parse_ids(a.prompt_ids);
  FP4MOE_CHECK(!prompt.empty(), "--prompt: the text encodes to no tokens");
  cpu::SamplingParams sampling = a.sampling;
  sampling.logprobs_top_n = a.logprobs;
  cpu::validate_sampling(sampling);
  const int32_t spec_steps = engine::speculative_steps(a.speculative, a.backend, 1);
  // --speculative-draft-model-quantization: a bad value, or the flag without the MTP layer, is refused here
  (void)engine::quantize_draft_experts(a.speculative, spec_steps > 0);
  // The dumps speculative decoding cannot give: its verify steps' rows are not one per token.
  FP4MOE_CHECK(spec_steps == 0 || (a.dump_logits.empty() && a.dump_hidden.empty()),
               "--dump-logits / --dump-hidden with speculative decoding: the verify steps' rows are not one per token; "
               "dump without --speculative-algorithm");
  const int64_t P = int64_t(prompt.size()), N = a.max_new_tokens;
  FP4MOE_CHECK(a.dump_mtp_logits.empty() || P >= 2,
               "--dump-mtp-logits: the prompt has {} token(s); the MTP layer needs at least 2", P);
  FP4MOE_CHECK(P + N <= INT32_MAX / 2, "the prompt ({} tokens) + {} new tokens are too many", P, N);

  std::string threads_note;
  std::unique_ptr<engine::Backend> backend = make_backend(a, P, spec_steps, threads_note);
  const engine::BackendInfo info = backend->info();
  for (int64_t i = 0; i < P; ++i)
    FP4MOE_CHECK(prompt[size_t(i)] >= 0 && prompt[size_t(i)] < info.vocab_size,
                 "prompt token {} = {} is out of the vocabulary (0 .. {})", i, prompt[size_t(i)], info.vocab_size - 1);
  FP4MOE_CHECK(P + N <= info.max_context,
               "the prompt ({} tokens) + {} new tokens exceed the model's max_position_embeddings ({})", P, N,
               info.max_context);
  if (a.backend == "cpu")  // the one start-up line
    fmt::print(stderr, "fp4moe: {}\n", static_cast<const engine::CpuModelBackend&>(*backend).model().description());
  engine::OneRequestObserver counter(spec_steps);
  backend->set_observer(&counter);

  engine::SchedulerConfig sc = engine::one_request_config(P, N, int32_t(a.page_size), spec_steps);
  if (info.kv_pool_tokens > 0)  // the cuda runner planned its pool at load: the request's pages fit in it
    FP4MOE_CHECK(int64_t(sc.num_pages) * sc.page_size <= info.kv_pool_tokens,
                 "the request's {} KV pages of {} tokens exceed the {} backend's pool ({} tokens)", sc.num_pages,
                 sc.page_size, info.name, info.kv_pool_tokens);
  engine::EngineOptions eo;
  eo.log_interval_rounds = 0;
  engine::Engine eng(sc, *backend, eo);

  engine::RequestSpec rq;
  rq.prompt = prompt;
  rq.max_new_tokens = int32_t(N);
  rq.ignore_eos = true;  // max_new_tokens tokens, always
  rq.sampling = sampling;  // validated above
  rq.sampling.has_seed = true;
  rq.dump = uint8_t((a.dump_logits.empty() ? 0 : engine::kDumpLogits) | (a.dump_hidden.empty() ? 0 : engine::kDumpHidden) |
                    (a.dump_mtp_logits.empty() ? 0 : engine::kDumpMtpLogits));
  const engine::OneRequestResult r = engine::run_one_request(eng, std::move(rq), &counter);
  eng.shutdown();

  const int64_t vocab = info.vocab_size;
  if (!a.dump_mtp_logits.empty()) {
    SafetensorsWriter w(a.dump_mtp_logits);
    w.add("tokens", DType::I32, {P}, prompt);
    w.add("mtp_logits", DType::F32, {P - 1, vocab}, r.mtp_logits);
    w.finish();
  }
  std::string ids;
  for (size_t i = size_t(P); i < r.tokens.size(); ++i) ids += fmt::format("{}{}", ids.empty() ? "" : ",", r.tokens[i]);
  if (tokenizer) {
    const std::span<const int32_t> out(r.tokens.data() + P, r.tokens.size() - size_t(P));
    fmt::print("{}\n", tokenizer->decode(out, /*skip_special_tokens=*/true));
  } else {
    fmt::print("{}\n", ids);
  }
  if (a.logprobs >= 0)
    for (const auto& s : r.generated) {
      std::string top;
      for (const auto& t : s.top) top += fmt::format(" {}:{:.4f}", t.id, t.logprob);
      fmt::print("logprob {} {:.6f}{}\n", s.id, s.logprob, top);
    }
  const int64_t new_tokens = int64_t(r.tokens.size()) - P, decoded = new_tokens - 1;
  fmt::print(stderr, "prefill: {} tokens in {:.3f} s ({:.1f} tok/s); decode: {} tokens in {:.3f} s ({:.2f} tok/s); {}\n",
             P, r.prefill_seconds, double(P) / r.prefill_seconds, decoded, r.decode_seconds,
             decoded > 0 ? double(decoded) / r.decode_seconds : 0.0, threads_note);
  if (spec_steps > 0) {
    const int64_t rounds = r.usage.spec_verify_steps;
    model::MtpSpeculator::Times t;  // wall times of the speculator's steps (each backend's speculator keeps them)
    if (const auto* c = dynamic_cast<const engine::CpuModelBackend*>(backend.get())) t = c->speculator_times();
#if defined(FP4MOE_HAVE_GPU_RUNNER)
    if (auto* g = dynamic_cast<engine::gpu::CudaModelBackend*>(backend.get()); g && g->speculator())
      t = g->speculator()->times;
#endif
    std::string hist;
    for (size_t i = 0; i < counter.accept_length.size(); ++i)
      hist += fmt::format("{}{}:{}", i ? " " : "", i + 1, counter.accept_length[i]);
    auto per_round = [&](double s) { return rounds ? 1e3 * s / double(rounds) : 0.0; };
    fmt::print(stderr,
               "speculative NEXTN {} steps: {} verify steps ({:.3f} ms each), {} of {} drafts accepted, mean accept "
               "length {:.2f} tokens per verify step (rounds by tokens emitted: {}); per round: draft steps {:.3f} ms, "
               "verify step {:.3f} ms, MTP over the emitted tokens {:.3f} ms (the prompt's included)\n",
               spec_steps, rounds, per_round(r.decode_seconds), counter.accepted, counter.drafted,
               rounds ? double(decoded) / double(rounds) : 0.0, hist, per_round(t.draft), per_round(t.verify),
               per_round(t.mtp));
  }
  if (!a.dump_logits.empty()) {
    SafetensorsWriter w(a.dump_logits);
    w.add("tokens", DType::I32, {int64_t(r.tokens.size())}, r.tokens);
    w.add("logits", DType::F32, {int64_t(r.tokens.size()) - 1, vocab}, r.logits);
    w.finish();
  }
  if (!a.dump_hidden.empty()) {
    SafetensorsWriter w(a.dump_hidden);
    const int64_t hidden_size = r.hidden.empty() ? 0 : int64_t(r.hidden[0].size()) / P;
    for (size_t i = 0; i < r.hidden.size(); ++i)
      w.add(fmt::format("hidden_states.{}", i), DType::F32, {P, hidden_size}, r.hidden[i]);
    w.finish();
  }
  return 0;
}

void setup(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<GenerateArgs>();
  app.add_option("--model", a->model, "checkpoint folder (GlmMoeDsaForCausalLM / DeepseekV3ForCausalLM / V3.2)")->required();
  auto* ids = app.add_option("--prompt-ids", a->prompt_ids, "prompt token ids, comma-separated (e.g. 1,2,3)");
  auto* text = app.add_option("--prompt", a->prompt_text, "prompt text (encoded with the folder's tokenizer.json); prints text");
  ids->excludes(text);
  app.add_option("--tokenizer-path", a->tokenizer_path, "folder with tokenizer.json (default: --model)");
  app.callback([ids, text] {
    if (ids->count() == 0 && text->count() == 0) throw CLI::RequiredError("--prompt-ids or --prompt");
  });
  app.add_option("--max-new-tokens", a->max_new_tokens, "tokens to generate")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--temperature", a->sampling.temperature, "0: greedy")->capture_default_str();
  app.add_option("--top-p", a->sampling.top_p, "nucleus mass kept, (0, 1]")->capture_default_str();
  app.add_option("--top-k", a->sampling.top_k, "-1: off, else >= 1 (0 is refused)")->capture_default_str();
  app.add_option("--min-p", a->sampling.min_p, "keep tokens with p >= min_p * p_max")->capture_default_str();
  app.add_option("--repetition-penalty", a->sampling.repetition_penalty, "1: off")->capture_default_str();
  app.add_option("--presence-penalty", a->sampling.presence_penalty, "0: off")->capture_default_str();
  app.add_option("--frequency-penalty", a->sampling.frequency_penalty, "0: off")->capture_default_str();
  app.add_option("--seed", a->sampling.seed, "sampling seed (same seed, same tokens)")->capture_default_str();
  app.add_option("--logprobs", a->logprobs, "print each sampled token's logprob and the top N (0..20)");
  app.add_option("--indexer-score-rows", a->indexer_score_rows,
                 "cuda: the DSA indexer scores and selects at most this many prompt rows per launch (0: the memory "
                 "plan's chunk; a smaller one gives the same tokens and logits)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--backend", a->backend, "cpu, or cuda (the GPU runner: BF16 KV cache, greedy on the device)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--mem-fraction-static", a->mem_fraction_static,
                 "cuda: share of the device for weights + workspace + KV pool")
      ->capture_default_str();
  app.add_option("--tp", a->tp, "tensor-parallel ranks (attention heads, dense layers); 1 in this version")
      ->capture_default_str();
  app.add_option("--ep", a->ep, "expert-parallel ranks (routed experts); 1 in this version")->capture_default_str();
  app.add_option("--threads", a->threads, "CPU threads (default: FP4MOE_THREADS or all cores)");
  app.add_option("--kv-dtype,--kv-cache-dtype", a->kv_dtype,
                 "KV cache element type: f32 (exact, the reference; --backend cuda keeps bf16 then), bf16, or fp8 "
                 "(= fp8_e4m3: E4M3 latent, rope key and index keys, scale 1.0; on both backends)")
      ->check(CLI::IsMember({"bf16", "fp8", "fp8_e4m3", "f32"}))
      ->capture_default_str();
  app.add_option("--page-size", a->page_size, "KV cache page size (tokens)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--dump-logits", a->dump_logits, "write tokens I32 [P+N] and logits F32 [P+N-1, vocab] here");
  app.add_option("--dump-hidden", a->dump_hidden, "write the prompt's hidden_states.{0..L} F32 [P, hidden] here");
  app.add_option("--speculative-algorithm", a->speculative.algorithm, engine::kSpeculativeAlgorithmHelp)
      ->check(CLI::IsMember({"NEXTN", "EAGLE"}));
  app.add_option("--speculative-num-steps", a->speculative.num_steps, engine::kSpeculativeNumStepsHelp);
  app.add_option("--speculative-eagle-topk", a->speculative.eagle_topk, engine::kSpeculativeEagleTopkHelp);
  app.add_option("--speculative-num-draft-tokens", a->speculative.num_draft_tokens, engine::kSpeculativeNumDraftTokensHelp);
  app.add_option("--speculative-draft-model-quantization", a->speculative.draft_model_quantization,
                 engine::kSpeculativeDraftModelQuantizationHelp)
      ->check(CLI::IsMember({"nvfp4", "unquant"}));
  app.add_option("--dump-mtp-logits", a->dump_mtp_logits,
                 "write tokens I32 [P] and mtp_logits F32 [P-1, vocab] here: row i = the MTP layer's logits given the "
                 "target's hidden state at prompt position i and token i+1 (cpu and cuda backends)");
  run = [a] { return run_generate(*a); };
}

const Registrar kRegistrar{"generate", "Generate tokens from prompt ids or text with a whole model (CPU or CUDA backend)", setup};

}  // namespace
}  // namespace fp4moe::cli
