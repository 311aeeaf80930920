// Sampling from one row of logits on the host: penalties, temperature, top-k, top-p, min-p,
// and a draw fixed by (seed, output index), so the same request state always samples the same
// token (retraction replays it). Logprobs are the log-softmax of the raw logits.
#pragma once

#include <cstdint>
#include <span>

#include "engine/backend.hpp"

namespace fp4moe::engine {

// A uniform double in [0, 1) from (seed, index); the same on every backend.
double sampling_uniform(uint64_t seed, int32_t index);

// Samples one token from logits (overwritten: penalties and temperature are applied in place).
GeneratedToken sample_logits_cpu(std::span<float> logits, const SampleSpec& spec);

}  // namespace fp4moe::engine
