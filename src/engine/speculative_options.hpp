// The speculative-decoding flags (SGLang's names) of `serve`, `generate` and `bench step`, checked
// in one place: --speculative-algorithm NEXTN (EAGLE: an alias; the model's own MTP layer as the
// draft), --speculative-num-steps N (default 3), --speculative-eagle-topk (1 only: chain drafts),
// --speculative-num-draft-tokens (N + 1 only), --speculative-draft-model-quantization (nvfp4 /
// unquant: the MTP layer's BF16 routed experts quantized at load or kept), and on `serve` only
// --speculative-disable-by-batch-size N (vLLM's name: a decode batch of more than N requests runs
// plain steps). Speculation runs on the cpu and cuda backends, one draft/verify round per
// scheduling round: --num-continuous-decode-steps must be 1 with it.
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
  std::optional<std::string> draft_model_quantization;  // nvfp4 (default) | unquant
  std::optional<int32_t> disable_by_batch_size;         // serve only; default: never (speculate at every size)
};

// The help texts (one per flag), shared by the commands.
extern const char* const kSpeculativeAlgorithmHelp;
extern const char* const kSpeculativeNumStepsHelp;
extern const char* const kSpeculativeEagleTopkHelp;
extern const char* const kSpeculativeNumDraftTokensHelp;
extern const char* const kSpeculativeDraftModelQuantizationHelp;
extern const char* const kSpeculativeDisableByBatchSizeHelp;

// N (draft steps per round), or 0 when speculation is off. Throws fp4moe::Error (one line) for
// a flag without --speculative-algorithm, another algorithm, N outside [1, 16], a top-k other
// than 1, draft tokens other than N + 1, a backend other than cpu / cuda, or continuous_decode_steps > 1.
int32_t speculative_steps(const SpeculativeFlags& f, const std::string& backend, int32_t continuous_decode_steps);

// --speculative-draft-model-quantization (SGLang's name; here it covers the MTP layer's routed
// experts, the part NVIDIA's NVFP4 checkpoints keep in BF16): true for nvfp4 (the default:
// quantized to NVFP4 at load, the FP4 grouped GEMM), false for unquant (kept BF16). Throws
// fp4moe::Error (one line) for another value, or the flag without speculation (speculating:
// --speculative-algorithm is on). `generate --dump-mtp-logits` alone (the MTP layer's math
// check) runs the experts as the checkpoint stores them.
bool quantize_draft_experts(const SpeculativeFlags& f, bool speculating);

// --speculative-disable-by-batch-size N (`serve` only; vLLM's speculative_disable_by_batch_size):
// a decode round whose running batch holds more than N requests is one plain decode step instead
// of a draft/verify round (the scheduler's SchedulerConfig::speculative_disable_by_batch_size);
// rounds of N or fewer speculate again. Returns N, or 0 when not given (speculate at every batch
// size). Throws fp4moe::Error (one line) for N < 1, or the flag without speculation (speculating:
// --speculative-algorithm is on).
int32_t speculative_disable_by_batch_size(const SpeculativeFlags& f, bool speculating);

}  // namespace fp4moe::engine
