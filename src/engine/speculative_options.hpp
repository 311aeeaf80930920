// The speculative-decoding flags (SGLang's names) of `serve`, `generate` and `bench step`, checked
// in one place: --speculative-algorithm NEXTN (EAGLE: an alias; the model's own MTP layer as the
// draft), --speculative-num-steps N (default 3), --speculative-eagle-topk (1 only: chain drafts),
// --speculative-num-draft-tokens (N + 1 only). Speculation runs on the cpu and cuda backends, one
// draft/verify round per scheduling round: --num-continuous-decode-steps must be 1 with it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace fp4moe::engine {

struct SpeculativeFlags {
  std::string algorithm;                  // "" (off), NEXTN, EAGLE
  std::optional<int32_t> num_steps;       // default 3
  std::optional<int32_t> eagle_topk;      // default 1
  std::optional<int32_t> num_draft_tokens;  // default num_steps + 1
};

// The help texts (one per flag), shared by the commands.
extern const char* const kSpeculativeAlgorithmHelp;
extern const char* const kSpeculativeNumStepsHelp;
extern const char* const kSpeculativeEagleTopkHelp;
extern const char* const kSpeculativeNumDraftTokensHelp;

// N (draft steps per round), or 0 when speculation is off. Throws fp4moe::Error (one line) for
// a flag without --speculative-algorithm, another algorithm, N outside [1, 16], a top-k other
// than 1, draft tokens other than N + 1, a backend other than cpu / cuda, or continuous_decode_steps > 1.
int32_t speculative_steps(const SpeculativeFlags& f, const std::string& backend, int32_t continuous_decode_steps);

}  // namespace fp4moe::engine
