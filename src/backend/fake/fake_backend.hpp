// A deterministic stand-in model for tests and for `serve --backend fake` (backend/fake).
//
// Its "KV cache" is real and paged: the entry of position p is a hash of the entry of p - 1,
// the token at p and p, written to the page the page table names. The logits after p are a
// hash of that entry, so the next token depends on the whole sequence exactly as the engine
// laid it out in pages: a wrong page table, a prefix page shared by mistake or overwritten
// by another request changes the output (and reading a slot never written fails loudly).
// Prefers printable tokens (a-z, space, '.') so that byte-level text reads; EOS is the
// argmax about once every eos_period positions. Sampling is sample_row_cpu.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend.hpp"

namespace fp4moe::engine {

struct FakeBackendOptions {
  int32_t vocab_size = 260;
  int32_t eos_id = -1;           // -1: never
  int32_t eos_period = 64;
  int32_t num_experts = 8;       // the MoE histogram hook sees top-2 routing over these
  int32_t max_context = 1 << 20;
  int32_t step_delay_us = 0;     // sleeps this long per step (to keep requests in flight in tests)
  int64_t fail_after_steps = -1; // >= 0: every step after this many throws (a fatal device error)
  // >= 0: a step in which a request computes this token throws StepError naming the requests
  // that do, before anything is written (a per-request failure: the others go on).
  int32_t fail_request_token = -1;
  // Not empty: a test scripts what the "model" says (e.g. reasoning and tool-call text for the
  // output parsers). After a position k tokens past the last script_marker token (k >= 1), the
  // greedy token is script[k - 1], then EOS once the script is spent: a prompt that ends in the
  // marker and one separator (the byte codec's "<|assistant|>\n") is answered with the whole
  // script. Positions before any marker, and the marker itself, keep the hash model.
  std::vector<int32_t> script;
  // Every logit 0 where the script does not speak: sampling picks among the allowed tokens alike
  // (structured-output tests, whose outputs must end without a model that closes strings).
  bool uniform_logits = false;
  int32_t script_marker = -1;
};

class FakeBackend : public Backend {
 public:
  explicit FakeBackend(FakeBackendOptions options);
  BackendInfo info() const override;
  void init_kv(int32_t num_pages, int32_t page_size, int32_t max_step_tokens, int32_t max_requests) override;
  void step(const StepBatch& batch, std::vector<GeneratedToken>& out) override;

  int64_t steps_run() const { return steps_; }
  int32_t max_batch_tokens_seen() const { return max_batch_tokens_; }
  // Logits after a KV entry (exposed so tests can predict the greedy next token).
  void logits_after(uint64_t kv_entry, std::vector<float>& logits) const;
  // With a script: the logits after a position `since` tokens past the last marker (>= 1).
  void script_logits(int32_t since, std::vector<float>& logits) const;

 private:
  FakeBackendOptions opt_;
  int32_t page_size_ = 0;
  int32_t max_step_tokens_ = 0;
  std::vector<uint64_t> kv_;  // num_pages * page_size entries
  std::vector<int32_t> since_marker_;  // per KV slot: tokens since the last script marker (-1: none yet)
  std::vector<float> logits_;
  int64_t steps_ = 0;
  int32_t max_batch_tokens_ = 0;
};

}  // namespace fp4moe::engine
