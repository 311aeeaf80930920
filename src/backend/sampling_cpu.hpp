// Host sampling for the engine's backends: a SampleSpec over one row of logits through
// cpu::sample_cpu (penalties, temperature, top-k / top-p / min-p, logprobs; the draw is fixed
// by (seed, output index), so a retracted request that is recomputed samples the same tokens,
// and it is the device sampler's draw: the same token on the GPU backend).
#pragma once

#include <cstdint>

#include "engine/backend.hpp"

namespace fp4moe::engine {

// Samples one token from logits [vocab] for spec.
GeneratedToken sample_row_cpu(const float* logits, int64_t vocab, const SampleSpec& spec);

}  // namespace fp4moe::engine
