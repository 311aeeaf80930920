// The sampling parameters of one request: the one struct the HTTP layer fills, the engine
// carries, the CPU sampler (cpu/sampling_cpu.hpp) reads and the device sampler (cuda/sampling)
// reads from a device array, one per row (plain data, no pointers: it can live among a CUDA
// graph's inputs). Meanings are SGLang's / OpenAI's; the defaults change nothing but draw with
// temperature 1 (a caller that wants greedy sets temperature 0).
#pragma once

#include <cstdint>

#include "core/host_device.hpp"

namespace fp4moe::cpu {

inline constexpr int kMaxTopLogprobs = 20;  // top_logprobs entries at most
inline constexpr int32_t kNoToken = -1;     // the sentinel of a row that produced nothing
inline constexpr int32_t kTopKOff = -1;     // top_k: every token

struct SamplingParams {
  float temperature = 1.0f;         // >= 0; 0: greedy (the highest logit, ties to the lower id)
  float top_p = 1.0f;               // (0, 1]; 1: off
  float min_p = 0.0f;               // [0, 1]; 0: off
  float repetition_penalty = 1.0f;  // > 0, on prompt and generated tokens; 1: off
  float presence_penalty = 0.0f;    // on generated tokens (the API allows [-2, 2])
  float frequency_penalty = 0.0f;   // on generated tokens (the API allows [-2, 2])
  int32_t top_k = kTopKOff;         // -1: off, else >= 1 (1: greedy); 0 and < -1 are refused (SGLang's rule)
  int32_t logprobs_top_n = -1;      // -1: no logprobs; 0: the chosen token's; n <= 20: and the top n
  // The draw is fixed by (seed, draw index): the engine draws a seed for a request that did
  // not give one (has_seed false), so a retracted request samples the same tokens again.
  uint64_t seed = 0;
  bool has_seed = false;

  // Greedy: temperature 0, or top_k 1 (the same token; logprobs are then of temperature 1).
  FP4MOE_HD bool greedy() const { return temperature == 0.0f || top_k == 1; }
  FP4MOE_HD bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
  FP4MOE_HD bool top_k_on(int64_t vocab) const { return top_k >= 1 && top_k < vocab; }
};
static_assert(sizeof(SamplingParams) == 48);

// Checks the ranges above (temperature finite and >= 0, top_k -1 or >= 1, top_p in (0, 1],
// min_p in [0, 1], repetition_penalty finite and > 0, presence / frequency finite,
// logprobs_top_n in [-1, 20]); throws fp4moe::Error with one line naming the field.
void validate_sampling(const SamplingParams& p);

}  // namespace fp4moe::cpu
