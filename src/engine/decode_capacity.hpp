// What a backend's K-step decode runs on the device, and the one rule that says whether a
// scheduling round fits it. The GPU runner is sized at load for K decode steps per call and a
// number of stop ids per request (its device buffers); a round beyond either is refused with
// the reason (a StepError naming the requests), never sent down a slower host loop in silence.
// `serve` sizes the runner from --num-continuous-decode-steps and the API's stop-id limit, so a
// round it schedules always fits.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/backend.hpp"

namespace fp4moe::engine {

struct DecodeCapacity {
  int32_t max_steps = 1;     // K of one call at most
  int32_t max_stop_ids = 0;  // stop ids of one request at most (its own plus the EOS ids)
};

struct DecodeRefusal {
  std::string reason;                  // one line
  std::vector<uint64_t> request_ids;   // the requests it concerns (empty: the whole round)
};

// Why `steps` decode steps over `batch` with `limits` do not fit `cap` (nullopt: they do). Checks
// the call's shape too (a limit per request, one sampling token per request).
std::optional<DecodeRefusal> decode_capacity_refusal(const StepBatch& batch, const DecodeLimits& limits, int32_t steps,
                                                     const DecodeCapacity& cap);

// The stop ids a request can bring through the API: `stop_token_ids` (at most kMaxStopTokenIds)
// plus the tokenizer's EOS ids. The capacity `serve` gives a device backend.
inline constexpr int32_t kMaxStopTokenIds = 64;
inline DecodeCapacity serve_decode_capacity(int32_t num_continuous_decode_steps, size_t eos_ids) {
  return {num_continuous_decode_steps, kMaxStopTokenIds + int32_t(eos_ids)};
}

}  // namespace fp4moe::engine
