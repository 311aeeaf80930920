// fp4moe serve: an OpenAI-compatible (and SGLang-native) HTTP server over the engine.
#pragma once

#include "engine/speculative_options.hpp"
#include <cstdint>
#include <string>

namespace fp4moe::serve {

// The flags of `fp4moe serve` (SGLang's names and meanings where SGLang has them).
struct ServeOptions {
  std::string model;                 // --model DIR
  std::string tokenizer_path;        // default: the model folder
  std::string backend = "cpu";       // --backend cpu|cuda|fake (fake: the deterministic test model)
  std::string host = "127.0.0.1";
  int port = 30000;
  std::string api_key;
  std::string served_model_name;     // default: the model folder's name
  int32_t max_running_requests = 64;
  int32_t num_continuous_decode_steps = 1;
  engine::SpeculativeFlags speculative;  // --speculative-* (engine/speculative_options.hpp)
  int32_t chunked_prefill_size = 2048;
  int64_t max_total_tokens = 0;      // 0: from --mem-fraction-static / the backend
  double mem_fraction_static = 0.0;  // 0: the backend's default (0.88 of the device)
  int32_t page_size = 16;
  int32_t cuda_graph_max_bs = 0;     // 0: --max-running-requests
  int32_t context_length = 0;        // 0: the model's
  int32_t max_queued_requests = -1;  // -1: unlimited
  bool disable_radix_cache = false;
  std::string kv_cache_dtype = "auto";  // auto (bf16) | bf16 | fp8_e4m3 | f32 (CPU reference)
  std::string attention_kernels = "auto";  // --backend cuda: auto | own | flashinfer-decode | mma-decode | wgmma-decode | wgmma-ws-decode
  bool log_requests = false;
  std::string reasoning_parser;   // "" | glm45 | deepseek-r1 | deepseek-v3: reasoning_content in chat replies
  std::string tool_call_parser;   // "" | glm47 | glm45 | deepseekv3 | deepseekv31: tool_calls in chat replies
  // fp4moe's own.
  int32_t decode_log_interval = 40;        // rounds per scheduler log line
  int32_t graceful_shutdown_timeout = 30;  // seconds SIGTERM waits for running requests
  int32_t http_request_timeout = 30;       // seconds a request's headers + body may take to arrive
  int64_t max_body_bytes = int64_t(32) << 20;
  int32_t http_max_connections = 4096;             // open at once; beyond, the oldest one not being served closes
  int32_t http_max_connections_per_client = 512;   // per IP, not counting connections whose request is running
  bool metrics_allow_unauthenticated = false;      // with --api-key: /metrics without the key
  // The fake backend (tests).
  int32_t fake_step_delay_us = 0;
  int32_t fake_load_delay_ms = 0;
  int32_t fake_eos_period = 64;
  int64_t fake_fail_after_steps = -1;
  bool fake_uniform_logits = false;  // every logit 0 (structured-output tests)
  std::string fake_script;  // not empty: the greedy answer after each "<|assistant|>" (fake_backend.hpp)
};

// Runs the server until SIGTERM / SIGINT; returns the exit code (0 after a graceful stop,
// 1 when it could not start).
int run_serve(const ServeOptions& options);

}  // namespace fp4moe::serve
