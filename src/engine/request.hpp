// What a client asks of the engine and what comes back, in native types only (no JSON).
//
// The serve layer turns an HTTP body into a RequestSpec (one per choice: n = 2 is two
// specs), the engine turns it into tokens, delivered as OutputEvents on the request's
// OutputChannel.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/finish_reason.hpp"
#include "core/sampling_params.hpp"
#include "grammar/grammar.hpp"

namespace fp4moe::engine {

// The sampling parameters (core/sampling_params.hpp: one struct from the HTTP layer to the
// device; top_k -1 = off; logprobs_top_n: -1 no logprobs, 0 the sampled token's, n plus the top n).
using cpu::SamplingParams;

struct RequestSpec {
  std::vector<int32_t> prompt;      // token ids, at least one
  SamplingParams sampling;
  int32_t max_new_tokens = 16;      // >= 1 (the server's validation guarantees the context fits)
  std::vector<int32_t> stop_ids;    // finish (reason stop) when sampled; always active
  bool ignore_eos = false;          // the model's EOS ids do not stop
  // Constrained decoding (null: none): every sampled token is one the grammar allows (the mask
  // is applied before every sampling mode); the request finishes with kStop when the grammar
  // accepts its stop id after complete text, kLength with partial text when max_new_tokens
  // runs out first. Compiled for the backend's vocabulary (the serve layer's Compiler).
  grammar::GrammarPtr grammar;
  // Rows the backend hands back beside the tokens (`fp4moe generate --dump-*`; DumpRows bits, 0:
  // none), in OutputEvent::dumps. A backend without BackendInfo::dumps_rows refuses them; a request
  // that dumps runs one step per round (no K-step decode, no speculative round when it dumps the
  // target's logits or hidden states).
  uint8_t dump = 0;
};

// What a request may ask the backend to hand back (RequestSpec::dump).
enum DumpRows : uint8_t {
  kDumpLogits = 1,     // the next-token logits of every position it computes
  kDumpHidden = 2,     // the hidden states (0: embeddings .. L: after the final norm) of its prompt positions
  kDumpMtpLogits = 4,  // the MTP layer's logits over every (position, next token) pair it computes
};

// One block of dumped rows of one request from one step: rows [start, start + rows) of one kind.
struct RowDump {
  int32_t request = 0;  // index of the request in the StepBatch (the scheduler maps it back)
  DumpRows what = kDumpLogits;
  int32_t layer = 0;    // kDumpHidden: hidden_states index 0 .. L
  int32_t start = 0;    // position of the first row (kDumpMtpLogits: h at start + i, token at start + i + 1)
  int32_t rows = 0;
  int32_t width = 0;    // floats per row (vocab, or hidden)
  std::vector<float> data;  // [rows, width]
};

using fp4moe::FinishReason;  // core/finish_reason.hpp (the engine delivers kStop, kLength, kAbort)
using fp4moe::finish_reason_name;

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

struct GeneratedToken {
  int32_t id = 0;
  float logprob = 0.0f;                // filled when the request asked for logprobs
  std::vector<TokenLogprob> top;       // top_logprobs entries, best first
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;  // prompt tokens whose KV came from the prefix cache (first admission)
  int32_t completion_tokens = 0;
  int32_t spec_verify_steps = 0;  // speculative decoding: the draft/verify rounds that produced its tokens (SGLang's spec_verify_ct)
};

// One delivery on a request's channel: new tokens, and at the end the finish.
struct OutputEvent {
  std::vector<GeneratedToken> tokens;
  bool finished = false;
  FinishReason reason = FinishReason::kLength;
  int32_t matched_stop_id = -1;  // the stop / EOS id that ended it, -1 otherwise
  std::string abort_message;     // why, for kAbort
  Usage usage;                   // valid when finished
  std::vector<RowDump> dumps;    // RequestSpec::dump: the rows computed since the last event
};

}  // namespace fp4moe::engine
