// fp4moe serve --model DIR: the OpenAI-compatible server (see src/serve/README.md).
#include "cli/command.hpp"
#include "serve/chat_output_parser.hpp"
#include "serve/server.hpp"

namespace {

void setup(CLI::App& app, std::function<int()>& run) {
  auto o = std::make_shared<fp4moe::serve::ServeOptions>();
  app.add_option("--model,--model-path", o->model, "Checkpoint folder (Hugging Face layout)");
  app.add_option("--tokenizer-path", o->tokenizer_path, "Tokenizer folder (default: --model)");
  app.add_option("--backend", o->backend, "cpu | cuda | fake (fake: the deterministic test model, byte tokenizer)")
      ->capture_default_str();
  app.add_option("--host", o->host, "Address to listen on")->capture_default_str();
  app.add_option("--port", o->port, "Port to listen on")->check(CLI::Range(0, 65535))->capture_default_str();
  app.add_option("--api-key", o->api_key,
                 "Require 'Authorization: Bearer KEY' (except /health and /health_generate, and /metrics with "
                 "--metrics-allow-unauthenticated)");
  app.add_flag("--metrics-allow-unauthenticated", o->metrics_allow_unauthenticated,
               "With --api-key: serve /metrics without the key (for a Prometheus scraper without credentials)");
  app.add_option("--served-model-name", o->served_model_name, "Model name in the API (default: the folder's name)");
  app.add_option("--max-running-requests", o->max_running_requests, "Requests in the running batch at most")
      ->check(CLI::Range(1, 65536))->capture_default_str();
  app.add_option("--num-continuous-decode-steps", o->num_continuous_decode_steps,
                 "Decode steps per scheduling round (on the device for the GPU runner); a round whose batch holds "
                 "a constrained request (response_format, regex, ebnf, json_schema) runs one step; must be 1 with "
                 "--speculative-algorithm, whose decode round is one draft/verify round of up to N + 1 tokens per request")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--speculative-algorithm", o->speculative.algorithm, fp4moe::engine::kSpeculativeAlgorithmHelp)
      ->check(CLI::IsMember({"NEXTN", "EAGLE"}));
  app.add_option("--speculative-num-steps", o->speculative.num_steps, fp4moe::engine::kSpeculativeNumStepsHelp);
  app.add_option("--speculative-eagle-topk", o->speculative.eagle_topk, fp4moe::engine::kSpeculativeEagleTopkHelp);
  app.add_option("--speculative-num-draft-tokens", o->speculative.num_draft_tokens,
                 fp4moe::engine::kSpeculativeNumDraftTokensHelp);
  app.add_option("--speculative-draft-model-quantization", o->speculative.draft_model_quantization,
                 fp4moe::engine::kSpeculativeDraftModelQuantizationHelp)
      ->check(CLI::IsMember({"nvfp4", "unquant"}));
  app.add_option("--speculative-disable-by-batch-size", o->speculative.disable_by_batch_size,
                 fp4moe::engine::kSpeculativeDisableByBatchSizeHelp);
  app.add_option("--chunked-prefill-size", o->chunked_prefill_size, "Prompt tokens per step at most (decode tokens ride along)")
      ->check(CLI::Range(1, 1 << 24))->capture_default_str();
  app.add_option("--max-total-tokens", o->max_total_tokens, "KV pool size in tokens (caps --mem-fraction-static)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  app.add_option("--mem-fraction-static", o->mem_fraction_static,
                 "Fraction of device memory for weights + workspaces + KV pool (default 0.88)")
      ->check(CLI::Range(0.01, 0.99));
  app.add_option("--page-size", o->page_size, "Tokens per KV page")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--cuda-graph-max-bs", o->cuda_graph_max_bs, "Largest CUDA-graph batch in requests (default: --max-running-requests; with "
                 "--speculative-algorithm the verify steps of that many requests, (N + 1) rows each, are captured)")
      ->check(CLI::Range(0, 65536));
  app.add_option("--context-length", o->context_length, "Tokens per request at most (default: the model's)")
      ->check(CLI::Range(2, 1 << 30));
  app.add_option("--max-queued-requests", o->max_queued_requests, "Waiting requests at most; more get 429 (default: no limit)")
      ->check(CLI::Range(0, 1 << 30));
  app.add_flag("--disable-radix-cache", o->disable_radix_cache, "No prefix reuse");
  app.add_option("--attention-kernels", o->attention_kernels,
                 "--backend cuda: auto (decode and top-k rows on FlashInfer's SM90 MLA over a device-built "
                 "schedule on sm_90 with 64 heads and a BF16 cache, the top-k rows of one-token steps on our MlaDecodeMma; "
                 "else, and over an fp8_e4m3 cache, MlaDecodeMma) | flashinfer-decode (FlashInfer for every decode and top-k row, or an error) | "
                 "mma-decode (always MlaDecodeMma) | wgmma-decode (its wgmma variant, sm_90) | wgmma-ws-decode (its "
                 "warp-specialized wgmma variant, sm_90, fp8_e4m3 cache only) | own (the runner's "
                 "any-dims kernels); a forced kernel the GPU or the dims cannot run is refused at start-up")
      ->check(CLI::IsMember({"auto", "own", "flashinfer-decode", "mma-decode", "wgmma-decode", "wgmma-ws-decode"}))
      ->capture_default_str();
  app.add_option("--kv-cache-dtype", o->kv_cache_dtype, "auto (bf16) | bf16 | fp8_e4m3 (E4M3 latent, rope key and index keys, scale 1.0; cpu and cuda) | f32 (the CPU reference)")
      ->capture_default_str();
  app.add_option("--reasoning-parser", o->reasoning_parser,
                 "Split <think> text into reasoning_content: glm45 | deepseek-r1 | deepseek-v3 (default: none)")
      ->check([](const std::string& v) { fp4moe::serve::ParserFlags f; return fp4moe::serve::parse_parser_flags(v, "", f); });
  app.add_option("--tool-call-parser", o->tool_call_parser,
                 "Parse the model's tool calls into tool_calls: glm47 | glm45 | deepseekv3 | deepseekv31 (default: none)")
      ->check([](const std::string& v) { fp4moe::serve::ParserFlags f; return fp4moe::serve::parse_parser_flags("", v, f); });
  app.add_flag("--log-requests", o->log_requests, "Log every request");
  app.add_option("--decode-log-interval", o->decode_log_interval, "Scheduling rounds per log line (0: none)")
      ->check(CLI::Range(0, 1 << 30))->capture_default_str();
  app.add_option("--graceful-shutdown-timeout", o->graceful_shutdown_timeout,
                 "Seconds SIGTERM lets running requests finish before aborting them")
      ->check(CLI::Range(0, 86400))->capture_default_str();
  app.add_option("--http-request-timeout", o->http_request_timeout,
                 "Seconds a request's headers and body may take to arrive (slow clients are dropped)")
      ->check(CLI::Range(1, 3600))->capture_default_str();
  app.add_option("--http-max-connections", o->http_max_connections,
                 "Open connections at most (also bounded by the descriptor limit); beyond, the oldest one whose "
                 "request is not running is closed")
      ->check(CLI::Range(16, 1 << 20))->capture_default_str();
  app.add_option("--http-max-connections-per-client", o->http_max_connections_per_client,
                 "Connections per client IP that are idle or still sending their request; beyond, its oldest "
                 "(if it has waited 1 s) is closed")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  auto* fake = "Fake backend (tests)";
  std::vector<CLI::Option*> fake_options = {
      app.add_option("--fake-step-delay-us", o->fake_step_delay_us, "Sleep per model step")
          ->check(CLI::Range(0, 10000000))->group(fake),
      app.add_option("--fake-load-delay-ms", o->fake_load_delay_ms, "Sleep while 'loading'")
          ->check(CLI::Range(0, 600000))->group(fake),
      app.add_option("--fake-fail-after-steps", o->fake_fail_after_steps,
                     "Every model step after this many fails, as a fatal device error would (default: never)")
          ->check(CLI::Range(int64_t(0), int64_t(1) << 40))->group(fake),
      app.add_option("--fake-script", o->fake_script,
                     "The greedy answer after each <|assistant|> token, then EOS (tests of the reasoning / tool-call "
                     "parsers)")
          ->group(fake),
      app.add_option("--fake-eos-period", o->fake_eos_period,
                     "EOS is the greedy choice about once in this many positions (0: never)")
          ->check(CLI::Range(0, 1 << 30))->group(fake),
      app.add_flag("--fake-uniform-logits", o->fake_uniform_logits,
                   "Every logit 0 (after any --fake-script): samples every allowed token alike (structured-output tests)")
          ->group(fake)};
  // The fake backend's options mean nothing to a real model: refused there, not ignored.
  app.callback([o, fake_options] {
    for (const CLI::Option* f : fake_options)
      if (f->count() > 0 && o->backend != "fake")
        throw CLI::ValidationError(f->get_name(), "only with --backend fake (got --backend " + o->backend + ")");
  });
  run = [o] { return fp4moe::serve::run_serve(*o); };
}

fp4moe::cli::Registrar reg{"serve", "Serve a model over HTTP (OpenAI-compatible and SGLang-native endpoints)", setup};

}  // namespace
