// Single-request generation on the CPU backend: one prefill step over the prompt, then one
// decode step per new token, with a paged KV pool sized for the request.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/paged_kv.hpp"
#include "cpu/sampling_cpu.hpp"
#include "model/model.hpp"

namespace fp4moe::model {

struct GenerateOptions {
  int64_t max_new_tokens = 16;
  cpu::SamplingParams sampling{.temperature = 0.0f};  // greedy unless set
  int64_t page_size = 16;
  KvElem kv_elem = KvElem::BF16;
  bool keep_logits = false;         // keep every next-token logits row (for --dump-logits / tests)
  bool prefill_token_by_token = false;  // feed the prompt one decode step at a time (tests)
  HiddenStates* prompt_hidden = nullptr;  // when set: the prefill step's hidden states
  // Teacher forcing (tests): new token i is forced[i] instead of the sampled one (which is
  // still recorded in `samples`) while i < forced.size().
  std::vector<int32_t> forced;
  // Speculative decoding with the MTP layer (generate_speculative): N draft steps per round, 0: off.
  int32_t speculative_steps = 0;
  std::function<int32_t(uint64_t id, uint64_t output_index, int32_t mtp_choice)> draft_override;  // tests (speculative.hpp)
  bool keep_kv = false;             // tests: GenerateResult::kv holds the pool afterwards
};

struct GenerateResult {
  std::vector<int32_t> tokens;          // prompt + generated, [P + N]
  std::vector<float> logits;            // keep_logits: [P + N − 1, vocab]; row i = after the first i+1 tokens
  std::vector<cpu::SampledToken> samples;  // [N]
  double prefill_seconds = 0.0, decode_seconds = 0.0;
  int64_t prompt_tokens = 0, new_tokens = 0;
  // Speculative decoding: rounds (verify steps), drafts proposed and accepted, and how many
  // rounds emitted 1, 2, .. N + 1 tokens (accept_length[i]: rounds that emitted i + 1).
  int64_t verify_steps = 0, drafted = 0, accepted = 0;
  double draft_seconds = 0.0, verify_seconds = 0.0, mtp_seconds = 0.0;  // of decode_seconds (MtpSpeculator::times)
  std::vector<int64_t> accept_length;
  std::shared_ptr<HostKvPool> kv;   // keep_kv: the pool after the run
  std::vector<int32_t> kv_pages;    // its page table for the request
};

// The checks of a request that depend only on the model's config (every backend's): an empty
// prompt or max_new_tokens < 1, an id outside the vocabulary, prompt + max_new_tokens beyond
// max_position_embeddings, bad sampling parameters. Throws fp4moe::Error (one line).
void validate_prompt(const MlaModelConfig& config, const std::vector<int32_t>& prompt, const GenerateOptions& opt);

// The single-request loop every backend runs over `res` (tokens = the prompt, prompt_tokens
// set): the prefill (or the prompt one decode step at a time), then one decode step per new
// token; teacher forcing, the vocabulary check of each new token, and the timings.
// run(p0, n, hidden) computes positions [p0, p0 + n) of res.tokens; sample(step) samples the
// next token from the last run's logits.
void run_generation(GenerateResult& res, int64_t vocab, const GenerateOptions& opt,
                    const std::function<void(int64_t p0, int64_t n, HiddenStates* hidden)>& run,
                    const std::function<cpu::SampledToken(uint64_t step)>& sample);

// Checks a request against the model before anything runs (validate_prompt's checks and a
// page size >= 1); throws fp4moe::Error (one line):
// an empty prompt, an id outside the vocabulary, prompt + max_new_tokens beyond
// max_position_embeddings, bad sampling parameters.
void validate_request(const Model& model, const std::vector<int32_t>& prompt, const GenerateOptions& opt);

// Errors (one line, validate_request's): an empty prompt, an id outside the vocabulary, prompt + max_new_tokens
// beyond max_position_embeddings, bad sampling parameters.
GenerateResult generate(Model& model, const std::vector<int32_t>& prompt, const GenerateOptions& opt);

// generate() with speculative decoding (opt.speculative_steps >= 1; model/speculative.hpp): the
// prefill, then draft/verify rounds until max_new_tokens. Greedy output equals generate()'s
// token for token. Refused (one line): no MTP layer, keep_logits, forced tokens, the prompt
// one token at a time, prompt hidden states.
GenerateResult generate_speculative(Model& model, const std::vector<int32_t>& prompt, const GenerateOptions& opt);

// The MTP layer's logits over a prompt (`fp4moe generate --dump-mtp-logits`): one target step
// over the prompt (its hidden states after the final norm), then one MTP step over positions
// 0 .. P-2 with token i+1 and the target's hidden state at i. Returns F32 [P-1, vocab]; row i
// predicts the token at i + 2. Errors (one line): a prompt under 2 tokens, no MTP layer.
std::vector<float> mtp_prompt_logits(Model& model, const std::vector<int32_t>& prompt, int64_t page_size, KvElem kv_elem);

}  // namespace fp4moe::model
