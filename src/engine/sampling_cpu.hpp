// Host sampling for the engine's backends: a SampleSpec over one row of logits through
// cpu::sample_cpu (penalties, temperature, top-k / top-p / min-p, logprobs; the draw is fixed
// by (seed, output index), so a retracted request that is recomputed samples the same tokens).
#pragma once

#include <cstdint>

#include "cpu/sampling_cpu.hpp"
#include "engine/backend.hpp"

namespace fp4moe::engine {

// The engine's sampling knobs in cpu/'s form (top_k <= 0 and top_k == 1 map as the engine means them).
cpu::SamplingParams cpu_sampling(const SamplingParams& p, int32_t top_logprobs);

// Samples one token from logits [vocab] for spec.
GeneratedToken sample_row_cpu(const float* logits, int64_t vocab, const SampleSpec& spec);

}  // namespace fp4moe::engine
